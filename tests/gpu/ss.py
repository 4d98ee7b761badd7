#!/usr/bin/env python3
"""gpu-check stand-in for iproute2's ss: -H[l]tn ['sport = :PORT'] | ['state established']."""
import socket
import sys

args = sys.argv[1:]
flags = "".join(a[1:] for a in args if a.startswith("-"))
rest = " ".join(a for a in args if not a.startswith("-"))
listening = "l" in flags
want_port = None
if "sport" in rest:
    want_port = int(rest.split(":")[-1])
names = {"01": "ESTAB", "0A": "LISTEN"}
def addr(text, v6):
    host, port = text.split(":")
    raw = bytes.fromhex(host)
    if v6:
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
        ip = "[%s]" % socket.inet_ntop(socket.AF_INET6, raw)
    else:
        ip = socket.inet_ntop(socket.AF_INET, raw[::-1])
    return ip, int(port, 16)
for path, v6 in (("/proc/net/tcp", False), ("/proc/net/tcp6", True)):
    try:
        lines = open(path).read().splitlines()[1:]
    except OSError:
        continue
    for line in lines:
        f = line.split()
        state = f[3]
        if listening and state != "0A":
            continue
        if not listening and state != "01":
            continue
        lip, lport = addr(f[1], v6)
        rip, rport = addr(f[2], v6)
        if want_port is not None and lport != want_port:
            continue
        tx, rx = (int(x, 16) for x in f[4].split(":"))
        peer = "%s:*" % rip if listening else "%s:%d" % (rip, rport)
        print("%s %d %d %s:%d %s" % (names[state], rx, tx, lip, lport, peer))
