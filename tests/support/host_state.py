"""What a deployment on this machine looks like from outside: its serving processes (PID, argv, start time), its
local facts and its installs. tools/test saves it before the tests and tests/host/test_host_untouched.py compares it
after: a deployment left serving here is not stopped, restarted, replaced or re-recorded by the tests, and none
appears.

    python tests/support/host_state.py save FILE
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

#: The executables of a deployment's serving processes (llama.cpp's and the project's supervisor).
SERVING = ("llama-server", "ggml-rpc-server", "rpc-server", "minimax-supervise", "iperf3")
FACTS = Path("/etc/ansible/facts.d")
INSTALLS = Path("/opt/minimax-spark")


def _own_pid_namespace(proc: Path) -> bool:
    try:
        return os.readlink(proc / "ns" / "pid") == os.readlink("/proc/self/ns/pid")
    except OSError:
        return False


def processes(proc_root: Path = Path("/proc")) -> dict:
    """{pid: {"argv": [...], "start": clock ticks}} of the serving processes of this machine's PID namespace (the
    tests' nodes have their own: theirs are not this machine's deployment)."""
    found = {}
    for proc in proc_root.iterdir():
        if not proc.name.isdigit() or not _own_pid_namespace(proc):
            continue
        try:
            argv = [a.decode(errors="replace") for a in (proc / "cmdline").read_bytes().split(b"\0") if a]
            start = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[19])
        except (OSError, IndexError, ValueError):
            continue  # ended while being read
        if any(Path(a).name in SERVING for a in argv[:2]):
            found[proc.name] = {"argv": argv, "start": start}
    return found


def facts(folder: Path = FACTS) -> dict:
    """{file name: sha256} of the local facts."""
    if not folder.is_dir():
        return {}
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(folder.glob("*.fact"))}


def installs(folder: Path = INSTALLS) -> dict:
    """{path: symlink target or "dir"/"file"} two levels deep (llama.cpp/current, services/...)."""
    found = {}
    for path in sorted(folder.glob("*")) + sorted(folder.glob("*/*")):
        found[str(path)] = os.readlink(path) if path.is_symlink() else ("dir" if path.is_dir() else "file")
    return found


def snapshot(facts_folder: Path = FACTS, installs_folder: Path = INSTALLS) -> dict:
    return {"processes": processes(), "facts": facts(facts_folder), "installs": installs(installs_folder)}


def differences(before: dict, after: dict) -> list[str]:
    """What changed, one line each (empty: untouched)."""
    lines = []
    for pid, was in before["processes"].items():
        now = after["processes"].get(pid)
        if now is None:
            lines.append("process %s (%s) is gone" % (pid, " ".join(was["argv"])))
        elif now != was:
            lines.append("process %s was %s, is now %s" % (pid, " ".join(was["argv"]), " ".join(now["argv"])))
    for pid, now in after["processes"].items():
        if pid not in before["processes"]:
            lines.append("process %s (%s) started" % (pid, " ".join(now["argv"])))
    for kind in ("facts", "installs"):
        for name in sorted(set(before[kind]) | set(after[kind])):
            if before[kind].get(name) != after[kind].get(name):
                lines.append("%s %s: %s -> %s" % (kind, name, before[kind].get(name, "absent"),
                                                  after[kind].get(name, "absent")))
    return lines


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "save":
        sys.exit(__doc__)
    Path(sys.argv[2]).write_text(json.dumps(snapshot(), indent=1))
