#!/usr/bin/env python3
"""gpu-check stand-in for procps' pgrep: pgrep [-a] [-f] PATTERN."""
import os
import re
import sys

args = [a for a in sys.argv[1:] if not a.startswith("-")]
show = any(a.startswith("-") and "a" in a for a in sys.argv[1:])
pattern = re.compile(args[0])
me = os.getpid()
found = False
for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
    if pid == me:
        continue
    try:
        cmd = open("/proc/%d/cmdline" % pid, "rb").read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        continue
    if cmd and pattern.search(cmd):
        found = True
        print("%d %s" % (pid, cmd) if show else pid)
sys.exit(0 if found else 1)
