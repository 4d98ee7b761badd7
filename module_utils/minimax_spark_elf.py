"""Which CPU architecture an ELF file is built for, read from its header (what `file` prints).

A DGX Spark is aarch64, the laptop driving it usually x86_64: a binary that crosses from one to the
other fails on the node with "Exec format error" (or, for a library, "wrong ELF class" / "cannot open
shared object file"). The build role reads the e_machine field of every binary it installs and
compares it with the node's ``ansible_architecture``.
"""
from __future__ import annotations

import struct

# e_machine values (the ELF gABI / <elf.h>) under the names `uname -m` and ansible_architecture use.
E_MACHINE = {
    3: "i386",
    8: "mips",
    20: "ppc",
    21: "ppc64",
    22: "s390x",
    40: "armv7l",
    62: "x86_64",
    183: "aarch64",
    243: "riscv64",
    258: "loongarch64",
}

# Other spellings of one architecture (Debian's dpkg names, BSD/macOS names, i686 and friends).
ALIASES = {
    "amd64": "x86_64",
    "x64": "x86_64",
    "arm64": "aarch64",
    "aarch64_be": "aarch64",
    "armhf": "armv7l",
    "armv7": "armv7l",
    "armv6l": "armv7l",
    "i486": "i386",
    "i586": "i386",
    "i686": "i386",
    "ppc64le": "ppc64",
    "ppc64el": "ppc64",
}


class ELFError(Exception):
    """The file is not an ELF file (or is too short to be one)."""


def canonical_arch(name):
    """One name per architecture: ``arm64`` and ``aarch64`` are the same CPU."""
    name = str(name or "").strip().lower()
    return ALIASES.get(name, name)


def elf_header(path):
    """The class (32/64), byte order and architecture of the ELF file at ``path``."""
    with open(path, "rb") as handle:
        head = handle.read(20)
    if len(head) < 20 or head[:4] != b"\x7fELF":
        raise ELFError("%s is not an ELF file" % path)
    bits = {1: 32, 2: 64}.get(head[4])
    order = {1: "little", 2: "big"}.get(head[5])
    if bits is None or order is None:
        raise ELFError("%s has an invalid ELF class or byte order (%d, %d)" % (path, head[4], head[5]))
    (machine,) = struct.unpack("<H" if order == "little" else ">H", head[18:20])
    return {"bits": bits, "byte_order": order, "e_machine": machine,
            "arch": E_MACHINE.get(machine, "e_machine %d" % machine)}


def check_machines(paths, expected):
    """Read every path; return ``(arches, mismatches)``: ``{path: arch}`` and the lines that say which
    file is built for another architecture than ``expected`` (or is no ELF file at all)."""
    want = canonical_arch(expected)
    arches, mismatches = {}, []
    for path in paths:
        try:
            arch = elf_header(path)["arch"]
        except (OSError, ELFError) as exc:
            arches[path] = None
            mismatches.append(str(exc) if isinstance(exc, ELFError) else "%s cannot be read: %s" % (path, exc.strerror))
            continue
        arches[path] = arch
        if arch != want:
            mismatches.append("%s is built for %s" % (path, arch))
    return arches, mismatches
