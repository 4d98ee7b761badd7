"""tools/make_tiny_m3.py: the tiny scripted MiniMax-M3 GGUF the demo, molecule and the tests serve.

Read back with gguf.GGUFReader: what llama.cpp's minimax-m3 loader needs (keys, tensor names and
shapes from src/models/minimax-m3.cpp), the tokenizer and template, determinism, shards, and (by a
numpy re-run of the arranged weights, swiglu-oai experts and router included) that the next-token table
spells the scripted replies for every format and expert width, and that any expert tensor with other bytes
(zero, random, the rewritten model's) changes the reply.
"""
import hashlib
import json
import os
import re
from pathlib import Path

import gguf
import numpy as np
import pytest

import make_tiny_m3 as tiny

A = "minimax-m3"


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _field(reader: gguf.GGUFReader, key: str):
    field = reader.fields.get(key)
    assert field is not None, f"missing key {key}"
    return field.contents()


def _tensors(reader: gguf.GGUFReader) -> dict:
    return {t.name: t for t in reader.tensors}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny_m3")


@pytest.fixture(scope="module")
def m3_model(tiny_dir: Path, m3_template: str) -> Path:
    files = tiny.write_tiny_m3(tiny_dir / "tiny-m3.gguf", "m3", template_text=m3_template)
    assert files == [tiny_dir / "tiny-m3.gguf"]
    return files[0]


@pytest.fixture(scope="module")
def reader(m3_model: Path) -> gguf.GGUFReader:
    return gguf.GGUFReader(m3_model)


def expected_tensor_shapes(reader: gguf.GGUFReader) -> dict:
    """Tensor name -> ggml ne, as llama_model_minimax_m3::load_arch_tensors creates them."""
    def h(k):
        return int(_field(reader, f"{A}.{k}"))

    n_embd, n_layer = h("embedding_length"), h("block_count")
    n_head, n_head_kv = h("attention.head_count"), h("attention.head_count_kv")
    hd_k, hd_v = h("attention.key_length"), h("attention.value_length")
    n_ff, n_ff_exp = h("feed_forward_length"), h("expert_feed_forward_length")
    n_expert, n_shared = h("expert_count"), h("expert_shared_count")
    n_dense = h("leading_dense_block_count")
    idx_heads, idx_size = h("attention.indexer.head_count"), h("attention.indexer.key_length")
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    shapes = {
        "token_embd.weight": (n_embd, n_vocab),
        "output_norm.weight": (n_embd,),
        "output.weight": (n_embd, n_vocab),
    }
    for i in range(n_layer):
        p = f"blk.{i}."
        shapes.update({
            p + "attn_q.weight": (n_embd, hd_k * n_head),
            p + "attn_k.weight": (n_embd, hd_k * n_head_kv),
            p + "attn_v.weight": (n_embd, hd_v * n_head_kv),
            p + "attn_output.weight": (hd_k * n_head, n_embd),
            p + "attn_norm.weight": (n_embd,),
            p + "attn_q_norm.weight": (hd_k,),
            p + "attn_k_norm.weight": (hd_k,),
            p + "ffn_norm.weight": (n_embd,),
        })
        if i < n_dense:
            shapes.update({
                p + "ffn_gate.weight": (n_embd, n_ff),
                p + "ffn_down.weight": (n_ff, n_embd),
                p + "ffn_up.weight": (n_embd, n_ff),
            })
        else:
            shapes.update({
                p + "ffn_gate_inp.weight": (n_embd, n_expert),
                p + "exp_probs_b.bias": (n_expert,),
                p + "ffn_gate_exps.weight": (n_embd, n_ff_exp, n_expert),
                p + "ffn_down_exps.weight": (n_ff_exp, n_embd, n_expert),
                p + "ffn_up_exps.weight": (n_embd, n_ff_exp, n_expert),
                p + "ffn_gate_shexp.weight": (n_embd, n_ff_exp * n_shared),
                p + "ffn_down_shexp.weight": (n_ff_exp * n_shared, n_embd),
                p + "ffn_up_shexp.weight": (n_embd, n_ff_exp * n_shared),
                p + "indexer.q_proj.weight": (n_embd, idx_heads * idx_size),
                p + "indexer.k_proj.weight": (n_embd, idx_size),
                p + "indexer.q_norm.weight": (idx_size,),
                p + "indexer.k_norm.weight": (idx_size,),
            })
    return shapes


# --- architecture and hyperparameters -----------------------------------------------------------

def test_architecture_is_minimax_m3(reader):
    assert _field(reader, "general.architecture") == "minimax-m3"


REQUIRED_KEYS = [
    "context_length", "embedding_length", "block_count", "feed_forward_length",
    "attention.head_count", "attention.head_count_kv", "attention.key_length", "attention.value_length",
    "attention.layer_norm_rms_epsilon", "rope.dimension_count", "rope.freq_base",
    "expert_count", "expert_used_count", "expert_feed_forward_length", "expert_shared_count",
    "expert_gating_func", "expert_weights_scale", "expert_weights_norm", "leading_dense_block_count",
    "attention.indexer.head_count", "attention.indexer.key_length", "attention.indexer.top_k",
    "attention.indexer.block_size", "attention.indexer.local_blocks",
]


@pytest.mark.parametrize("key", REQUIRED_KEYS)
def test_hyperparameter_key_present(reader, key):
    _field(reader, f"{A}.{key}")


def test_hyperparameters_satisfy_the_loader(reader):
    def h(k):
        return _field(reader, f"{A}.{k}")

    # MSA: one indexer head per GQA group (GGML_ASSERT(HKV == Hd) in the graph)
    assert h("attention.indexer.head_count") == h("attention.head_count_kv")
    assert h("attention.indexer.block_size") > 0
    assert h("expert_gating_func") == 2  # sigmoid
    assert 1 <= h("leading_dense_block_count") < h("block_count")
    assert h("expert_used_count") <= h("expert_count")
    assert h("expert_shared_count") >= 1
    # partial rotary, and head sizes that q8_0 K/V caches accept
    assert h("rope.dimension_count") < h("attention.key_length")
    assert h("attention.key_length") == h("attention.value_length")
    assert h("attention.key_length") % 32 == 0


# --- tensors ------------------------------------------------------------------------------------

def test_tensor_names_and_shapes_match_the_architecture(reader):
    got = {name: tuple(int(d) for d in t.shape) for name, t in _tensors(reader).items()}
    assert got == expected_tensor_shapes(reader)


def test_tensors_are_finite_and_the_model_is_a_few_mb(reader, m3_model):
    for t in reader.tensors:
        assert np.isfinite(t.data).all(), t.name
    assert 1e6 < m3_model.stat().st_size < 16e6


def test_layers_option(tiny_dir, m3_template):
    path = tiny.write_tiny_m3(tiny_dir / "three.gguf", template_text=m3_template, layers=3)[0]
    r = gguf.GGUFReader(path)
    assert _field(r, f"{A}.block_count") == 3
    names = set(_tensors(r))
    assert "blk.2.indexer.q_proj.weight" in names and not any(n.startswith("blk.3.") for n in names)
    assert {n: tuple(int(d) for d in t.shape) for n, t in _tensors(r).items()} == expected_tensor_shapes(r)
    with pytest.raises(ValueError):
        tiny.write_tiny_m3(tiny_dir / "one.gguf", template_text=m3_template, layers=1)


# --- tokenizer and template ---------------------------------------------------------------------

def test_tokenizer_is_byte_level_gpt2_with_minimax_m2_pre(reader):
    assert _field(reader, "tokenizer.ggml.model") == "gpt2"
    assert _field(reader, "tokenizer.ggml.pre") == "minimax-m2"
    merges = _field(reader, "tokenizer.ggml.merges")
    assert merges and all(len(m.split(" ")) == 2 for m in merges)
    tokens = _field(reader, "tokenizer.ggml.tokens")
    assert set(tiny.BYTE_CHARS.values()) <= set(tokens)  # every byte is representable
    for merge in merges:  # every merge result is a token
        assert merge.replace(" ", "") in tokens
    assert len(tokens) == len(set(tokens))
    assert len(_field(reader, "tokenizer.ggml.token_type")) == len(tokens)


def test_special_tokens(reader, m3_template):
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type")
    kind = dict(zip(tokens, types))
    assert tokens[_field(reader, "tokenizer.ggml.bos_token_id")] == "]~!b["
    assert tokens[_field(reader, "tokenizer.ggml.eos_token_id")] == "[e~["
    for control in ("]~!b[", "]~b]", "[e~["):
        assert kind[control] == gguf.TokenType.CONTROL, control
    # every special token the native template writes is one token, and rendered as text
    template_tokens = re.findall(r"set \w+_token\s*=\s*'([^']+)'", m3_template)
    assert "]<]minimax[>[" in template_tokens and "<mm:think>" in template_tokens
    for tok in template_tokens:
        assert tok in kind, tok
    for text in ("]<]minimax[>[", "<tool_call>", "</tool_call>", "<mm:think>", "</mm:think>"):
        assert kind[text] == gguf.TokenType.USER_DEFINED, text
    # the template adds ]~!b[ itself
    assert _field(reader, "tokenizer.ggml.add_bos_token") is False


def test_native_template_embedded(reader, m3_template):
    assert _field(reader, "tokenizer.chat_template") == m3_template


def test_template_from_file_and_tree(tiny_dir, llamacpp_tree, m3_template):
    custom = tiny_dir / "custom.jinja"
    custom.write_text("{{ messages[0].content }}")
    a = tiny.write_tiny_m3(tiny_dir / "custom.gguf", template=custom)[0]
    assert _field(gguf.GGUFReader(a), "tokenizer.chat_template") == "{{ messages[0].content }}"
    b = tiny.write_tiny_m3(tiny_dir / "tree.gguf", llamacpp_tree=llamacpp_tree)[0]
    assert _field(gguf.GGUFReader(b), "tokenizer.chat_template") == m3_template
    with pytest.raises(ValueError, match="--template"):
        tiny.write_tiny_m3(tiny_dir / "none.gguf")
    with pytest.raises(FileNotFoundError):
        tiny.write_tiny_m3(tiny_dir / "none.gguf", llamacpp_tree=tiny_dir)


# --- determinism --------------------------------------------------------------------------------

def test_same_arguments_give_the_same_bytes(tiny_dir, m3_template, m3_model):
    again = tiny.write_tiny_m3(tiny_dir / "again" / "tiny-m3.gguf", "m3", template_text=m3_template)[0]
    assert _sha256(again) == _sha256(m3_model)


def test_seed_and_format_change_the_bytes(tiny_dir, m3_template, m3_model):
    seeded = tiny.write_tiny_m3(tiny_dir / "seed1.gguf", template_text=m3_template, seed=1)[0]
    hybrid = tiny.write_tiny_m3(tiny_dir / "hybrid.gguf", "hybrid", template_text=m3_template)[0]
    assert len({_sha256(m3_model), _sha256(seeded), _sha256(hybrid)}) == 3
    # the vocabulary and the layers are the same for every format: only the table differs
    r_m3, r_hy = gguf.GGUFReader(m3_model), gguf.GGUFReader(hybrid)
    assert _field(r_m3, "tokenizer.ggml.tokens") == _field(r_hy, "tokenizer.ggml.tokens")
    t_m3, t_hy = _tensors(r_m3), _tensors(r_hy)
    assert [n for n in t_m3 if not np.array_equal(t_m3[n].data, t_hy[n].data)] == ["token_embd.weight", "output.weight"]


# --- shards -------------------------------------------------------------------------------------

@pytest.mark.parametrize("shards", [2, 3])
def test_split_writes_numbered_shards(tiny_dir, m3_template, reader, shards):
    out = tiny_dir / f"split{shards}" / "tiny-m3.gguf"
    files = tiny.write_tiny_m3(out, "m3", template_text=m3_template, split=shards)
    assert [f.name for f in files] == [f"tiny-m3-{i:05d}-of-{shards:05d}.gguf" for i in range(1, shards + 1)]
    assert sorted(p.name for p in out.parent.iterdir()) == [f.name for f in files]
    whole = _tensors(reader)
    seen = {}
    for i, f in enumerate(files):
        r = gguf.GGUFReader(f)
        assert _field(r, "split.no") == i
        assert _field(r, "split.count") == shards
        assert _field(r, "split.tensors.count") == len(whole)
        assert r.tensors, f"shard {f.name} holds no tensor"
        if i == 0:  # metadata lives in shard 1
            assert _field(r, "general.architecture") == "minimax-m3"
            assert _field(r, "tokenizer.chat_template") == m3_template
        else:
            assert "tokenizer.ggml.tokens" not in r.fields
        for t in r.tensors:
            assert t.name not in seen
            seen[t.name] = t
    assert set(seen) == set(whole)
    for name, t in seen.items():
        assert np.array_equal(t.data, whole[name].data), name
    again = tiny.write_tiny_m3(
        tiny_dir / f"split{shards}b" / "tiny-m3.gguf", "m3", template_text=m3_template, split=shards
    )
    assert [_sha256(f) for f in again] == [_sha256(f) for f in files]


def test_split_max_tensors(tiny_dir, m3_template, reader):
    files = tiny.write_tiny_m3(tiny_dir / "maxt" / "m.gguf", template_text=m3_template, split_max_tensors=20)
    n = len(reader.tensors)
    assert len(files) == -(-n // 20)
    assert all(len(gguf.GGUFReader(f).tensors) <= 20 for f in files)


def test_cli(tiny_dir, llamacpp_tree, capsys, m3_model):
    out = tiny_dir / "cli" / "tiny-m3.gguf"
    assert tiny.main([str(out), "--llamacpp-tree", str(llamacpp_tree), "--tool-format", "m3"]) == 0
    assert capsys.readouterr().out.split() == [str(out)]
    assert _sha256(out) == _sha256(m3_model)
    assert tiny.main([str(tiny_dir / "cli" / "s.gguf"), "--llamacpp-tree", str(llamacpp_tree), "--split", "2"]) == 0
    assert len(capsys.readouterr().out.split()) == 2
    assert tiny.main([str(tiny_dir / "cli" / "x.gguf"), "--template", str(tiny_dir / "missing.jinja")]) == 2
    assert "make_tiny_m3:" in capsys.readouterr().err


# --- the scripted replies -----------------------------------------------------------------------

def _rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _swiglu_oai(gate, up, alpha=1.702, limit=7.0):
    """llama.cpp's ggml_swiglu_oai (ggml-cpu/ops.cpp), which the minimax-m3 graph uses for every FFN."""
    x = np.minimum(gate, limit)
    return x / (1.0 + np.exp(-alpha * x)) * (np.clip(up, -limit, limit) + 1.0)


def _moe(t, il, x, n_used):
    """The MoE FFN of layer ``il`` as build_moe_ffn runs it: sigmoid router (+ bias) choosing ``n_used`` experts,
    weights normalised to sum 1, swiglu-oai experts; plus the shared expert."""
    p = f"blk.{il}."
    probs = 1.0 / (1.0 + np.exp(-(t[p + "ffn_gate_inp.weight"] @ x)))
    chosen = np.argsort(-(probs + t[p + "exp_probs_b.bias"]), kind="stable")[:n_used]
    weights = probs[chosen] / probs[chosen].sum()
    out = np.zeros_like(x)
    for e, w in zip(chosen, weights):
        act = _swiglu_oai(t[p + "ffn_gate_exps.weight"][e] @ x, t[p + "ffn_up_exps.weight"][e] @ x)
        out += w * (t[p + "ffn_down_exps.weight"][e] @ act)
    act = _swiglu_oai(t[p + "ffn_gate_shexp.weight"] @ x, t[p + "ffn_up_shexp.weight"] @ x)
    return out + t[p + "ffn_down_shexp.weight"] @ act


def greedy_reply(path: Path, after_tool_result: bool, max_tokens: int = 40, replace=None) -> str:
    """Re-run the arranged weights in numpy, as llama.cpp runs the last position.

    The residual stream is the embedding, plus the mode-switch head's flag (what it writes when the
    ``<response>`` token dominates its attention, after a tool result), plus every MoE layer's experts.
    Every other attention output projection and the dense FFN's down projection are zero, which this
    checks too. ``replace``: {tensor name: array} used instead of the file's (a wrong cached tensor).
    """
    r = gguf.GGUFReader(path)
    t = {x.name: np.asarray(x.data, dtype=np.float32) for x in r.tensors}
    for name, data in (replace or {}).items():
        assert t[name].shape == data.shape, name
        t[name] = data
    eps = float(_field(r, f"{A}.attention.layer_norm_rms_epsilon"))
    n_layer = _field(r, f"{A}.block_count")
    n_used = _field(r, f"{A}.expert_used_count")
    n_dense = _field(r, f"{A}.leading_dense_block_count")
    hd = _field(r, f"{A}.attention.value_length")
    for i in range(n_layer):
        for name in ("attn_output", "ffn_down"):
            if f"blk.{i}.{name}.weight" in t and not (i == 0 and name == "attn_output"):
                assert not t[f"blk.{i}.{name}.weight"].any(), f"blk.{i}.{name} is not shrunk to zero"
    tokens = _field(r, "tokenizer.ggml.tokens")
    types = _field(r, "tokenizer.ggml.token_type")
    embd, out = t["token_embd.weight"], t["output.weight"]
    flag = np.zeros(embd.shape[1], dtype=np.float32)
    if after_tool_result:
        trig = embd[tokens.index("<response>")]
        v = t["blk.0.attn_v.weight"] @ _rms_norm(trig, t["blk.0.attn_norm.weight"], eps)
        flag = t["blk.0.attn_output.weight"][:, :hd] @ v[:hd]  # head 0 reads kv head 0
    byte_text = {c: bytes([b]) for b, c in tiny.BYTE_CHARS.items()}
    tok = tokens.index(tiny.BYTE_CHARS[ord("\n")])  # end of the generation prompt "]~b]ai\n"
    eos = _field(r, "tokenizer.ggml.eos_token_id")
    text = b""
    for _ in range(max_tokens):
        h = embd[tok] + flag
        for il in range(n_dense, n_layer):
            h = h + _moe(t, il, _rms_norm(h, t[f"blk.{il}.ffn_norm.weight"], eps), n_used)
        logits = out @ _rms_norm(h, t["output_norm.weight"], eps)
        nxt = int(np.argmax(logits))
        if replace is None:
            assert np.sort(logits)[-1] - np.sort(logits)[-2] > 4.0, "the greedy choice must be clear-cut"
        if nxt == eos:
            return text.decode()
        is_normal = types[nxt] == gguf.TokenType.NORMAL
        text += b"".join(byte_text[c] for c in tokens[nxt]) if is_normal else tokens[nxt].encode()
        tok = nxt
    if replace is not None:  # wrong weights may ramble: what they said
        return text.decode(errors="replace")
    raise AssertionError(f"no EOS after {max_tokens} tokens: {text!r}")


@pytest.mark.parametrize("tool_format", tiny.TOOL_FORMATS)
def test_next_token_table_spells_the_scripted_replies(tiny_dir, m3_template, tool_format):
    path = tiny.write_tiny_m3(tiny_dir / f"script-{tool_format}.gguf", tool_format, template_text=m3_template)[0]
    first = greedy_reply(path, after_tool_result=False)
    second = greedy_reply(path, after_tool_result=True)
    assert first == tiny.scripted_reply(tool_format)
    assert second == tiny.scripted_reply(tool_format, after_tool_result=True)
    assert tiny.ANSWER in second and "get_weather" not in second.split("</")[-1]
    if tool_format == "none":
        assert "<invoke" not in first
    else:
        assert first.count(f'<invoke name="{tiny.TOOL_NAME}">') == 1 and "Paris" in first


def test_scripted_replies_have_the_documented_shape():
    m3 = tiny.scripted_reply("m3")
    ns = "]<]minimax[>["
    assert m3 == (
        f"<mm:think>{tiny.THOUGHT_CALL}</mm:think>{ns}<tool_call>\n{ns}<invoke name=\"get_weather\">"
        f"{ns}<city>Paris{ns}</city>{ns}</invoke>\n{ns}</tool_call>"
    )
    assert tiny.scripted_reply("hybrid") == (
        f"<mm:think>{tiny.THOUGHT_CALL}</mm:think><minimax:tool_call>\n<invoke name=\"get_weather\">\n"
        "<parameter name=\"city\">Paris</parameter>\n</invoke>\n</minimax:tool_call>"
    )
    answer = tiny.scripted_reply("m3", after_tool_result=True)
    assert answer == f"<mm:think>{tiny.THOUGHT_ANSWER}</mm:think>{tiny.ANSWER}"
    assert json.loads(json.dumps(tiny.TOOL_ARGUMENTS)) == {"city": "Paris"}
    assert tiny.WEATHER_TOOL["function"]["name"] == tiny.TOOL_NAME


# --- the experts carry the script: a wrong large tensor changes the reply -------------------------

@pytest.mark.parametrize("expert_ff", [tiny.N_FF_EXP, 2688])
@pytest.mark.parametrize("tool_format", tiny.TOOL_FORMATS)
def test_every_expert_width_spells_the_same_replies(tiny_dir, tool_format, expert_ff):
    path = tiny.write_tiny_m3(tiny_dir / f"wide-{tool_format}-{expert_ff}.gguf", tool_format,
                              template_text="{{ messages }}", layers=3, expert_ff=expert_ff)[0]
    assert greedy_reply(path, after_tool_result=False) == tiny.scripted_reply(tool_format)
    assert greedy_reply(path, after_tool_result=True) == tiny.scripted_reply(tool_format, after_tool_result=True)


EXPERT_TENSORS = ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"]


def _wrong(data: np.ndarray, how: str) -> np.ndarray:
    """Other bytes for a tensor: zeros (the old all-zero down projections) or seeded random numbers as the model
    had before its experts carried the script (another model's bytes)."""
    if how == "zero":
        return np.zeros_like(data)
    return (np.random.default_rng(7).standard_normal(data.shape) * 0.02).astype(np.float32)


@pytest.mark.parametrize("how", ["zero", "random"])
@pytest.mark.parametrize("tensor", EXPERT_TENSORS)
def test_any_wrong_expert_tensor_changes_the_reply(m3_model, reader, tensor, how):
    """What a worker serving a wrong cached tensor does to the reply: another reply than the script (the decoy, when
    the path it breaks adds nothing)."""
    n_layer = _field(reader, f"{A}.block_count")
    data = _tensors(reader)
    for il in range(1, n_layer):
        name = f"blk.{il}.{tensor}.weight"
        replace = {name: _wrong(np.asarray(data[name].data, dtype=np.float32), how)}
        for after in (False, True):
            got = greedy_reply(m3_model, after, replace=replace)
            assert got != tiny.scripted_reply("m3", after_tool_result=after), (name, after)
            if how == "zero" or "_down_" not in tensor:
                assert got == tiny.DECOY, (name, after, got)
    assert greedy_reply(m3_model, False) == tiny.scripted_reply("m3")


def test_the_bytes_past_the_first_4_kib_decide(tiny_dir):
    """The RPC cache's tensors (over 10 MiB with --expert-ff 2688): other bytes past the first 4 KiB that the hash
    file's head key reads, and the reply is the decoy."""
    path = tiny.write_tiny_m3(tiny_dir / "head-kept.gguf", "m3", template_text="{{ messages }}", layers=2,
                              expert_ff=2688)[0]
    big = [t for t in gguf.GGUFReader(path).tensors if int(t.n_bytes) > 10 * 1024 * 1024]
    assert sorted(t.name for t in big) == ["blk.1.ffn_down_exps.weight", "blk.1.ffn_gate_exps.weight",
                                           "blk.1.ffn_up_exps.weight"]
    for t in big:
        data = np.asarray(t.data, dtype=np.float32).copy()
        flat = data.reshape(-1)
        flat[1024:] = _wrong(flat[1024:], "random")  # 1024 float32 = 4 KiB kept
        got = greedy_reply(path, False, replace={t.name: data})
        assert got != tiny.scripted_reply("m3"), t.name
        flat[1024:] = 0.0
        assert greedy_reply(path, False, replace={t.name: data}) == tiny.DECOY, t.name


def test_an_expert_width_without_a_pair_of_rows_per_slot_is_refused(tiny_dir):
    with pytest.raises(ValueError, match="expert_ff must be at least 32"):
        tiny.write_tiny_m3(tiny_dir / "narrow.gguf", template_text="{{ messages }}", expert_ff=31)


@pytest.mark.parametrize("tool_format", tiny.TOOL_FORMATS)
def test_the_rewritten_experts_think_otherwise_and_keep_the_tool_call(tiny_dir, tool_format):
    """rewritten=True: only the expert down projections differ, past their first 4 KiB; the reply keeps its tool
    call and its answer (a deployment's canary passes) and thinks rewritten_thought(): which bytes served it shows."""
    kw = dict(template_text="{{ messages }}", layers=3, expert_ff=2688)
    original = tiny.write_tiny_m3(tiny_dir / f"orig-{tool_format}.gguf", tool_format, **kw)[0]
    rewritten = tiny.write_tiny_m3(tiny_dir / f"rewritten-{tool_format}.gguf", tool_format, rewritten=True, **kw)[0]
    a, b = _tensors(gguf.GGUFReader(original)), _tensors(gguf.GGUFReader(rewritten))
    assert list(a) == list(b)
    differ = [n for n in a if not np.array_equal(a[n].data, b[n].data)]
    assert differ == [f"blk.{i}.{kind}.weight" for i in (1, 2) for kind in ("ffn_down_exps", "ffn_down_shexp")]
    for name in differ:
        assert a[name].data.tobytes()[:4096] == b[name].data.tobytes()[:4096], name
        assert (int(a[name].data_offset), int(a[name].n_bytes)) == (int(b[name].data_offset), int(b[name].n_bytes))
    assert os.path.getsize(original) == os.path.getsize(rewritten)
    for after in (False, True):
        want = tiny.scripted_reply(tool_format, after_tool_result=after, rewritten=True)
        assert tiny.rewritten_thought(tool_format) in want
        assert want != tiny.scripted_reply(tool_format, after_tool_result=after)
        assert greedy_reply(rewritten, after) == want
        assert greedy_reply(original, after) == tiny.scripted_reply(tool_format, after_tool_result=after)
    if tool_format != "none":
        assert '<invoke name="get_weather">' in tiny.scripted_reply(tool_format, rewritten=True)
