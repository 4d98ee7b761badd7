#!/usr/bin/python
"""Judge a llama-server start from its own log: every RPC worker holds its share, and the context is the one asked."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: llama_server_log
short_description: Prove from llama-server's log that every RPC worker holds its share and the context is served
description:
  - >-
    Reads what llama-server logged since its start (the supervisor's log file, or the systemd journal of its
    unit) and judges it. On a start that answered C(/health) (O(loaded=true)) every endpoint in the command
    line's C(--rpc) must hold a model buffer (the line C(load_tensors - RPC0[HOST:PORT] model buffer size = X MiB))
    near the share the recorded plan gives it, and no C(RPC server version mismatch), C(Failed to connect),
    C(RPC handshake failed) or C(Remote RPC server crashed or returned malformed response) line may be in the
    log; otherwise the head serves without a worker (llama.cpp goes on without a device it could not use).
  - >-
    With O(url), the context per slot llama-server serves (C(/props) C(default_generation_settings.n_ctx)) must
    be the command line's C(--ctx-size) shared by its C(--parallel) slots (each padded to 256 as llama.cpp does),
    naming llama-server's own capping line when it logged one.
  - On a start that failed (O(loaded=false)) it names the worker that made it fail, if the log says one did.
  - >-
    Each worker the log blames (or that holds nothing) is asked the RPC hello as llama-server asks it, so the
    verdict says what answers at its address (nothing, a program that is not an RPC server, an RPC server of
    another protocol or without devices).
  - >-
    Never fails on a bad verdict; RV(ok) and RV(message) carry it. Fails only when the log or the command line
    cannot be read.
version_added: "1.0.0"
author: minimax-spark
options:
  service:
    description:
      - The service running llama-server (C(minimax_service)'s O(name)) - its log (the supervisor's log file, or its
        systemd unit's journal) and its definition (the command line) are read. One of O(service) and O(log) is
        required.
    type: str
  manager:
    description: How O(service) runs; C(auto) - systemd when it is PID 1 (as C(minimax_service) decides).
    type: str
    choices: [auto, systemd, supervisor]
    default: auto
  run_dir:
    description: Folder of the supervisor's service definitions (C(minimax_service)'s O(run_dir)).
    type: path
    default: /opt/minimax-spark/services
  log_dir:
    description: Folder of supervised services' logs (C(minimax_service)'s O(log_dir)).
    type: path
    default: /var/log/minimax-spark
  log:
    description: A log file to read instead of O(service)'s.
    type: path
  offset:
    description:
      - Byte offset of a log file where the start began; after a failed start everything after it is read (every
        restart since).
      - Negative - the last start only (from the supervisor's last C(starting:) line).
    type: int
    default: -1
  since:
    description:
      - With systemd, epoch seconds the start began. A failed start is judged from the journal since then; a loaded
        one from its unit's current run (since then when that cannot be told).
    type: float
    default: 0
  argv:
    description: llama-server's command line; by default the one in O(service)'s definition.
    type: list
    elements: str
  workers:
    description:
      - Each worker's inventory name and what it recorded of its RPC server (C(ansible_local.minimax_rpc) -
        C(endpoint), C(service)), so the verdict names the worker of an endpoint.
    type: dict
    default: {}
  plan:
    description: The recorded placement plan (C(ansible_local.minimax_plan)); its worker rows give each share.
    type: dict
    default: {}
  tolerance:
    description: How far (a fraction of the planned share, besides the plan's rounding) a worker's buffer may be.
    type: float
    default: 0.1
  loaded:
    description: Whether llama-server answered C(/health) (true), or its start failed (false).
    type: bool
    default: true
  url:
    description: llama-server's base URL, to read C(/props); empty - the context is not checked.
    type: str
    default: ""
  api_key_file:
    description: File holding the API key C(/props) needs; empty - none.
    type: path
    default: ""
  probe:
    description: Ask the blamed workers' endpoints the RPC hello, to say what answers there.
    type: bool
    default: true
  probe_timeout:
    description: Seconds each probe waits for an answer.
    type: int
    default: 5
notes:
  - Reads only. A probe opens one connection to a worker that the log blames or that holds nothing.
extends_documentation_fragment:
  - minimax_attributes
attributes:
  check_mode:
    support: full
    details: Reads and judges in check mode as in a real run.
  platform:
    platforms: linux
"""

EXAMPLES = r"""
- name: Prove every worker holds its share
  llama_server_log:
    service: minimax-llama-server
    workers:
      spark-2: {endpoint: "10.20.20.2:50052", service: minimax-rpc-server}
    plan: "{{ ansible_local.minimax_plan }}"
    url: http://127.0.0.1:8891
  register: verdict

- name: Stop on a head that serves alone
  ansible.builtin.fail:
    msg: "{{ verdict.message }}"
  when: not verdict.ok
"""

RETURN = r"""
ok:
  description: The start is what was asked - every worker holds its share and the context is served.
  type: bool
  returned: always
message:
  description: What is wrong, naming each worker, its address, llama.cpp's line and the fix (empty when ok).
  type: str
  returned: always
problems:
  description: One entry per problem.
  type: list
  elements: dict
  returned: always
  contains:
    worker:
      description: The worker's inventory name (empty when no worker recorded the endpoint).
      type: str
    endpoint:
      description: Its C(host:port).
      type: str
    kind:
      description: One of version, connect, handshake, malformed, missing, share, unlogged, context.
      type: str
    line:
      description: The line llama.cpp logged (empty when none).
      type: str
    answered:
      description: What answers at the endpoint (the probe), in words.
      type: str
    fix:
      description: What to do.
      type: str
buffers:
  description: MiB of model weights on each endpoint, from llama.cpp's log.
  type: dict
  returned: always
context:
  description: >-
    The context per slot - C(expected) from the command line, C(served) from /props, and llama-server's
    C(capping) line.
  type: dict
  returned: always
endpoints:
  description: The C(--rpc) endpoints of the command line, in order.
  type: list
  elements: str
  returned: always
answers:
  description: What each probed endpoint answered (C(kind), C(version), C(devices), C(sample)).
  type: dict
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.minimax_spark_serverlog import (
    ServerLogError,
    argv_from_definition,
    command_settings,
    current_start,
    message,
    parse_log,
    planned_shares,
    probe_rpc,
    read_journal,
    read_log_file,
    served_context,
    to_check,
    verdict,
    where,
)

ARGUMENT_SPEC = dict(
    service=dict(type="str"),
    manager=dict(type="str", choices=["auto", "systemd", "supervisor"], default="auto"),
    run_dir=dict(type="path", default="/opt/minimax-spark/services"),
    log_dir=dict(type="path", default="/var/log/minimax-spark"),
    log=dict(type="path"),
    offset=dict(type="int", default=-1),
    since=dict(type="float", default=0),
    argv=dict(type="list", elements="str"),
    workers=dict(type="dict", default={}),
    plan=dict(type="dict", default={}),
    tolerance=dict(type="float", default=0.1),
    loaded=dict(type="bool", default=True),
    url=dict(type="str", default=""),
    api_key_file=dict(type="path", default=""),
    probe=dict(type="bool", default=True),
    probe_timeout=dict(type="int", default=5),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True,
                           required_one_of=[("service", "log")], required_by={"log": ("argv",)})
    p = module.params
    log, unit, definition = where(p["service"], p["manager"], p["run_dir"], p["log_dir"], p["log"])
    try:
        argv = p["argv"]
        if argv is None:
            with open(definition) as handle:
                argv = argv_from_definition(handle.read())
        settings = command_settings(argv)
    except (OSError, ValueError, ServerLogError) as exc:
        module.fail_json(msg="cannot read llama-server's command line: %s" % exc)
    if log:
        try:
            text = read_log_file(log, p["offset"])
        except OSError as exc:
            module.fail_json(msg="cannot read llama-server's log %s: %s" % (log, exc))
        if p["loaded"] or p["offset"] < 0:
            text = current_start(text)
    else:
        try:
            text = read_journal(unit, p["since"], p["loaded"])
        except OSError as exc:
            module.fail_json(msg="cannot read the journal of %s: %s" % (unit, exc))
    workers = [{"name": name, "endpoint": str((fact or {}).get("endpoint", "")),
                "service": str((fact or {}).get("service", ""))} for name, fact in p["workers"].items()]
    parsed = parse_log(text, settings["model"])
    answers = {}
    if p["probe"]:
        for endpoint in to_check(parsed, settings["rpc"], p["loaded"]):
            answers[endpoint] = probe_rpc(endpoint, p["probe_timeout"])
    served = None
    if p["url"] and p["loaded"]:
        try:
            served = served_context(p["url"], p["api_key_file"])
        except Exception as exc:  # noqa: BLE001 - any failure to read /props is reported, not raised
            module.fail_json(msg="cannot read %s/props: %s" % (p["url"].rstrip("/"), exc))
    result = verdict(parsed, settings, workers=workers, shares=planned_shares(p["plan"], settings),
                     tolerance=p["tolerance"], answers=answers, served_ctx=served, loaded=p["loaded"],
                     probe_timeout=p["probe_timeout"])
    module.exit_json(changed=False, ok=result["ok"], message=message(result, p["loaded"]), problems=[
        {k: v for k, v in prob.items() if k != "text"} for prob in result["problems"]],
        buffers=parsed["buffers"], context=result["context"], endpoints=settings["rpc"],
        answers=answers)


if __name__ == "__main__":
    main()
