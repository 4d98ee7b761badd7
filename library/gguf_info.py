#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Report the facts of a GGUF model file that the minimax-spark roles need."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: gguf_info
short_description: Read the facts of a GGUF model (architecture, layers, context, shards, size)
description:
  - Reads the metadata of a GGUF file with the C(gguf) library and returns the facts the roles
    need to place and serve the model. Changes nothing.
  - For a split model, O(path) must be shard 1 under its original name
    (C(<prefix>-00001-of-0000N.gguf)); llama.cpp must be given that file and finds the other shards
    by name. The module checks that every shard is present and sums their sizes.
version_added: "1.0.0"
author: minimax-spark
options:
  path:
    description:
      - The GGUF file; shard 1 of a split model.
    type: path
    required: true
    aliases: [src]
notes:
  - Needs the C(gguf) Python package (and numpy) on the target.
  - Supports check mode (it never changes anything).
"""

EXAMPLES = r"""
- name: Read the model's facts
  gguf_info:
    path: /var/lib/minimax-spark/models/UD-IQ4_XS/MiniMax-M3-UD-IQ4_XS-00001-of-00006.gguf
  register: model_info

- name: Show the layer count
  ansible.builtin.debug:
    msg: "{{ model_info.architecture }} with {{ model_info.block_count }} layers, {{ model_info.file_size }} bytes"
"""

RETURN = r"""
path:
  description: The file that was read (shard 1).
  returned: always
  type: str
architecture:
  description: C(general.architecture).
  returned: success
  type: str
  sample: minimax-m3
block_count:
  description: Number of transformer layers (C(<arch>.block_count)).
  returned: success
  type: int
  sample: 60
context_length:
  description: Training context length (C(<arch>.context_length)); null when the file does not say.
  returned: success
  type: int
expert_count:
  description: Number of experts (C(<arch>.expert_count)); null for a dense model.
  returned: success
  type: int
  sample: 128
split_count:
  description: Number of shards (C(split.count)); 1 for a single-file model.
  returned: success
  type: int
  sample: 6
split_no:
  description: C(split.no) as stored, 0-based; always 0 here, since only shard 1 is accepted.
  returned: success
  type: int
  sample: 0
shards:
  description: Paths of all shards, shard 1 first (just O(path) for a single-file model).
  returned: success
  type: list
  elements: str
tensor_count:
  description: Tensors of the whole model (C(split.tensors.count) for a split model).
  returned: success
  type: int
file_size:
  description: Size in bytes of the model, all shards together.
  returned: success
  type: int
has_chat_template:
  description: Whether the file carries C(tokenizer.chat_template).
  returned: success
  type: bool
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_native

from ansible.module_utils.minimax_spark_gguf import GGUFError, open_gguf, split_shard_paths


def gguf_facts(path):
    """The facts of the GGUF at ``path`` (shard 1 of a split model) as a dict.

    Raises :class:`GGUFError` with a message that says what to fix.
    """
    meta = open_gguf(path)
    split_count = meta.split_count
    split_no = meta.split_no
    if split_no != 0:
        raise GGUFError(
            "%s is shard %d of %d of a split model; give shard 1 (named '<prefix>-00001-of-%05d.gguf'), "
            "which llama.cpp must be given under its original name" % (path, split_no + 1, split_count, split_count)
        )
    architecture = meta.architecture
    block_count = meta.arch_get("block_count", None)
    if block_count is None:
        raise GGUFError(
            "GGUF file %s has no %s.block_count: not a complete model file" % (path, architecture)
        )
    shards = split_shard_paths(path, split_count)
    missing = [shard for shard in shards if not os.path.isfile(shard)]
    if missing:
        raise GGUFError(
            "split model %s has %d shards but %d are missing: %s; finish the download"
            % (path, split_count, len(missing), ", ".join(missing))
        )
    return dict(
        architecture=architecture,
        block_count=int(block_count),
        context_length=meta.context_length,
        expert_count=meta.expert_count,
        split_count=split_count,
        split_no=split_no,
        shards=shards,
        tensor_count=meta.tensor_count,
        file_size=sum(os.path.getsize(shard) for shard in shards),
        has_chat_template=meta.has_chat_template,
    )


def run_module():
    module = AnsibleModule(
        argument_spec=dict(path=dict(type="path", required=True, aliases=["src"])),
        supports_check_mode=True,
    )
    path = module.params["path"]
    try:
        facts = gguf_facts(path)
    except GGUFError as exc:
        module.fail_json(msg=to_native(exc), path=path)
    module.exit_json(changed=False, path=path, **facts)


def main():
    run_module()


if __name__ == "__main__":
    main()
