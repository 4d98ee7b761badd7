#!/usr/bin/python
"""Check that ELF binaries are built for the node's CPU architecture."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: elf_machine
short_description: Check that ELF binaries and libraries are built for this node's CPU architecture
description:
  - Reads the ELF header (the C(e_machine) field, what C(file) prints) of every file in O(paths) and
    compares its architecture with O(architecture), normally the node's C(ansible_architecture).
  - Fails, naming each file and the architecture it is built for, when one of them is built for another
    CPU or is not an ELF file; a binary copied from an x86_64 controller onto an aarch64 DGX Spark (or
    back) would otherwise fail only when its service starts, with C(Exec format error).
  - C(arm64) and C(aarch64), C(amd64) and C(x86_64) are the same architecture.
version_added: "1.0.0"
author: minimax-spark
options:
  paths:
    description: The files to check.
    type: list
    elements: path
    required: true
  architecture:
    description: The architecture the files must be built for (C(ansible_architecture) of the node).
    type: str
    required: true
notes:
  - Reads only; never changes anything.
extends_documentation_fragment:
  - minimax_attributes
attributes:
  check_mode:
    support: full
    details: Reads the files in check mode as in a real run.
"""

EXAMPLES = r"""
- name: Check the installed binaries run on this node's CPU
  elf_machine:
    paths:
      - /opt/minimax-spark/llama.cpp/current/bin/llama-server
      - /opt/minimax-spark/llama.cpp/current/bin/libggml.so
    architecture: "{{ ansible_architecture }}"
"""

RETURN = r"""
architecture:
  description: The expected architecture under its canonical name (aarch64 for arm64).
  type: str
  returned: always
arches:
  description: "Each path and the architecture it is built for (null: not an ELF file)."
  type: dict
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.minimax_spark_elf import canonical_arch, check_machines


def run_module():
    module = AnsibleModule(
        argument_spec=dict(
            paths=dict(type="list", elements="path", required=True),
            architecture=dict(type="str", required=True),
        ),
        supports_check_mode=True,
    )
    want = canonical_arch(module.params["architecture"])
    if not want:
        module.fail_json(msg="architecture is empty: pass the node's ansible_architecture")
    arches, mismatches = check_machines(module.params["paths"], want)
    if mismatches:
        module.fail_json(
            msg="this node is %s, but %s: binaries do not cross architectures; build on a node of this "
                "architecture (build_llamacpp builds once per architecture)" % (want, "; ".join(mismatches)),
            architecture=want, arches=arches)
    module.exit_json(changed=False, architecture=want, arches=arches)


def main():
    run_module()


if __name__ == "__main__":
    main()
