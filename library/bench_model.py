#!/usr/bin/python
"""What a GGUF reads per decoded token, and its tokenizer fields, for the bench role."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: bench_model
short_description: Bytes read per decoded token of a GGUF, and its vocabulary for an offline tokenizer
description:
  - Reads the tensor sizes of every shard of a GGUF (C(gguf) library) and returns the bytes one decoded
    token reads; expert tensors (C(*_exps)) count their share C(expert_used_count / expert_count), the token
    embedding one row.
  - With O(vocab_dest), writes the C(tokenizer.ggml.*) fields (byte-level BPE only) as JSON, from which the
    controller builds an HF C(tokenizer.json) for llama-benchy (no Hub needed).
version_added: "1.0.0"
author: minimax-spark
options:
  path:
    description: The GGUF file; shard 1 of a split model.
    type: path
    required: true
  vocab_dest:
    description: Where to write the vocabulary JSON; empty writes nothing.
    type: path
    default: ""
notes:
  - Needs the C(gguf) Python package on the target. Check mode reads but writes nothing.
extends_documentation_fragment:
  - minimax_attributes
attributes:
  check_mode:
    support: full
    details: Reads the GGUF and reports; with O(vocab_dest) it writes nothing in check mode.
"""

EXAMPLES = r"""
- name: Read the model's cost per token
  bench_model:
    path: /var/lib/minimax-spark/models/MiniMax-M3-UD-IQ4_XS-00001-of-00003.gguf
    vocab_dest: /tmp/minimax-bench-vocab.json
  register: model
"""

RETURN = r"""
active_bytes_per_token: {description: Bytes one decoded token reads., type: int, returned: success}
total_bytes: {description: Bytes of all tensors., type: int, returned: success}
expert_count: {description: Routed experts per layer., type: int, returned: success}
expert_used_count: {description: Experts used per token., type: int, returned: success}
context_length: {description: The model's trained context., type: int, returned: success}
vocab_dest: {description: The vocabulary file written (empty when none)., type: str, returned: success}
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_native
from ansible.module_utils.minimax_spark_bench import gguf_vocab, model_stats
from ansible.module_utils.minimax_spark_files import write_atomic
from ansible.module_utils.minimax_spark_gguf import GGUFError


def run_module():
    module = AnsibleModule(
        argument_spec=dict(path=dict(type="path", required=True), vocab_dest=dict(type="path", default="")),
        supports_check_mode=True,
    )
    path, dest = module.params["path"], module.params["vocab_dest"]
    try:
        stats = model_stats(path)
        changed = False
        if dest:
            vocab = gguf_vocab(path)
            text = json.dumps(vocab, sort_keys=True)
            old = open(dest, encoding="utf-8").read() if os.path.isfile(dest) else None
            changed = old != text
            if changed and not module.check_mode:
                write_atomic(dest, text, move=module.atomic_move)
    except GGUFError as exc:
        module.fail_json(msg=to_native(exc), path=path)
    module.exit_json(changed=changed, path=path, vocab_dest=dest, **stats)


def main():
    run_module()


if __name__ == "__main__":
    main()
