#!/usr/bin/python
"""Run a long-lived process as a service: a systemd unit, or a supervised process where there is no systemd."""

from __future__ import annotations

DOCUMENTATION = r"""
module: minimax_service
short_description: >-
  Run llama-server or the RPC server as a service, with or without systemd, and put back its last verified
  definition
description:
  - On a host whose PID 1 is systemd, writes C(/etc/systemd/system/<name>.service) (restart on failure,
    logs in the journal, enabled at boot), reloads systemd and starts, restarts or stops the unit.
  - Elsewhere (plain containers, CI) the same definition runs under the project's supervisor
    (C(<run_dir>/minimax-supervise), shipped by this module) with a pid file, a log file readable by its owner only,
    restart on failure.
  - A changed definition (command, environment, pre-start commands, fingerprint) restarts a running service.
  - O(wait_for) makes every start wait until those endpoints accept a TCP connection (the head waits for its
    RPC workers); O(pre_start) commands run before every start; O(watch_ports) restarts the service when a peer
    on one of those remote ports closes its connection (llama-server cannot reconnect to a restarted RPC worker).
  - O(state=verified) records the definition now running as the last verified one (with O(note));
    O(state=restored) puts that definition back and runs it, or stops and disables the service when none was
    ever recorded. A deployment that fails its checks is rolled back this way.
options:
  name: {description: Service name., type: str, required: true}
  description: {description: One line describing the service., type: str, default: ""}
  argv: {description: The command and its arguments (required to start)., type: list, elements: str}
  env: {description: Environment variables., type: dict, default: {}}
  wait_for:
    description: "Endpoints (C(host:port), C([v6]:port)) that must accept a TCP connection before each start."
    type: list
    elements: str
    default: []
  wait_timeout:
    description: "Seconds each start waits for O(wait_for) before it fails (and is retried)."
    type: int
    default: 600
  pre_start:
    description: "Commands (argv lists) run in order before each start; a failure fails the start."
    type: list
    elements: list
    default: []
  watch_ports:
    description: "Remote TCP ports whose connections, once closed by the peer, restart the service."
    type: list
    elements: int
    default: []
  watchdog:
    description:
      - Ask the server for a one-token completion every C(interval) seconds (C(POST <url>/completion); a server
        whose slot is busy answering a request counts as alive, one loading its model is not judged). When it does
        not answer within C(timeout) seconds the service is restarted; after C(restarts) restarts in a row without
        an answer it is left stopped, with a log (journal) line that says so. C(/health) alone is no proof.
      - "With systemd: a timer C(<name>-watchdog.timer) and its oneshot service; under the supervisor: the
        supervisor itself. Unset, or C(interval: 0), has no watchdog."
    type: dict
    suboptions:
      url: {description: The server's base URL (e.g. C(http://127.0.0.1:8891))., type: str}
      interval: {description: Seconds between two probes (0 - no watchdog)., type: int, default: 0}
      timeout: {description: Seconds a probe waits for the answer., type: int, default: 60}
      restarts:
        description: Restarts in a row without an answer before the service is left stopped.
        type: int
        default: 3
      key_file:
        description: File holding the API key the probe sends (never on a command line).
        type: path
        default: ""
  fingerprint:
    description: "Extra text that, when it changes, restarts the service (e.g. the chat template's sha256)."
    type: str
    default: ''
  restart_sec: {description: Seconds between a failure and the restart., type: int, default: 5}
  settle:
    description: >-
      After a (re)start, seconds to watch the process; if it exits in that time the service is stopped and the module
      fails with the log (a bad flag fails at once instead of restarting forever).
    type: int
    default: 0
  stop_timeout: {description: Seconds to wait for a clean stop before SIGKILL., type: int, default: 60}
  after:
    description: "systemd units this one starts after (and wants), on the same host."
    type: list
    elements: str
    default: []
  note:
    description: >-
      With O(state=verified): what was verified (template, model, ...), kept with the record and returned by
      O(state=restored).
    type: dict
    default: {}
  state:
    description:
      - C(started), C(stopped), C(restarted) as usual.
      - C(verified) records the running definition as the last verified one; it fails when the service is not running.
      - C(restored) puts the last verified definition back and runs it (settling like a start), or stops and
        disables the service when there is none; RV(restored) says which.
    type: str
    choices: [started, stopped, restarted, verified, restored]
    default: started
  enabled: {description: Start at boot (systemd only)., type: bool, default: true}
  manager:
    description: "Service manager; C(auto) picks systemd when it is PID 1."
    type: str
    choices: [auto, systemd, supervisor]
    default: auto
  run_dir:
    description: "Folder for definitions, pid files, verified records and the supervisor."
    type: path
    default: /opt/minimax-spark/services
  log_dir: {description: Log folder of supervised services., type: path, default: /var/log/minimax-spark}
extends_documentation_fragment:
  - minimax_attributes
attributes:
  check_mode:
    support: full
    details: Reports the definition, start, restart or stop it would make; writes and runs nothing.
  diff_mode:
    support: full
    details: The service definition before and after.
  platform:
    platforms: linux
"""

EXAMPLES = r"""
- name: Run the RPC server
  minimax_service:
    name: minimax-rpc-server
    argv: [/opt/minimax-spark/llama.cpp/current/bin/ggml-rpc-server, -H, 10.20.20.2, -p, "50052", -c]
    env: {LLAMA_CACHE: /var/lib/minimax-spark/rpc-cache}

- name: Run llama-server once its workers answer
  minimax_service:
    name: minimax-llama-server
    argv: [/opt/minimax-spark/llama.cpp/current/bin/llama-server, --rpc, "10.20.20.2:50052", --port, "8891"]
    wait_for: ["10.20.20.2:50052"]
    watch_ports: [50052]
    settle: 10

- name: Remember what passed the checks
  minimax_service:
    name: minimax-llama-server
    state: verified
    note: {template_sha256: "{{ template.sha256 }}"}

- name: Put the last verified deployment back
  minimax_service:
    name: minimax-llama-server
    state: restored
  register: restore
"""

RETURN = r"""
manager: {description: systemd or supervisor., type: str, returned: always}
definition: {description: Path of the unit file or the supervisor definition., type: str, returned: always}
definition_sha256:
  description: >-
    With O(state=verified), the sha256 of the definition file now recorded as verified (what a rollback compares
    the file on disk with to tell whether this service was changed since).
  type: str
  returned: when state is verified
pid:
  description: "Main process id (supervisor only, when running)."
  type: int
  returned: when running under the supervisor
log:
  description: "Log file (supervisor) or the journalctl command to read the log (systemd)."
  type: str
  returned: always
command:
  description: >-
    The command line, shell-quoted: the O(argv) given; with O(state=verified), the one the recorded definition runs
    (the unit's C(ExecStart=) as written, or the supervisor definition's argv).
  type: str
  returned: always
running: {description: Whether the service runs when the module returns., type: bool, returned: always}
verified:
  description: The last verified definition, if any.
  type: dict
  returned: always
  contains:
    exists: {description: Whether a verified definition was ever recorded., type: bool}
    verified_at: {description: When it was recorded., type: str}
    note: {description: The O(note) recorded with it., type: dict}
    serving: {description: Whether the service now runs exactly that definition., type: bool}
restored:
  description: "With O(state=restored), whether a verified definition was put back (false - the service was stopped)."
  type: bool
  returned: when state is restored
"""

import hashlib
import shlex

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.minimax_spark_service import (  # noqa: F401  (re-exported for the tests)
    SUPERVISOR_NAME,
    defined_command,
    definition,
    quote_systemd,
    render_unit,
    service_for,
    supervisor_path,
    supervisor_source,
)

ARGUMENT_SPEC = dict(
    name=dict(type="str", required=True),
    description=dict(type="str", default=""),
    argv=dict(type="list", elements="str"),
    env=dict(type="dict", default={}),
    wait_for=dict(type="list", elements="str", default=[]),
    wait_timeout=dict(type="int", default=600),
    pre_start=dict(type="list", elements="list", default=[]),
    watch_ports=dict(type="list", elements="int", default=[]),
    watchdog=dict(type="dict", options=dict(
        url=dict(type="str"),
        interval=dict(type="int", default=0),
        timeout=dict(type="int", default=60),
        restarts=dict(type="int", default=3),
        key_file=dict(type="path", default=""),
    )),
    fingerprint=dict(type="str", default=""),
    restart_sec=dict(type="int", default=5),
    settle=dict(type="int", default=0),
    stop_timeout=dict(type="int", default=60),
    after=dict(type="list", elements="str", default=[]),
    note=dict(type="dict", default={}),
    state=dict(type="str", choices=["started", "stopped", "restarted", "verified", "restored"], default="started"),
    enabled=dict(type="bool", default=True),
    manager=dict(type="str", choices=["auto", "systemd", "supervisor"], default="auto"),
    run_dir=dict(type="path", default="/opt/minimax-spark/services"),
    log_dir=dict(type="path", default="/var/log/minimax-spark"),
)


def main():
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        required_if=[("state", "started", ["argv"]), ("state", "restarted", ["argv"])],
        supports_check_mode=True,
    )
    params = module.params
    if params["argv"] is not None and not params["argv"]:
        module.fail_json(msg="argv is empty: give the command to run")
    service = service_for(module)
    extra = {}
    command = " ".join(shlex.quote(a) for a in params["argv"] or [])
    if params["state"] == "verified":
        record = service.mark_verified()
        result = service.result()
        command = defined_command(service.manager, record["files"].get(result["definition"], ""))
        extra["definition_sha256"] = file_sha256(result["definition"])
    elif params["state"] == "restored":
        extra["restored"] = service.restore() is not None
        result = service.result()
    else:
        result = service.apply()
    if module._diff:
        extra["diff"] = service.diff
    module.exit_json(
        changed=service.changed, manager=service.manager, name=params["name"],
        command=command,
        running=service.is_running(), verified=service.record_summary(service.read_record()),
        **result, **extra)


def file_sha256(path):
    """sha256 of the file at ``path`` ('' when it cannot be read: check mode before its first write)."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    except OSError:
        return ""
    return digest.hexdigest()


if __name__ == "__main__":
    main()
