#!/usr/bin/env python3
"""minimax-spark supervisor: runs one service definition where there is no systemd, and the helpers
the service units call.

The minimax_service module writes this file, as it is, to ``<run_dir>/minimax-supervise`` on the node and
runs it with the node's Python. It imports nothing but the standard library, so it runs without Ansible.

    minimax-supervise run DEF.json                    run the service, restart it on failure
    minimax-supervise wait-tcp HOST:PORT... [--timeout S]
                                                      wait until every endpoint accepts a TCP connection
    minimax-supervise watch UNIT PORTS [INTERVAL]     (systemd) restart UNIT when a peer on one of PORTS
                                                      closes its connection
    minimax-supervise watchdog UNIT URL TIMEOUT RESTARTS STATE [KEY_FILE]
                                                      (systemd, from a timer) ask UNIT's server at URL for a
                                                      one-token completion; restart UNIT when it does not
                                                      answer, at most RESTARTS times in a row, then stop it

``run`` reads the definition (argv, env, pre_start, watch_ports, restart_sec, stop_timeout), runs each
pre-start command and then the command, restarts it ``restart_sec`` after it fails, and stops it on SIGTERM
or SIGINT (SIGKILL after ``stop_timeout``). With ``watch_ports`` it restarts the command when a peer on one of
those remote ports closes its connection: llama-server cannot reconnect to a restarted RPC worker. With
``watchdog`` (``url``, ``interval``, ``timeout``, ``restarts``, ``key_file``) it asks the server for a one-token
completion every ``interval`` seconds (a server busy answering a request counts as alive), restarts it when it
does not answer, and after ``restarts`` restarts in a row without an answer leaves it stopped, saying so in the
log: ``/health`` alone answers from a server that serves nothing.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

#: ``/proc/net/tcp`` state of a connection the peer has closed.
TCP_CLOSE_WAIT = "08"


def log(msg):
    print("[minimax-supervise] %s %s" % (time.strftime("%Y-%m-%dT%H:%M:%S"), msg), flush=True)


def socket_inodes(pid):
    """Inodes of the sockets process ``pid`` holds (empty when it is gone)."""
    inodes = set()
    try:
        fds = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def closed_by_peer(pid, ports, tables=("/proc/net/tcp", "/proc/net/tcp6")):
    """True when a socket of process ``pid`` talks to one of ``ports`` and the peer has closed it (CLOSE_WAIT)."""
    inodes = socket_inodes(pid)
    if not inodes:
        return False
    for table in tables:
        try:
            with open(table) as handle:
                next(handle)
                for line in handle:
                    fields = line.split()
                    port = int(fields[2].rsplit(":", 1)[1], 16)
                    if fields[3] == TCP_CLOSE_WAIT and port in ports and fields[9] in inodes:
                        return True
        except (OSError, StopIteration):
            continue
    return False


def split_endpoint(endpoint):
    """``host:port`` or ``[v6]:port`` -> (host, port)."""
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


def wait_tcp(endpoints, timeout, interval=1.0):
    """Wait until every endpoint accepts a TCP connection; 0 when they all did, 1 after ``timeout`` seconds."""
    deadline = time.time() + timeout
    pending = list(endpoints)
    while pending:
        try:
            socket.create_connection(split_endpoint(pending[0]), timeout=2).close()
            log("%s answers" % pending.pop(0))
        except OSError:
            if time.time() > deadline:
                log("%s did not answer within %d s" % (pending[0], timeout))
                return 1
            time.sleep(interval)
    return 0


def _ask(url, timeout, key_file="", body=None):
    """(status, parsed JSON body) of a GET (or a POST of ``body``) to ``url``; raises on no answer."""
    headers = {"Content-Type": "application/json"}
    if key_file:
        with open(key_file) as handle:
            headers["Authorization"] = "Bearer " + handle.read().strip()
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers)
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 (the server's own URL)
        raw = response.read()
        return response.status, json.loads(raw) if raw else None


def busy(url, timeout, key_file=""):
    """True when one of the server's slots is answering a request (its loop runs; a probe would queue)."""
    try:
        _status, slots = _ask(url.rstrip("/") + "/slots", timeout, key_file)
    except (OSError, ValueError):
        return False
    return isinstance(slots, list) and any(isinstance(s, dict) and s.get("is_processing") for s in slots)


def probe(url, timeout, key_file=""):
    """None when the server at ``url`` answers a one-token completion (or is busy answering a request, or still
    loading its model); else why it is not serving."""
    if busy(url, timeout, key_file):
        return None
    body = {"prompt": "Hi", "n_predict": 1, "cache_prompt": False}
    try:
        _status, reply = _ask(url.rstrip("/") + "/completion", timeout, key_file, body)
    except urllib.error.HTTPError as exc:
        if exc.code == 503:  # loading the model: not judged yet
            return None
        return "a one-token completion was answered with HTTP %d" % exc.code
    except (OSError, ValueError) as exc:
        if busy(url, timeout, key_file):
            return None
        reason = getattr(exc, "reason", exc)
        return "no answer to a one-token completion within %d s (%s)" % (timeout, reason)
    if not isinstance(reply, dict) or "content" not in reply:
        return "a one-token completion came back without a completion: %.200s" % json.dumps(reply)
    return None


class Runner:
    """Runs one definition until told to stop."""

    def __init__(self, spec):
        self.spec = spec
        self.env = dict(os.environ, **{k: str(v) for k, v in spec.get("env", {}).items()})
        self.proc = None
        self.stopping = False
        self.watchdog = spec.get("watchdog") or {}
        self.watchdog_failures = 0

    def on_signal(self, signum, frame):  # pylint: disable=unused-argument
        self.stopping = True
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()

    def stop_child(self):
        try:
            self.proc.wait(self.spec.get("stop_timeout", 60))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def pre_start(self):
        for cmd in self.spec.get("pre_start", []):
            log("pre-start: %s" % " ".join(cmd))
            if subprocess.call(cmd, env=self.env) != 0:
                return False
        return True

    def kill_child(self):
        """Stop the command even when it is frozen (SIGSTOP, a hung loop): SIGCONT and SIGTERM, then SIGKILL."""
        for sig in (signal.SIGCONT, signal.SIGTERM):
            try:
                self.proc.send_signal(sig)
            except OSError:
                pass
        try:
            self.proc.wait(min(self.spec.get("stop_timeout", 60), 10))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def watchdog_check(self):
        """Ask the server; False when it must not run on (restarted, or left stopped past the bound)."""
        wd = self.watchdog
        why = probe(wd["url"], wd.get("timeout", 60), wd.get("key_file", ""))
        if why is None:
            self.watchdog_failures = 0
            return True
        self.watchdog_failures += 1
        if self.watchdog_failures > wd.get("restarts", 3):
            log("watchdog: %s; restarted %d times in a row without an answer: leaving it stopped "
                "(fix the cause, then start it again: site.yml --tags head_server)" % (why, wd.get("restarts", 3)))
            self.stopping = True
        else:
            log("watchdog: %s: restarting it (%d of at most %d in a row)" % (
                why, self.watchdog_failures, wd.get("restarts", 3)))
        self.kill_child()
        return False

    def run_once(self):
        """Start the command and follow it; its exit status (None when stopped by us)."""
        log("starting: %s" % " ".join(self.spec["argv"]))
        self.proc = subprocess.Popen(self.spec["argv"], env=self.env, cwd="/")
        ports = set(self.spec.get("watch_ports", []))
        interval = self.watchdog.get("interval", 0) if self.watchdog.get("url") else 0
        next_probe = time.time() + interval
        while self.proc.poll() is None:
            time.sleep(1)
            if ports and closed_by_peer(self.proc.pid, ports):
                log("a worker closed its connection: restarting")
                self.proc.terminate()
                self.stop_child()
            elif interval and time.time() >= next_probe and not self.stopping:
                if not self.watchdog_check():
                    break
                next_probe = time.time() + interval
        if self.stopping:
            self.stop_child()
            return None
        log("exited with status %s" % self.proc.returncode)
        # 0 ends a service that finished its work; a watchdog restart is a failure whatever the status.
        return self.proc.returncode if self.watchdog_failures == 0 else -1

    def run(self):
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        delay = self.spec.get("restart_sec", 5)
        while not self.stopping:
            if self.pre_start() and not self.stopping:
                if self.run_once() == 0:
                    break
            if not self.stopping:
                log("restarting in %d s" % delay)
                time.sleep(delay)
        log("stopped")
        return 0


def watch(unit, ports, interval):
    """systemd hosts: restart ``unit`` when its main process has a connection closed by a peer on ``ports``."""
    while True:
        time.sleep(interval)
        try:
            out = subprocess.check_output(["systemctl", "show", "-p", "MainPID", "--value", unit])
            pid = int(out.strip() or 0)
        except (subprocess.CalledProcessError, ValueError):
            continue
        if pid and closed_by_peer(pid, ports):
            log("a worker closed its connection to %s: restarting it" % unit)
            subprocess.call(["systemctl", "restart", unit])


def _systemctl_value(unit, prop):
    try:
        return subprocess.check_output(["systemctl", "show", "-p", prop, "--value", unit]).decode().strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def watchdog_once(unit, wd, state_path):
    """systemd hosts, run by a timer: ask ``unit``'s server for a one-token completion; restart the unit when
    it does not answer, and after ``restarts`` restarts in a row stop it. The count lives in ``state_path`` with
    the invocation it belongs to: a start by anyone else begins a new count.
    Returns 0 when the server answered (or the unit is not running), 1 otherwise."""
    if _systemctl_value(unit, "ActiveState") != "active":
        return 0
    try:
        with open(state_path) as handle:
            state = json.load(handle)
    except (OSError, ValueError):
        state = {}
    invocation = _systemctl_value(unit, "InvocationID")
    failures = state.get("failures", 0) if state.get("invocation") == invocation else 0
    why = probe(wd["url"], wd.get("timeout", 60), wd.get("key_file", ""))
    if why is None:
        failures = 0
    else:
        failures += 1
        if failures > wd.get("restarts", 3):
            log("watchdog: %s: %s; restarted %d times in a row without an answer: leaving it stopped "
                "(fix the cause, then start it again: site.yml --tags head_server)" % (
                    unit, why, wd.get("restarts", 3)))
            subprocess.call(["systemctl", "stop", unit])
        else:
            log("watchdog: %s: %s: restarting it (%d of at most %d in a row)" % (
                unit, why, failures, wd.get("restarts", 3)))
            subprocess.call(["systemctl", "restart", unit])
            invocation = _systemctl_value(unit, "InvocationID")
    with open(state_path + ".tmp", "w") as handle:
        json.dump({"invocation": invocation, "failures": failures}, handle)
    os.replace(state_path + ".tmp", state_path)
    return 0 if why is None else 1


USAGE = ("usage: minimax-supervise run DEF | wait-tcp HOST:PORT... [--timeout S] | watch UNIT PORTS [INTERVAL]"
         " | watchdog UNIT URL TIMEOUT RESTARTS STATE [KEY_FILE]")


def main(argv=None):
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        return USAGE
    command, args = args[0], args[1:]
    if command == "run" and len(args) == 1:
        with open(args[0]) as handle:
            return Runner(json.load(handle)).run()
    if command == "wait-tcp":
        timeout = 3600
        if "--timeout" in args:
            i = args.index("--timeout")
            timeout = int(args[i + 1])
            del args[i:i + 2]
        return wait_tcp(args, timeout)
    if command == "watchdog" and len(args) in (5, 6):
        wd = {"url": args[1], "timeout": int(args[2]), "restarts": int(args[3]),
              "key_file": args[5] if len(args) > 5 else ""}
        return watchdog_once(args[0], wd, args[4])
    if command == "watch" and len(args) in (2, 3):
        return watch(args[0], {int(p) for p in args[1].split(",")}, int(args[2]) if len(args) > 2 else 5)
    return USAGE


if __name__ == "__main__":
    sys.exit(main())
