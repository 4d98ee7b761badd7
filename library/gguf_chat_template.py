#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Write a GGUF's chat template to a file, either as shipped or as the MiniMax-M3 hybrid."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: gguf_chat_template
short_description: Write the chat template of a GGUF model, native or as the MiniMax-M3 hybrid
description:
  - Reads C(tokenizer.chat_template) from a GGUF file with the C(gguf) library and writes it to O(dest).
  - O(mode=native) writes the template byte for byte. Use it with a llama.cpp build that has the
    native MiniMax-M3 tool-call parser (llama.cpp PR 26210, chat format C(peg-minimax-m3)).
  - O(mode=hybrid) rewrites a MiniMax-M3 template so that its tool calls use MiniMax-M2's
    C(<minimax:tool_call><invoke name=...><parameter name=...>) format, which llama.cpp builds
    without the native M3 parser can parse (chat format C(peg-native)). Three blocks are replaced,
    the tool-call token definitions, the tool instruction block and the renderer of past assistant
    tool calls. Everything else (roles, C(<mm:think>) handling, the generation prompt, the
    C(<response>) tool results) stays native.
  - Each replaced block must occur exactly once in the native template; otherwise, or when the
    template is not MiniMax-M3-shaped, the module fails and writes nothing.
  - Writes through a temporary file and an atomic move; reports C(changed=false) when O(dest)
    already has the same content.
version_added: "1.0.0"
author: minimax-spark
options:
  src:
    description:
      - The GGUF file to read. For a split model, shard 1 (C(...-00001-of-0000N.gguf)), which holds the metadata.
    type: path
    required: true
  dest:
    description:
      - The template file to write. Its directory must exist.
    type: path
    required: true
  mode:
    description:
      - V(native) writes the GGUF's template unchanged; V(hybrid) writes the M3 template with
        MiniMax-M2's tool-call format (see the description).
      - V(auto) picks by the template's family and the build, see RV(family) and O(m3_parser) -
        C(native) for a MiniMax-M3 template when the build has the M3 parser, C(hybrid) for one when it
        has not, C(native) for any other template (M2's, ...; the hybrid is made only from M3's).
      - Not the file permissions; use O(file_mode) for those.
    type: str
    required: true
    choices: [auto, native, hybrid]
    aliases: [template_mode]
  m3_parser:
    description:
      - Whether the llama.cpp build has the native MiniMax-M3 tool-call parser (the build manifest's
        C(has_m3_parser)); decides V(auto) and the RV(chat_format) reported.
    type: bool
    default: true
  file_mode:
    description:
      - Permissions of O(dest), as the C(mode) option of M(ansible.builtin.file) takes them.
    type: raw
extends_documentation_fragment:
  - files
notes:
  - Needs the C(gguf) Python package (and numpy) on the target.
  - The file attribute option C(mode) of the C(files) fragment is replaced by O(file_mode) here,
    because O(mode) selects the template.
  - Supports check mode and diff mode.
"""

EXAMPLES = r"""
- name: Write the hybrid template for a llama.cpp build without the native M3 parser
  gguf_chat_template:
    src: /var/lib/minimax-spark/models/UD-IQ4_XS/MiniMax-M3-UD-IQ4_XS-00001-of-00006.gguf
    dest: /var/lib/minimax-spark/templates/chat-template.jinja
    mode: hybrid
    file_mode: "0644"

- name: Write the template exactly as the GGUF ships it
  gguf_chat_template:
    src: /var/lib/minimax-spark/models/model.gguf
    dest: /var/lib/minimax-spark/templates/chat-template.jinja
    mode: native
"""

RETURN = r"""
template:
  description: >-
    The template file. (Not returned as C(dest): Ansible would then add the file's attributes to the
    result, and their C(mode), the permissions, would hide the template mode.)
  returned: always
  type: str
  sample: /var/lib/minimax-spark/templates/chat-template.jinja
mode:
  description: The template mode written (with O(mode=auto), the one it picked).
  returned: always
  type: str
  sample: hybrid
family: {description: "The GGUF template's family - C(m3) (native MiniMax-M3), C(m2) (MiniMax-M2's format), C(other).", returned: success, type: str}
chat_format:
  description: The C(chat format:) llama-server logs for the written template with this build (C(peg-minimax-m3) or C(peg-native)).
  returned: success
  type: str
alternative: {description: The other mode worth trying when the canary fails (empty when none)., returned: success, type: str}
sha256:
  description: SHA-256 of the template content now at O(dest) (in check mode, of the content it would get).
  returned: success
  type: str
native_sha256:
  description: SHA-256 of C(tokenizer.chat_template) as stored in the GGUF.
  returned: success
  type: str
size:
  description: Size in bytes of the template content.
  returned: success
  type: int
"""

import hashlib
import os
import re
import tempfile
from dataclasses import dataclass
from typing import Callable, Tuple

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_native

from ansible.module_utils.minimax_spark_gguf import GGUFError, open_gguf

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
class Transplant(object):
    """One block of the native M3 template replaced by its MiniMax-M2 counterpart."""

    name: str
    pattern: "re.Pattern[str]"
    anchors: Tuple["re.Pattern[str]", ...]
    replacement: Callable[["re.Match[str]"], str]


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
            raise HybridTemplateError("the GGUF's chat template is not valid UTF-8: %s" % exc)
        return make_hybrid(native_text).encode("utf-8")
    raise ValueError("unknown template mode %r" % (mode,))


# --------------------------------------------------------------------------------------------
# The module
# --------------------------------------------------------------------------------------------


def _read_bytes(path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


_text = lambda data: data.decode("utf-8", errors="replace")  # noqa: E731


def run_module():
    module = AnsibleModule(
        argument_spec=dict(
            src=dict(type="path", required=True),
            dest=dict(type="path", required=True),
            mode=dict(type="str", required=True, choices=["auto", "native", "hybrid"], aliases=["template_mode"]),
            m3_parser=dict(type="bool", default=True),
            file_mode=dict(type="raw"),
        ),
        add_file_common_args=True,
        supports_check_mode=True,
    )
    src = module.params["src"]
    dest = module.params["dest"]
    mode = module.params["mode"]
    result = dict(changed=False, template=dest, mode=mode)

    try:
        native = open_gguf(src).chat_template_bytes
        family = template_family(_text(native))
        mode = pick_mode(mode, family, module.params["m3_parser"])
        result.update(mode=mode, family=family, chat_format=predicted_chat_format(mode, family, module.params["m3_parser"]),
                      alternative={"native": "hybrid", "hybrid": "native"}[mode] if family == "m3" else "")
        content = template_for_mode(mode, native)
    except GGUFError as exc:
        module.fail_json(msg=to_native(exc), **result)
    except HybridTemplateError as exc:
        module.fail_json(msg="cannot make the hybrid template from %s: %s" % (src, to_native(exc)), **result)

    if os.path.isdir(dest):
        module.fail_json(msg="dest %s is a directory; give the path of the template file" % dest, **result)
    dest_dir = os.path.dirname(os.path.abspath(dest))
    current = None
    if os.path.isdir(dest_dir):
        try:
            current = _read_bytes(dest)
        except OSError as exc:
            module.fail_json(msg="cannot read %s: %s" % (dest, to_native(exc)), **result)
    elif not module.check_mode:
        # In check mode a missing folder is fine: a task before this one would create it.
        module.fail_json(msg="directory %s for dest does not exist; create it first" % dest_dir, **result)
    changed = current != content

    result.update(
        sha256=hashlib.sha256(content).hexdigest(),
        native_sha256=hashlib.sha256(native).hexdigest(),
        size=len(content),
    )
    text_diff = dict(
        before_header=dest if current is not None else "%s (absent)" % dest,
        after_header="%s (%s template from %s)" % (dest, mode, src),
        before=_text(current) if current is not None else "",
        after=_text(content),
    )

    if changed and not module.check_mode:
        fd, tmp_path = tempfile.mkstemp(dir=dest_dir, prefix=".%s." % os.path.basename(dest), suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(content)
            module.atomic_move(tmp_path, dest, unsafe_writes=module.params["unsafe_writes"])
        except Exception as exc:
            if os.path.exists(tmp_path):
                os.unlink(tmp_path)
            module.fail_json(msg="cannot write %s: %s" % (dest, to_native(exc)), **result)

    attr_diff = {}
    if os.path.exists(dest):
        file_args = module.load_file_common_arguments(dict(module.params, mode=module.params["file_mode"]), path=dest)
        changed = module.set_fs_attributes_if_different(file_args, changed, diff=attr_diff)
    elif module.check_mode and module.params["file_mode"] is not None:
        attr_diff = dict(before={}, after=dict(mode=module.params["file_mode"]))

    result["changed"] = changed
    if module._diff:
        result["diff"] = [text_diff, attr_diff] if attr_diff else [text_diff]
    module.exit_json(**result)


def main():
    run_module()


if __name__ == "__main__":
    main()
