#!/usr/bin/python
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
  sizes:
    description:
      - Also read every shard's tensor table and return RV(layer_bytes), RV(non_layer_bytes) and
        RV(kv_bytes_per_token) (what the placement plan needs). Reads headers only, never the weights.
    type: bool
    default: false
  cache_type_k:
    description: KV cache type of the keys (C(--cache-type-k)) for RV(kv_bytes_per_token).
    type: str
    default: f16
    choices: [bf16, f16, f32, iq4_nl, q4_0, q4_1, q5_0, q5_1, q8_0]
  cache_type_v:
    description: KV cache type of the values (C(--cache-type-v)) for RV(kv_bytes_per_token).
    type: str
    default: f16
    choices: [bf16, f16, f32, iq4_nl, q4_0, q4_1, q5_0, q5_1, q8_0]
notes:
  - Needs the C(gguf) Python package (and numpy) on the target.
  - Supports check mode (it never changes anything).
extends_documentation_fragment:
  - minimax_attributes
  - minimax_attributes.read_only
"""

EXAMPLES = r"""
- name: Read the model's facts
  gguf_info:
    path: /var/lib/minimax-spark/models/UD-IQ4_XS/MiniMax-M3-UD-IQ4_XS-00001-of-00006.gguf
  register: model_info

- name: Read the layer sizes and the KV bytes per token in q8_0
  gguf_info:
    path: /var/lib/minimax-spark/models/UD-IQ4_XS/MiniMax-M3-UD-IQ4_XS-00001-of-00006.gguf
    sizes: true
    cache_type_k: q8_0
    cache_type_v: q8_0
  register: model_sizes

- name: Show the layer count
  ansible.builtin.debug:
    msg: "{{ model_info.architecture }} with {{ model_info.block_count }} layers, {{ model_info.file_size }} bytes"
"""

RETURN = r"""
path:
  description: The file that was read (shard 1).
  returned: always
  type: str
is_file:
  description: >-
    Whether O(path) is a regular file: a failure with C(false) means the file is not there, with C(true) that it
    does not read as a complete model.
  returned: always
  type: bool
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
n_vocab:
  description: Vocabulary size (rows of C(token_embd.weight)); with O(sizes).
  returned: success and sizes
  type: int
  sample: 200064
n_embd:
  description: C(<arch>.embedding_length); with O(sizes) (the plan's compute buffer estimate).
  returned: success and sizes
  type: int
n_ff_exp:
  description: C(<arch>.expert_feed_forward_length); null for a dense model.
  returned: success and sizes
  type: int
n_expert_used:
  description: C(<arch>.expert_used_count); null for a dense model.
  returned: success and sizes
  type: int
leading_dense_block_count:
  description: C(<arch>.leading_dense_block_count) (layers without MoE and MSA); 0 when absent.
  returned: success and sizes
  type: int
layer_bytes:
  description: Bytes of each layer (C(blk.N.*) tensors of all shards), layer 0 first.
  returned: success and sizes
  type: list
  elements: int
non_layer_bytes:
  description: Bytes of each tensor outside the layers (C(token_embd.weight), C(output.weight), C(output_norm.weight)).
  returned: success and sizes
  type: dict
  sample: {"token_embd.weight": 1037332992, "output.weight": 1037332992, "output_norm.weight": 24576}
tensor_bytes:
  description: Bytes of all tensors together (the file size less headers and padding).
  returned: success and sizes
  type: int
kv_bytes_per_token:
  description:
    - KV cache bytes per token (one cell) in the O(cache_type_k)/O(cache_type_v) types. C(main) is the
      attention cache, C(indexer) MiniMax-M3's sparse-attention indexer cache (layers after the leading
      dense ones), C(per_layer) the sum per layer (a layer's cache lives where the layer lives).
  returned: success and sizes
  type: dict
  sample: {"cache_type_k": "q8_0", "cache_type_v": "q8_0", "main": 65280, "indexer": 15504, "total": 80784}
target_layers:
  description: >-
    The target layers an EAGLE-3 draft reads (C(<arch>.target_layers), three for C(draft-eagle3)); empty for
    other models.
  returned: success
  type: list
  elements: int
  sample: [2, 30, 57]
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_native
from ansible.module_utils.minimax_spark_gguf import (
    KV_CACHE_TYPES,
    GGUFError,
    kv_bytes_per_token,
    open_gguf,
    split_shard_paths,
    tensor_sizes,
)


def gguf_sizes(meta, shards, cache_type_k="f16", cache_type_v="f16"):
    """Layer sizes, non-layer tensors and KV bytes per token of the model whose shard 1 is ``meta``."""
    block_count = int(meta.block_count)
    layers, non_layer, total = tensor_sizes([meta] + list(shards[1:]))
    missing = [il for il in range(block_count) if il not in layers]
    extra = sorted(il for il in layers if il >= block_count)
    if missing or extra:
        raise GGUFError(
            "%s: the tensors do not match block_count=%d (no tensors for layers %s%s): an incomplete or "
            "mislabelled model"
            % (meta.path, block_count, missing[:5], "; unexpected layers %s" % extra[:5] if extra else "")
        )
    n_vocab = None
    for tensor in meta.reader.tensors:
        if tensor.name == "token_embd.weight":
            n_vocab = int(tensor.shape[-1]) if len(tensor.shape) > 1 else None
    kv = kv_bytes_per_token(meta, cache_type_k, cache_type_v)
    return dict(
        n_vocab=n_vocab,
        n_embd=meta.arch_get("embedding_length", None),
        n_ff_exp=meta.arch_get("expert_feed_forward_length", None),
        n_expert_used=meta.arch_get("expert_used_count", None),
        leading_dense_block_count=meta.arch_get("leading_dense_block_count", 0),
        layer_bytes=[layers[il] for il in range(block_count)],
        non_layer_bytes=non_layer,
        tensor_bytes=total,
        kv_bytes_per_token=kv,
    )


def gguf_facts(path, sizes=False, cache_type_k="f16", cache_type_v="f16"):
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
    facts = dict(
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
        target_layers=[int(i) for i in (meta.arch_get("target_layers", None) or [])],
    )
    if sizes:
        facts.update(gguf_sizes(meta, shards, cache_type_k, cache_type_v))
    return facts


def run_module():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True, aliases=["src"]),
            sizes=dict(type="bool", default=False),
            cache_type_k=dict(type="str", default="f16", choices=sorted(KV_CACHE_TYPES)),
            cache_type_v=dict(type="str", default="f16", choices=sorted(KV_CACHE_TYPES)),
        ),
        supports_check_mode=True,
    )
    path = module.params["path"]
    try:
        facts = gguf_facts(
            path, module.params["sizes"], module.params["cache_type_k"], module.params["cache_type_v"]
        )
    except GGUFError as exc:
        module.fail_json(msg=to_native(exc), path=path, is_file=os.path.isfile(path))
    module.exit_json(changed=False, path=path, is_file=True, **facts)


def main():
    run_module()


if __name__ == "__main__":
    main()
