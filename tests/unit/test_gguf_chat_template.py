"""gguf_chat_template: the native M3 template byte for byte, or the hybrid with M2's tool-call format.

The hybrid is checked three ways: the transplants on the real MiniMax-M3 template, a Jinja render of
a conversation with tools (the text the model sees), and llama.cpp's own template detection read from
the vendored common/chat.cpp (the hybrid must not reach the native M3 parser).
"""
import ast
import difflib
import hashlib
import json
import os
import re
import stat
from pathlib import Path

import gguf
import numpy as np
import pytest
from ansible.module_utils import minimax_spark_template as engine
from jinja2.sandbox import ImmutableSandboxedEnvironment

import gguf_chat_template as gct
from helpers import run_module

# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------


def write_gguf(path, template=None, arch="minimax-m3"):
    """A small GGUF like a MiniMax-M3 shard 1: a few metadata keys, the template, one tensor."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_uint32(arch + ".block_count", 3)
    writer.add_uint32(arch + ".context_length", 4096)
    writer.add_string("tokenizer.ggml.model", "gpt2")
    if template is not None:
        writer.add_string("tokenizer.chat_template", template)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)


def render(template, messages, tools=None, add_generation_prompt=True, **extra):
    """Render like llama.cpp / transformers: trim_blocks, lstrip_blocks, tojson(ensure_ascii=...)."""

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(
        messages=messages, tools=tools, add_generation_prompt=add_generation_prompt, **extra
    )


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "opts": {"type": "object", "properties": {"unit": {"type": "string"}}},
                },
                "required": ["city"],
            },
        },
    }
]

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "I need the tool.",
        "tool_calls": [
            {
                "type": "function",
                "id": "call_1",
                "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2, "opts": {"unit": "C"}}},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    {"role": "user", "content": "And Rome?"},
]

#: What M2's renderer writes for the assistant call above (models/templates/MiniMax-M2.jinja).
M2_CALL_BLOCK = (
    "<minimax:tool_call>\n"
    '<invoke name="get_weather">\n'
    '<parameter name="city">Paris</parameter>\n'
    '<parameter name="days">2</parameter>\n'
    '<parameter name="opts">{"unit": "C"}</parameter>\n'
    "</invoke>\n"
    "</minimax:tool_call>"
)


@pytest.fixture(scope="module")
def hybrid(m3_template):
    return engine.make_hybrid(m3_template)


@pytest.fixture(scope="module")
def m2_template(llamacpp_tree):
    return (llamacpp_tree / "models" / "templates" / "MiniMax-M2.jinja").read_text()


# ------------------------------------------------------------------------------------------------
# llama.cpp's template detection, read from the vendored common/chat.cpp
# ------------------------------------------------------------------------------------------------

_CPP_LITERAL = r'"(?:[^"\\\n]|\\.)*"'


def _cpp_tokens_skip(text, start, open_ch, close_ch):
    """Index just past the bracket matching text[start] == open_ch, skipping strings and comments."""
    depth = 0
    i = start
    while i < len(text):
        if text.startswith("//", i):
            i = text.index("\n", i)
            continue
        if text.startswith("/*", i):
            i = text.index("*/", i) + 2
            continue
        ch = text[i]
        if ch in "\"'":
            j = i + 1
            while text[j] != ch:
                j += 2 if text[j] == "\\" else 1
            i = j + 1
            continue
        if ch == open_ch:
            depth += 1
        elif ch == close_ch:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise AssertionError("unbalanced %s%s in llama.cpp source" % (open_ch, close_ch))


def _helper_predicate_source(tree, name):
    """The return expression of a helper such as ``bool is_lfm2_template(const std::string & src)``."""
    pattern = re.compile(
        r"bool\s+%s\s*\(\s*const\s+std::string\s*&\s*src\s*\)\s*\{\s*return\s+(.*?);\s*\}" % name, re.S
    )
    for source in sorted((tree / "common").rglob("*.cpp")):
        match = pattern.search(source.read_text(errors="replace"))
        if match:
            return match.group(1)
    raise AssertionError("llama.cpp helper %s not found" % name)


def _cpp_condition_to_python(tree, condition, literals=None):
    """Turn a detection condition made of src.find(...) tests, && and || into a Python predicate."""
    literals = {} if literals is None else literals

    def literal(match):
        name = "_s%d" % len(literals)
        literals[name] = ast.literal_eval(match.group(1))
        return "(%s %s src)" % (name, "in" if match.group(2) == "!=" else "not in")

    def helper(match):
        return _cpp_condition_to_python(tree, _helper_predicate_source(tree, match.group(1)), literals)[0]

    # Drop comments (keeping string literals, which may hold anything).
    expr = re.sub(r"(%s)|//[^\n]*|/\*.*?\*/" % _CPP_LITERAL, lambda m: m.group(1) or " ", condition, flags=re.S)
    expr = re.sub(r"(is_\w+_template)\s*\(\s*src\s*\)", helper, expr)
    expr = re.sub(r"src\.find\(\s*(%s)\s*\)\s*(!=|==)\s*std::string::npos" % _CPP_LITERAL, literal, expr)
    expr = expr.replace("&&", " and ").replace("||", " or ")
    leftover = re.sub(r"\b(?:and|or|not|in|src|_s\d+)\b|[()\s]", "", expr)
    assert not leftover, "llama.cpp detection uses a construct this test does not know: %r" % condition
    return "(%s)" % " ".join(expr.split()), literals


def llamacpp_specialized_handlers(tree):
    """[(init function, python expression, literals)] in the order common/chat.cpp tries them."""
    source = (tree / "common" / "chat.cpp").read_text()
    head = re.search(r"common_chat_try_specialized_template\s*\([^)]*\)\s*\{", source)
    assert head, "common_chat_try_specialized_template not found in common/chat.cpp"
    body_start = head.end() - 1
    body = source[body_start:_cpp_tokens_skip(source, body_start, "{", "}")]
    handlers = []
    i = 1
    while True:
        found = re.compile(r"\bif\s*\(").search(body, i)
        if not found:
            break
        cond_start = found.end() - 1
        cond_end = _cpp_tokens_skip(body, cond_start, "(", ")")
        block_start = body.index("{", cond_end)
        block_end = _cpp_tokens_skip(body, block_start, "{", "}")
        init = re.search(r"return\s+(common_chat_params_init_\w+)", body[block_start:block_end])
        assert init, "a detection branch without a dedicated parser: %s" % body[cond_start:cond_end]
        expr, literals = _cpp_condition_to_python(tree, body[cond_start + 1:cond_end - 1])
        handlers.append((init.group(1), expr, literals))
        i = block_end
    assert len(handlers) >= 10, "parsed too few detection branches from common/chat.cpp"
    return handlers


def llamacpp_chosen_handler(tree, template_src):
    """The dedicated parser llama.cpp picks for ``template_src``, or None for the autoparser (peg-native)."""
    for init, expr, literals in llamacpp_specialized_handlers(tree):
        if eval(expr, {"__builtins__": {}}, dict(literals, src=template_src)):  # noqa: S307 - our own translation
            return init
    return None


def test_detection_rule_matches_vendored_llamacpp(llamacpp_tree):
    """The module's trigger strings are exactly the ones common/chat.cpp tests for MiniMax-M3."""
    handlers = {init: literals for init, _expr, literals in llamacpp_specialized_handlers(llamacpp_tree)}
    assert "common_chat_params_init_minimax_m3" in handlers
    assert sorted(handlers["common_chat_params_init_minimax_m3"].values()) == sorted(engine.LLAMACPP_NATIVE_M3_TRIGGERS)


def test_llamacpp_picks_native_parser_for_m3_and_autoparser_for_m2(llamacpp_tree, m3_template, m2_template):
    assert llamacpp_chosen_handler(llamacpp_tree, m3_template) == "common_chat_params_init_minimax_m3"
    assert engine.llamacpp_selects_native_m3_parser(m3_template)
    assert llamacpp_chosen_handler(llamacpp_tree, m2_template) is None  # differential autoparser: peg-native


def test_hybrid_goes_to_the_autoparser_like_m2(llamacpp_tree, hybrid):
    assert llamacpp_chosen_handler(llamacpp_tree, hybrid) is None
    assert not engine.llamacpp_selects_native_m3_parser(hybrid)
    for trigger in ("]<]minimax[>[", "<tool_call>"):
        assert trigger not in hybrid


# ------------------------------------------------------------------------------------------------
# the transplants on the real M3 template
# ------------------------------------------------------------------------------------------------


def test_hybrid_changes_only_the_three_blocks(m3_template, hybrid):
    native_lines = m3_template.splitlines(keepends=True)
    # Line ranges [first, last) of the three transplanted blocks in the native template.
    spans = []
    for transplant in engine.TRANSPLANTS:
        match = transplant.pattern.search(m3_template)
        first = m3_template.count("\n", 0, match.start())
        spans.append((first, first + match.group(0).count("\n")))
    opcodes = difflib.SequenceMatcher(a=native_lines, b=hybrid.splitlines(keepends=True), autojunk=False).get_opcodes()
    changed = [(i1, i2) for tag, i1, i2, _j1, _j2 in opcodes if tag != "equal"]
    assert changed
    for i1, i2 in changed:
        assert any(first <= i1 and i2 <= last for first, last in spans), "".join(native_lines[i1:i2])
    # Roles, thinking, generation prompt and tool results are untouched.
    for kept in (
        "{%- set think_begin_token      = '<mm:think>'                     -%}",
        "{{- think_begin_token ~ reasoning_content ~ think_end_token }}",
        "{{- '\\n<response>' }}",
        "{{- bos_token ~ 'ai' ~ '\\n' }}",
        "{{- bos_token ~ 'tool' }}",
        "{%- macro to_xml(val, ns) -%}",
    ):
        assert kept in hybrid
    assert hybrid.count("{%- set toolcall_begin_token   = '<minimax:tool_call>'") == 1
    assert hybrid.count("{%- set toolcall_end_token     = '</minimax:tool_call>'") == 1


def test_make_hybrid_is_deterministic_and_refuses_its_own_output(m3_template, hybrid):
    assert engine.make_hybrid(m3_template) == hybrid
    with pytest.raises(engine.HybridTemplateError, match="not a MiniMax-M3 chat template"):
        engine.make_hybrid(hybrid)


def test_hybrid_render_uses_m2_tool_call_format_and_keeps_m3_behaviour(hybrid):
    text = render(hybrid, CONVERSATION, tools=TOOLS)
    # The tool instruction example is M2's.
    assert (
        "When making tool calls, use XML format to invoke tools and pass parameters:\n\n"
        "<minimax:tool_call>\n"
        '<invoke name="tool-name-1">\n'
        '<parameter name="param-key-1">param-value-1</parameter>\n'
        '<parameter name="param-key-2">param-value-2</parameter>\n'
        "...\n"
        "</invoke>\n"
        "</minimax:tool_call>[e~[\n"
    ) in text
    # The past call is in M2's format, right after M3's thinking block.
    assert "]~b]ai\n<mm:think>I need the tool.</mm:think>" + M2_CALL_BLOCK + "[e~[\n" in text
    # M3's tool result and the native generation prompt (adaptive: no think prefix).
    assert "]~b]tool\n<response>sunny, 21 C</response>[e~[\n" in text
    assert text.endswith("]~b]user\nAnd Rome?[e~[\n]~b]ai\n")
    assert "<mm:think>" in text and "<think>" not in text
    for trigger in ("]<]minimax[>[", "<tool_call>"):
        assert trigger not in text
    # The rendered prompt would not switch llama.cpp to the native parser either.
    assert not engine.llamacpp_selects_native_m3_parser(text)


def test_hybrid_generation_prompt_follows_m3_thinking_modes(hybrid):
    messages = [{"role": "user", "content": "Hi"}]
    assert render(hybrid, messages, thinking_mode="enabled").endswith("]~b]ai\n<mm:think>")
    assert render(hybrid, messages, thinking_mode="disabled").endswith("]~b]ai\n</mm:think>")
    assert render(hybrid, messages, thinking_mode="adaptive").endswith("]~b]ai\n")


def test_hybrid_renders_like_native_without_tool_calls(m3_template, hybrid):
    plain = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
             {"role": "assistant", "content": "<mm:think>greet</mm:think>Hello!"}, {"role": "user", "content": "Bye"}]
    assert render(hybrid, plain) == render(m3_template, plain)
    native_tools = render(m3_template, plain, tools=TOOLS)
    hybrid_tools = render(hybrid, plain, tools=TOOLS)
    cut = "</tools>\n\n"
    assert hybrid_tools.split(cut)[0] == native_tools.split(cut)[0]
    assert hybrid_tools.split("[e~[\n]~b]user\nHi")[1] == native_tools.split("[e~[\n]~b]user\nHi")[1]


def test_hybrid_tool_blocks_render_exactly_like_m2(hybrid, m2_template):
    m2_text = render(m2_template, CONVERSATION, tools=TOOLS)
    hybrid_text = render(hybrid, CONVERSATION, tools=TOOLS)
    example = re.search(r"When making tool calls.*?</minimax:tool_call>", m2_text, re.S).group(0)
    assert example in hybrid_text
    assert M2_CALL_BLOCK in m2_text and M2_CALL_BLOCK in hybrid_text


def test_hybrid_skips_none_arguments_and_accepts_flat_tool_calls(hybrid):
    messages = [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": "ok", "tool_calls": [{"name": "f", "arguments": {"a": "b", "skip": None}}]},
        {"role": "tool", "content": "done"},
    ]
    text = render(hybrid, messages, tools=TOOLS, add_generation_prompt=False)
    assert '</mm:think>ok<minimax:tool_call>\n<invoke name="f">\n<parameter name="a">b</parameter>\n</invoke>\n' in text
    assert "skip" not in text


# ------------------------------------------------------------------------------------------------
# refusals: not M3, a block repeated, a block missing
# ------------------------------------------------------------------------------------------------

BLOCKS = [t.name for t in engine.TRANSPLANTS]


def _block_text(template, name):
    transplant = next(t for t in engine.TRANSPLANTS if t.name == name)
    return transplant.pattern.search(template).group(0)


#: Edits that make one block unrecognisable while the template stays M3-shaped.
BREAK_BLOCK = {
    "tool-call token definitions": lambda t: t.replace("set toolcall_begin_token", "set tool_call_begin_token"),
    "tool instruction block": lambda t: t.replace("'To call tools, wrap all", "'To call a tool, wrap all"),
    "tool-call renderer": lambda t: t.replace("for tool_call in message.tool_calls", "for call in message.tool_calls"),
}


@pytest.mark.parametrize("text", ["{{ messages }}", "{% for m in messages %}{{ m.content }}{% endfor %}"])
def test_refuses_a_template_that_is_not_m3(text):
    with pytest.raises(engine.HybridTemplateError, match="not a MiniMax-M3 chat template"):
        engine.make_hybrid(text)


def test_refuses_the_m2_template(m2_template):
    with pytest.raises(engine.HybridTemplateError, match="not a MiniMax-M3 chat template"):
        engine.make_hybrid(m2_template)


@pytest.mark.parametrize("name", BLOCKS)
def test_refuses_a_repeated_block(m3_template, name):
    block = _block_text(m3_template, name)
    doubled = m3_template.replace(block, block + block, 1)
    with pytest.raises(engine.HybridTemplateError) as info:
        engine.make_hybrid(doubled)
    assert "'%s'" % name in str(info.value)
    others = [b for b in BLOCKS if b != name]
    assert not any("'%s'" % other in str(info.value) for other in others)


@pytest.mark.parametrize("name", BLOCKS)
def test_refuses_a_missing_block(m3_template, name):
    broken = BREAK_BLOCK[name](m3_template)
    assert broken != m3_template
    with pytest.raises(engine.HybridTemplateError) as info:
        engine.make_hybrid(broken)
    assert "'%s'" % name in str(info.value)
    assert "0 times" in str(info.value)


def test_refuses_a_deleted_renderer(m3_template):
    without = m3_template.replace(_block_text(m3_template, "tool-call renderer"), "")
    with pytest.raises(engine.HybridTemplateError, match="'tool-call renderer' matched 0 times"):
        engine.make_hybrid(without)


def test_refuses_ns_token_used_elsewhere(m3_template):
    extra = m3_template.replace("{#- Render messages -#}", "{{- ns_token }}\n{#- Render messages -#}", 1)
    with pytest.raises(engine.HybridTemplateError, match="ns_token outside"):
        engine.make_hybrid(extra)


# ------------------------------------------------------------------------------------------------
# the module
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def m3_gguf(tmp_path, m3_template):
    return write_gguf(tmp_path / "MiniMax-M3-tiny.gguf", template=m3_template)


def test_native_writes_the_template_byte_for_byte(tmp_path, m3_template):
    template = m3_template + "{#- non-ASCII kept: \u00e9\u4e2d -#}"  # and no trailing newline
    src = write_gguf(tmp_path / "m.gguf", template=template)
    dest = tmp_path / "chat.jinja"
    result = run_module(gct.main, dict(src=str(src), dest=str(dest), mode="native"))
    assert not result.get("failed"), result
    assert result["changed"] is True
    assert result["mode"] == "native" and result["template"] == str(dest)
    assert dest.read_bytes() == template.encode("utf-8")
    assert result["sha256"] == hashlib.sha256(template.encode("utf-8")).hexdigest() == result["native_sha256"]


def test_hybrid_mode_writes_make_hybrid_output(m3_gguf, tmp_path, hybrid):
    dest = tmp_path / "chat.jinja"
    result = run_module(gct.main, dict(src=str(m3_gguf), dest=str(dest), mode="hybrid"))
    assert not result.get("failed"), result
    assert result["changed"] is True and result["mode"] == "hybrid"
    assert dest.read_text() == hybrid
    assert result["sha256"] == hashlib.sha256(hybrid.encode()).hexdigest()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".chat.jinja")], "temp file left behind"


@pytest.mark.parametrize("mode", ["native", "hybrid"])
def test_second_run_changes_nothing(m3_gguf, tmp_path, mode):
    dest = tmp_path / "chat.jinja"
    first = run_module(gct.main, dict(src=str(m3_gguf), dest=str(dest), mode=mode))
    mtime = dest.stat().st_mtime_ns
    second = run_module(gct.main, dict(src=str(m3_gguf), dest=str(dest), mode=mode))
    assert not second.get("failed") and first["changed"] is True and second["changed"] is False
    assert second["sha256"] == first["sha256"]
    assert dest.stat().st_mtime_ns == mtime


def test_switching_mode_rewrites(m3_gguf, tmp_path, m3_template, hybrid):
    dest = tmp_path / "chat.jinja"
    run_module(gct.main, dict(src=str(m3_gguf), dest=str(dest), mode="hybrid"))
    result = run_module(gct.main, dict(src=str(m3_gguf), dest=str(dest), mode="native"))
    assert result["changed"] is True and dest.read_text() == m3_template
    result = run_module(gct.main, dict(src=str(m3_gguf), dest=str(dest), mode="hybrid"))
    assert result["changed"] is True and dest.read_text() == hybrid


def test_check_mode_writes_nothing(m3_gguf, tmp_path, hybrid):
    dest = tmp_path / "chat.jinja"
    args = dict(src=str(m3_gguf), dest=str(dest), mode="hybrid", file_mode="0640")
    result = run_module(gct.main, args, check_mode=True)
    assert not result.get("failed"), result
    assert result["changed"] is True
    assert result["sha256"] == hashlib.sha256(hybrid.encode()).hexdigest()
    assert not dest.exists()
    assert list(tmp_path.iterdir()) == [m3_gguf]


def test_check_mode_reports_no_change_when_up_to_date(m3_gguf, tmp_path):
    dest = tmp_path / "chat.jinja"
    run_module(gct.main, dict(src=str(m3_gguf), dest=str(dest), mode="hybrid"))
    result = run_module(gct.main, dict(src=str(m3_gguf), dest=str(dest), mode="hybrid"), check_mode=True)
    assert result["changed"] is False


def test_diff_mode_shows_before_and_after(m3_gguf, tmp_path, m3_template, hybrid):
    dest = tmp_path / "chat.jinja"
    result = run_module(gct.main, dict(src=str(m3_gguf), dest=str(dest), mode="native"), diff=True)
    text_diff = result["diff"][0]
    assert text_diff["before"] == "" and text_diff["after"] == m3_template
    result = run_module(gct.main, dict(src=str(m3_gguf), dest=str(dest), mode="hybrid"), check_mode=True, diff=True)
    text_diff = result["diff"][0]
    assert text_diff["before"] == m3_template and text_diff["after"] == hybrid
    assert dest.read_text() == m3_template  # check mode + diff: still nothing written
    no_diff = run_module(gct.main, dict(src=str(m3_gguf), dest=str(dest), mode="hybrid"))
    assert "diff" not in no_diff


def test_file_mode_is_applied_and_idempotent(m3_gguf, tmp_path):
    dest = tmp_path / "chat.jinja"
    result = run_module(gct.main, dict(src=str(m3_gguf), dest=str(dest), mode="hybrid", file_mode="0640"))
    assert stat.S_IMODE(dest.stat().st_mode) == 0o640
    os.chmod(dest, 0o600)
    result = run_module(gct.main, dict(src=str(m3_gguf), dest=str(dest), mode="hybrid", file_mode="0640"))
    assert result["changed"] is True and stat.S_IMODE(dest.stat().st_mode) == 0o640
    result = run_module(gct.main, dict(src=str(m3_gguf), dest=str(dest), mode="hybrid", file_mode="0640"))
    assert result["changed"] is False


@pytest.mark.parametrize("name", BLOCKS)
def test_module_fails_naming_the_block_and_writes_nothing(tmp_path, m3_template, name):
    src = write_gguf(tmp_path / "m.gguf", template=BREAK_BLOCK[name](m3_template))
    dest = tmp_path / "chat.jinja"
    result = run_module(gct.main, dict(src=str(src), dest=str(dest), mode="hybrid"))
    assert result.get("failed")
    assert "'%s'" % name in result["msg"]
    assert not dest.exists()


def test_module_refuses_a_non_m3_template_but_native_still_works(tmp_path, m2_template):
    src = write_gguf(tmp_path / "m2.gguf", template=m2_template, arch="minimax-m2")
    dest = tmp_path / "chat.jinja"
    result = run_module(gct.main, dict(src=str(src), dest=str(dest), mode="hybrid"))
    assert result.get("failed") and "not a MiniMax-M3 chat template" in result["msg"]
    assert not dest.exists()
    result = run_module(gct.main, dict(src=str(src), dest=str(dest), mode="native"))
    assert not result.get("failed") and dest.read_text() == m2_template


def test_existing_file_is_kept_when_the_hybrid_fails(tmp_path, m3_template):
    dest = tmp_path / "chat.jinja"
    dest.write_text("previous template")
    src = write_gguf(tmp_path / "m.gguf", template=BREAK_BLOCK["tool-call renderer"](m3_template))
    result = run_module(gct.main, dict(src=str(src), dest=str(dest), mode="hybrid"))
    assert result.get("failed") and dest.read_text() == "previous template"


def test_missing_gguf_fails_clearly(tmp_path):
    result = run_module(gct.main, dict(src=str(tmp_path / "nope.gguf"), dest=str(tmp_path / "t.jinja"), mode="native"))
    assert result.get("failed")
    assert "nope.gguf does not exist" in result["msg"]
    assert "Traceback" not in result["msg"]


def test_text_file_is_not_a_gguf(tmp_path):
    text = tmp_path / "model.gguf"
    text.write_text("<html>Access denied</html>\n")
    result = run_module(gct.main, dict(src=str(text), dest=str(tmp_path / "t.jinja"), mode="hybrid"))
    assert result.get("failed") and "is not a GGUF file" in result["msg"]
    assert not (tmp_path / "t.jinja").exists()


def test_truncated_gguf_fails_clearly(m3_gguf, tmp_path):
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(m3_gguf.read_bytes()[:200])
    result = run_module(gct.main, dict(src=str(truncated), dest=str(tmp_path / "t.jinja"), mode="native"))
    assert result.get("failed") and "cannot be read" in result["msg"] and "truncated" in result["msg"]


def test_gguf_without_template_fails_clearly(tmp_path):
    src = write_gguf(tmp_path / "m.gguf", template=None)
    result = run_module(gct.main, dict(src=str(src), dest=str(tmp_path / "t.jinja"), mode="native"))
    assert result.get("failed") and "tokenizer.chat_template" in result["msg"]


def test_missing_dest_directory_fails_clearly(m3_gguf, tmp_path):
    result = run_module(gct.main, dict(src=str(m3_gguf), dest=str(tmp_path / "no" / "t.jinja"), mode="native"))
    assert result.get("failed") and "does not exist" in result["msg"] and "create it first" in result["msg"]
    # In check mode the folder may not exist yet (the role creates it first): report the change.
    result = run_module(
        gct.main, dict(src=str(m3_gguf), dest=str(tmp_path / "no" / "t.jinja"), mode="native"), check_mode=True
    )
    assert not result.get("failed") and result["changed"] is True
    assert not (tmp_path / "no").exists()


def test_bad_mode_is_rejected(m3_gguf, tmp_path):
    result = run_module(gct.main, dict(src=str(m3_gguf), dest=str(tmp_path / "t.jinja"), mode="0644"))
    assert result.get("failed") and "native" in result["msg"] and "hybrid" in result["msg"]


# ------------------------------------------------------------------------------------------------
# family, auto and the chat format llama-server will use
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("template_name, m3_parser, mode, family, chat_format, alternative", [
    ("m3", True, "native", "m3", "peg-minimax-m3", "hybrid"),
    ("m3", False, "hybrid", "m3", "peg-native", "native"),
    ("m2", True, "native", "m2", "peg-native", ""),
    ("m2", False, "native", "m2", "peg-native", ""),
    ("plain", True, "native", "other", "peg-native", ""),
])
def test_auto_picks_by_the_template_family_and_the_build(
        tmp_path, m3_template, m2_template, template_name, m3_parser, mode, family, chat_format, alternative):
    text = {"m3": m3_template, "m2": m2_template,
            "plain": "{% for m in messages %}{{ m.content }}{% endfor %}"}[template_name]
    src = write_gguf(tmp_path / "model.gguf", text)
    result = run_module(gct.main, dict(src=str(src), dest=str(tmp_path / "t.jinja"), mode="auto", m3_parser=m3_parser))
    assert not result.get("failed"), result
    assert (result["mode"], result["family"], result["chat_format"], result["alternative"]) == (
        mode, family, chat_format, alternative)


def test_native_m3_on_a_build_without_the_parser_goes_to_the_autoparser(tmp_path, m3_template):
    src = write_gguf(tmp_path / "model.gguf", m3_template)
    result = run_module(gct.main, dict(src=str(src), dest=str(tmp_path / "t.jinja"), mode="native", m3_parser=False))
    assert (result["mode"], result["chat_format"]) == ("native", "peg-native")
    result = run_module(gct.main, dict(src=str(src), dest=str(tmp_path / "t.jinja"), mode="hybrid"))
    assert (result["mode"], result["chat_format"], result["alternative"]) == ("hybrid", "peg-native", "native")
