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

``run`` reads the definition (argv, env, pre_start, watch_ports, restart_sec, stop_timeout), runs each
pre-start command and then the command, restarts it ``restart_sec`` after it fails, and stops it on SIGTERM
or SIGINT (SIGKILL after ``stop_timeout``). With ``watch_ports`` it restarts the command when a peer on one of
those remote ports closes its connection: llama-server cannot reconnect to a restarted RPC worker.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

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


class Runner:
    """Runs one definition until told to stop."""

    def __init__(self, spec):
        self.spec = spec
        self.env = dict(os.environ, **{k: str(v) for k, v in spec.get("env", {}).items()})
        self.proc = None
        self.stopping = False

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

    def run_once(self):
        """Start the command and follow it; its exit status (None when stopped by us)."""
        log("starting: %s" % " ".join(self.spec["argv"]))
        self.proc = subprocess.Popen(self.spec["argv"], env=self.env, cwd="/")
        ports = set(self.spec.get("watch_ports", []))
        while self.proc.poll() is None:
            time.sleep(1)
            if ports and closed_by_peer(self.proc.pid, ports):
                log("a worker closed its connection: restarting")
                self.proc.terminate()
                self.stop_child()
        if self.stopping:
            self.stop_child()
            return None
        log("exited with status %s" % self.proc.returncode)
        return self.proc.returncode

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


USAGE = "usage: minimax-supervise run DEF | wait-tcp HOST:PORT... [--timeout S] | watch UNIT PORTS [INTERVAL]"


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
    if command == "watch" and len(args) in (2, 3):
        return watch(args[0], {int(p) for p in args[1].split(",")}, int(args[2]) if len(args) > 2 else 5)
    return USAGE


if __name__ == "__main__":
    sys.exit(main())
