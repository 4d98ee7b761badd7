"""The link between a head and a worker, as one node sees it: the interface the kernel routes an
address over (``ip -j route get``), the interface holding a local address (``ip -j addr``), its speed,
MTU and state (sysfs, ``ethtool`` where sysfs has no speed), a bond's slaves, the default route's
interfaces, the RDMA devices sitting on an interface (sysfs ``gid_attrs/ndevs`` or ``rdma link``), and
an iperf3 client's JSON report. Pure functions on captured text and a sysfs root, so that every case
(Ethernet, bonded, RoCE present and absent, a veth without a speed) is tested on captured outputs.
On a node without iproute2 (no ``ip`` command: a slim container image) the same facts come from ``/proc/net``
(``route``, ``ipv6_route``, ``if_inet6``), each interface's IPv4 address (SIOCGIFADDR) and the source address the
kernel picks for a peer (a UDP socket's connect, which sends nothing). Nothing here changes the node.
"""
from __future__ import annotations

import fcntl
import ipaddress
import json
import os
import re
import socket
import struct

# ARPHRD_LOOPBACK in /sys/class/net/IF/type.
ARPHRD_LOOPBACK = 772
# ioctl(SIOCGIFADDR): an interface's (first) IPv4 address, for a node without the ip command.
SIOCGIFADDR = 0x8915
# Said where the ip command is missing and /proc/net stood in.
NO_IP = "read from /proc/net and sysfs: no ip command on this node"


class NotHeld(ValueError):
    """No interface of this node holds the address asked for."""


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


class NoResult(ValueError):
    """An iperf3 client run that reported nothing: neither figures nor an error."""


def parse_iperf3(text):
    """An iperf3 client's ``-J`` report -> {gbit_s, mean_rtt_ms, retransmits, seconds}, the rate as the receiver
    counted it. Raises ValueError with iperf3's own error when the run failed, NoResult when it said nothing."""
    report = json.loads(text or "{}")
    if report.get("error"):
        raise ValueError(report["error"])
    end = report.get("end") or {}
    received = end.get("sum_received") or {}
    sent = end.get("sum_sent") or {}
    if not received and not sent:
        raise NoResult("iperf3 gave no result")
    bits = received.get("bits_per_second") or sent.get("bits_per_second") or 0
    rtts = [s.get("sender", {}).get("mean_rtt") for s in end.get("streams", []) or []]
    rtts = [r for r in rtts if r]
    return {
        "gbit_s": round(bits / 1e9, 3),
        "mean_rtt_ms": round(sum(rtts) / len(rtts) / 1000.0, 3) if rtts else None,
        "retransmits": sent.get("retransmits"),
        "seconds": round(received.get("seconds") or sent.get("seconds") or 0, 2),
    }


def _hex_ipv4(text):
    """/proc/net/route's little-endian hex address -> IPv4Address."""
    return ipaddress.IPv4Address(struct.pack("<I", int(text, 16)))


def parse_proc_route(text):
    """/proc/net/route -> [{dev, dst, gateway}] (IPv4 networks, the main table as the kernel lists it)."""
    routes = []
    for line in (text or "").splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8:
            continue
        try:
            dst, gateway, mask = _hex_ipv4(fields[1]), _hex_ipv4(fields[2]), _hex_ipv4(fields[7])
            network = ipaddress.ip_network("%s/%s" % (dst, mask), strict=False)
        except ValueError:
            continue
        routes.append({"dev": fields[0], "dst": network,
                       "gateway": "" if int(gateway) == 0 else str(gateway)})
    return routes


def parse_proc_ipv6_route(text):
    """/proc/net/ipv6_route -> [{dev, dst, gateway}] (the loopback and local entries left out)."""
    routes = []
    for line in (text or "").splitlines():
        fields = line.split()
        if len(fields) < 10 or fields[9] == "lo":
            continue
        try:
            dst = ipaddress.ip_network("%s/%d" % (ipaddress.IPv6Address(bytes.fromhex(fields[0])),
                                                  int(fields[1], 16)), strict=False)
            gateway = ipaddress.IPv6Address(bytes.fromhex(fields[4]))
        except ValueError:
            continue
        routes.append({"dev": fields[9], "dst": dst, "gateway": "" if int(gateway) == 0 else str(gateway)})
    return routes


def parse_if_inet6(text):
    """/proc/net/if_inet6 -> [(ifname, address, scope)]; scope as ip names it (global, link, host, site)."""
    scopes = {0x00: "global", 0x20: "link", 0x10: "host", 0x40: "site"}
    found = []
    for line in (text or "").splitlines():
        fields = line.split()
        if len(fields) < 6:
            continue
        try:
            address = str(ipaddress.IPv6Address(bytes.fromhex(fields[0])))
        except ValueError:
            continue
        found.append((fields[5], address, scopes.get(int(fields[3], 16), "global")))
    return found


def ipv4_of(ifname):
    """The (first) IPv4 address of an interface (ioctl SIOCGIFADDR), None when it has none."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        packed = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", ifname.encode()[:15]))
        return socket.inet_ntoa(packed[20:24])
    except OSError:
        return None
    finally:
        sock.close()


def source_for(peer):
    """The source address the kernel picks to reach ``peer`` (a UDP socket's connect sends nothing)."""
    family = socket.AF_INET6 if ipaddress.ip_address(peer).version == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    try:
        sock.connect((peer, 9))
        return sock.getsockname()[0]
    finally:
        sock.close()


def _read_text(path):
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return ""


class ProcReader:
    """What ``ip -j addr show``, ``ip -j route get`` and ``ip -j route show default`` would say, from /proc/net,
    sysfs and the kernel's own answers, in the same JSON shapes, so that the parsers above read either."""

    def __init__(self, sysfs_net, proc_net="/proc/net", ipv4=ipv4_of, source=source_for):
        self.sysfs_net, self.proc_net, self.ipv4, self.source = sysfs_net, proc_net, ipv4, source

    def _routes(self):
        return (parse_proc_route(_read_text(os.path.join(self.proc_net, "route")))
                + parse_proc_ipv6_route(_read_text(os.path.join(self.proc_net, "ipv6_route"))))

    def addr_json(self):
        """``ip -j addr show``'s shape: [{ifname, addr_info: [{family, local, scope}]}]."""
        try:
            names = sorted(os.listdir(self.sysfs_net))
        except OSError:
            names = []
        links = {name: [] for name in names}
        for name in names:
            address = self.ipv4(name)
            if address:
                scope = "host" if ipaddress.ip_address(address).is_loopback else "global"
                links[name].append({"family": "inet", "local": address, "scope": scope})
        for name, address, scope in parse_if_inet6(_read_text(os.path.join(self.proc_net, "if_inet6"))):
            links.setdefault(name, []).append({"family": "inet6", "local": address, "scope": scope})
        return json.dumps([{"ifname": name, "addr_info": infos} for name, infos in links.items()])

    def route_get_json(self, peer):
        """``ip -j route get PEER``'s shape: the longest matching route's device and gateway, the source the
        kernel picks; an address of this host (or loopback) is ``type: local`` over lo."""
        want = ipaddress.ip_address(peer)
        local = {ipaddress.ip_address(info["local"]) for link in json.loads(self.addr_json())
                 for info in link["addr_info"]}
        if want.is_loopback or want in local:
            return json.dumps([{"type": "local", "dst": peer, "dev": "lo", "prefsrc": peer}])
        matches = [r for r in self._routes() if r["dst"].version == want.version and want in r["dst"]]
        if not matches:
            raise ValueError("no route to %s in %s" % (peer, self.proc_net))
        best = max(matches, key=lambda r: r["dst"].prefixlen)
        route = {"dst": peer, "dev": best["dev"], "prefsrc": self.source(peer)}
        if best["gateway"]:
            route["gateway"] = best["gateway"]
        return json.dumps([route])

    def default_json(self):
        """``ip -j route show default``'s shape: the routes to 0.0.0.0/0 and ::/0."""
        return json.dumps([{"dst": "default", "dev": r["dev"], "gateway": r["gateway"]}
                           for r in self._routes() if r["dst"].prefixlen == 0])

    def run(self, argv):
        """Answer the ip commands gather() asks, (rc, stdout, stderr) like ``run``."""
        try:
            if argv[:4] == ["ip", "-j", "addr", "show"]:
                return 0, self.addr_json(), ""
            if argv[:4] == ["ip", "-j", "route", "get"]:
                return 0, self.route_get_json(argv[4]), ""
            if argv[:5] == ["ip", "-j", "route", "show", "default"]:
                return 0, self.default_json(), ""
        except (OSError, ValueError) as exc:
            return 1, "", str(exc)
        return 127, "", "%s not found" % argv[0]


def gather(run, peer=None, local_address=None, sysfs_net="/sys/class/net", sysfs_ib="/sys/class/infiniband",
           proc=None):
    """What this node knows of its end of a link. ``run(argv)`` returns (rc, stdout, stderr).
    ``peer``: the address to route to (the head asks for the worker's); ``local_address``: an address of this
    node (the worker's bind address). ``proc``: the ProcReader that answers for ``ip`` where the command is
    missing (rc 127). Returns {route, interface, default_devs, interfaces, rdma, rdma_source, source}."""
    def ethtool(ifname):
        rc, out, _ = run(["ethtool", ifname])
        return out if rc == 0 else ""

    result = {"route": None, "interface": None, "source": "ip"}
    ip = run
    rc, addr_out, err = run(["ip", "-j", "addr", "show"])
    if rc == 127:
        # No iproute2 on this node: /proc/net and sysfs answer the same questions.
        proc = proc or ProcReader(sysfs_net)
        ip = proc.run
        result["source"] = NO_IP
        rc, addr_out, err = ip(["ip", "-j", "addr", "show"])
    if rc != 0:
        raise ValueError("ip addr show failed: %s" % (err or addr_out).strip())
    addresses = parse_addresses(addr_out)
    if peer:
        rc, out, err = ip(["ip", "-j", "route", "get", peer])
        if rc != 0:
            raise ValueError("ip route get %s failed: %s" % (peer, (err or out).strip()))
        result["route"] = parse_route_get(out)
        ifname = result["route"]["dev"]
    else:
        ifname = parse_addr_owner(addr_out, local_address)
        if ifname is None:
            raise NotHeld("no interface of this host holds %s%s" % (
                local_address, "" if ip is run else " (%s: only each interface's first IPv4 address is seen; "
                "install iproute2 to see the others)" % NO_IP))
    result["interface"] = interface_facts(sysfs_net, ifname, ethtool)
    result["interface"]["addresses"] = addresses.get(ifname, [])
    rc, out, _ = ip(["ip", "-j", "route", "show", "default"])
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
