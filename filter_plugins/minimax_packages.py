"""What a rerun need not install: the packages ``dpkg-query`` does not report installed (common, build_llamacpp).

``dpkg-query -W -f '${Package} ${Architecture} ${Status}\\n' NAME...`` prints one line per package it knows;
``minimax_dpkg_missing`` gives the wanted names that have no installed line for this node's architecture (or
``all``), so the apt task runs only for a list that is not installed yet (and apt still decides what that means).
"""
from __future__ import annotations

# ansible_architecture -> Debian architecture
DEB_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "armhf", "ppc64le": "ppc64el", "s390x": "s390x",
            "i386": "i386", "i686": "i386", "riscv64": "riscv64"}


def dpkg_missing(wanted, dpkg_lines, architecture=None):
    """The names in ``wanted`` without an ``install ok installed`` line in ``dpkg_lines`` (``Package Arch Status``)
    of this node's architecture (``ansible_architecture``, mapped to Debian's) or ``all``; any architecture when
    the mapping does not know it.

    {{ ['cmake', 'g++'] | minimax_dpkg_missing(query.stdout_lines, ansible_architecture) }}  ->  ['g++']
    """
    arch = DEB_ARCH.get(str(architecture or ""))
    installed = set()
    for line in dpkg_lines or []:
        fields = str(line).split(None, 2)
        if len(fields) < 3 or fields[2].strip() != "install ok installed":
            continue
        if arch is None or fields[1] in (arch, "all"):
            installed.add(fields[0])
    return [name for name in wanted if name not in installed]


class FilterModule:
    def filters(self):
        return {"minimax_dpkg_missing": dpkg_missing}
