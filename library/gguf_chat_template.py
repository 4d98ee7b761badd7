#!/usr/bin/python
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
  - minimax_attributes
notes:
  - Needs the C(gguf) Python package (and numpy) on the target.
  - The file attribute option C(mode) of the C(files) fragment is replaced by O(file_mode) here,
    because O(mode) selects the template.
  - Supports check mode and diff mode.
attributes:
  check_mode:
    support: full
    details: Reads the GGUF and compares the template with O(dest); writes nothing.
  diff_mode:
    support: full
    details: The template text before and after, and the file attributes that would change.
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
family:
  description: "The GGUF template's family - C(m3) (native MiniMax-M3), C(m2) (MiniMax-M2's format), C(other)."
  returned: success
  type: str
chat_format:
  description: >-
    The C(chat format:) llama-server logs for the written template with this build (C(peg-minimax-m3) or
    C(peg-native)).
  returned: success
  type: str
alternative:
  description: "The other mode worth trying when the canary fails (empty when none)."
  returned: success
  type: str
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

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_native
from ansible.module_utils.minimax_spark_files import write_atomic
from ansible.module_utils.minimax_spark_gguf import GGUFError, open_gguf
from ansible.module_utils.minimax_spark_template import (
    HybridTemplateError,
    pick_mode,
    predicted_chat_format,
    template_family,
    template_for_mode,
)

# --------------------------------------------------------------------------------------------
# The module
# --------------------------------------------------------------------------------------------


def _read_bytes(path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def _text(data):
    return data.decode("utf-8", errors="replace")


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
        result.update(mode=mode, family=family,
                      chat_format=predicted_chat_format(mode, family, module.params["m3_parser"]),
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
        try:
            unsafe = module.params["unsafe_writes"]
            write_atomic(dest, content, move=lambda tmp, path: module.atomic_move(tmp, path, unsafe_writes=unsafe))
        except Exception as exc:
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
