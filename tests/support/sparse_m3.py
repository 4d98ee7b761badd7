#!/usr/bin/env python3
"""Write metadata-only MiniMax-M3 GGUF shards at the real scale, as sparse files.

Every shard carries M3's real tensor table (60 layers: 3 dense, 57 MoE with 128 experts, a shared
expert and the MSA indexer; token_embd/output over a 200064-token vocabulary) in the quant types of
unsloth's dynamic quants, and is then extended with ``truncate`` to the size its tensor data needs:
the file reads as a complete 35-50 GB shard while taking a few kilobytes of disk. ``gguf_info``
and ``playbooks/plan.yml`` read it exactly like the real download; llama.cpp would load zeros.

The shape is the public model's (FACTS.md): n_embd 6144, 64 query heads and 4 KV heads of 128,
expert FFN 3072, dense FFN 12288; the indexer's key length (128) is an assumption. The recipes
give UD-IQ4_XS ~208 GB and UD-Q4_K_XL ~265 GB, the sizes of the Hub's files.

    python tests/support/sparse_m3.py /tmp/m3 UD-IQ4_XS     # -> /tmp/m3/UD-IQ4_XS/...-00001-of-00006.gguf
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import gguf
import numpy as np
from gguf.constants import GGML_QUANT_SIZES
from gguf.constants import GGMLQuantizationType as Q

ARCH = "minimax-m3"
HPARAMS = dict(
    n_layer=60, n_dense=3, n_embd=6144, n_head=64, n_head_kv=4, head_dim=128, n_rot=64,
    n_ff=12288, n_ff_exp=3072, n_expert=128, n_expert_used=4, n_vocab=200064, n_ctx_train=1048576,
    indexer_head_size=128, indexer_top_k=16, indexer_block_size=128, indexer_local_blocks=1,
)

#: Per quant: the type of each tensor kind, and the type the expert tensors of the first
#: ``upgrade_layers`` MoE layers take instead (how unsloth's dynamic quants keep some layers
#: wider), chosen so the total matches the Hub's file size.
RECIPES = {
    "UD-IQ4_XS": dict(
        embd=Q.Q4_K, output=Q.Q6_K, attn=Q.Q8_0, dense=Q.Q8_0, shexp=Q.Q8_0, indexer=Q.Q8_0,
        gate_up_exps=Q.IQ3_S, down_exps=Q.IQ4_XS, upgrade=Q.IQ4_XS, upgrade_layers=7, shards=6,
        target_gb=208,
    ),
    "UD-Q4_K_XL": dict(
        embd=Q.Q4_K, output=Q.Q6_K, attn=Q.Q8_0, dense=Q.Q8_0, shexp=Q.Q8_0, indexer=Q.Q8_0,
        gate_up_exps=Q.Q4_K, down_exps=Q.Q5_K, upgrade=Q.Q5_K, upgrade_layers=4, shards=6,
        target_gb=265,
    ),
    "UD-IQ3_XXS": dict(
        embd=Q.Q4_K, output=Q.Q6_K, attn=Q.Q8_0, dense=Q.Q8_0, shexp=Q.Q8_0, indexer=Q.Q8_0,
        gate_up_exps=Q.IQ2_S, down_exps=Q.IQ3_XXS, upgrade=Q.IQ3_XXS, upgrade_layers=12, shards=4,
        target_gb=159,
    ),
}


def nbytes(qtype, shape):
    """Bytes of a tensor of ``shape`` (ggml order: ne0 first) in ``qtype``."""
    block, size = GGML_QUANT_SIZES[qtype]
    n = 1
    for d in shape:
        n *= d
    assert shape[0] % block == 0, (qtype, shape)
    return n // block * size


def tensor_table(quant, hp=HPARAMS):
    """``[(name, ggml_shape, qtype)]`` of the whole model in the file order llama.cpp's converter uses."""
    r = RECIPES[quant]
    e, h, kv, d = hp["n_embd"], hp["n_head"], hp["n_head_kv"], hp["head_dim"]
    fe, ne, ix = hp["n_ff_exp"], hp["n_expert"], hp["indexer_head_size"]
    out = [("token_embd.weight", (e, hp["n_vocab"]), r["embd"])]
    for il in range(hp["n_layer"]):
        b = "blk.%d." % il
        out += [
            (b + "attn_norm.weight", (e,), Q.F32),
            (b + "attn_q.weight", (e, h * d), r["attn"]),
            (b + "attn_k.weight", (e, kv * d), r["attn"]),
            (b + "attn_v.weight", (e, kv * d), r["attn"]),
            (b + "attn_output.weight", (h * d, e), r["attn"]),
            (b + "attn_q_norm.weight", (d,), Q.F32),
            (b + "attn_k_norm.weight", (d,), Q.F32),
            (b + "ffn_norm.weight", (e,), Q.F32),
        ]
        if il < hp["n_dense"]:
            out += [
                (b + "ffn_gate.weight", (e, hp["n_ff"]), r["dense"]),
                (b + "ffn_up.weight", (e, hp["n_ff"]), r["dense"]),
                (b + "ffn_down.weight", (hp["n_ff"], e), r["dense"]),
            ]
            continue
        wide = il - hp["n_dense"] < r["upgrade_layers"]
        gu = r["upgrade"] if wide else r["gate_up_exps"]
        out += [
            (b + "ffn_gate_inp.weight", (e, ne), Q.F32),
            (b + "exp_probs_b.bias", (ne,), Q.F32),
            (b + "ffn_gate_exps.weight", (e, fe, ne), gu),
            (b + "ffn_up_exps.weight", (e, fe, ne), gu),
            (b + "ffn_down_exps.weight", (fe, e, ne), r["down_exps"]),
            (b + "ffn_gate_shexp.weight", (e, fe), r["shexp"]),
            (b + "ffn_up_shexp.weight", (e, fe), r["shexp"]),
            (b + "ffn_down_shexp.weight", (fe, e), r["shexp"]),
            (b + "indexer.q_proj.weight", (e, kv * ix), r["indexer"]),
            (b + "indexer.k_proj.weight", (e, ix), r["indexer"]),
            (b + "indexer.q_norm.weight", (ix,), Q.F32),
            (b + "indexer.k_norm.weight", (ix,), Q.F32),
        ]
    out += [("output_norm.weight", (e,), Q.F32), ("output.weight", (e, hp["n_vocab"]), r["output"])]
    return out


def add_metadata(writer, hp=HPARAMS):
    a = ARCH + "."
    writer.add_string("general.name", "MiniMax-M3")
    for key, value in (
        ("context_length", hp["n_ctx_train"]), ("embedding_length", hp["n_embd"]),
        ("block_count", hp["n_layer"]), ("feed_forward_length", hp["n_ff"]),
        ("attention.head_count", hp["n_head"]), ("attention.head_count_kv", hp["n_head_kv"]),
        ("attention.key_length", hp["head_dim"]), ("attention.value_length", hp["head_dim"]),
        ("rope.dimension_count", hp["n_rot"]), ("expert_count", hp["n_expert"]),
        ("expert_used_count", hp["n_expert_used"]), ("expert_feed_forward_length", hp["n_ff_exp"]),
        ("expert_shared_count", 1), ("expert_gating_func", 2),
        ("leading_dense_block_count", hp["n_dense"]),
        ("attention.indexer.head_count", hp["n_head_kv"]),
        ("attention.indexer.key_length", hp["indexer_head_size"]),
        ("attention.indexer.top_k", hp["indexer_top_k"]),
        ("attention.indexer.block_size", hp["indexer_block_size"]),
        ("attention.indexer.local_blocks", hp["indexer_local_blocks"]),
    ):
        writer.add_uint32(a + key, value)
    writer.add_float32(a + "attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_float32(a + "rope.freq_base", 5000000.0)
    writer.add_float32(a + "expert_weights_scale", 2.5)
    writer.add_bool(a + "expert_weights_norm", True)
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_string("tokenizer.ggml.pre", "minimax-m2")


def write_sparse_model(root, quant, shards=None):
    """Write the sparse shards of ``quant`` under ``root/quant``; return the path of shard 1."""
    recipe = RECIPES[quant]
    shards = shards or recipe["shards"]
    table = tensor_table(quant)
    sizes = [nbytes(q, shape) for _, shape, q in table]
    folder = Path(root) / quant
    folder.mkdir(parents=True, exist_ok=True)
    base = folder / ("MiniMax-M3-%s.gguf" % quant)
    per_shard = int(sum(sizes) / shards * 1.05)
    writer = gguf.GGUFWriter(str(base), ARCH, split_max_size=per_shard)
    add_metadata(writer)
    for (name, shape, qtype), size in zip(table, sizes):
        writer.add_tensor_info(name, tuple(reversed(shape)), np.float32, size, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    alignment = writer.data_alignment
    paths = []
    for fout, tensors in zip(writer.fout, writer.tensors):
        fout.flush()
        start = gguf.GGUFWriter.ggml_pad(fout.tell(), alignment)
        data = sum(gguf.GGUFWriter.ggml_pad(ti.nbytes, alignment) for ti in tensors.values())
        paths.append(fout.name)
        fout.truncate(start + data)  # sparse: no blocks are written
    writer.close()
    first = sorted(paths)[0]
    assert first.endswith("-00001-of-%05d.gguf" % len(paths)), paths
    return Path(first)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root")
    parser.add_argument("quant", nargs="+", choices=sorted(RECIPES))
    args = parser.parse_args(argv)
    for quant in args.quant:
        path = write_sparse_model(args.root, quant)
        total = sum(os.path.getsize(p) for p in path.parent.glob("*.gguf"))
        print("%s %.1f GB (%.1f GiB) %s" % (quant, total / 1e9, total / 2**30, path))


if __name__ == "__main__":
    sys.exit(main())
