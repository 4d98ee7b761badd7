"""The link between a head and a worker, as one node sees it: the interface the kernel routes an
address over (``ip -j route get``), the interface holding a local address (``ip -j addr``), its speed,
MTU and state (sysfs, ``ethtool`` where sysfs has no speed), a bond's slaves, the default route's
interfaces, the RDMA devices sitting on an interface (sysfs ``gid_attrs/ndevs`` or ``rdma link``), and
an iperf3 client's JSON report. Pure functions on captured text and a sysfs root, so that every case
(Ethernet, bonded, RoCE present and absent, a veth without a speed) is tested on captured outputs.
Nothing here changes the node.
"""
from __future__ import annotations

import ipaddress
import json
import os
import re

# ARPHRD_LOOPBACK in /sys/class/net/IF/type.
ARPHRD_LOOPBACK = 772


def parse_route_get(text):
    """``ip -j route get ADDR`` -> {dev, src, gateway, local}. ``local`` is true for an address of this host
    (the kernel answers ``type: local`` over ``lo``)."""
    routes = json.loads(text or "[]")
    if not routes:
        raise ValueError("ip route get gave no route")
    route = routes[0]
    return {
        "dev": route.get("dev", ""),
        "src": route.get("prefsrc", ""),
        "gateway": route.get("gateway", ""),
        "local": route.get("type") == "local" or route.get("dev") == "lo",
    }


def parse_default_devs(text):
    """``ip -j route show default`` -> the interfaces that carry a default route, in the kernel's order."""
    devs = []
    for route in json.loads(text or "[]"):
        dev = route.get("dev")
        if dev and dev not in devs:
            devs.append(dev)
        for hop in route.get("nexthops", []) or []:
            if hop.get("dev") and hop["dev"] not in devs:
                devs.append(hop["dev"])
    return devs


def parse_addr_owner(text, address):
    """``ip -j addr show`` -> the interface holding ``address`` (None when no interface holds it)."""
    want = ipaddress.ip_address(address)
    for link in json.loads(text or "[]"):
        for info in link.get("addr_info", []) or []:
            try:
                if ipaddress.ip_address(info.get("local", "")) == want:
                    return link.get("ifname")
            except ValueError:
                continue
    return None


def parse_addresses(text):
    """``ip -j addr show`` -> {ifname: [global addresses, IPv4 first]}."""
    found = {}
    for link in json.loads(text or "[]"):
        infos = [i for i in link.get("addr_info", []) or [] if i.get("scope", "global") == "global" and i.get("local")]
        infos.sort(key=lambda i: i.get("family") != "inet")
        found[link.get("ifname")] = [i["local"] for i in infos]
    return found


def parse_ethtool_speed(text):
    """``ethtool IF`` -> the speed in Mbit/s, None when it says ``Unknown!`` or nothing."""
    match = re.search(r"^\s*Speed:\s*(\d+)\s*Mb/s", text or "", re.MULTILINE)
    return int(match.group(1)) if match else None


def parse_rdma_link(text):
    """``rdma link`` (iproute2) -> [{device, port, state, netdev}], one per port."""
    links = []
    for line in (text or "").splitlines():
        match = re.match(r"^link\s+(\S+)/(\d+)\s+(.*)$", line.strip())
        if not match:
            continue
        words = match.group(3).split()
        fields = dict(zip(words[::2], words[1::2]))
        links.append({"device": match.group(1), "port": int(match.group(2)),
                      "state": fields.get("state", ""), "netdev": fields.get("netdev", "")})
    return links


def _read(path):
    """A sysfs attribute's text, or None when it cannot be read (absent, or EINVAL on a link with no speed)."""
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return None


def _int_or_none(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def read_speed(sysfs_net, ifname):
    """Link speed in Mbit/s from sysfs; None when unknown (-1, EINVAL on a veth, a link down, loopback)."""
    speed = _int_or_none(_read(os.path.join(sysfs_net, ifname, "speed")))
    return speed if speed is not None and speed > 0 else None


def interface_facts(sysfs_net, ifname, ethtool=None):
    """One interface as sysfs describes it: {name, kind, speed_mbps, mtu, operstate, slaves}. ``kind`` is
    ``loopback``, ``bond`` (its speed is the sum of its slaves' that are up), ``physical`` (it has a device) or
    ``virtual`` (a veth, bridge, tunnel: no device, often no speed). ``ethtool``: a function giving ethtool's
    output for an interface, asked when sysfs has no speed for a physical port."""
    base = os.path.join(sysfs_net, ifname)
    slaves_text = _read(os.path.join(base, "bonding", "slaves"))
    if _int_or_none(_read(os.path.join(base, "type"))) == ARPHRD_LOOPBACK or ifname == "lo":
        kind = "loopback"
    elif slaves_text is not None:
        kind = "bond"
    elif os.path.exists(os.path.join(base, "device")):
        kind = "physical"
    else:
        kind = "virtual"
    facts = {
        "name": ifname,
        "kind": kind,
        "speed_mbps": read_speed(sysfs_net, ifname),
        "speed_source": "sysfs",
        "mtu": _int_or_none(_read(os.path.join(base, "mtu"))),
        "operstate": _read(os.path.join(base, "operstate")) or "unknown",
        "slaves": [],
    }
    if kind == "bond":
        for slave in (slaves_text or "").split():
            facts["slaves"].append({
                "name": slave,
                "speed_mbps": read_speed(sysfs_net, slave),
                "mtu": _int_or_none(_read(os.path.join(sysfs_net, slave, "mtu"))),
                "operstate": _read(os.path.join(sysfs_net, slave, "operstate")) or "unknown",
            })
        if facts["speed_mbps"] is None:
            up = [s["speed_mbps"] for s in facts["slaves"] if s["operstate"] == "up" and s["speed_mbps"]]
            facts["speed_mbps"] = sum(up) if up else None
            facts["speed_source"] = "slaves"
    if facts["speed_mbps"] is None and kind == "physical" and ethtool is not None:
        facts["speed_mbps"] = parse_ethtool_speed(ethtool(ifname))
        facts["speed_source"] = "ethtool"
    if facts["speed_mbps"] is None:
        facts["speed_source"] = "none"
    return facts


def list_interfaces(sysfs_net, ethtool=None, addresses=None):
    """Every interface that is up, except loopback, with its addresses: the candidates for "a faster one
    exists"."""
    found = []
    try:
        names = sorted(os.listdir(sysfs_net))
    except OSError:
        return found
    for name in names:
        facts = interface_facts(sysfs_net, name, ethtool)
        if facts["kind"] != "loopback" and facts["operstate"] == "up":
            facts["addresses"] = (addresses or {}).get(name, [])
            found.append(facts)
    return found


def rdma_on(sysfs_ib, ifname, address=None):
    """RDMA devices whose port sits on ``ifname`` (``ports/P/gid_attrs/ndevs/N``): [{device, port, gid_index,
    gid, type}]. With ``address``, the RoCE v2 GID that carries it (IPv4-mapped for an IPv4 address) comes
    first; the transport picks the same one when GGML_RDMA_GID is unset."""
    found = []
    try:
        devices = sorted(os.listdir(sysfs_ib))
    except OSError:
        return found
    target = None
    if address:
        try:
            ip = ipaddress.ip_address(address)
            target = (ipaddress.IPv6Address("::ffff:" + str(ip)) if ip.version == 4 else ip)
        except ValueError:
            target = None
    for device in devices:
        ports_dir = os.path.join(sysfs_ib, device, "ports")
        try:
            ports = sorted(os.listdir(ports_dir), key=lambda p: _int_or_none(p) or 0)
        except OSError:
            continue
        for port in ports:
            ndevs = os.path.join(ports_dir, port, "gid_attrs", "ndevs")
            try:
                indexes = sorted(os.listdir(ndevs), key=lambda i: _int_or_none(i) or 0)
            except OSError:
                continue
            entries = []
            for index in indexes:
                if _read(os.path.join(ndevs, index)) != ifname:
                    continue
                gid = _read(os.path.join(ports_dir, port, "gids", index)) or ""
                kind = _read(os.path.join(ports_dir, port, "gid_attrs", "types", index)) or ""
                entry = {"device": device, "port": int(port), "gid_index": int(index), "gid": gid, "type": kind}
                try:
                    entry["matches_address"] = target is not None and ipaddress.ip_address(gid) == target
                except ValueError:
                    entry["matches_address"] = False
                entries.append(entry)
            # The GID the transport would choose: the address's RoCE v2 GID, else any RoCE v2, else the first.
            entries.sort(key=lambda e: (not e["matches_address"], "v2" not in e["type"].lower(), e["gid_index"]))
            found.extend(entries[:1])
    return found


def parse_iperf3(text):
    """An iperf3 client's ``-J`` report -> {gbit_s, mean_rtt_ms, retransmits, seconds}, the rate as the receiver
    counted it. Raises ValueError with iperf3's own error when the run failed."""
    report = json.loads(text or "{}")
    if report.get("error"):
        raise ValueError(report["error"])
    end = report.get("end") or {}
    received = end.get("sum_received") or {}
    sent = end.get("sum_sent") or {}
    if not received and not sent:
        raise ValueError("iperf3 gave no result")
    bits = received.get("bits_per_second") or sent.get("bits_per_second") or 0
    rtts = [s.get("sender", {}).get("mean_rtt") for s in end.get("streams", []) or []]
    rtts = [r for r in rtts if r]
    return {
        "gbit_s": round(bits / 1e9, 3),
        "mean_rtt_ms": round(sum(rtts) / len(rtts) / 1000.0, 3) if rtts else None,
        "retransmits": sent.get("retransmits"),
        "seconds": round(received.get("seconds") or sent.get("seconds") or 0, 2),
    }


def gather(run, peer=None, local_address=None, sysfs_net="/sys/class/net", sysfs_ib="/sys/class/infiniband"):
    """What this node knows of its end of a link. ``run(argv)`` returns (rc, stdout, stderr).
    ``peer``: the address to route to (the head asks for the worker's); ``local_address``: an address of this
    node (the worker's bind address). Returns {route, interface, default_devs, interfaces, rdma, rdma_source}."""
    def ethtool(ifname):
        rc, out, _ = run(["ethtool", ifname])
        return out if rc == 0 else ""

    result = {"route": None, "interface": None}
    rc, addr_out, err = run(["ip", "-j", "addr", "show"])
    if rc != 0:
        raise ValueError("ip addr show failed: %s" % (err or addr_out).strip())
    addresses = parse_addresses(addr_out)
    if peer:
        rc, out, err = run(["ip", "-j", "route", "get", peer])
        if rc != 0:
            raise ValueError("ip route get %s failed: %s" % (peer, (err or out).strip()))
        result["route"] = parse_route_get(out)
        ifname = result["route"]["dev"]
    else:
        ifname = parse_addr_owner(addr_out, local_address)
        if ifname is None:
            raise ValueError("no interface of this host holds %s" % local_address)
    result["interface"] = interface_facts(sysfs_net, ifname, ethtool)
    result["interface"]["addresses"] = addresses.get(ifname, [])
    rc, out, _ = run(["ip", "-j", "route", "show", "default"])
    result["default_devs"] = parse_default_devs(out) if rc == 0 else []
    result["interfaces"] = list_interfaces(sysfs_net, ethtool, addresses)
    address = local_address or (result["route"] or {}).get("src")
    result["rdma"] = rdma_on(sysfs_ib, ifname, address)
    result["rdma_source"] = "sysfs"
    if not result["rdma"] and not os.path.isdir(sysfs_ib):
        rc, out, _ = run(["rdma", "link"])
        if rc == 0:
            result["rdma"] = [dict(link, gid_index=None, gid="", type="", matches_address=False)
                              for link in parse_rdma_link(out) if link["netdev"] == ifname]
            result["rdma_source"] = "rdma link"
    return result
