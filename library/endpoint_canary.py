#!/usr/bin/python
"""Prove llama-server's endpoint on every API surface: the tool-call canary, the tool results answered, reasoning."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: endpoint_canary
short_description: Prove llama-server's tool calls, tool-result turns and reasoning on every API it serves
description:
  - Sends the tool-call canary (C(What is the weather in Paris? Use the get_weather tool.), one C(get_weather) tool)
    to llama-server's three APIs, each in its own shape, not streamed and streamed - C(/v1/chat/completions),
    C(/v1/responses), C(/v1/messages) - and judges every reply the way that API's clients read it - a structured tool
    call with JSON-object arguments holding C(city), the stop reason clients loop on, the reasoning in that API's own
    field (C(reasoning_content), a C(reasoning) output item, a C(thinking) block) and no tool-call or reasoning
    markup in the text.
  - When the canary passes (and O(answers)), asks the plain question without tools and, on each API, the
    tool-result turn that answers that API's own tool call the way its clients do (replaying the reasoning on
    Responses and Messages), and judges those answers - HTTP errors, empty answers, markup in the text.
  - Never fails on a wrong endpoint - the verdict is the result (RV(ok), RV(msg)), so that the caller can recover
    (the verify role tries auto's other template, or puts the last verified deployment back). Every message names
    the API and mode that failed, what came back, what was served and what to do.
  - Changes nothing; it runs in check mode too, against the live endpoint.
version_added: "1.0.0"
author: minimax-spark
options:
  url:
    description: llama-server's base URL (C(http://HOST:PORT), no path).
    type: str
    required: true
  api_key:
    description: llama-server's API key (C(--api-key)); sent as a bearer token, and as C(x-api-key) on C(/v1/messages).
    type: str
    default: ""
  model:
    description: The model name sent in every request (llama-server's alias).
    type: str
    default: minimax-m3
  max_tokens:
    description: Token limit of every reply (C(max_tokens), C(max_output_tokens) on Responses).
    type: int
    default: 512
  timeout:
    description: Seconds to wait for each reply.
    type: int
    default: 600
  template_mode:
    description: The template mode that serves (the C(minimax_template) fact's C(mode)), named in every message.
    type: str
    default: unknown
  chat_format:
    description: The chat format llama-server picked (the C(minimax_template) fact's C(chat_format)), named in
      every message.
    type: str
    default: unknown
  answers:
    description: Also ask the plain question and the tool-result turns when the canary passes.
    type: bool
    default: true
notes:
  - Needs the Python C(requests) library on the node (Debian/Ubuntu package C(python3-requests); the common role
    installs it).
extends_documentation_fragment:
  - minimax_attributes
  - minimax_attributes.read_only
"""

EXAMPLES = r"""
- name: Prove the endpoint
  endpoint_canary:
    url: http://127.0.0.1:8891
    api_key: "{{ head_server_api_key }}"
    model: minimax-m3
    template_mode: "{{ ansible_local.minimax_template.mode | default('unknown') }}"
    chat_format: "{{ ansible_local.minimax_template.chat_format | default('unknown') }}"
  register: endpoint

- name: Fail on a wrong endpoint
  ansible.builtin.fail:
    msg: "{{ endpoint.msg }}"
  when: not endpoint.ok
"""

RETURN = r"""
ok:
  description: Whether the canary passed on every API and mode, and every answer asked after it is clean.
  returned: always
  type: bool
msg:
  description: The first failure's message (the canary's, else the answers'), or the canary's pass message.
  returned: always
  type: str
  sample: >-
    Tool-call canary passed on /v1/chat/completions, /v1/responses, /v1/messages, each streamed and not:
    get_weather({"city": "Paris"}). Served: template mode native, chat format peg-minimax-m3, at http://127.0.0.1:8891.
canary:
  description:
    - The canary's verdict, C({ok, kind, msg, tool_call, reasoning, surfaces}). C(kind) is C(ok) or the first
      failure's (C(unreachable), C(http), C(stream), C(length), C(markup), C(no_reasoning), C(no_tool_calls),
      C(wrong_name), C(bad_arguments), C(wrong_stop)); the fix in C(msg) is that kind's.
    - C(surfaces) holds each API and mode's verdict by label (C(/v1/messages (streamed))), C(tool_call) and
      C(reasoning) are the non-streamed chat reply's.
  returned: always
  type: dict
answers:
  description: The answers' verdict, C({ok, msg, asked, answers}); C(answers) maps each label (C(chat) for the
    plain question, C(/v1/responses tool-result turn)) to the text that came back. C(asked) is false when the
    canary failed (or O(answers) is false).
  returned: always
  type: dict
surfaces:
  description: The tool call each API and mode returned, by label.
  returned: always
  type: dict
  sample: {"/v1/messages (streamed)": {"name": "get_weather", "arguments": {"city": "Paris"}}}
tool_call:
  description: The non-streamed chat reply's tool call, its arguments parsed.
  returned: always
  type: dict
reasoning:
  description: The non-streamed chat reply's C(reasoning_content).
  returned: always
  type: str
chat:
  description: The answer to the plain question (empty when it was not asked).
  returned: always
  type: str
multi_turn:
  description: The answer of the chat completions tool-result turn (empty when it was not asked).
  returned: always
  type: str
tokens_per_second:
  description: Generation speed llama-server reported for the chat completions tool-result turn (null when none).
  returned: always
  type: float
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible.module_utils.minimax_spark_canary import run
from ansible.module_utils.minimax_spark_http import HAS_REQUESTS, REQUESTS_IMPORT_ERROR


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            api_key=dict(type="str", default="", no_log=True),
            model=dict(type="str", default="minimax-m3"),
            max_tokens=dict(type="int", default=512),
            timeout=dict(type="int", default=600),
            template_mode=dict(type="str", default="unknown"),
            chat_format=dict(type="str", default="unknown"),
            answers=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    if not HAS_REQUESTS:
        module.fail_json(msg=missing_required_lib("requests"), exception=str(REQUESTS_IMPORT_ERROR))
    p = module.params
    if p["max_tokens"] < 1 or p["timeout"] < 1:
        module.fail_json(msg="max_tokens and timeout must be at least 1 (got %s, %s)" % (p["max_tokens"], p["timeout"]))
    result = run(p["url"], api_key=p["api_key"], model=p["model"], max_tokens=p["max_tokens"], timeout=p["timeout"],
                 mode=p["template_mode"] or "unknown", chat_format=p["chat_format"] or "unknown", answers=p["answers"])
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
