#!/usr/bin/env python3
"""gpu-check stand-in for iproute2's ip, read from /proc and sysfs: only what the link role asks for.

    ip -j addr show                 interfaces (/sys/class/net) with their IPv4 address (SIOCGIFADDR) and
                                    IPv6 addresses (/proc/net/if_inet6)
    ip -j route get ADDR            an address of this host (or loopback): type local over lo; otherwise the
                                    longest matching prefix of /proc/net/route (IPv4) or /proc/net/ipv6_route
    ip -j route show default        the IPv4 default routes of /proc/net/route

Anything else is refused with exit status 2 and says so: the stand-in never guesses.
"""
import fcntl
import ipaddress
import json
import os
import socket
import struct
import sys

SYS_NET = os.environ.get("GPU_CHECK_SYS_NET", "/sys/class/net")
PROC_NET = os.environ.get("GPU_CHECK_PROC_NET", "/proc/net")
SIOCGIFADDR, SIOCGIFNETMASK = 0x8915, 0x891B
SCOPES = {0x00: "global", 0x10: "host", 0x20: "link", 0x40: "site"}


def _read(path):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return None


def _lines(name):
    text = _read(os.path.join(PROC_NET, name))
    return text.splitlines() if text else []


def _ipv4(ifname):
    """(address, prefix length) of an interface's primary IPv4 address, or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = struct.pack("256s", ifname.encode()[:15])
            addr = socket.inet_ntoa(fcntl.ioctl(sock.fileno(), SIOCGIFADDR, packed)[20:24])
            mask = socket.inet_ntoa(fcntl.ioctl(sock.fileno(), SIOCGIFNETMASK, packed)[20:24])
        except OSError:
            return None
    return addr, ipaddress.ip_network("0.0.0.0/%s" % mask).prefixlen


def _ipv6():
    """{ifname: [(address, prefix length, scope)]} from /proc/net/if_inet6."""
    found = {}
    for line in _lines("if_inet6"):
        parts = line.split()
        if len(parts) < 6:
            continue
        addr = str(ipaddress.IPv6Address(bytes.fromhex(parts[0])))
        found.setdefault(parts[5], []).append((addr, int(parts[2], 16), SCOPES.get(int(parts[3], 16), "global")))
    return found


def links():
    v6 = _ipv6()
    result = []
    names = sorted(os.listdir(SYS_NET)) if os.path.isdir(SYS_NET) else sorted(v6)
    for ifname in names:
        base = os.path.join(SYS_NET, ifname)
        info = []
        v4 = _ipv4(ifname)
        if v4:
            info.append({"family": "inet", "local": v4[0], "prefixlen": v4[1],
                         "scope": "host" if ipaddress.ip_address(v4[0]).is_loopback else "global",
                         "label": ifname})
        for addr, plen, scope in v6.get(ifname, []):
            info.append({"family": "inet6", "local": addr, "prefixlen": plen, "scope": scope})
        result.append({"ifindex": int(_read(os.path.join(base, "ifindex")) or 0), "ifname": ifname,
                       "mtu": int(_read(os.path.join(base, "mtu")) or 0),
                       "operstate": (_read(os.path.join(base, "operstate")) or "unknown").upper(),
                       "address": _read(os.path.join(base, "address")) or "", "addr_info": info})
    return sorted(result, key=lambda link: link["ifindex"])


def _v4_routes():
    routes = []
    for line in _lines("route")[1:]:
        f = line.split()
        if len(f) < 8 or not int(f[3], 16) & 0x1:  # RTF_UP
            continue
        dst, gw, mask = (socket.inet_ntoa(struct.pack("<I", int(x, 16))) for x in (f[1], f[2], f[7]))
        routes.append({"dev": f[0], "net": ipaddress.ip_network("%s/%s" % (dst, mask), strict=False),
                       "gateway": gw if int(f[3], 16) & 0x2 else "", "metric": int(f[6])})
    return routes


def _v6_routes():
    routes = []
    for line in _lines("ipv6_route"):
        f = line.split()
        if len(f) < 10 or f[9] == "lo" or not int(f[8], 16) & 0x1:
            continue
        net = ipaddress.ip_network("%s/%d" % (ipaddress.IPv6Address(bytes.fromhex(f[0])), int(f[1], 16)))
        gw = str(ipaddress.IPv6Address(bytes.fromhex(f[4])))
        routes.append({"dev": f[9], "net": net, "gateway": "" if gw == "::" else gw, "metric": int(f[5], 16)})
    return routes


def route_get(dest):
    target = ipaddress.ip_address(dest)
    all_links = links()
    local = {ipaddress.ip_address(i["local"]) for link in all_links for i in link["addr_info"]}
    if target.is_loopback or target in local:
        return [{"type": "local", "dst": dest, "dev": "lo", "prefsrc": dest, "flags": []}]
    routes = [r for r in (_v4_routes() if target.version == 4 else _v6_routes()) if target in r["net"]]
    if not routes:
        return None
    best = sorted(routes, key=lambda r: (-r["net"].prefixlen, r["metric"]))[0]
    family = "inet" if target.version == 4 else "inet6"
    src = next((i["local"] for link in all_links if link["ifname"] == best["dev"] for i in link["addr_info"]
                if i["family"] == family and i["scope"] == "global"), "")
    route = {"dst": dest, "dev": best["dev"], "prefsrc": src, "flags": []}
    if best["gateway"]:
        route["gateway"] = best["gateway"]
    return [route]


def main(argv):
    words = [a for a in argv if a != "-j"]
    if "-j" not in argv:
        return _refuse(argv)
    if words in (["addr"], ["addr", "show"], ["address"], ["address", "show"]):
        print(json.dumps(links()))
        return 0
    if len(words) == 3 and words[:2] == ["route", "get"]:
        try:
            found = route_get(words[2])
        except ValueError:
            sys.stderr.write('Error: any valid prefix is expected rather than "%s".\n' % words[2])
            return 1
        if found is None:
            sys.stderr.write("RTNETLINK answers: Network is unreachable\n")
            return 2
        print(json.dumps(found))
        return 0
    if words == ["route", "show", "default"]:
        print(json.dumps([{"dst": "default", "gateway": r["gateway"], "dev": r["dev"], "flags": []}
                          for r in sorted(_v4_routes(), key=lambda r: r["metric"]) if r["net"].prefixlen == 0]))
        return 0
    return _refuse(argv)


def _refuse(argv):
    sys.stderr.write("ip (gpu-check stand-in, tests/gpu/ip.py): 'ip %s' is not supported; it answers "
                     "'-j addr show', '-j route get ADDR', '-j route show default'\n" % " ".join(argv))
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
