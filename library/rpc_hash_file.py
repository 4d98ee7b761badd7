#!/usr/bin/python
"""Write the RPC weight-hash files beside a GGUF model (read by llama.cpp's patched RPC client)."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: rpc_hash_file
short_description: Write the hash files llama.cpp's RPC client reads instead of hashing the weights on every load
description:
  - For every weight over 10 MiB placed on an RPC worker, llama.cpp's RPC client sends the FNV-1a 64
    hash of its bytes, computed on one core on every load. With the project patch C(rpc-hash-sidecar)
    (build manifest C(rpc_hash_file), role build_llamacpp) it reads the hash from the files named in
    C(GGML_RPC_HASH_FILE) instead.
  - This module writes one such file beside every GGUF file of the models (C(<file>.rpc-hashes)),
    hashing their tensors in parallel with the C FNV-1a library.
  - A hash file is valid only for the exact file it was made from. It records the GGUF file's size,
    mtime, inode and ctime, and the sha256 the download verified (O(sha256)). A file is kept while all
    of them are as recorded and its checksum line matches; otherwise it is written again (atomically).
    A rewrite in place that puts the mtime back (C(cp -p), C(touch -r), C(rsync -t)) still moves the
    ctime, so the GGUF file is hashed again. llama.cpp checks the same record at every load, ignores a
    file that does not match and logs which file it used or ignored and why.
version_added: "1.0.0"
author: minimax-spark
options:
  models:
    description: GGUF models (shard 1 of a split model; the other shards beside it). Empty strings are skipped.
    type: list
    elements: path
    required: true
  hash_library:
    description:
      - The C FNV-1a library (C(libminimax_fnv1a.so), fact C(fnv1a_library) of build_llamacpp). Without
        it hashing runs in pure Python, refused above O(python_hash_max_bytes).
    type: path
  python_hash_max_bytes:
    description: Most bytes hashed in pure Python (a few MB/s) before the module refuses.
    type: int
    default: 268435456
  jobs:
    description: Tensors hashed in parallel (0 - up to 8, at most the CPU count).
    type: int
    default: 0
  sha256:
    description:
      - The sha256 the download verified, by GGUF file path (model_download's fact,
        C(ansible_local.minimax_model.sha256)). Recorded in the hash file; a hash file made for another sha256 of
        that path is written again. Files not named here record none.
    type: dict
    default: {}
notes:
  - Supports check mode (reports which files would be written, writes nothing). A rerun with unchanged
    models changes nothing.
  - Needs the C(gguf) Python package on the node.
extends_documentation_fragment:
  - minimax_attributes
attributes:
  check_mode:
    support: full
    details: Reports which hash files would be written and writes nothing.
"""

EXAMPLES = r"""
- name: Write the hash files beside the model
  rpc_hash_file:
    models:
      - /var/lib/minimax-spark/models/UD-IQ4_XS/MiniMax-M3-UD-IQ4_XS-00001-of-00006.gguf
    hash_library: "{{ ansible_local.minimax_llamacpp.fnv1a_library }}"
    sha256: "{{ ansible_local.minimax_model.sha256 | default({}) }}"
  register: hashes

- name: Give llama-server the files
  ansible.builtin.debug:
    msg: "GGML_RPC_HASH_FILE={{ hashes.env }}"
"""

RETURN = r"""
files:
  description: The hash file of every GGUF file of the models, in order.
  returned: always
  type: list
  elements: str
env:
  description: O(files) joined by C(:), the value of C(GGML_RPC_HASH_FILE).
  returned: always
  type: str
written:
  description: Files written (or, in check mode, that would be) and why (C(missing), C(stale ...), C(corrupt ...)).
  returned: always
  type: list
  elements: dict
checked:
  description:
    - Every hash file with its GGUF file (C(model_file)), C(state) (C(kept), C(written), or C(to write) in check mode)
      and C(reason) (C(current ...), C(missing), C(stale (... ctime differs)), ...).
  returned: always
  type: list
  elements: dict
tensors_hashed:
  description: Tensors hashed by this run.
  returned: always
  type: int
bytes_hashed:
  description: Bytes hashed by this run.
  returned: always
  type: int
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_native
from ansible.module_utils.minimax_spark_gguf import GGUFError
from ansible.module_utils.minimax_spark_rpchashes import HashFileError, HashFiles


def run_module():
    module = AnsibleModule(
        argument_spec=dict(
            models=dict(type="list", elements="path", required=True),
            hash_library=dict(type="path"),
            python_hash_max_bytes=dict(type="int", default=256 * 1024 * 1024),
            jobs=dict(type="int", default=0),
            sha256=dict(type="dict", default={}),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["jobs"] < 0:
        module.fail_json(msg="rpc_hash_file: jobs=%d: use 0 (automatic) or a positive number" % p["jobs"])
    try:
        engine = HashFiles(p["models"], library=p["hash_library"], jobs=p["jobs"],
                           python_max_bytes=p["python_hash_max_bytes"], sha256=p["sha256"])
        report = engine.run(write=not module.check_mode)
    except (HashFileError, GGUFError) as exc:
        module.fail_json(msg="rpc_hash_file: %s" % to_native(exc))
    except (OSError, ValueError) as exc:
        module.fail_json(msg="rpc_hash_file: writing the hash files of %s failed: %s"
                         % (", ".join(p["models"]), to_native(exc)))
    report["msg"] = "%s%d hash files, %d %s (%d tensors, %.2f GiB hashed): %s" % (
        "Check mode: " if module.check_mode else "", len(report["files"]), len(report["written"]),
        "to write" if module.check_mode else "written", report["tensors_hashed"], report["bytes_hashed"] / 2.0 ** 30,
        "; ".join("%s %s, %s" % (c["path"], c["state"], c["reason"]) for c in report["checked"]))
    module.exit_json(**report)


def main():
    run_module()


if __name__ == "__main__":
    main()
