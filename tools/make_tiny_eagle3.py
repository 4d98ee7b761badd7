#!/usr/bin/env python3
"""Write a tiny EAGLE-3 draft GGUF for the tiny MiniMax-M3 of ``make_tiny_m3.py`` (offline, seeded).

llama.cpp loads it as the ``eagle3`` architecture (``src/models/eagle3.cpp``) and ``--spec-type
draft-eagle3`` drafts with it: the keys ``eagle3.target_layers`` (three layer ids of the target whose
inputs the draft reads) and ``eagle3.target_hidden_size`` (the target's width), one decoder layer
(``blk.0.*`` with ``attn_norm_2`` on the fused target features, attention over ``2 * n_embd``), the
feature fusion ``fc.weight`` (``3 * n_embd_target`` -> ``n_embd``), and an ``output`` head over the
target's vocabulary. It has no ``token_embd``: the decoder reads the target's token embeddings, as
drafts converted with ``convert_hf_to_gguf.py --target-model-dir`` do. The vocabulary is the tiny
M3's (speculation needs the same tokens).

The weights are seeded random numbers: the draft proposes tokens the target mostly rejects, which is
enough to prove the machinery. At temperature 0 the target's verification makes the replies the same
as without speculation, whatever the draft proposes.

Usage::

    tools/make_tiny_eagle3.py OUT.gguf [--target-layers 0 1 2] [--seed 0]
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

try:
    import gguf
    import numpy as np

    from make_tiny_m3 import BOD, CONTEXT_LENGTH, EOS, HEAD_DIM, N_EMBD, N_FF, N_HEAD, N_HEAD_KV, RMS_EPS, build_vocab
except ImportError as exc:  # pragma: no cover - depends on the interpreter
    if __name__ != "__main__":
        raise
    sys.exit(f"make_tiny_eagle3: {exc}; run it with the project's .venv/bin/python (numpy and gguf installed)")

ARCH = "eagle3"
#: The target's layers read by default (the tiny M3 has 4: all below its block count).
TARGET_LAYERS = (0, 1, 2)


def build_tensors(n_vocab: int, seed: int) -> list[tuple[str, np.ndarray]]:
    """The draft's tensors as float32 arrays in numpy order (rows = ggml ne[1])."""
    rng = np.random.default_rng(seed)

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    ones = np.ones(N_EMBD, dtype=np.float32)
    return [
        ("fc.weight", rand(N_EMBD, 3 * N_EMBD)),
        ("output_norm.weight", ones),
        ("output.weight", rand(n_vocab, N_EMBD)),
        ("blk.0.attn_norm.weight", ones),
        ("blk.0.attn_norm_2.weight", ones),
        ("blk.0.attn_q.weight", rand(N_HEAD * HEAD_DIM, 2 * N_EMBD)),
        ("blk.0.attn_k.weight", rand(N_HEAD_KV * HEAD_DIM, 2 * N_EMBD)),
        ("blk.0.attn_v.weight", rand(N_HEAD_KV * HEAD_DIM, 2 * N_EMBD)),
        ("blk.0.attn_output.weight", rand(N_EMBD, N_HEAD * HEAD_DIM)),
        ("blk.0.ffn_norm.weight", ones),
        ("blk.0.ffn_gate.weight", rand(N_FF, N_EMBD)),
        ("blk.0.ffn_up.weight", rand(N_FF, N_EMBD)),
        ("blk.0.ffn_down.weight", rand(N_EMBD, N_FF)),
    ]


def write_tiny_eagle3(path, target_layers: Sequence[int] = TARGET_LAYERS, seed: int = 0) -> Path:
    """Write the draft to ``path`` and return it. ``target_layers``: three layer ids of the target."""
    if len(target_layers) != 3:
        raise ValueError("an EAGLE-3 draft reads exactly 3 target layers, got %d" % len(target_layers))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tokens, types, merges = build_vocab()
    w = gguf.GGUFWriter(str(path), ARCH)
    a = ARCH
    w.add_string("general.type", "model")
    w.add_string("general.name", "MiniMax-M3 tiny EAGLE-3 draft")
    w.add_uint32("general.file_type", int(gguf.LlamaFileType.ALL_F32))
    w.add_uint32("general.quantization_version", gguf.GGML_QUANT_VERSION)
    w.add_uint32(f"{a}.context_length", CONTEXT_LENGTH)
    w.add_uint32(f"{a}.embedding_length", N_EMBD)
    w.add_uint32(f"{a}.block_count", 1)
    w.add_uint32(f"{a}.feed_forward_length", N_FF)
    w.add_uint32(f"{a}.attention.head_count", N_HEAD)
    w.add_uint32(f"{a}.attention.head_count_kv", N_HEAD_KV)
    w.add_uint32(f"{a}.attention.key_length", HEAD_DIM)
    w.add_uint32(f"{a}.attention.value_length", HEAD_DIM)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", RMS_EPS)
    w.add_uint32(f"{a}.rope.dimension_count", HEAD_DIM)
    w.add_float32(f"{a}.rope.freq_base", 10000.0)
    w.add_uint32(f"{a}.vocab_size", len(tokens))
    w.add_array(f"{a}.target_layers", [int(i) for i in target_layers])
    w.add_uint32(f"{a}.target_hidden_size", N_EMBD)
    w.add_bool(f"{a}.norm_before_residual", False)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "minimax-m2")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_array("tokenizer.ggml.merges", merges)
    w.add_uint32("tokenizer.ggml.bos_token_id", tokens.index(BOD))
    w.add_uint32("tokenizer.ggml.eos_token_id", tokens.index(EOS))
    w.add_uint32("tokenizer.ggml.padding_token_id", tokens.index(EOS))
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_bool("tokenizer.ggml.add_eos_token", False)
    for name, arr in build_tensors(len(tokens), seed):
        w.add_tensor(name, np.ascontiguousarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main(argv: Iterable[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("output", help="GGUF file to write")
    ap.add_argument("--target-layers", type=int, nargs=3, default=list(TARGET_LAYERS),
                    help="the three target layers the draft reads (default 0 1 2; the tiny M3 has 4)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    args = ap.parse_args(list(argv) if argv is not None else None)
    try:
        print(write_tiny_eagle3(args.output, args.target_layers, args.seed))
    except (ValueError, OSError) as exc:
        print(f"make_tiny_eagle3: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
