#!/usr/bin/python
"""Seed llama.cpp's RPC tensor cache from a local copy of the model."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: rpc_cache_seed
short_description: Write the RPC tensor cache of ggml-rpc-server from a local copy of the GGUF
description:
  - C(ggml-rpc-server -c) keeps every weight tensor larger than 10 MiB it receives under
    C($LLAMA_CACHE/rpc/<FNV-1a 64 of the bytes, %016x>), and the head sends only a hash for a
    tensor the worker already has. This module writes those files from the worker's own copy of
    the model, so the first load over the network sends no large tensor.
  - Entries are written atomically (temporary file, fsync, rename) and listed in a manifest
    (C(<cache_dir>/minimax-seed-manifest.json), size and hash per entry). Every run verifies the
    entries (the server serves a corrupt file silently); a bad entry is rewritten. Entries the
    manifest lists that the current model does not need (a previous model) are removed.
  - O(cache_dir) and its C(rpc) folder are made mode 0700 and owned by O(owner)/O(group); FNV is
    not collision-resistant, so nobody but the service may write there.
  - The needed disk space is computed first; seeding is refused when the disk cannot hold it.
version_added: "1.0.0"
author: minimax-spark
options:
  model:
    description: The GGUF model; shard 1 of a split model (the other shards must be beside it).
    type: path
    required: true
  cache_dir:
    description: The server's C(LLAMA_CACHE); the entries go to its C(rpc) folder.
    type: path
    required: true
  state:
    description:
      - C(seed) writes the cache. C(estimate) reads only the manifest and file sizes and reports the
        disk cost (an upper bound for tensors not hashed before); it never writes.
    type: str
    choices: [seed, estimate]
    default: seed
  include:
    description:
      - Regular expressions on tensor names (searched); only matching tensors are seeded, e.g. the
        layers placed on this worker (C(^blk\.(3[0-9]|4[0-9])\.)). Empty - every tensor over 10 MiB.
    type: list
    elements: str
    default: []
  hash_library:
    description:
      - The C FNV-1a library (C(libminimax_fnv1a.so), recorded by build_llamacpp as
        C(fnv1a_library)). Without it hashing runs in pure Python, refused above
        O(python_hash_max_bytes).
    type: path
  python_hash_max_bytes:
    description: Most bytes hashed in pure Python (a few MB/s) before the module refuses.
    type: int
    default: 268435456
  jobs:
    description: Tensors hashed and written in parallel (0 - up to 4, at most the CPU count).
    type: int
    default: 0
  verify:
    description:
      - C(full) hashes every existing entry on every run; C(size) only compares sizes (fast, for very
        large caches on trusted disks).
    type: str
    choices: [full, size]
    default: full
  reserve_gib:
    description: Disk space (GiB) left free beside the cache; seeding is refused otherwise.
    type: float
    default: 2.0
  owner:
    description: User owning the cache (the RPC service's user); default the module's user.
    type: str
  group:
    description: Group owning the cache.
    type: str
notes:
  - Supports check mode (it reads and hashes, writes nothing) and diff-free reruns (a rerun of an
    unchanged model reports every entry as reused and changes nothing).
  - Needs the C(gguf) Python package on the node.
extends_documentation_fragment:
  - minimax_attributes
attributes:
  check_mode:
    support: full
    details: Reads and hashes the tensors and reports the entries; writes nothing.
"""

EXAMPLES = r"""
- name: Seed the RPC cache from the worker's copy of the model
  rpc_cache_seed:
    model: /var/lib/minimax-spark/models/UD-IQ4_XS/MiniMax-M3-UD-IQ4_XS-00001-of-00006.gguf
    cache_dir: /var/lib/minimax-spark/rpc-cache
    hash_library: "{{ ansible_local.minimax_llamacpp.fnv1a_library }}"
    include: ['^blk\.(3[1-9]|[4-5][0-9])\.']
  register: seeded

- name: Report the disk cost first
  rpc_cache_seed:
    model: /models/MiniMax-M3-00001-of-00006.gguf
    cache_dir: /var/lib/minimax-spark/rpc-cache
    state: estimate
"""

RETURN = r"""
seeded:
  description: Entries (hash names) written because they were missing.
  returned: always
  type: list
  elements: str
reused:
  description: Entries that were present and verified.
  returned: always
  type: list
  elements: str
rewritten:
  description: Entries that were present but bad (size or hash) and were written again.
  returned: always
  type: list
  elements: str
removed:
  description: Entries of a previous model (listed in the manifest, not needed now) that were removed.
  returned: always
  type: list
  elements: str
tensors:
  description: Tensors over 10 MiB selected (several may share one entry).
  returned: always
  type: int
to_write_bytes_max:
  description: Bytes that had to be (or, for estimate, might have to be) written.
  returned: always
  type: int
disk_free_bytes:
  description: Free bytes on the cache's file system before seeding.
  returned: always
  type: int
fits:
  description: Whether the disk holds what is to be written (plus O(reserve_gib)).
  returned: always
  type: bool
entry_bytes:
  description: Bytes of the cache entries once seeded.
  returned: state=seed
  type: int
hash_library:
  description: The C library used for hashing; null when hashing ran in pure Python.
  returned: always
  type: str
msg:
  description: One line saying what was done.
  returned: always
  type: str
"""

import grp
import os
import pwd

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_native
from ansible.module_utils.minimax_spark_gguf import GGUFError
from ansible.module_utils.minimax_spark_rpccache import Seeder, SeedError


def _ids(module):
    uid = gid = -1
    owner, group = module.params["owner"], module.params["group"]
    try:
        if owner:
            uid = pwd.getpwnam(owner).pw_uid
        if group:
            gid = grp.getgrnam(group).gr_gid
    except KeyError:
        module.fail_json(msg="rpc_cache_seed: user %r or group %r does not exist on this node: create the service user "
                             "first (worker_rpc runs the server as it)" % (owner, group))
    return uid, gid


def _gib(n):
    return "%.2f GiB" % ((n or 0) / 2.0 ** 30)


def run_module():
    module = AnsibleModule(
        argument_spec=dict(
            model=dict(type="path", required=True),
            cache_dir=dict(type="path", required=True),
            state=dict(type="str", choices=["seed", "estimate"], default="seed"),
            include=dict(type="list", elements="str", default=[]),
            hash_library=dict(type="path"),
            python_hash_max_bytes=dict(type="int", default=256 * 1024 * 1024),
            jobs=dict(type="int", default=0),
            verify=dict(type="str", choices=["full", "size"], default="full"),
            reserve_gib=dict(type="float", default=2.0),
            owner=dict(type="str"),
            group=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    uid, gid = _ids(module)
    jobs = p["jobs"] or max(1, min(4, os.cpu_count() or 1))
    seeder = Seeder(
        p["model"], p["cache_dir"], include=p["include"], library=p["hash_library"], jobs=jobs, uid=uid, gid=gid,
        verify=p["verify"], reserve_bytes=int(p["reserve_gib"] * 2 ** 30), python_max_bytes=p["python_hash_max_bytes"],
    )
    estimate = p["state"] == "estimate"
    try:
        report = seeder.run(write=not (estimate or module.check_mode), hash_sources=not estimate)
    except (SeedError, GGUFError) as exc:
        module.fail_json(msg="rpc_cache_seed: %s" % to_native(exc), notes=seeder.notes)
    except (OSError, ValueError) as exc:
        module.fail_json(msg="rpc_cache_seed: seeding %s from %s failed: %s"
                             % (p["cache_dir"], p["model"], to_native(exc)),
                         notes=seeder.notes)
    report["notes"] = seeder.notes
    if estimate:
        report["changed"] = False
        report["msg"] = (
            "%d tensors over 10 MiB (%s): up to %s to write into %s, %s free, %s kept free: %s"
            % (report["tensors"], _gib(report["tensor_bytes"]), _gib(report["to_write_bytes_max"]), p["cache_dir"],
               _gib(report["disk_free_bytes"]), _gib(report["reserve_bytes"]),
               "fits" if report["fits"] else "does NOT fit"))
        module.exit_json(**report)
    report["changed"] = bool(report["seeded"] or report["rewritten"] or report["removed"]
                             or report.get("dirs_changed") or report.get("manifest_changed"))
    report["msg"] = (
        "%s%d entries (%s) for %d tensors: %d seeded, %d reused, %d rewritten, %d removed (hashing: %s)"
        % ("Check mode: " if module.check_mode else "", report["entries"], _gib(report["entry_bytes"]),
           report["tensors"], len(report["seeded"]), len(report["reused"]), len(report["rewritten"]),
           len(report["removed"]), report["hash_library"] or "pure Python"))
    module.exit_json(**report)


def main():
    run_module()


if __name__ == "__main__":
    main()
