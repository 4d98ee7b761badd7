"""Chat template engine of the gguf_chat_template module: MiniMax-M3 detection and the M3/M2 hybrid.

* ``template_family(text)``: ``m3``, ``m2`` or ``other``; ``pick_mode`` and ``predicted_chat_format``
  say which mode ``auto`` stands for and which chat format llama-server will log.
* ``make_hybrid(native_text)``: the native M3 template with MiniMax-M2's tool-call format transplanted
  into three blocks (``TRANSPLANTS``); raises ``HybridTemplateError`` naming what does not fit.
* ``template_for_mode(mode, native_bytes)``: the bytes to write for ``native`` or ``hybrid``.

Modules import it as ``from ansible.module_utils.minimax_spark_template import ...``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

# --------------------------------------------------------------------------------------------
# llama.cpp's template detection
# --------------------------------------------------------------------------------------------

#: MiniMax-M3's namespace token, written before every tag of a native M3 tool call.
M3_NAMESPACE_TOKEN = "]<]minimax[>["

#: llama.cpp selects its dedicated MiniMax-M3 parser (chat format ``peg-minimax-m3``) when the
#: template *source* contains all three of these strings (common/chat.cpp,
#: ``common_chat_try_specialized_template``: ``src.find("]<]minimax[>[") != npos &&
#: src.find("<tool_call>") != npos && src.find("<invoke name=") != npos``). A template that
#: misses any of them falls through to the differential autoparser (chat format ``peg-native``).
LLAMACPP_NATIVE_M3_TRIGGERS = (M3_NAMESPACE_TOKEN, "<tool_call>", "<invoke name=")

#: Strings that identify a native MiniMax-M3 template: the three parser triggers plus the
#: ``<mm:think>`` reasoning tag that M3 (not M2) was trained with.
M3_SHAPE_MARKERS = LLAMACPP_NATIVE_M3_TRIGGERS + ("<mm:think>",)

#: MiniMax-M2's tool-call block tokens, which the hybrid uses instead of ``ns_token ~ '<tool_call>'``.
M2_TOOLCALL_BEGIN = "<minimax:tool_call>"
M2_TOOLCALL_END = "</minimax:tool_call>"


def llamacpp_selects_native_m3_parser(src):
    """True when llama.cpp would route ``src`` to its native MiniMax-M3 parser."""
    return all(trigger in src for trigger in LLAMACPP_NATIVE_M3_TRIGGERS)


def template_family(text):
    """``m3`` (native MiniMax-M3), ``m2`` (MiniMax-M2's ``<minimax:tool_call>`` format) or ``other``."""
    if not m3_shape_problems(text):
        return "m3"
    if M2_TOOLCALL_BEGIN in text and M3_NAMESPACE_TOKEN not in text:
        return "m2"
    return "other"


def pick_mode(mode, family, m3_parser):
    """The mode ``auto`` stands for, given the template's family and the build."""
    return mode if mode != "auto" else ("hybrid" if family == "m3" and not m3_parser else "native")


def predicted_chat_format(mode, family, m3_parser):
    """The ``chat format:`` llama-server logs for the template written in ``mode``."""
    return "peg-minimax-m3" if mode == "native" and family == "m3" and m3_parser else "peg-native"


def m3_shape_problems(text):
    """The M3 markers missing from ``text`` (empty when it looks like a native M3 template)."""
    return [marker for marker in M3_SHAPE_MARKERS if marker not in text]


# --------------------------------------------------------------------------------------------
# The three transplants
# --------------------------------------------------------------------------------------------

# (1) Tool-call token definitions. Native M3 (models/templates/MiniMax-M3.jinja, lines 2-7):
#       {%- set ns_token               = ']<]minimax[>['                  -%}
#       {%- set bod_token / bos_token / eos_token ...                         -%}   (kept)
#       {%- set toolcall_begin_token   = ns_token ~ '<tool_call>'         -%}
#       {%- set toolcall_end_token     = ns_token ~ '</tool_call>'        -%}
#     The block runs from the ns_token definition to the toolcall_end_token definition; lines
#     in between that define other tokens are kept as they are. ns_token is dropped (after the
#     three transplants nothing uses it, and its value is one of llama.cpp's M3 triggers).
TOKEN_DEFS_PATTERN = re.compile(
    r"^[ \t]*\{%-?\s*set\s+ns_token\s*=\s*'\]<\]minimax\[>\['\s*-?%\}[ \t]*\n"
    r"(?P<kept>(?:^(?![ \t]*\{%-?\s*set\s+(?:ns_token|toolcall_(?:begin|end)_token)\b).*\n)*?)"
    r"^[ \t]*\{%-?\s*set\s+toolcall_begin_token\s*=\s*ns_token\s*~\s*'<tool_call>'\s*-?%\}[ \t]*\n"
    r"^[ \t]*\{%-?\s*set\s+toolcall_end_token\s*=\s*ns_token\s*~\s*'</tool_call>'\s*-?%\}[ \t]*\n",
    re.MULTILINE,
)
#: Each of these must occur exactly once in the native template (a repeated definition would
#: make the result depend on which one Jinja evaluates last).
TOKEN_DEFS_ANCHORS = (
    re.compile(r"\{%-?\s*set\s+ns_token\s*="),
    re.compile(r"\{%-?\s*set\s+toolcall_begin_token\s*="),
    re.compile(r"\{%-?\s*set\s+toolcall_end_token\s*="),
)
#: MiniMax-M2's token definitions (models/templates/MiniMax-M2.jinja, lines 2-3).
HYBRID_TOKEN_DEFS = (
    "{%- set toolcall_begin_token   = '" + M2_TOOLCALL_BEGIN + "'            -%}\n"
    "{%- set toolcall_end_token     = '" + M2_TOOLCALL_END + "'           -%}\n"
)

# (2) Tool instruction block. Native M3 (lines 127-141): the sentence
#       {{- 'To call tools, wrap all invocations in a single ' ~ toolcall_begin_token ~ ...
#     followed by the namespaced example call, up to and including the first
#       {{- toolcall_end_token }}
#     after it. It sits inside ``{%- if tools -%}``, after the ``<tools>`` list (kept).
TOOL_INSTRUCTIONS_PATTERN = re.compile(
    r"^(?P<indent>[ \t]*)\{\{-?\s*'To call tools, wrap all invocations in a single '[^\n]*\n"
    r"(?:.*\n)*?"
    r"[ \t]*\{\{-?\s*toolcall_end_token\s*-?\}\}[ \t]*\n",
    re.MULTILINE,
)
TOOL_INSTRUCTIONS_ANCHORS = (re.compile(re.escape("'To call tools, wrap all invocations in a single '")),)
#: MiniMax-M2's instruction and example (models/templates/MiniMax-M2.jinja, lines 69-76), written
#: as expressions in M3's style; it renders exactly the text M2 renders.
HYBRID_TOOL_INSTRUCTIONS = (
    "{{- 'When making tool calls, use XML format to invoke tools and pass parameters:' ~ '\\n' }}\n",
    "{{- '\\n' ~ toolcall_begin_token ~ '\\n' }}\n",
    "{{- '<invoke name=\"tool-name-1\">' ~ '\\n' }}\n",
    "{{- '<parameter name=\"param-key-1\">param-value-1</parameter>' ~ '\\n' }}\n",
    "{{- '<parameter name=\"param-key-2\">param-value-2</parameter>' ~ '\\n' }}\n",
    "{{- '...' ~ '\\n' }}\n",
    "{{- '</invoke>' ~ '\\n' }}\n",
    "{{- toolcall_end_token }}\n",
)

# (3) Renderer of past assistant tool calls. Native M3 (lines 174-190):
#       {{- toolcall_begin_token ~ '\n' }}
#       {%- for tool_call in message.tool_calls -%}  ... ns_token + '<' + k + '>' ... to_xml ...
#       {%- endfor -%}
#       {{- toolcall_end_token }}
#     The surrounding ``{%- if message.tool_calls -%}`` and the bookkeeping of
#     ``last_tool_call.name`` after it stay native.
TOOL_CALL_RENDERER_PATTERN = re.compile(
    r"^(?P<indent>[ \t]*)\{\{-?\s*toolcall_begin_token\s*~\s*'\\n'\s*-?\}\}[ \t]*\n"
    r"(?:[ \t]*\n)*"
    r"[ \t]*\{%-?\s*for\s+tool_call\s+in\s+message\.tool_calls\s*-?%\}[^\n]*\n"
    r"(?:.*\n)*?"
    r"[ \t]*\{\{-?\s*toolcall_end_token\s*-?\}\}[ \t]*\n",
    re.MULTILINE,
)
TOOL_CALL_RENDERER_ANCHORS = (re.compile(r"\{%-?\s*for\s+tool_call\s+in\s+message\.tool_calls\b"),)
#: MiniMax-M2's renderer (models/templates/MiniMax-M2.jinja, lines 104-120): one ``<invoke>`` per
#: call, one ``<parameter name=...>`` per argument, strings raw and other values as JSON. Like
#: native M3 it opens the block right after the content and skips None arguments.
HYBRID_TOOL_CALL_RENDERER = (
    "{{- toolcall_begin_token ~ '\\n' }}\n",
    "{%- for tool_call in message.tool_calls -%}\n",
    "    {%- if tool_call.function -%}\n",
    "        {%- set tool_call = tool_call.function -%}\n",
    "    {%- endif -%}\n",
    "    {{- '<invoke name=\"' + tool_call.name + '\">' ~ '\\n' }}\n",
    "    {%- for k, v in tool_call.arguments.items() if v is not none -%}\n",
    "        {{- '<parameter name=\"' + k + '\">' }}\n",
    "        {{- v | tojson(ensure_ascii=False) if v is not string else v }}\n",
    "        {{- '</parameter>' ~ '\\n' }}\n",
    "    {%- endfor -%}\n",
    "    {{- '</invoke>' ~ '\\n' }}\n",
    "{%- endfor -%}\n",
    "{{- toolcall_end_token }}\n",
)


def _indented(lines, indent):
    return "".join(indent + line for line in lines)


class HybridTemplateError(ValueError):
    """The native template cannot be turned into the hybrid; the message names the reason."""


@dataclass(frozen=True)
class Transplant:
    """One block of the native M3 template replaced by its MiniMax-M2 counterpart."""

    name: str
    pattern: re.Pattern[str]
    anchors: tuple[re.Pattern[str], ...]
    replacement: Callable[[re.Match[str]], str]


TRANSPLANTS = (
    Transplant(
        name="tool-call token definitions",
        pattern=TOKEN_DEFS_PATTERN,
        anchors=TOKEN_DEFS_ANCHORS,
        replacement=lambda m: m.group("kept") + HYBRID_TOKEN_DEFS,
    ),
    Transplant(
        name="tool instruction block",
        pattern=TOOL_INSTRUCTIONS_PATTERN,
        anchors=TOOL_INSTRUCTIONS_ANCHORS,
        replacement=lambda m: _indented(HYBRID_TOOL_INSTRUCTIONS, m.group("indent")),
    ),
    Transplant(
        name="tool-call renderer",
        pattern=TOOL_CALL_RENDERER_PATTERN,
        anchors=TOOL_CALL_RENDERER_ANCHORS,
        replacement=lambda m: _indented(HYBRID_TOOL_CALL_RENDERER, m.group("indent")),
    ),
)


def make_hybrid(native_text):
    """Return the MiniMax-M3 hybrid of the native M3 template ``native_text``.

    Raises :class:`HybridTemplateError` when the template is not M3-shaped, when a transplanted
    block is missing or repeated (the message names each such block), or when the result would
    still make llama.cpp pick the native M3 parser.
    """
    missing = m3_shape_problems(native_text)
    if missing:
        raise HybridTemplateError(
            "not a MiniMax-M3 chat template (it lacks %s); the hybrid is made only from the native "
            "M3 template" % ", ".join(repr(m) for m in missing)
        )

    problems = []
    matches = []
    for transplant in TRANSPLANTS:
        for anchor in transplant.anchors:
            count = len(anchor.findall(native_text))
            if count != 1:
                problems.append(
                    "block '%s': %r occurs %d times, expected exactly once" % (transplant.name, anchor.pattern, count)
                )
        found = list(transplant.pattern.finditer(native_text))
        if len(found) != 1:
            problems.append("block '%s' matched %d times, expected exactly once" % (transplant.name, len(found)))
        else:
            matches.append((found[0], transplant))
    if problems:
        raise HybridTemplateError(
            "the M3 template does not have the expected shape: %s" % "; ".join(_dedupe(problems))
        )

    matches.sort(key=lambda item: item[0].start())
    for (previous, prev_t), (current, cur_t) in zip(matches, matches[1:]):
        if current.start() < previous.end():
            raise HybridTemplateError("blocks '%s' and '%s' overlap" % (prev_t.name, cur_t.name))

    pieces = []
    position = 0
    for match, transplant in matches:
        pieces.append(native_text[position:match.start()])
        pieces.append(transplant.replacement(match))
        position = match.end()
    pieces.append(native_text[position:])
    hybrid = "".join(pieces)

    check_hybrid(hybrid)
    return hybrid


def check_hybrid(hybrid):
    """Raise :class:`HybridTemplateError` unless ``hybrid`` is a usable hybrid template."""
    if re.search(r"\bns_token\b", hybrid):
        raise HybridTemplateError(
            "the M3 template uses ns_token outside the three transplanted blocks; the hybrid would "
            "leave native M3 tool-call syntax in place"
        )
    leftovers = [t for t in LLAMACPP_NATIVE_M3_TRIGGERS[:2] if t in hybrid]
    if leftovers or llamacpp_selects_native_m3_parser(hybrid):
        raise HybridTemplateError(
            "the hybrid still contains %s, which make llama.cpp pick its native M3 parser"
            % ", ".join(repr(t) for t in leftovers)
        )
    for needed in (M2_TOOLCALL_BEGIN, "<mm:think>"):
        if needed not in hybrid:
            raise HybridTemplateError("the hybrid lacks %r" % needed)


def _dedupe(items):
    return list(dict.fromkeys(items))


def template_for_mode(mode, native_bytes):
    """The bytes to write for ``mode`` (``native`` or ``hybrid``) from the GGUF's template."""
    if mode == "native":
        return native_bytes
    if mode == "hybrid":
        try:
            native_text = native_bytes.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise HybridTemplateError("the GGUF's chat template is not valid UTF-8: %s" % exc) from exc
        return make_hybrid(native_text).encode("utf-8")
    raise ValueError("unknown template mode %r" % (mode,))
