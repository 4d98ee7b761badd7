"""Benchmark engine for minimax-spark: what a GGUF costs per token, its tokenizer, llama-benchy's results.

* ``model_stats(path)`` (on the head, ``gguf`` only): the bytes a decoded token reads, from the tensor
  sizes of every shard and the expert counts (expert tensors count ``experts used / experts total``;
  the token embedding is one row, not the whole matrix).
* ``gguf_vocab(path)`` (on the head): the ``tokenizer.ggml.*`` fields, small enough to copy.
* ``build_tokenizer(vocab, dest)`` (on the controller, ``tokenizers``): an HF ``tokenizer.json`` made
  from those fields, so llama-benchy needs no Hub.
* ``parse_benchy(report)``: llama-benchy's JSON report as rows ``{depth, pp, tg}``.

Modules import it as ``from ansible.module_utils.minimax_spark_bench import ...``.
"""
from __future__ import annotations

import json
import os

from ansible.module_utils.minimax_spark_files import atomic_path
from ansible.module_utils.minimax_spark_gguf import GGUFError, open_gguf, split_shard_paths

#: Tensor names holding routed experts (llama.cpp's ``ffn_{gate,up,down}_exps`` and merged variants).
EXPERT_MARK = "_exps"
#: GGUF token types (llama.cpp's ``llama_token_type``).
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4


def _shards(path):
    first = open_gguf(path)
    count = first.split_count
    paths = split_shard_paths(path, count) if count > 1 else [path]
    return first, paths


def model_stats(path):
    """Bytes read per decoded token and the figures behind them (dict of plain values)."""
    first, paths = _shards(path)
    expert_count = int(first.arch_get("expert_count", 0) or 0)
    expert_used = int(first.arch_get("expert_used_count", 0) or 0)
    n_embd = int(first.arch_get("embedding_length", 0) or 0)
    dense = expert = embd = 0
    total = 0
    for shard in paths:
        reader = first.reader if shard == paths[0] else open_gguf(shard).reader
        for tensor in reader.tensors:
            size = int(tensor.n_bytes)
            total += size
            if tensor.name == "token_embd.weight":
                rows = int(tensor.shape[-1]) if len(tensor.shape) > 1 else 1
                embd += size // max(rows, 1)
            elif EXPERT_MARK in tensor.name:
                expert += size
            else:
                dense += size
    share = (float(expert_used) / expert_count) if expert_count else 1.0
    active = int(dense + embd + expert * share)
    return {
        "architecture": first.architecture,
        "context_length": int(first.context_length or 0),
        "block_count": int(first.block_count or 0),
        "embedding_length": n_embd,
        "expert_count": expert_count,
        "expert_used_count": expert_used,
        "shards": len(paths),
        "total_bytes": total,
        "dense_bytes": dense,
        "expert_bytes": expert,
        "embedding_row_bytes": embd,
        "active_bytes_per_token": active,
    }


def gguf_vocab(path):
    """The GGUF's tokenizer fields: model, pre, tokens, token_type, merges, bos/eos ids."""
    first = open_gguf(path)
    model = first.get("tokenizer.ggml.model", "")
    if model != "gpt2":
        raise GGUFError(
            "%s has a %r tokenizer; only byte-level BPE (gpt2, as MiniMax-M3) converts to tokenizer.json: "
            "set bench_tokenizer to an HF tokenizer folder or tokenizer.json" % (path, model))
    return {
        "model": model,
        "pre": first.get("tokenizer.ggml.pre", ""),
        "tokens": list(first.get("tokenizer.ggml.tokens")),
        "token_type": [int(t) for t in first.get("tokenizer.ggml.token_type", [])],
        "merges": list(first.get("tokenizer.ggml.merges", [])),
        "bos_token_id": first.get("tokenizer.ggml.bos_token_id", None),
        "eos_token_id": first.get("tokenizer.ggml.eos_token_id", None),
    }


def build_tokenizer(vocab, dest):
    """Write an HF tokenizer.json for a byte-level BPE vocabulary (``gguf_vocab``'s dict); return dest."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokens = vocab["tokens"]
    ids = {}
    for i, tok in enumerate(tokens):
        ids.setdefault(tok, i)
    merges = [tuple(m.split(" ", 1)) for m in vocab.get("merges", []) if " " in m]
    tok = Tokenizer(models.BPE(vocab=ids, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    types = vocab.get("token_type") or []
    special = [
        AddedToken(tokens[i], special=types[i] == TOKEN_CONTROL, normalized=False)
        for i in range(min(len(types), len(tokens))) if types[i] in (TOKEN_CONTROL, TOKEN_USER_DEFINED)
    ]
    if special:
        tok.add_special_tokens(special)
    with atomic_path(dest) as tmp:
        tok.save(tmp)
    return dest


def _metric(run, key):
    value = run.get(key)
    if isinstance(value, dict) and value.get("mean") is not None:
        return float(value["mean"])
    return None


def _spread(run, key):
    value = run.get(key)
    if isinstance(value, dict) and value.get("std") is not None:
        return float(value["std"])
    return None


def parse_benchy(report):
    """llama-benchy's JSON report (dict) -> rows ``{depth, pp, tg, pp_std, tg_std, runs, prompt, generated}``.

    ``pp_std``/``tg_std``: llama-benchy's standard deviation over the repeated runs (``--runs``), the spread the
    sweep's winner must lead by; ``runs``: how many runs the figures are made of.
    """
    rows = []
    for run in report.get("benchmarks", []):
        if run.get("is_context_prefill_phase"):
            continue
        rows.append({
            "depth": int(run.get("context_size", 0)),
            "prompt": int(run.get("prompt_size", 0)),
            "generated": int(run.get("response_size", 0)),
            "pp": _metric(run, "pp_throughput"),
            "tg": _metric(run, "tg_throughput"),
            "pp_std": _spread(run, "pp_throughput"),
            "tg_std": _spread(run, "tg_throughput"),
            "runs": len((run.get("tg_throughput") or {}).get("values") or []) or None,
            "ttfr_ms": _metric(run, "ttfr"),
        })
    rows.sort(key=lambda r: r["depth"])
    return rows


def load_json(path):
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


# --- llama-benchy, offline -----------------------------------------------------------------------
#: The corpus URL handed to llama-benchy. It is never fetched: llama-benchy reads its cache file
#: (~/.cache/llama-benchy/<md5 of the URL>.txt) first, and the runner writes that file itself.
CORPUS_URL = "offline://minimax-spark/bench-corpus"
_WORDS = (
    "the model reads every layer once for each token it writes while the prompt is processed in large "
    "batches across the fast link between the head and its workers so the speed of prefill depends on "
    "compute and the speed of decode on memory bandwidth a cluster of two sparks holds the weights of a "
    "large mixture of experts where only a few experts answer each token and the cache of keys and values "
    "grows with the depth of the conversation until the context is full river mountain window garden "
    "letter morning evening travel market question answer history science music number simple careful"
).split()

#: Runs llama-benchy in a child process whose command line holds no argument (the API key stays off ps).
_RUNNER = "import json, runpy, sys; sys.argv = ['llama-benchy'] + json.load(sys.stdin); " \
          "runpy.run_module('llama_benchy', run_name='__main__')"


def corpus_text(words=120000, seed=0):
    """A deterministic English-like text (words of a fixed list), long enough for 64k-token depths."""
    import random

    rng = random.Random(seed)
    out, line = [], []
    for _ in range(words):
        line.append(rng.choice(_WORDS))
        if len(line) >= 14:
            out.append(" ".join(line).capitalize() + ".")
            line = []
    return "\n".join(out) + "\n"


def benchy_argv(url, model, tokenizer, depths, prompt_tokens, generate_tokens, runs, result, extra=(),
                latency_mode="api"):
    """llama-benchy's arguments (without the API key, which goes through the environment of the runner)."""
    argv = ["--base-url", url, "--model", model, "--served-model-name", model, "--tokenizer", tokenizer,
            "--pp", str(int(prompt_tokens)), "--tg", str(int(generate_tokens)),
            "--depth"] + [str(int(d)) for d in depths] + [
            "--runs", str(int(runs)), "--no-cache", "--exact-tg", "--skip-coherence", "--latency-mode", latency_mode,
            "--book-url", CORPUS_URL, "--save-result", result, "--format", "json"]
    return argv + [str(a) for a in extra]


def run_benchy(python, workdir, argv, api_key="", timeout=3600):
    """Run llama-benchy offline in workdir (its HOME); return (rc, output). The corpus is written first."""
    import hashlib
    import subprocess

    cache = os.path.join(workdir, ".cache", "llama-benchy")
    os.makedirs(cache, exist_ok=True)
    book = os.path.join(cache, hashlib.md5(CORPUS_URL.encode()).hexdigest() + ".txt")  # nosec - a cache key
    if not os.path.isfile(book):
        with open(book, "w", encoding="utf-8") as handle:
            handle.write(corpus_text())
    if api_key:
        argv = list(argv) + ["--api-key", api_key]
    env = dict(os.environ, HOME=workdir, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", MPLBACKEND="Agg",
               PYTHONUNBUFFERED="1")
    proc = subprocess.run([python, "-c", _RUNNER], input=json.dumps(argv), capture_output=True, text=True,
                          env=env, cwd=workdir, timeout=timeout)
    return proc.returncode, (proc.stdout + proc.stderr)
