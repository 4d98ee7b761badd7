#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Run a long-lived process as a service: a systemd unit, or a supervised process where there is no systemd."""

from __future__ import annotations

DOCUMENTATION = r"""
module: minimax_service
short_description: Run llama-server or the RPC server as a service, with or without systemd
description:
  - On a host whose PID 1 is systemd, writes C(/etc/systemd/system/<name>.service) (restart on failure,
    logs in the journal, enabled at boot), reloads systemd and starts, restarts or stops the unit.
  - Elsewhere (plain containers, CI) the same definition runs under a small supervisor
    (C(<run_dir>/minimax-supervise)): a pid file, a log file, restart on failure.
  - A changed definition (command, environment, fingerprint) restarts a running service.
  - C(pre_start) commands run before every start (the head waits there for its workers);
    C(watch_ports) restarts the service when a peer on one of those remote ports closes its connection
    (llama-server cannot reconnect to a restarted RPC worker).
options:
  name: {description: Service name., type: str, required: true}
  description: {description: One line describing the service., type: str, default: ""}
  argv: {description: The command and its arguments., type: list, elements: str}
  env: {description: Environment variables., type: dict, default: {}}
  pre_start: {description: Commands (argv lists) run in order before each start; a failure fails the start., type: list, elements: list, default: []}
  watch_ports: {description: Remote TCP ports whose connections, once closed by the peer, restart the service., type: list, elements: int, default: []}
  fingerprint: {description: Extra text that, when it changes, restarts the service (e.g. the chat template's sha256)., type: str, default: ""}
  restart_sec: {description: Seconds between a failure and the restart., type: int, default: 5}
  settle: {description: After a (re)start, seconds to watch the process; if it exits in that time the service is stopped and the module fails with the log (a bad flag fails at once instead of restarting forever)., type: int, default: 0}
  stop_timeout: {description: Seconds to wait for a clean stop before SIGKILL., type: int, default: 60}
  after: {description: systemd units this one starts after (and wants), on the same host., type: list, elements: str, default: []}
  state: {description: Desired state., type: str, choices: [started, stopped, restarted], default: started}
  enabled: {description: Start at boot (systemd only)., type: bool, default: true}
  manager: {description: Service manager; C(auto) picks systemd when it is PID 1., type: str, choices: [auto, systemd, supervisor], default: auto}
  run_dir: {description: Folder for definitions, pid files and the supervisor., type: path, default: /opt/minimax-spark/services}
  log_dir: {description: Log folder of supervised services., type: path, default: /var/log/minimax-spark}
"""

EXAMPLES = r"""
- name: Run the RPC server
  minimax_service:
    name: minimax-rpc-server
    argv: [/opt/minimax-spark/llama.cpp/current/bin/ggml-rpc-server, -H, 10.20.20.2, -p, "50052", -c]
    env: {LLAMA_CACHE: /var/lib/minimax-spark/rpc-cache}
"""

RETURN = r"""
manager: {description: systemd or supervisor., type: str, returned: always}
definition: {description: Path of the unit file or the supervisor definition., type: str, returned: always}
pid: {description: Main process id (supervisor only, when running)., type: int, returned: when running under the supervisor}
log: {description: Log file (supervisor) or the journalctl command to read the log (systemd)., type: str, returned: always}
"""

import json
import os
import shlex
import signal
import subprocess
import sys
import time

from ansible.module_utils.basic import AnsibleModule

# The supervisor that runs a service where there is no systemd. Installed as a file so it
# outlives this module's run. Subcommands: run DEF, wait-tcp HOST:PORT... --timeout S, watch.
SUPERVISOR = r'''#!/usr/bin/env python3
"""minimax-spark supervisor: runs one service definition, restarts it on failure."""
import json, os, signal, socket, subprocess, sys, time


def log(msg):
    print("[minimax-supervise] %s %s" % (time.strftime("%Y-%m-%dT%H:%M:%S"), msg), flush=True)


def closed_by_peer(pid, ports):
    """True when a socket of process pid talks to one of ports and the peer has closed it (CLOSE_WAIT)."""
    inodes = set()
    try:
        for fd in os.listdir("/proc/%d/fd" % pid):
            try:
                target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                next(handle)
                for line in handle:
                    fields = line.split()
                    port = int(fields[2].rsplit(":", 1)[1], 16)
                    if fields[3] == "08" and port in ports and fields[9] in inodes:
                        return True
        except OSError:
            continue
    return False


def wait_tcp(endpoints, timeout):
    deadline = time.time() + timeout
    pending = list(endpoints)
    while pending:
        host, port = pending[0].rsplit(":", 1)
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=2).close()
            log("%s answers" % pending.pop(0))
        except OSError:
            if time.time() > deadline:
                log("%s did not answer within %d s" % (pending[0], timeout))
                return 1
            time.sleep(1)
    return 0


def run(path):
    with open(path) as handle:
        spec = json.load(handle)
    env = dict(os.environ, **spec.get("env", {}))
    child = {"proc": None, "stop": False}

    def on_term(signum, frame):
        child["stop"] = True
        if child["proc"] and child["proc"].poll() is None:
            child["proc"].terminate()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    delay = spec.get("restart_sec", 5)
    while not child["stop"]:
        ok = True
        for cmd in spec.get("pre_start", []):
            log("pre-start: %s" % " ".join(cmd))
            if subprocess.call(cmd, env=env) != 0:
                ok = False
                break
        if ok and not child["stop"]:
            log("starting: %s" % " ".join(spec["argv"]))
            child["proc"] = proc = subprocess.Popen(spec["argv"], env=env, cwd=spec.get("working_dir") or "/")
            while proc.poll() is None:
                time.sleep(1)
                if spec.get("watch_ports") and closed_by_peer(proc.pid, set(spec["watch_ports"])):
                    log("a worker closed its connection: restarting")
                    proc.terminate()
                    try:
                        proc.wait(spec.get("stop_timeout", 60))
                    except subprocess.TimeoutExpired:
                        proc.kill()
            if child["stop"]:
                try:
                    proc.wait(spec.get("stop_timeout", 60))
                except subprocess.TimeoutExpired:
                    proc.kill()
                break
            log("exited with status %s" % proc.returncode)
            if proc.returncode == 0:
                break
        if not child["stop"]:
            log("restarting in %d s" % delay)
            time.sleep(delay)
    log("stopped")
    return 0


def watch(unit, ports, interval):
    """systemd hosts: restart UNIT when its main process has a connection closed by a peer on PORTS."""
    while True:
        time.sleep(interval)
        try:
            pid = int(subprocess.check_output(["systemctl", "show", "-p", "MainPID", "--value", unit]).strip() or 0)
        except (subprocess.CalledProcessError, ValueError):
            continue
        if pid and closed_by_peer(pid, ports):
            log("a worker closed its connection to %s: restarting it" % unit)
            subprocess.call(["systemctl", "restart", unit])


if __name__ == "__main__":
    if sys.argv[1] == "run":
        sys.exit(run(sys.argv[2]))
    if sys.argv[1] == "wait-tcp":
        args = sys.argv[2:]
        timeout = 3600
        if "--timeout" in args:
            i = args.index("--timeout")
            timeout = int(args[i + 1])
            del args[i:i + 2]
        sys.exit(wait_tcp(args, timeout))
    if sys.argv[1] == "watch":
        sys.exit(watch(sys.argv[2], {int(p) for p in sys.argv[3].split(",")}, int(sys.argv[4]) if len(sys.argv) > 4 else 5))
    sys.exit("usage: minimax-supervise run DEF | wait-tcp HOST:PORT... [--timeout S] | watch UNIT PORTS [INTERVAL]")
'''

UNIT_DIR = "/etc/systemd/system"


def supervisor_path(run_dir):
    return os.path.join(run_dir, "minimax-supervise")


def systemd_running():
    return os.path.isdir("/run/systemd/system")


def definition(params):
    """What the service is: everything whose change must restart it."""
    return {
        "name": params["name"],
        "description": params["description"],
        "argv": params["argv"],
        "env": {k: str(v) for k, v in sorted(params["env"].items())},
        "pre_start": [[str(a) for a in cmd] for cmd in params["pre_start"]],
        "watch_ports": params["watch_ports"],
        "fingerprint": params["fingerprint"],
        "restart_sec": params["restart_sec"],
        "stop_timeout": params["stop_timeout"],
    }


def quote_systemd(arg, exec_line=True):
    """Quote one word for a unit line (systemd unquotes C-style double quotes and expands %; Exec lines
    also expand $, Environment= lines do not)."""
    arg = arg.replace("%", "%%")
    if exec_line:
        arg = arg.replace("$", "$$")
    if arg and all(c.isalnum() or c in "-_./:=,+@" for c in arg):
        return arg
    return '"%s"' % arg.replace("\\", "\\\\").replace('"', '\\"')


def render_unit(params, supervisor):
    spec = definition(params)
    lines = [
        "# Managed by minimax-spark (minimax_service). Local changes are overwritten.",
        "[Unit]",
        "Description=%s" % (spec["description"] or spec["name"]),
        "After=%s" % " ".join(["network-online.target"] + params["after"]),
        "Wants=%s" % " ".join(["network-online.target"] + params["after"]),
        "StartLimitIntervalSec=0",
        "",
        "[Service]",
        "Type=simple",
    ]
    for key, value in spec["env"].items():
        lines.append("Environment=%s" % quote_systemd("%s=%s" % (key, value), exec_line=False))
    if spec["fingerprint"]:
        lines.append("Environment=MINIMAX_SPARK_FINGERPRINT=%s" % quote_systemd(spec["fingerprint"], exec_line=False))
    for cmd in spec["pre_start"]:
        lines.append("ExecStartPre=%s" % " ".join(quote_systemd(a) for a in cmd))
    lines += [
        "ExecStart=%s" % " ".join(quote_systemd(a) for a in spec["argv"]),
        "Restart=on-failure",
        "RestartSec=%d" % spec["restart_sec"],
        "TimeoutStartSec=infinity",
        "TimeoutStopSec=%d" % spec["stop_timeout"],
        "LimitNOFILE=1048576",
        "LimitMEMLOCK=infinity",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    units = {spec["name"] + ".service": "\n".join(lines)}
    if spec["watch_ports"]:
        units[spec["name"] + "-watch.service"] = "\n".join([
            "# Managed by minimax-spark (minimax_service). Local changes are overwritten.",
            "[Unit]",
            "Description=Restart %s when an RPC worker drops its connection" % spec["name"],
            "BindsTo=%s.service" % spec["name"],
            "After=%s.service" % spec["name"],
            "",
            "[Service]",
            "ExecStart=/usr/bin/python3 %s watch %s.service %s" % (
                supervisor, spec["name"], ",".join(str(p) for p in spec["watch_ports"])),
            "Restart=always",
            "RestartSec=5",
            "",
            "[Install]",
            "WantedBy=%s.service" % spec["name"],
            "",
        ])
    return units


class Service:
    def __init__(self, module):
        self.module = module
        self.params = module.params
        self.name = self.params["name"]
        self.run_dir = self.params["run_dir"]
        self.changed = False
        self.diff = {"before": "", "after": ""}

    def write(self, path, text, mode=0o644):
        """Write text atomically when it differs; return True when it did (or would, in check mode)."""
        try:
            with open(path) as handle:
                current = handle.read()
        except OSError:
            current = None
        if current == text:
            return False
        self.diff["before"] += current or ""
        self.diff["after"] += text
        if not self.module.check_mode:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = "%s.%d.tmp" % (path, os.getpid())
            with open(tmp, "w") as handle:
                handle.write(text)
            os.chmod(tmp, mode)
            self.module.atomic_move(tmp, path)
            # atomic_move gives a new file the umask's mode (0644): keep the supervisor executable.
            os.chmod(path, mode)
        return True


class SystemdService(Service):
    manager = "systemd"

    def systemctl(self, *args, check=True):
        rc, out, err = self.module.run_command(["systemctl"] + list(args))
        if check and rc != 0:
            self.module.fail_json(msg="systemctl %s failed: %s%s" % (" ".join(args), err.strip(), self.journal_hint()))
        return rc, out.strip()

    def journal_hint(self):
        rc, out, err = self.module.run_command(["journalctl", "-u", self.name, "-n", "30", "--no-pager"])
        return ("\nLast journal lines of %s:\n%s" % (self.name, out)) if rc == 0 else ""

    def restarts(self):
        rc, out = self.systemctl("show", "-p", "NRestarts", "--value", self.name, check=False)
        return int(out) if out.isdigit() else 0

    def settle(self, restarts, units):
        """Fail when the unit dies or restarts within `settle` seconds of its start."""
        deadline = time.time() + self.params["settle"]
        while time.time() < deadline:
            time.sleep(0.5)
            rc, state = self.systemctl("show", "-p", "ActiveState", "--value", self.name, check=False)
            if state == "failed" or self.restarts() > restarts:
                hint = self.journal_hint()
                self.systemctl("stop", *units, check=False)
                self.module.fail_json(msg="%s exited within %d s of its start and is stopped now.%s" % (
                    self.name, self.params["settle"], hint))

    def check_loaded(self):
        """Fail when systemd refused the unit it was given (a bad setting is only a log line otherwise)."""
        rc, state = self.systemctl("show", "-p", "LoadState", "--value", self.name, check=False)
        if state != "loaded":
            rc, err = self.systemctl("show", "-p", "LoadError", "--value", self.name, check=False)
            self.module.fail_json(msg="systemd did not load %s (LoadState=%s %s)%s" % (
                self.name, state, err, self.journal_hint()))

    def apply(self):
        params = self.params
        supervisor = supervisor_path(self.run_dir)
        defined = False
        if params["state"] != "stopped":
            self.write(supervisor, SUPERVISOR, 0o755)
            for unit, text in render_unit(params, supervisor).items():
                defined |= self.write(os.path.join(UNIT_DIR, unit), text)
            if defined and not self.module.check_mode:
                self.systemctl("daemon-reload")
                self.check_loaded()
        units = [self.name] + ([self.name + "-watch"] if params["watch_ports"] else [])
        active = self.systemctl("is-active", self.name, check=False)[0] == 0
        if params["state"] == "stopped":
            if active:
                self.changed = True
                if not self.module.check_mode:
                    self.systemctl("stop", *units)
        else:
            if params["state"] == "restarted" or (defined and active) or not active:
                self.changed = True
                if not self.module.check_mode:
                    restarts = self.restarts()
                    self.systemctl("restart", *units)
                    self.settle(restarts, units)
            enabled = self.systemctl("is-enabled", self.name, check=False)[1] == "enabled"
            if params["enabled"] != enabled:
                self.changed = True
                if not self.module.check_mode:
                    self.systemctl("enable" if params["enabled"] else "disable", *units)
        self.changed |= defined
        return {"definition": os.path.join(UNIT_DIR, self.name + ".service"), "log": "journalctl -u %s" % self.name}


class SupervisedService(Service):
    manager = "supervisor"

    @property
    def spec_path(self):
        return os.path.join(self.run_dir, self.name + ".json")

    @property
    def pid_path(self):
        return os.path.join(self.run_dir, self.name + ".pid")

    @property
    def log_path(self):
        return os.path.join(self.params["log_dir"], self.name + ".log")

    def running_pid(self):
        """The supervisor's pid when it runs this definition, else None."""
        try:
            with open(self.pid_path) as handle:
                pid = int(handle.read().strip())
            with open("/proc/%d/cmdline" % pid, "rb") as handle:
                cmdline = handle.read().split(b"\0")
        except (OSError, ValueError):
            return None
        return pid if self.spec_path.encode() in cmdline else None

    def stop(self, pid):
        """SIGTERM the supervisor's process group, then SIGKILL what is left after stop_timeout."""
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.time() + self.params["stop_timeout"] + 5
        while time.time() < deadline:
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        # Reap when it is our child's child (never, normally) and drop the pid file.
        try:
            os.unlink(self.pid_path)
        except OSError:
            pass

    def settle(self, pid, offset):
        """Fail when the supervised command exits within `settle` seconds of its start."""
        deadline = time.time() + self.params["settle"]
        while time.time() < deadline:
            time.sleep(0.5)
            with open(self.log_path, "rb") as handle:
                handle.seek(offset)
                fresh = handle.read().decode(errors="replace")
            if "[minimax-supervise]" in fresh and " exited with status " in fresh:
                self.stop(pid)
                self.module.fail_json(msg="%s exited within %d s of its start and is stopped now; see %s:\n%s" % (
                    self.name, self.params["settle"], self.log_path, fresh[-4000:]))

    def start(self):
        os.makedirs(self.params["log_dir"], exist_ok=True)
        with open(self.log_path, "ab") as log, open(os.devnull, "rb") as devnull:
            proc = subprocess.Popen(
                [sys.executable, supervisor_path(self.run_dir), "run", self.spec_path],
                stdin=devnull, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True,
            )
        with open(self.pid_path, "w") as handle:
            handle.write("%d\n" % proc.pid)
        time.sleep(1)
        if proc.poll() is not None:
            self.module.fail_json(msg="%s stopped at once (status %s); see %s:\n%s" % (
                self.name, proc.returncode, self.log_path, self.tail()))
        return proc.pid

    def tail(self, lines=30):
        try:
            with open(self.log_path, errors="replace") as handle:
                return "".join(handle.readlines()[-lines:])
        except OSError:
            return ""

    def apply(self):
        params = self.params
        pid = self.running_pid()
        if params["state"] == "stopped":
            if pid:
                self.changed = True
                if not self.module.check_mode:
                    self.stop(pid)
            return {"definition": self.spec_path, "log": self.log_path}
        self.write(supervisor_path(self.run_dir), SUPERVISOR, 0o755)
        defined = self.write(self.spec_path, json.dumps(definition(params), indent=2, sort_keys=True) + "\n")
        if params["state"] == "restarted" or defined or not pid:
            self.changed = True
            if not self.module.check_mode:
                if pid:
                    self.stop(pid)
                offset = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
                pid = self.start()
                self.settle(pid, offset)
        return {"definition": self.spec_path, "log": self.log_path, "pid": pid}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            description=dict(type="str", default=""),
            argv=dict(type="list", elements="str"),
            env=dict(type="dict", default={}),
            pre_start=dict(type="list", elements="list", default=[]),
            watch_ports=dict(type="list", elements="int", default=[]),
            fingerprint=dict(type="str", default=""),
            restart_sec=dict(type="int", default=5),
            settle=dict(type="int", default=0),
            stop_timeout=dict(type="int", default=60),
            after=dict(type="list", elements="str", default=[]),
            state=dict(type="str", choices=["started", "stopped", "restarted"], default="started"),
            enabled=dict(type="bool", default=True),
            manager=dict(type="str", choices=["auto", "systemd", "supervisor"], default="auto"),
            run_dir=dict(type="path", default="/opt/minimax-spark/services"),
            log_dir=dict(type="path", default="/var/log/minimax-spark"),
        ),
        required_if=[("state", "started", ["argv"]), ("state", "restarted", ["argv"])],
        supports_check_mode=True,
    )
    params = module.params
    if params["argv"] is not None and not params["argv"]:
        module.fail_json(msg="argv is empty: give the command to run")
    manager = params["manager"]
    if manager == "auto":
        manager = "systemd" if systemd_running() else "supervisor"
    service = (SystemdService if manager == "systemd" else SupervisedService)(module)
    result = service.apply()
    extra = {"diff": service.diff} if module._diff else {}
    module.exit_json(changed=service.changed, manager=manager, name=params["name"],
                     command=" ".join(shlex.quote(a) for a in params["argv"] or []), **result, **extra)


if __name__ == "__main__":
    main()
