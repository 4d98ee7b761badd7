"""The engine of the minimax_service module: a long-lived process as a systemd unit, or under the
project's supervisor where there is no systemd; and the record of its last verified definition.

The module file keeps the documentation, the argument spec and the result; everything here is imported and
unit-tested without Ansible running (an object with ``params``, ``check_mode``, ``run_command``,
``atomic_move`` and ``fail_json`` stands for the AnsibleModule).
"""
from __future__ import annotations

import inspect
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time

from ansible.module_utils import minimax_spark_supervisor
from ansible.module_utils.minimax_spark_files import write_atomic

UNIT_DIR = "/etc/systemd/system"
SUPERVISOR_NAME = "minimax-supervise"
# Supervised services' logs hold what the servers print (a key's last characters among it): owner only.
LOG_MODE = 0o600
LOG_DIR_MODE = 0o750
RECORD_MODE = 0o600


def supervisor_path(run_dir):
    return os.path.join(run_dir, SUPERVISOR_NAME)


def supervisor_source():
    """The supervisor program, as the module ships it (module_utils/minimax_spark_supervisor.py)."""
    return inspect.getsource(minimax_spark_supervisor)


def systemd_running():
    return os.path.isdir("/run/systemd/system")


def pre_start_commands(params, python=None):
    """The pre-start commands of a service: waiting for ``wait_for`` endpoints first, then ``pre_start``."""
    commands = []
    if params.get("wait_for"):
        commands.append(
            [python or sys.executable, supervisor_path(params["run_dir"]), "wait-tcp"]
            + [str(e) for e in params["wait_for"]]
            + ["--timeout", str(params.get("wait_timeout", 600))]
        )
    commands += [[str(a) for a in cmd] for cmd in params.get("pre_start") or []]
    return commands


def definition(params):
    """What the service is: everything whose change must restart it."""
    return {
        "name": params["name"],
        "description": params["description"],
        "argv": params["argv"],
        "env": {k: str(v) for k, v in sorted(params["env"].items())},
        "pre_start": pre_start_commands(params),
        "watch_ports": params["watch_ports"],
        "fingerprint": params["fingerprint"],
        "restart_sec": params["restart_sec"],
        "stop_timeout": params["stop_timeout"],
        "watchdog": watchdog_settings(params),
    }


def watchdog_settings(params):
    """The watchdog of a service (``{}``: none): the server's URL, the interval, the probe's timeout, the
    restarts in a row before it is left stopped, the API key file."""
    wd = params.get("watchdog") or {}
    if not wd.get("url") or not wd.get("interval"):
        return {}
    return {
        "url": wd["url"],
        "interval": int(wd["interval"]),
        "timeout": int(wd.get("timeout") or 60),
        "restarts": int(wd["restarts"] if wd.get("restarts") is not None else 3),
        "key_file": wd.get("key_file") or "",
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


def render_unit(params, supervisor, python=None):
    """The unit files of a service: ``{file name: text}`` (the service, and its watcher with watch_ports)."""
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
            "ExecStart=%s %s watch %s.service %s" % (
                python or sys.executable, supervisor, spec["name"], ",".join(str(p) for p in spec["watch_ports"])),
            "Restart=always",
            "RestartSec=5",
            "",
            "[Install]",
            "WantedBy=%s.service" % spec["name"],
            "",
        ])
    wd = spec["watchdog"]
    if wd:
        state = os.path.join(os.path.dirname(supervisor), spec["name"] + ".watchdog-state.json")
        units[spec["name"] + "-watchdog.service"] = "\n".join([
            "# Managed by minimax-spark (minimax_service). Local changes are overwritten.",
            "[Unit]",
            "Description=Ask %s for a one-token completion; restart it (at most %d times in a row) when it does "
            "not answer" % (spec["name"], wd["restarts"]),
            "",
            "[Service]",
            "Type=oneshot",
            "ExecStart=%s" % " ".join(quote_systemd(a) for a in [
                python or sys.executable, supervisor, "watchdog", spec["name"] + ".service", wd["url"],
                str(wd["timeout"]), str(wd["restarts"]), state] + ([wd["key_file"]] if wd["key_file"] else [])),
            "",
        ])
        units[spec["name"] + "-watchdog.timer"] = "\n".join([
            "# Managed by minimax-spark (minimax_service). Local changes are overwritten.",
            "[Unit]",
            "Description=Ask %s for a completion every %d s" % (spec["name"], wd["interval"]),
            "PartOf=%s.service" % spec["name"],
            "After=%s.service" % spec["name"],
            "",
            "[Timer]",
            "OnActiveSec=%d" % wd["interval"],
            "OnUnitActiveSec=%d" % wd["interval"],
            "",
            "[Install]",
            "WantedBy=%s.service" % spec["name"],
            "",
        ])
    return units


def defined_command(manager, text):
    """The command line a definition runs: a unit's ExecStart= as written, or the supervisor definition's argv
    shell-quoted; '' for no definition."""
    if not text:
        return ""
    if manager == "systemd":
        match = re.search(r"^ExecStart=(.*)$", text, re.MULTILINE)
        return match.group(1) if match else ""
    try:
        argv = json.loads(text).get("argv") or []
    except (ValueError, AttributeError):
        return ""
    return " ".join(shlex.quote(str(arg)) for arg in argv)


def read_text(path):
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return None


class Service:
    """What both managers share: writing definition files, and the record of the verified definition."""

    manager = None

    def __init__(self, module):
        self.module = module
        self.params = module.params
        self.name = self.params["name"]
        self.run_dir = self.params["run_dir"]
        self.changed = False
        self.diff = {"before": "", "after": ""}

    # -- files ---------------------------------------------------------------------------------------------
    def write(self, path, text, mode=0o644):
        """Write text atomically when it differs; return True when it did (or would, in check mode)."""
        current = read_text(path)
        if current == text:
            return False
        self.diff["before"] += current or ""
        self.diff["after"] += text
        if not self.module.check_mode:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            write_atomic(path, text, mode=mode, move=self.module.atomic_move)
        return True

    def remove(self, path):
        if os.path.exists(path):
            self.diff["before"] += read_text(path) or ""
            if not self.module.check_mode:
                os.unlink(path)
            return True
        return False

    def install_supervisor(self):
        return self.write(supervisor_path(self.run_dir), supervisor_source(), 0o755)

    # -- the verified record ---------------------------------------------------------------------------------
    @property
    def record_path(self):
        return os.path.join(self.run_dir, self.name + ".verified.json")

    def definition_files(self):
        """``{path: text}`` of the files that define the service now (what a restore puts back)."""
        raise NotImplementedError

    def read_record(self):
        text = read_text(self.record_path)
        if text is None:
            return None
        try:
            record = json.loads(text)
        except ValueError:
            return None
        if not isinstance(record, dict) or record.get("manager") != self.manager or not record.get("files"):
            return None
        return record

    def record_summary(self, record):
        if not record:
            return {"exists": False}
        return {
            "exists": True,
            "verified_at": record.get("verified_at", ""),
            "note": record.get("note", {}),
            "serving": self.definition_files() == record["files"] and self.is_running(),
        }

    def mark_verified(self):
        """Record the running definition as the last verified one."""
        if not self.is_running():
            self.module.fail_json(
                msg="%s is not running: only a running service can be recorded as verified" % self.name)
        files = self.definition_files()
        note = self.params["note"] or {}
        record = self.read_record()
        if record and record["files"] == files and record.get("note", {}) == note:
            return record
        record = {
            "manager": self.manager,
            "files": files,
            "note": note,
            "verified_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        self.changed = True
        if not self.module.check_mode:
            self.write(self.record_path, json.dumps(record, indent=2, sort_keys=True) + "\n", RECORD_MODE)
        return record

    def restore(self):
        """Put the verified definition back and run it; without one, stop (and disable) the service."""
        record = self.read_record()
        if record is None:
            self.stop_service(disable=True)
            return None
        self.install_supervisor()
        written = False
        for path, text in record["files"].items():
            written |= self.write(path, text)
        for path in set(self.definition_files()) - set(record["files"]):
            written |= self.remove(path)
        self.after_definition_change(written)
        if written or not self.is_running():
            self.changed = True
            if not self.module.check_mode:
                self.restart_service()
        self.ensure_enabled(True)
        self.changed |= written
        return record

    # -- per manager -------------------------------------------------------------------------------------------
    def is_running(self):
        raise NotImplementedError

    def stop_service(self, disable=False):
        raise NotImplementedError

    def restart_service(self):
        raise NotImplementedError

    def after_definition_change(self, written):
        """Hook run after definition files were (re)written."""

    def ensure_enabled(self, enabled):
        """Hook: start at boot or not."""

    def result(self):
        raise NotImplementedError


class SystemdService(Service):
    manager = "systemd"

    #: The units beside the service, by file name suffix: the RPC watcher and the watchdog's timer (the timer
    #: starts its oneshot service; both go with the service).
    COMPANIONS = ("-watch", "-watchdog.timer")
    COMPANION_FILES = ("-watch", "-watchdog", "-watchdog.timer")

    @property
    def units(self):
        return [self.name] + [self.name + c for c in self.COMPANIONS if os.path.exists(self.unit_path(self.name + c))]

    @staticmethod
    def unit_path(unit):
        return os.path.join(UNIT_DIR, unit if unit.endswith(".timer") else unit + ".service")

    def systemctl(self, *args, check=True):
        rc, out, err = self.module.run_command(["systemctl"] + list(args))
        if check and rc != 0:
            self.module.fail_json(msg="systemctl %s failed: %s%s" % (" ".join(args), err.strip(), self.journal_hint()))
        return rc, out.strip()

    def journal_hint(self):
        rc, out, _err = self.module.run_command(["journalctl", "-u", self.name, "-n", "30", "--no-pager"])
        return ("\nLast journal lines of %s:\n%s" % (self.name, out)) if rc == 0 else ""

    def restarts(self):
        _rc, out = self.systemctl("show", "-p", "NRestarts", "--value", self.name, check=False)
        return int(out) if out.isdigit() else 0

    def is_running(self):
        return self.systemctl("is-active", self.name, check=False)[0] == 0

    def definition_files(self):
        files = {}
        for unit in (self.name,) + tuple(self.name + c for c in self.COMPANION_FILES):
            text = read_text(self.unit_path(unit))
            if text is not None:
                files[self.unit_path(unit)] = text
        return files

    def settle(self, restarts):
        """Fail when the unit dies or restarts within `settle` seconds of its start."""
        deadline = time.time() + self.params["settle"]
        while time.time() < deadline:
            time.sleep(0.5)
            _rc, state = self.systemctl("show", "-p", "ActiveState", "--value", self.name, check=False)
            # A server that exits 0 on a bad flag (ggml-rpc-server does) leaves the unit inactive, not failed.
            if state in ("failed", "inactive", "deactivating") or self.restarts() > restarts:
                hint = self.journal_hint()
                self.systemctl("stop", *self.units, check=False)
                self.module.fail_json(msg="%s exited within %d s of its start and is stopped now.%s" % (
                    self.name, self.params["settle"], hint))

    def check_loaded(self):
        """Fail when systemd refused the unit it was given (a bad setting is only a log line otherwise)."""
        _rc, state = self.systemctl("show", "-p", "LoadState", "--value", self.name, check=False)
        if state != "loaded":
            _rc, err = self.systemctl("show", "-p", "LoadError", "--value", self.name, check=False)
            self.module.fail_json(msg="systemd did not load %s (LoadState=%s %s)%s" % (
                self.name, state, err, self.journal_hint()))

    def after_definition_change(self, written):
        if written and not self.module.check_mode:
            self.systemctl("daemon-reload")
            self.check_loaded()

    def restart_service(self):
        restarts = self.restarts()
        self.systemctl("restart", *self.units)
        self.settle(restarts)

    def stop_service(self, disable=False):
        if self.is_running():
            self.changed = True
            if not self.module.check_mode:
                self.systemctl("stop", *self.units)
        if disable:
            self.ensure_enabled(False)

    def ensure_enabled(self, enabled):
        if not os.path.exists(self.unit_path(self.name)) and not enabled:
            return
        current = self.systemctl("is-enabled", self.name, check=False)[1] == "enabled"
        if enabled != current:
            self.changed = True
            if not self.module.check_mode:
                self.systemctl("enable" if enabled else "disable", *self.units)

    def apply(self):
        params = self.params
        state = params["state"]
        if state == "stopped":
            self.stop_service()
        elif state in ("started", "restarted"):
            self.install_supervisor()
            defined = False
            units = render_unit(params, supervisor_path(self.run_dir))
            for unit, text in units.items():
                defined |= self.write(os.path.join(UNIT_DIR, unit), text)
            for companion in self.COMPANION_FILES:
                path = self.unit_path(self.name + companion)
                if os.path.basename(path) not in units:
                    defined |= self.remove(path)
            self.after_definition_change(defined)
            active = self.is_running()
            if state == "restarted" or defined or not active:
                self.changed = True
                if not self.module.check_mode:
                    self.restart_service()
            self.ensure_enabled(params["enabled"])
            self.changed |= defined
        return self.result()

    def result(self):
        return {"definition": self.unit_path(self.name), "log": "journalctl -u %s" % self.name}


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

    def is_running(self):
        return self.running_pid() is not None

    def definition_files(self):
        text = read_text(self.spec_path)
        return {self.spec_path: text} if text is not None else {}

    def stop_pid(self, pid):
        """SIGTERM the supervisor's process group, then SIGKILL what is left after stop_timeout."""
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.time() + self.params["stop_timeout"] + 5
        while time.time() < deadline:
            try:  # our own child (a start that did not settle) stays a zombie, alive to killpg, until reaped
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
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
        try:
            os.unlink(self.pid_path)
        except OSError:
            pass

    def stop_service(self, disable=False):
        pid = self.running_pid()
        if pid:
            self.changed = True
            if not self.module.check_mode:
                self.stop_pid(pid)

    def settle(self, pid, offset):
        """Fail when the supervised command exits within `settle` seconds of its start."""
        deadline = time.time() + self.params["settle"]
        while time.time() < deadline:
            time.sleep(0.5)
            with open(self.log_path, "rb") as handle:
                handle.seek(offset)
                fresh = handle.read().decode(errors="replace")
            if "[minimax-supervise]" in fresh and " exited with status " in fresh:
                self.stop_pid(pid)
                self.module.fail_json(msg="%s exited within %d s of its start and is stopped now; see %s:\n%s" % (
                    self.name, self.params["settle"], self.log_path, fresh[-4000:]))

    def open_log(self):
        """The log, created private to its owner (servers print key fragments and prompts into it)."""
        os.makedirs(self.params["log_dir"], exist_ok=True)
        os.chmod(self.params["log_dir"], LOG_DIR_MODE)
        fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, LOG_MODE)
        os.fchmod(fd, LOG_MODE)
        return os.fdopen(fd, "ab")

    def start(self):
        with self.open_log() as log, open(os.devnull, "rb") as devnull:
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

    def restart_service(self):
        pid = self.running_pid()
        if pid:
            self.stop_pid(pid)
        offset = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
        pid = self.start()
        self.settle(pid, offset)

    def tail(self, lines=30):
        try:
            with open(self.log_path, errors="replace") as handle:
                return "".join(handle.readlines()[-lines:])
        except OSError:
            return ""

    def apply(self):
        params = self.params
        state = params["state"]
        if state == "stopped":
            self.stop_service()
        elif state in ("started", "restarted"):
            self.install_supervisor()
            defined = self.write(self.spec_path, json.dumps(definition(params), indent=2, sort_keys=True) + "\n")
            if state == "restarted" or defined or not self.is_running():
                self.changed = True
                if not self.module.check_mode:
                    self.restart_service()
        return self.result()

    def result(self):
        out = {"definition": self.spec_path, "log": self.log_path}
        pid = self.running_pid()
        if pid:
            out["pid"] = pid
        return out


def service_for(module):
    """The Service object for the module's ``manager`` (``auto``: systemd when it is PID 1)."""
    manager = module.params["manager"]
    if manager == "auto":
        manager = "systemd" if systemd_running() else "supervisor"
    return (SystemdService if manager == "systemd" else SupervisedService)(module)
