#!/usr/bin/env python3
"""Write an M3-shaped proxy GGUF: MiniMax-M3's real tensor shapes, fewer layers, random quantised weights.

For load-time and speed figures on a machine that cannot hold (or download) the real 200+ GB model: the
proxy has M3's per-layer tensors at their real sizes and quant types (the table of
``tests/support/sparse_m3.py``, recipe UD-IQ4_XS by default), the ``minimax-m3`` architecture keys
llama.cpp loads, a byte-level vocabulary padded to M3's 200064 tokens and M3's chat template. Only the
layer count is smaller (default 3 dense + 5 MoE layers: ~23 GB). Offline, in seconds (it writes at the
disk's speed).

The weights are random: every quantised block is random bytes from a per-type pool with its fp16
scale fields set to small finite values, rotated per tensor so no two tensors share their bytes (the
RPC cache and its hashes see distinct tensors). The output is noise: the tool-call canary fails on
it, which is expected; it is for load and speed measurements only.

    tools/make_m3_proxy.py OUT.gguf --template MiniMax-M3.jinja              # ~23 GB, the H200 proxy
    tools/make_m3_proxy.py OUT.gguf --template T --layers 4 --dense 1 --embd 2048 --experts 16 \\
        --expert-ff 768 --ff 4096 --vocab 32768                               # ~0.3 GB, a CPU rehearsal
    tools/make_m3_proxy.py OUT.gguf --template T --dry-run                   # sizes only

The same arguments always give the same bytes.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "support"))

try:
    import gguf
    import numpy as np
    from gguf.constants import GGML_QUANT_SIZES
    from gguf.constants import GGMLQuantizationType as Q
except ImportError as exc:  # pragma: no cover - depends on the interpreter
    if __name__ != "__main__":
        raise
    sys.exit("make_m3_proxy: %s; run it with an interpreter that has numpy and gguf" % exc)

import make_tiny_m3  # noqa: E402  (vocabulary, special tokens, template reading)
import sparse_m3  # noqa: E402  (M3's tensor table and quant recipes)

ARCH = sparse_m3.ARCH
#: The RPC client hashes (and the worker caches) tensors larger than this.
RPC_HASH_MIN = 10 * 1024 * 1024
#: Byte offsets of the fp16 scale fields inside one block, per quant type (ggml-common.h).
SCALE_OFFSETS = {
    Q.Q4_0: (0,), Q.Q8_0: (0,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,),
    Q.IQ4_XS: (0,), Q.IQ3_S: (0,), Q.IQ3_XXS: (0,), Q.IQ2_S: (0,),
}
POOL_BYTES = 64 * 1024 * 1024
SCALE_RANGE = (2e-4, 1e-3)


def hparams(layers=8, dense=3, embd=None, experts=None, expert_ff=None, ff=None, vocab=None):
    """M3's hyperparameters (sparse_m3.HPARAMS) with the given ones replaced."""
    hp = dict(sparse_m3.HPARAMS)
    if dense < 1 or layers <= dense:
        raise ValueError("need at least one dense layer and one MoE layer (dense >= 1, layers > dense)")
    hp.update(n_layer=layers, n_dense=dense)
    for key, value in (("n_embd", embd), ("n_expert", experts), ("n_ff_exp", expert_ff), ("n_ff", ff),
                       ("n_vocab", vocab)):
        if value is not None:
            if value < 1:
                raise ValueError("%s must be positive" % key)
            hp[key] = value
    if hp["n_expert"] < hp["n_expert_used"]:
        raise ValueError("experts must be at least %d (experts used per token)" % hp["n_expert_used"])
    return hp


def plan(quant="UD-IQ4_XS", hp=None):
    """``[(name, ggml_shape, qtype, nbytes)]`` of the proxy, in file order."""
    hp = hp or hparams()
    out = []
    for name, shape, qtype in sparse_m3.tensor_table(quant, hp):
        block, _ = GGML_QUANT_SIZES[qtype]
        if shape[0] % block:
            raise ValueError("%s: row of %d is not a multiple of %s's block of %d: pick other sizes"
                             % (name, shape[0], qtype.name, block))
        out.append((name, shape, qtype, sparse_m3.nbytes(qtype, shape)))
    return out


def _pool(qtype, rng, need):
    """Random blocks of ``qtype`` (as uint8 rows) with finite fp16 scales."""
    block, size = GGML_QUANT_SIZES[qtype]
    if qtype not in SCALE_OFFSETS:
        raise ValueError("no scale layout known for %s" % qtype.name)
    n = max(1, min(POOL_BYTES, need) // size)
    pool = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    for off in SCALE_OFFSETS[qtype]:
        scales = rng.uniform(*SCALE_RANGE, size=n).astype("<f2")
        pool[:, off:off + 2] = scales.view(np.uint8).reshape(n, 2)
    return pool


def _f32(name, shape, rng):
    n = int(np.prod(shape))
    if name.endswith("_norm.weight") or name.endswith("norm.weight"):
        return np.ones(n, dtype="<f4")
    if name.endswith("exp_probs_b.bias"):
        return np.zeros(n, dtype="<f4")
    return (rng.standard_normal(n) * 0.02).astype("<f4")


def write_proxy(path, template_text, quant="UD-IQ4_XS", hp=None, seed=0, name="MiniMax-M3 shaped proxy (random)"):
    """Write the proxy to ``path``; returns ``{path, bytes, tensors, hashed_tensors, hashed_bytes, seconds}``."""
    started = time.monotonic()
    hp = hp or hparams()
    table = plan(quant, hp)
    tokens, types, merges = make_tiny_m3.build_vocab()
    if hp["n_vocab"] < len(tokens):
        raise ValueError("vocab must be at least %d (the byte and special tokens)" % len(tokens))
    pad = hp["n_vocab"] - len(tokens)
    tokens = tokens + ["[proxy-unused-%d]" % i for i in range(pad)]
    types = types + [int(gguf.TokenType.UNUSED)] * pad

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    try:
        _write(tmp, template_text, quant, hp, seed, name, table, tokens, types, merges)
    except BaseException:
        tmp.unlink(missing_ok=True)  # never a half-written proxy under any name
        raise
    os.replace(tmp, path)
    hashed = [s for _, _, _, s in table if s > RPC_HASH_MIN]
    return {"path": str(path), "bytes": path.stat().st_size, "tensors": len(table), "hashed_tensors": len(hashed),
            "hashed_bytes": sum(hashed), "seconds": round(time.monotonic() - started, 1)}


def _write(tmp, template_text, quant, hp, seed, name, table, tokens, types, merges):
    w = gguf.GGUFWriter(str(tmp), ARCH)
    a = ARCH + "."
    w.add_string("general.type", "model")
    w.add_string("general.name", name)
    w.add_string("general.description", "random weights in MiniMax-M3's shapes (%s recipe, seed %d): "
                 "for load and speed measurements only" % (quant, seed))
    w.add_uint32("general.quantization_version", gguf.GGML_QUANT_VERSION)
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
        ("vocab_size", hp["n_vocab"]),
    ):
        w.add_uint32(a + key, value)
    w.add_float32(a + "attention.layer_norm_rms_epsilon", 1e-6)
    w.add_float32(a + "rope.freq_base", 5000000.0)
    w.add_float32(a + "expert_weights_scale", 2.5)
    w.add_bool(a + "expert_weights_norm", True)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "minimax-m2")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_array("tokenizer.ggml.merges", merges)
    w.add_uint32("tokenizer.ggml.bos_token_id", tokens.index(make_tiny_m3.BOD))
    w.add_uint32("tokenizer.ggml.eos_token_id", tokens.index(make_tiny_m3.EOS))
    w.add_uint32("tokenizer.ggml.padding_token_id", tokens.index(make_tiny_m3.EOS))
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_bool("tokenizer.ggml.add_eos_token", False)
    w.add_string("tokenizer.chat_template", template_text)
    for tname, shape, qtype, size in table:
        w.add_tensor_info(tname, tuple(reversed(shape)), np.float32, size, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()

    rng = np.random.default_rng(seed)
    pools = {}
    align = w.data_alignment
    f = w.fout[0]
    f.flush()
    f.seek(0, os.SEEK_END)
    f.write(b"\0" * (gguf.GGUFWriter.ggml_pad(f.tell(), align) - f.tell()))
    for index, (tname, shape, qtype, size) in enumerate(table):
        if qtype == Q.F32:
            f.write(_f32(tname, shape, rng).tobytes())
        else:
            if qtype not in pools:
                need = max(s for _, _, q, s in table if q == qtype)
                pools[qtype] = _pool(qtype, rng, need)
            pool = pools[qtype]
            data = memoryview(pool.reshape(-1))
            bsize = pool.shape[1]
            start = (index * 7919 % pool.shape[0]) * bsize
            left = size
            while left:
                chunk = data[start:start + left]
                f.write(chunk)
                left -= len(chunk)
                start = 0
        f.write(b"\0" * (gguf.GGUFWriter.ggml_pad(size, align) - size))
    w.close()


def layer_bytes(table):
    """Bytes per block index (``-1``: token_embd, output and output_norm)."""
    out = {}
    for tname, _, _, size in table:
        key = int(tname.split(".")[1]) if tname.startswith("blk.") else -1
        out[key] = out.get(key, 0) + size
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("output", help="GGUF file to write")
    ap.add_argument("--template", help="chat template file (MiniMax-M3.jinja)")
    ap.add_argument("--llamacpp-tree", default=os.environ.get("MINIMAX_SPARK_LLAMACPP_TREE"),
                    help="llama.cpp tree holding models/templates/MiniMax-M3.jinja (instead of --template)")
    ap.add_argument("--quant", default="UD-IQ4_XS", choices=sorted(sparse_m3.RECIPES),
                    help="whose tensor types to use (default UD-IQ4_XS)")
    ap.add_argument("--layers", type=int, default=8, help="block count (default 8; M3 has 60)")
    ap.add_argument("--dense", type=int, default=3, help="leading dense layers (default 3, as M3)")
    ap.add_argument("--embd", type=int, help="n_embd (default M3's 6144)")
    ap.add_argument("--experts", type=int, help="routed experts per layer (default M3's 128)")
    ap.add_argument("--expert-ff", type=int, help="expert FFN width (default M3's 3072)")
    ap.add_argument("--ff", type=int, help="dense FFN width (default M3's 12288)")
    ap.add_argument("--vocab", type=int, help="vocabulary size (default M3's 200064)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dry-run", action="store_true", help="print the sizes, write nothing")
    args = ap.parse_args(argv)
    try:
        hp = hparams(args.layers, args.dense, args.embd, args.experts, args.expert_ff, args.ff, args.vocab)
        table = plan(args.quant, hp)
        if args.dry_run:
            total = sum(t[3] for t in table)
            hashed = [t[3] for t in table if t[3] > RPC_HASH_MIN]
            print("%d tensors, %.2f GB; %d over 10 MiB (%.2f GB)" % (len(table), total / 1e9, len(hashed),
                                                                      sum(hashed) / 1e9))
            for layer, size in sorted(layer_bytes(table).items()):
                print("  %s %.3f GB" % ("other" if layer < 0 else "blk.%d" % layer, size / 1e9))
            return 0
        text = make_tiny_m3.read_template(args.template, args.llamacpp_tree)
        res = write_proxy(args.output, text, args.quant, hp, args.seed)
    except (ValueError, OSError) as exc:
        print("make_m3_proxy: %s" % exc, file=sys.stderr)
        return 2
    print("%s: %.2f GB, %d tensors (%d over 10 MiB: %.2f GB) in %.1f s" % (
        res["path"], res["bytes"] / 1e9, res["tensors"], res["hashed_tensors"], res["hashed_bytes"] / 1e9,
        res["seconds"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
