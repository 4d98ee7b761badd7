#!/usr/bin/python
"""Write one local fact (facts.d) and return the node's local facts read back, in one module run."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: local_fact
short_description: Record a JSON local fact and return ansible_local read back
description:
  - Writes O(content) as JSON to C(<fact_path>/<name>.fact), atomically (a reader sees the old file or the new
    one), with mode C(0644), creating O(fact_path) (C(0755)) when it is missing.
  - A file that already holds this content (compared as JSON) is left as it is.
  - Returns the node's local facts read back as C(ansible.builtin.setup) with C(filter=ansible_local) reads them
    (every C(*.fact) file of O(fact_path), with the same collector), so the next task sees
    C(ansible_local[name]) without another module run. Pass C(delegate_facts=true) when the task is delegated,
    so the facts land on the node written to.
version_added: "1.0.0"
author: minimax-spark
options:
  name:
    description: The fact's name, the file's name without C(.fact) (letters, digits and C(_)).
    type: str
    required: true
  content:
    description: The fact.
    type: dict
    required: true
  fact_path:
    description: The local facts folder (C(ansible.builtin.setup)'s O(ansible.builtin.setup#module:fact_path)).
    type: path
    default: /etc/ansible/facts.d
extends_documentation_fragment:
  - minimax_attributes
attributes:
  check_mode:
    support: full
    details: Reports whether the file would change and writes nothing; the facts returned are those on disk.
  diff_mode:
    support: full
"""

EXAMPLES = r"""
- name: Record the plan for the roles that follow
  local_fact:
    name: minimax_plan
    content:
      ctx_size: 65536
      split: [34, 28]
  delegate_facts: true
"""

RETURN = r"""
path:
  description: The fact's file.
  type: str
  returned: always
ansible_facts:
  description: C(ansible_local), every local fact of the node read back (after the write).
  type: dict
  returned: success
"""

import json
import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_native
from ansible.module_utils.facts.system.local import LocalFactCollector
from ansible.module_utils.minimax_spark_files import write_atomic

NAME = re.compile(r"^[A-Za-z0-9_]+$")


def fact_text(content):
    """The file's text: what Ansible's to_nice_json writes, with a final newline."""
    return json.dumps(content, indent=4, sort_keys=True, separators=(",", ": ")) + "\n"


def read_fact(path):
    """(text, parsed) of the fact file; (None, None) when there is none, (text, None) when it is not JSON."""
    try:
        with open(path, "rb") as handle:
            text = handle.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return None, None
    try:
        return text, json.loads(text)
    except ValueError:
        return text, None


def run_module():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            content=dict(type="dict", required=True),
            fact_path=dict(type="path", default="/etc/ansible/facts.d"),
        ),
        supports_check_mode=True,
    )
    name = module.params["name"]
    folder = module.params["fact_path"]
    path = os.path.join(folder, "%s.fact" % name)
    result = dict(changed=False, path=path)
    if not NAME.match(name):
        module.fail_json(msg="name %r is not a fact name: use letters, digits and _ (it becomes ansible_local.NAME "
                             "and the file NAME.fact)" % name, **result)
    # The content as it reads back: JSON round trip, so that a tuple and a list, or 1 and 1.0, compare as on disk.
    want = json.loads(json.dumps(module.params["content"]))
    if os.path.exists(folder) and not os.path.isdir(folder):
        module.fail_json(msg="fact_path %s is not a folder: give the local facts folder (setup's fact_path, "
                             "default /etc/ansible/facts.d)" % folder, **result)
    before_text, before = read_fact(path)
    if before_text is None or before != want:
        text = fact_text(want)
        result["changed"] = True
        if module._diff:
            result["diff"] = dict(before=before_text or "", after=text,
                                  before_header=path if before_text is not None else "%s (absent)" % path,
                                  after_header=path)
        if not module.check_mode:
            try:
                if not os.path.isdir(folder):
                    os.makedirs(folder, mode=0o755)
                    os.chmod(folder, 0o755)
                write_atomic(path, text, mode=0o644, move=module.atomic_move)
            except OSError as exc:
                module.fail_json(msg="cannot write %s: %s" % (path, to_native(exc)), **result)
    local = LocalFactCollector().collect(module=module).get("local", {})
    module.exit_json(ansible_facts=dict(ansible_local=local), **result)


def main():
    run_module()


if __name__ == "__main__":
    main()
