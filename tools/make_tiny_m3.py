#!/usr/bin/env python3
"""Write a tiny, scripted MiniMax-M3 GGUF that llama.cpp loads as the real ``minimax-m3`` architecture.

The demo, the molecule scenario and the tests serve this file instead of the 200 GB model. It has
every tensor and key the ``minimax-m3`` loader asks for (leading dense layer, MoE layers with routed
and shared experts, MSA indexer tensors), a byte-level ``gpt2`` vocabulary (pre-tokenizer
``minimax-m2``) with M3's special tokens, and the native M3 chat template embedded as
``tokenizer.chat_template``.

Scripted replies
----------------
Random weights never call a tool, so the weights are arranged instead (``--tool-format``):

* Every attention output projection but the mode switch's below, and the dense ``ffn_down``, are
  zero; the other attention, MSA indexer and router weights are seeded random numbers and still run
  through the whole graph, on the head and on RPC workers alike.
* ``token_embd`` gives each *source* token (the last prompt token and every token of a scripted
  reply) its own one-hot "slot" dimension plus a constant "bias" dimension, and ``output`` is a
  next-token table: at temperature 0 each token deterministically produces the next token of the
  script, and the last one produces EOS ``[e~[``.
* The experts carry the script (:func:`expert_weights`): the table reads each slot's *signal*
  dimension, which the embedding starts at ``-(4 * moe_layers - 1)`` and which every MoE layer's
  routed experts and its shared expert each raise by exactly 2 (gates saturated at swiglu-oai's
  clamp, up rows in pairs of opposite sign so only the active slot moves). With every expert tensor
  intact the signal ends at +1; with any one of them wrong it does not: a zeroed tensor, or a random
  gate or up projection, leaves it at -1 and the reply is the decoy ``?``; a random down projection
  writes noise everywhere. So the ``ffn_*_exps`` and ``ffn_*_shexp`` tensors, the ones over 10 MiB an
  RPC worker's cache serves with ``--expert-ff 2688`` or more, decide the reply: a wrong cached tensor
  changes it. ``rewritten=True`` (a test's "new bytes") changes only the down projections past their
  first 4 KiB, so the reply thinks :func:`rewritten_thought` before the same tool call.
* The pieces of a reply are single user-defined vocabulary tokens (e.g.
  ``]<]minimax[>[<invoke name="get_weather">``), so a token never has two different successors.
* Mode switch: in the leading dense layer, one attention head has a constant query and a key that
  is non-zero only for the ``<response>`` token, which only the tool-result rendering of the
  template contains (``]~b]tool\\n<response>...</response>``). Its value writes a "mode flag" into
  the residual stream; the table's rows read the flag, so after a tool result the model answers in
  plain text ("It is sunny in Paris.") instead of calling the tool again. The query/key use the
  head dimensions that rotary embedding leaves alone, so the switch works at any distance.

Reply formats (:data:`SCRIPTS`):

* ``m3``: ``<mm:think>...</mm:think>]<]minimax[>[<tool_call>\\n]<]minimax[>[<invoke name="get_weather">``
  ``]<]minimax[>[<city>Paris]<]minimax[>[</city>]<]minimax[>[</invoke>\\n]<]minimax[>[</tool_call>``,
  exactly what the M3 template renders and ``common/parsers/minimax-m3.cpp`` parses.
* ``hybrid``: M3 thinking tags, then the M2-style block ``<minimax:tool_call>\\n<invoke name=...>``
  ``<parameter name="city">Paris</parameter>...</minimax:tool_call>``.
* ``m2``: for the M2 template, whose generation prompt already opens ``<think>\\n``.
* ``none``: a thought and a plain-text greeting, never a tool call.

Usage::

    tools/make_tiny_m3.py OUT.gguf --llamacpp-tree .cache/.../vendor/llama.cpp [--tool-format m3]
    tools/make_tiny_m3.py OUT.gguf --template MiniMax-M3.jinja --split 3   # OUT-0000{1,2,3}-of-00003.gguf

The same arguments always give the same bytes.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

try:
    import gguf
    import numpy as np
except ImportError as exc:  # pragma: no cover - depends on the interpreter
    if __name__ != "__main__":
        raise
    sys.exit(f"make_tiny_m3: {exc}; run it with the project's .venv/bin/python (numpy and gguf installed)")

ARCH = "minimax-m3"
TEMPLATE_RELPATH = Path("models") / "templates" / "MiniMax-M3.jinja"

# --- what the scripted model says ---------------------------------------------------------------
TOOL_NAME = "get_weather"
TOOL_ARGUMENTS = {"city": "Paris"}
#: An OpenAI-style tool definition matching the scripted call (use it in requests).
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city name."}},
            "required": ["city"],
        },
    },
}
THOUGHT_CALL = "The user asks about the weather in Paris, so I will call get_weather."
THOUGHT_ANSWER = "The tool returned the weather for Paris, so I can answer now."
THOUGHT_PLAIN = "No tool is needed for this, so I will answer directly."
THOUGHTS = (THOUGHT_CALL, THOUGHT_ANSWER, THOUGHT_PLAIN)
ANSWER = "It is sunny in Paris."
GREETING = "Hello! I am a tiny scripted MiniMax-M3 model."

# --- M3 special tokens --------------------------------------------------------------------------
BOD = "]~!b["        # beginning of document: the tokenizer's BOS
ROLE = "]~b]"        # starts every role header (]~b]system, ]~b]ai, ...)
EOS = "[e~["
NS = "]<]minimax[>["
THINK_OPEN, THINK_CLOSE = "<mm:think>", "</mm:think>"
M2_THINK_OPEN, M2_THINK_CLOSE = "<think>", "</think>"
#: Only the template's rendering of a tool result contains it (M3, M2 and hybrid templates alike).
TOOL_RESULT_TRIGGER = "<response>"
CONTROL_TOKENS = [BOD, ROLE, EOS, "]<]image[>[", "]<]video[>["]
USER_DEFINED_TOKENS = [
    NS, "<tool_call>", "</tool_call>", THINK_OPEN, THINK_CLOSE, M2_THINK_OPEN, M2_THINK_CLOSE,
    TOOL_RESULT_TRIGGER, "</response>",
]
NEWLINE = "\n"  # the last token of every template's generation prompt (``]~b]ai\n`` / ``<think>\n``)

_M3_CALL = [
    NS + "<tool_call>\n",
    NS + f'<invoke name="{TOOL_NAME}">',
    NS + "<city>",
    "Paris",
    NS + "</city>",
    NS + "</invoke>\n",
    NS + "</tool_call>",
]
# No piece equals a grammar trigger word (llama-server refuses a one-token trigger that is not a
# preserved token): the autoparser's trigger for this block is "<minimax:tool_call>\n".
_M2_CALL = [
    "<minimax:tool_call>",
    f'\n<invoke name="{TOOL_NAME}">\n',
    '<parameter name="city">',
    "Paris",
    "</parameter>\n",
    "</invoke>\n",
    "</minimax:tool_call>",
]
_ANSWER_M3 = [NEWLINE, THINK_OPEN, THOUGHT_ANSWER, THINK_CLOSE, ANSWER, EOS]

#: format -> (reply without a tool result in the prompt, reply after a tool result). Each list
#: starts with the source token (the prompt's last token) and ends with EOS.
SCRIPTS: dict[str, tuple[list[str], list[str]]] = {
    "m3": ([NEWLINE, THINK_OPEN, THOUGHT_CALL, THINK_CLOSE, *_M3_CALL, EOS], _ANSWER_M3),
    "hybrid": ([NEWLINE, THINK_OPEN, THOUGHT_CALL, THINK_CLOSE, *_M2_CALL, EOS], _ANSWER_M3),
    "m2": (
        [NEWLINE, THOUGHT_CALL, "\n" + M2_THINK_CLOSE + "\n\n", *_M2_CALL, EOS],
        [NEWLINE, THOUGHT_ANSWER, "\n" + M2_THINK_CLOSE + "\n\n", ANSWER, EOS],
    ),
    "none": ([NEWLINE, THINK_OPEN, THOUGHT_PLAIN, THINK_CLOSE, GREETING, EOS], _ANSWER_M3),
}
TOOL_FORMATS = tuple(SCRIPTS)


def _thought_at(seq: Sequence[str]) -> int:
    """Index of the thought in a script."""
    return next(i for i, piece in enumerate(seq) if piece in THOUGHTS)


def rewritten_thought(tool_format: str = "m3") -> str:
    """The thought of the same model with rewritten expert tensors (``rewritten=True``): one its script never thinks.
    The tool call and the answer stay, so a deployment's canary passes, and the reply shows which bytes served it."""
    used = {piece for seq in SCRIPTS[tool_format] for piece in seq}
    return next(t for t in (THOUGHT_PLAIN, THOUGHT_CALL) if t not in used)


def scripted_reply(tool_format: str = "m3", after_tool_result: bool = False, rewritten: bool = False) -> str:
    """The exact text the model generates for ``tool_format`` (EOS excluded); ``rewritten``: the model written with
    ``rewritten=True`` (other expert bytes), whose thought is :func:`rewritten_thought`."""
    seq = list(SCRIPTS[tool_format][1 if after_tool_result else 0])
    if rewritten:
        seq[_thought_at(seq)] = rewritten_thought(tool_format)
    return "".join(seq[1:-1])


# --- vocabulary ---------------------------------------------------------------------------------
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (what byte-level BPE vocabularies store)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE_CHARS = _bytes_to_unicode()
# A handful of merges so the vocabulary is a real BPE one (the loader requires the merges key).
_MERGES = [("a", "i"), ("Ġ", "t"), ("h", "e"), ("i", "n"), ("e", "r"), ("o", "n"), ("Ġt", "he"), ("a", "t")]


def build_vocab() -> tuple[list[str], list[int], list[str]]:
    """Tokens, token types and merges; the same for every tool format."""
    tokens: list[str] = [BYTE_CHARS[b] for b in range(256)]
    types: list[int] = [int(gguf.TokenType.NORMAL)] * 256
    merges = []
    for a, b in _MERGES:
        merges.append(f"{a} {b}")
        tokens.append(a + b)
        types.append(int(gguf.TokenType.NORMAL))
    for t in CONTROL_TOKENS:
        tokens.append(t)
        types.append(int(gguf.TokenType.CONTROL))
    script_pieces: list[str] = []
    for name in TOOL_FORMATS:
        for seq in SCRIPTS[name]:
            script_pieces.extend(seq)
    for t in USER_DEFINED_TOKENS + script_pieces:
        if t in (NEWLINE, EOS) or t in tokens:
            continue
        tokens.append(t)
        types.append(int(gguf.TokenType.USER_DEFINED))
    assert len(set(tokens)) == len(tokens)
    return tokens, types, merges


def _token_id(tokens: Sequence[str], text: str) -> int:
    """Id of the token generating ``text`` (a byte token for the newline, else the literal token)."""
    if text == NEWLINE:
        return tokens.index(BYTE_CHARS[ord("\n")])
    return tokens.index(text)


def next_token_tables(tool_format: str, tokens: Sequence[str]) -> tuple[dict[int, int], dict[int, int]]:
    """source token id -> next token id, without and with a tool result in the prompt."""
    tables = []
    for seq in SCRIPTS[tool_format]:
        table: dict[int, int] = {}
        ids = [_token_id(tokens, t) for t in seq]
        for src, nxt in zip(ids, ids[1:]):
            if table.get(src, nxt) != nxt:
                raise ValueError(f"script for {tool_format!r}: token {tokens[src]!r} would need two successors")
            table[src] = nxt
        # the rewritten experts' thought, in every model: followed by what follows the script's thought
        i = _thought_at(seq)
        table[_token_id(tokens, rewritten_thought(tool_format))] = _token_id(tokens, seq[i + 1])
        tables.append(table)
    return tables[0], tables[1]


# --- hyperparameters ----------------------------------------------------------------------------
N_EMBD = 128
N_HEAD = 4
N_HEAD_KV = 2
HEAD_DIM = 32          # a multiple of 32 so q8_0 K/V caches work
N_ROT = 16             # partial rotary: dims 16..31 of every head are position-free
N_FF = 256
N_FF_EXP = 64
N_EXPERT = 8
N_EXPERT_USED = 2
N_EXPERT_SHARED = 1
INDEXER_HEAD_SIZE = 32
INDEXER_TOP_K = 4
INDEXER_BLOCK_SIZE = 16
INDEXER_LOCAL_BLOCKS = 1
CONTEXT_LENGTH = 65536   # the training context llama-server caps a slot at: room for an agent's first request
RMS_EPS = 1e-6

# residual-stream dimensions with a meaning
D_ONE, D_TRIG, D_FLAG, D_GENERIC = 0, 1, 2, 3
#: Source tokens get a slot each: its one-hot dimension (what the experts read) and its signal dimension
#: (what the experts write and the table reads). The same for every tool format, so are the experts.
SLOTS = 16
D_FIRST_SOURCE = 4
D_FIRST_SIGNAL = D_FIRST_SOURCE + SLOTS
D_REWRITTEN = D_FIRST_SIGNAL + SLOTS    # written only by rewritten experts; the table reads their thought from it
D_FIRST_FREE = D_REWRITTEN + 1          # always zero in the residual stream: the experts' seeded noise reads these
SWIGLU_LIMIT, SWIGLU_ALPHA = 7.0, 1.702  # llama.cpp's swiglu-oai (LLM_FFN_SWIGLU_OAI_MOE), as in gpt-oss
PATH_GAIN = 2.0                          # what one intact expert path (routed or shared, per layer) adds to a signal
DECOY = "?"                              # what the model says when an expert tensor is wrong
DECOY_GAIN = 1.5                         # below TABLE_GAIN: the decoy wins only when the signal is negative
FLAG_DIM = HEAD_DIM - 1     # the head dimension carrying the trigger match (not rotated)
TABLE_GAIN = 3.0            # A: weight of the correct successor
FLAG_GAIN = 2.0             # B: how strongly the mode flag moves a mode-dependent row
FLAG_BIAS = 2.0             # C: bias against after-tool-result rows when the flag is off
QK_GAIN = 2.5               # q_norm/k_norm weight on FLAG_DIM: trigger score about 35


def _rms_normed(v: np.ndarray) -> np.ndarray:
    return v / np.sqrt(np.mean(v * v) + RMS_EPS)


def signal_bias(layers: int) -> float:
    """Where a source's signal starts: one path's gain short of what all of them add, less 1 (the signal ends at +1)."""
    return PATH_GAIN * 2 * (layers - 1) - 1.0


def saturation(layers: int) -> float:
    """Gate and up weight that drives swiglu-oai's clamp for any state of the residual stream (3x margin).

    The residual holds at most the bias, a slot, the trigger and the flag (1 each) and a signal between
    -signal_bias and +1, so its rms is at most sqrt((4 + bias^2) / N_EMBD) and a 1 reads at least 1 / that.
    """
    return 3.0 * SWIGLU_LIMIT * math.sqrt((4.0 + signal_bias(layers) ** 2) / N_EMBD)


def expert_weights(expert_ff: int, layers: int, noise,
                   redirect: dict[int, int] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One expert's ``(gate, up, down)`` (``[ff, N_EMBD]``, ``[ff, N_EMBD]``, ``[N_EMBD, ff]``): +PATH_GAIN on the
    signal dimension of the active slot, exactly, and 0 on every other dimension.

    Rows come in pairs, pair ``p`` serving slot ``p % SLOTS``: both gates read the bias dimension past
    swiglu-oai's clamp (activation ``g = 7 * sigmoid(1.702 * 7)``); the ups read the slot's one-hot dimension
    with opposite signs, clamped to +-7, so the pair's outputs are ``8g`` and ``-6g`` for the active slot and
    ``g`` and ``g`` for the others; the down weights ``+w``/``-w`` turn that into ``14 g w`` or 0. Every row is
    used, so every part of the tensors carries the signal. ``noise(shape)``: seeded numbers written into the
    dimensions that are always zero in the residual stream (they change the bytes per seed, not the result).
    ``redirect``: {slot: dimension} written instead of the slot's signal (the rewritten experts).
    """
    pairs = expert_ff // 2
    if pairs < SLOTS:
        raise ValueError(f"expert_ff must be at least {2 * SLOTS} (a pair of rows for each of the {SLOTS} slots)")
    sat = saturation(layers)
    act = SWIGLU_LIMIT / (1.0 + math.exp(-SWIGLU_ALPHA * SWIGLU_LIMIT))
    gate = np.zeros((expert_ff, N_EMBD), dtype=np.float32)
    up = np.zeros((expert_ff, N_EMBD), dtype=np.float32)
    down = np.zeros((N_EMBD, expert_ff), dtype=np.float32)
    per_slot = [len(range(i, pairs, SLOTS)) for i in range(SLOTS)]
    for p in range(pairs):
        slot = p % SLOTS
        w = PATH_GAIN / ((SWIGLU_LIMIT + 1.0 - (1.0 - SWIGLU_LIMIT)) * act * per_slot[slot])
        for row, sign in ((2 * p, 1.0), (2 * p + 1, -1.0)):
            gate[row, D_ONE] = sat
            up[row, D_FIRST_SOURCE + slot] = sign * sat
            down[(redirect or {}).get(slot, D_FIRST_SIGNAL + slot), row] = sign * w
    gate[:, D_FIRST_FREE:] = noise((expert_ff, N_EMBD - D_FIRST_FREE))
    up[:, D_FIRST_FREE:] = noise((expert_ff, N_EMBD - D_FIRST_FREE))
    return gate, up, down


def build_tensors(tool_format: str, layers: int, seed: int, tokens: Sequence[str],
                  expert_ff: int = N_FF_EXP, rewritten: bool = False) -> list[tuple[str, np.ndarray]]:
    """All tensors, in the order llama.cpp lists them, as float32 numpy arrays (rows = ggml ne[1]).

    ``expert_ff``: feed-forward width of each expert (default 64, at least ``2 * SLOTS``); 2688 makes every
    routed expert tensor about 10.5 MiB, above the 10 MiB the RPC tensor cache starts at. ``rewritten``:
    the same model but for the down projections of its experts, which send the thought's source to
    :func:`rewritten_thought` (every other tensor, and each tensor's first 4 KiB, keep their bytes).
    """
    if layers < 2:
        raise ValueError("layers must be at least 2 (one leading dense layer, then MoE+MSA layers)")
    n_vocab = len(tokens)
    rng = np.random.default_rng(seed)

    def rand(*shape: int, scale: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    t0, t1 = next_token_tables(tool_format, tokens)
    sources = sorted(set(t0) | set(t1))
    if len(sources) > SLOTS:
        raise ValueError(f"{len(sources)} scripted source tokens, more than the {SLOTS} slots")
    src_dim = {tok: D_FIRST_SOURCE + i for i, tok in enumerate(sources)}
    sig_dim = {tok: D_FIRST_SIGNAL + i for i, tok in enumerate(sources)}
    trigger_id = tokens.index(TOOL_RESULT_TRIGGER)
    eos_id = tokens.index(EOS)
    decoy_id = tokens.index(BYTE_CHARS[ord(DECOY)])
    rewritten_id = _token_id(tokens, rewritten_thought(tool_format))
    seq0 = SCRIPTS[tool_format][0]
    thought_source = _token_id(tokens, seq0[_thought_at(seq0) - 1])
    redirect = {sources.index(thought_source): D_REWRITTEN} if rewritten else None

    # token_embd: bias dimension + one-hot slot dimension (or the shared "generic" one); a source's signal starts
    # negative, the experts raise it
    embd = np.zeros((n_vocab, N_EMBD), dtype=np.float32)
    embd[:, D_ONE] = 1.0
    for tok in range(n_vocab):
        embd[tok, src_dim.get(tok, D_GENERIC)] = 1.0
    for tok in sources:
        embd[tok, sig_dim[tok]] = -signal_bias(layers)
    embd[trigger_id, D_TRIG] = 1.0

    # output: the next-token table over the signals. Rows that follow a source only in one mode read the flag.
    out = np.zeros((n_vocab, N_EMBD), dtype=np.float32)
    out[eos_id, D_GENERIC] = TABLE_GAIN
    out[decoy_id, D_ONE] = DECOY_GAIN
    out[rewritten_id, D_REWRITTEN] = TABLE_GAIN
    only0: set[int] = set()
    only1: set[int] = set()
    for src in sources:
        n0, n1 = t0.get(src), t1.get(src)
        for nxt in {n0, n1} - {None}:
            out[nxt, sig_dim[src]] = TABLE_GAIN
        if n0 is not None and n1 is not None and n0 != n1:
            only0.add(n0)
            only1.add(n1)
    both = only0 & only1
    if both:
        raise ValueError(f"tokens {[tokens[i] for i in both]} follow mode-dependent sources in both modes")
    for row in only0:
        out[row, D_FLAG] = -FLAG_GAIN
    for row in only1:
        out[row, D_FLAG] = FLAG_GAIN
        out[row, D_ONE] = -FLAG_BIAS

    q_dim = N_HEAD * HEAD_DIM
    kv_dim = N_HEAD_KV * HEAD_DIM
    trig_normed = _rms_normed(embd[trigger_id])[D_TRIG]

    tensors: list[tuple[str, np.ndarray]] = [
        ("token_embd.weight", embd),
        ("output_norm.weight", np.ones(N_EMBD, dtype=np.float32)),
        ("output.weight", out),
    ]
    for il in range(layers):
        p = f"blk.{il}."
        if il == 0:
            # the mode-switch head: constant query, key only on the trigger token, value -> flag
            wq = np.zeros((q_dim, N_EMBD), dtype=np.float32)
            wk = np.zeros((kv_dim, N_EMBD), dtype=np.float32)
            wv = np.zeros((kv_dim, N_EMBD), dtype=np.float32)
            wo = np.zeros((N_EMBD, q_dim), dtype=np.float32)
            for h in range(N_HEAD):
                wq[h * HEAD_DIM + FLAG_DIM, D_ONE] = 1.0
            wk[FLAG_DIM, D_TRIG] = 1.0               # kv head 0
            wv[0, D_TRIG] = 1.0                      # kv head 0, dim 0
            wo[D_FLAG, 0] = 1.0 / trig_normed        # q head 0, dim 0 -> flag = 1 after a tool result
            qk_norm = np.ones(HEAD_DIM, dtype=np.float32)
            qk_norm[FLAG_DIM] = QK_GAIN
            q_norm = k_norm = qk_norm
        else:
            wq, wk, wv = rand(q_dim, N_EMBD), rand(kv_dim, N_EMBD), rand(kv_dim, N_EMBD)
            wo = np.zeros((N_EMBD, q_dim), dtype=np.float32)
            q_norm = k_norm = np.ones(HEAD_DIM, dtype=np.float32)
        tensors += [
            (p + "attn_norm.weight", np.ones(N_EMBD, dtype=np.float32)),
            (p + "attn_q.weight", wq),
            (p + "attn_k.weight", wk),
            (p + "attn_v.weight", wv),
            (p + "attn_output.weight", wo),
            (p + "attn_q_norm.weight", q_norm.copy()),
            (p + "attn_k_norm.weight", k_norm.copy()),
            (p + "ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32)),
        ]
        if il == 0:
            tensors += [
                (p + "ffn_gate.weight", rand(N_FF, N_EMBD)),
                (p + "ffn_up.weight", rand(N_FF, N_EMBD)),
                (p + "ffn_down.weight", np.zeros((N_EMBD, N_FF), dtype=np.float32)),
            ]
        else:
            # every routed expert is the same function (the router's choice and weights, which sum to 1, do not
            # change the sum) and so is the shared one: each path adds PATH_GAIN to the active slot's signal
            ff_sh = expert_ff * N_EXPERT_SHARED
            gate_inp = rand(N_EXPERT, N_EMBD, scale=0.1)
            routed = [expert_weights(expert_ff, layers, lambda shape: rand(*shape), redirect) for _ in range(N_EXPERT)]
            shared = expert_weights(ff_sh, layers, lambda shape: rand(*shape), redirect)
            tensors += [
                (p + "ffn_gate_inp.weight", gate_inp),
                (p + "exp_probs_b.bias", np.zeros(N_EXPERT, dtype=np.float32)),
                (p + "ffn_gate_exps.weight", np.stack([g for g, _, _ in routed])),
                (p + "ffn_up_exps.weight", np.stack([u for _, u, _ in routed])),
                (p + "ffn_down_exps.weight", np.stack([d for _, _, d in routed])),
                (p + "ffn_gate_shexp.weight", shared[0]),
                (p + "ffn_up_shexp.weight", shared[1]),
                (p + "ffn_down_shexp.weight", shared[2]),
                (p + "indexer.q_proj.weight", rand(N_HEAD_KV * INDEXER_HEAD_SIZE, N_EMBD)),
                (p + "indexer.k_proj.weight", rand(INDEXER_HEAD_SIZE, N_EMBD)),
                (p + "indexer.q_norm.weight", np.ones(INDEXER_HEAD_SIZE, dtype=np.float32)),
                (p + "indexer.k_norm.weight", np.ones(INDEXER_HEAD_SIZE, dtype=np.float32)),
            ]
    return tensors


def read_template(template: str | os.PathLike | None = None, llamacpp_tree: str | os.PathLike | None = None) -> str:
    """The chat template text: ``template`` (a path) or MiniMax-M3.jinja from a llama.cpp tree."""
    if template is not None:
        return Path(template).read_text(encoding="utf-8")
    if llamacpp_tree is not None:
        path = Path(llamacpp_tree) / TEMPLATE_RELPATH
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} not found: pass the llama.cpp source tree (the folder with models/templates/)"
            )
        return path.read_text(encoding="utf-8")
    raise ValueError("no chat template: give --template PATH or --llamacpp-tree DIR")


def _split_max_tensors_for(n_tensors: int, shards: int) -> int:
    """A tensors-per-shard limit giving exactly ``shards`` shards with gguf's writer."""
    for per in range(math.ceil(n_tensors / shards), 0, -1):
        if math.ceil(n_tensors / per) == shards:
            return per
    raise ValueError(f"cannot split {n_tensors} tensors into exactly {shards} shards")


def write_tiny_m3(
    path: str | os.PathLike,
    tool_format: str = "m3",
    *,
    template_text: str | None = None,
    template: str | os.PathLike | None = None,
    llamacpp_tree: str | os.PathLike | None = None,
    layers: int = 4,
    split: int | None = None,
    split_max_tensors: int = 0,
    seed: int = 0,
    name: str = "MiniMax-M3 tiny scripted",
    expert_ff: int = N_FF_EXP,
    rewritten: bool = False,
) -> list[Path]:
    """Write the tiny model and return the written files (one, or the shards in order).

    The chat template comes from ``template_text``, else from the file ``template``, else from
    ``llamacpp_tree``/models/templates/MiniMax-M3.jinja. ``split=N`` writes exactly N shards named
    ``<stem>-0000i-of-0000N.gguf`` next to ``path``; ``split_max_tensors`` caps tensors per shard.
    ``rewritten=True``: the same file but for the expert down projections past their first 4 KiB, whose
    reply thinks :func:`rewritten_thought` (:func:`scripted_reply` with ``rewritten=True``): what a test writes over a
    deployed model to see which bytes serve it.
    """
    if tool_format not in SCRIPTS:
        raise ValueError(f"tool_format must be one of {', '.join(TOOL_FORMATS)}")
    if template_text is None:
        template_text = read_template(template, llamacpp_tree)
    path = Path(path)
    tokens, types, merges = build_vocab()
    if expert_ff < 2 * SLOTS:
        raise ValueError(f"expert_ff must be at least {2 * SLOTS} (a pair of rows for each of the {SLOTS} slots)")
    tensors = build_tensors(tool_format, layers, seed, tokens, expert_ff=expert_ff, rewritten=rewritten)
    if split is not None and split > 1:
        split_max_tensors = _split_max_tensors_for(len(tensors), split)
    elif split is not None and split < 1:
        raise ValueError("split must be at least 1")

    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(path, ARCH, split_max_tensors=split_max_tensors)
    a = ARCH
    w.add_string("general.type", "model")
    w.add_string("general.name", name)
    w.add_string("general.description", f"scripted tiny MiniMax-M3 (tool format {tool_format}, seed {seed})")
    w.add_uint32("general.file_type", int(gguf.LlamaFileType.ALL_F32))
    w.add_uint32("general.quantization_version", gguf.GGML_QUANT_VERSION)
    w.add_uint32(f"{a}.context_length", CONTEXT_LENGTH)
    w.add_uint32(f"{a}.embedding_length", N_EMBD)
    w.add_uint32(f"{a}.block_count", layers)
    w.add_uint32(f"{a}.feed_forward_length", N_FF)
    w.add_uint32(f"{a}.attention.head_count", N_HEAD)
    w.add_uint32(f"{a}.attention.head_count_kv", N_HEAD_KV)
    w.add_uint32(f"{a}.attention.key_length", HEAD_DIM)
    w.add_uint32(f"{a}.attention.value_length", HEAD_DIM)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", RMS_EPS)
    w.add_uint32(f"{a}.rope.dimension_count", N_ROT)
    w.add_float32(f"{a}.rope.freq_base", 10000.0)
    w.add_uint32(f"{a}.expert_count", N_EXPERT)
    w.add_uint32(f"{a}.expert_used_count", N_EXPERT_USED)
    w.add_uint32(f"{a}.expert_feed_forward_length", expert_ff)
    w.add_uint32(f"{a}.expert_shared_count", N_EXPERT_SHARED)
    w.add_uint32(f"{a}.expert_gating_func", 2)  # sigmoid
    w.add_float32(f"{a}.expert_weights_scale", 1.0)
    w.add_bool(f"{a}.expert_weights_norm", True)
    w.add_uint32(f"{a}.leading_dense_block_count", 1)
    w.add_uint32(f"{a}.attention.indexer.head_count", N_HEAD_KV)  # must equal head_count_kv
    w.add_uint32(f"{a}.attention.indexer.key_length", INDEXER_HEAD_SIZE)
    w.add_uint32(f"{a}.attention.indexer.top_k", INDEXER_TOP_K)
    w.add_uint32(f"{a}.attention.indexer.block_size", INDEXER_BLOCK_SIZE)
    w.add_uint32(f"{a}.attention.indexer.local_blocks", INDEXER_LOCAL_BLOCKS)
    w.add_uint32(f"{a}.vocab_size", len(tokens))

    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "minimax-m2")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_array("tokenizer.ggml.merges", merges)
    w.add_uint32("tokenizer.ggml.bos_token_id", tokens.index(BOD))
    w.add_uint32("tokenizer.ggml.eos_token_id", tokens.index(EOS))
    w.add_uint32("tokenizer.ggml.padding_token_id", tokens.index(EOS))
    # the template writes ]~!b[ itself
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_bool("tokenizer.ggml.add_eos_token", False)
    w.add_string("tokenizer.chat_template", template_text)

    for tname, arr in tensors:
        w.add_tensor(tname, np.ascontiguousarray(arr, dtype=np.float32))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return w.format_shard_names(path)


def main(argv: Iterable[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("output", help="GGUF file to write (with --split: the shard name prefix, e.g. tiny.gguf)")
    ap.add_argument("--tool-format", choices=TOOL_FORMATS, default="m3",
                    help="how the scripted reply writes its tool call (default: m3, the native M3 format)")
    ap.add_argument("--template", help="chat template file to embed (default: MiniMax-M3.jinja from --llamacpp-tree)")
    ap.add_argument("--llamacpp-tree", default=os.environ.get("MINIMAX_SPARK_LLAMACPP_TREE"),
                    help="llama.cpp source tree holding models/templates/MiniMax-M3.jinja "
                         "(default: $MINIMAX_SPARK_LLAMACPP_TREE)")
    ap.add_argument("--layers", type=int, default=4, help="block count: 1 dense + (N-1) MoE/MSA layers (default 4)")
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--split", type=int, help="write exactly N shards <prefix>-0000i-of-0000N.gguf")
    group.add_argument("--split-max-tensors", type=int, default=0, help="at most N tensors per shard")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random (inert) weights (default 0)")
    ap.add_argument("--expert-ff", type=int, default=N_FF_EXP,
                    help=f"feed-forward width of each expert (default {N_FF_EXP}, at least {2 * SLOTS}); 2688 puts the "
                         "routed expert tensors (~10.5 MiB) above the RPC tensor cache's 10 MiB threshold")
    args = ap.parse_args(list(argv) if argv is not None else None)
    try:
        files = write_tiny_m3(
            args.output, args.tool_format, template=args.template, llamacpp_tree=args.llamacpp_tree,
            layers=args.layers, split=args.split, split_max_tensors=args.split_max_tensors, seed=args.seed,
            expert_ff=args.expert_ff,
        )
    except (ValueError, OSError) as exc:
        print(f"make_tiny_m3: {exc}", file=sys.stderr)
        return 2
    for f in files:
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
