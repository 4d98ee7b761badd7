"""The watchdog minimax_service gives a server: it asks for a one-token completion every interval, restarts a
server that does not answer (frozen with SIGSTOP here, as a hung llama-server would be), spares one busy
answering a request, and after its bound leaves the server stopped with a line that says so.

The supervisor runs for real, in tmp_path, with a small HTTP server standing in for llama-server; the systemd
path's oneshot runs with a stand-in ``systemctl`` on PATH that records what it was asked.
"""
import json
import os
import signal
import socket
import stat
import subprocess
import sys
import time

import pytest
from test_minimax_service import alive, pids_in, sup, unit_params, wait_for  # noqa: F401  (sup is a fixture)

import minimax_service as ms

PY = sys.executable

# A stand-in llama-server: records its pid, answers /completion with a completion and /slots with one slot (busy
# when the file BUSY exists, and then /completion never answers, as a server queueing behind a long prompt).
SERVER = r"""
import http.server, json, os, sys, time
pidfile, port, busy = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with open(pidfile, "a") as f:
    f.write("%d\n" % os.getpid())
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def reply(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self):
        self.reply([{"id": 0, "is_processing": os.path.exists(busy)}])
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if os.path.exists(busy):
            time.sleep(600)
        self.reply({"content": "Hello", "auth": self.headers.get("Authorization", "")})
http.server.ThreadingHTTPServer.allow_reuse_address = True
http.server.ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.fixture
def server(tmp_path):
    port = free_port()
    pidfile, busy = tmp_path / "server.pid", tmp_path / "BUSY"
    return {"port": port, "pidfile": pidfile, "busy": busy,
            "argv": [PY, "-c", SERVER, str(pidfile), str(port), str(busy)],
            "url": "http://127.0.0.1:%d" % port}


def start(sup, server, **watchdog):  # noqa: F811  (the fixture, passed on)
    wd = dict({"url": server["url"], "interval": 1, "timeout": 2, "restarts": 2}, **watchdog)
    result = sup.run(name="head", argv=server["argv"], watchdog=wd)
    assert not result.get("failed"), result
    assert wait_for(lambda: pids_in(server["pidfile"]) and answers(server["port"]), timeout=15), sup.log("head")
    return pids_in(server["pidfile"])[-1]


def test_a_frozen_server_is_restarted_within_its_interval(sup, server):  # noqa: F811
    first = start(sup, server)
    os.kill(first, signal.SIGSTOP)
    frozen_at = time.time()
    # interval 1 s + a probe timeout of 2 s (and the busy check's 2 s) + restart_sec 1 s: well inside 15 s.
    assert wait_for(lambda: len(pids_in(server["pidfile"])) >= 2 and answers(server["port"]), timeout=15), \
        sup.log("head")
    took = time.time() - frozen_at
    log = sup.log("head")
    assert "watchdog: no answer to a one-token completion within 2 s" in log
    assert "restarting it (1 of at most 2 in a row)" in log
    assert wait_for(lambda: not alive(first), timeout=5), "the frozen server was left behind"
    second = pids_in(server["pidfile"])[-1]
    assert alive(second) and second != first
    assert took < 15


def test_after_its_bound_the_server_is_left_stopped_with_a_line_that_says_so(sup, server):  # noqa: F811
    start(sup, server, restarts=1)
    # Freeze every server the supervisor starts: the first, then its one restart.
    for round_ in (1, 2):
        assert wait_for(lambda round_=round_: len(pids_in(server["pidfile"])) >= round_, timeout=20), sup.log("head")
        pid = pids_in(server["pidfile"])[round_ - 1]
        assert wait_for(lambda: answers(server["port"]), timeout=10)
        os.kill(pid, signal.SIGSTOP)
    assert wait_for(lambda: "leaving it stopped" in sup.log("head"), timeout=20), sup.log("head")
    log = sup.log("head")
    assert "restarted 1 times in a row without an answer: leaving it stopped" in log
    assert "site.yml --tags head_server" in log
    # Stopped and stays stopped: no server, no supervisor, nothing restarting.
    time.sleep(3)
    assert len(pids_in(server["pidfile"])) == 2
    assert not any(alive(p) for p in pids_in(server["pidfile"]))
    assert not answers(server["port"])
    status = sup.run(name="head", state="stopped")
    assert status["running"] is False


def test_a_server_busy_answering_a_request_is_not_restarted(sup, server):  # noqa: F811
    first = start(sup, server)
    server["busy"].write_text("")
    time.sleep(6)  # several probes: each finds the slot busy
    assert pids_in(server["pidfile"]) == [first]
    assert "watchdog" not in sup.log("head")
    server["busy"].unlink()


def test_the_probe_sends_the_key_from_its_file_and_the_key_is_on_no_command_line(tmp_path, server):
    key = tmp_path / "api-key"
    key.write_text("sk-secret-1234\n")
    os.chmod(key, 0o600)
    proc = subprocess.Popen(server["argv"])
    try:
        assert wait_for(lambda: answers(server["port"]), timeout=10)
        from ansible.module_utils import minimax_spark_supervisor as sv

        status, reply = sv._ask(server["url"] + "/completion", 5, str(key), {"prompt": "Hi", "n_predict": 1})
        assert reply["auth"] == "Bearer sk-secret-1234"
        assert sv.probe(server["url"], 5, str(key)) is None
    finally:
        proc.kill()
        proc.wait()
    units = ms.render_unit(unit_params(watchdog={"url": server["url"], "interval": 300, "key_file": str(key)}),
                           "/opt/minimax-spark/services/minimax-supervise")
    text = "\n".join(units.values())
    assert str(key) in text and "sk-secret" not in text


def test_no_watchdog_no_timer_and_the_timer_follows_the_settings():
    assert set(ms.render_unit(unit_params(), "/x/minimax-supervise")) == {"minimax-llama-server.service"}
    assert set(ms.render_unit(unit_params(watchdog={"url": "http://127.0.0.1:8891", "interval": 0}),
                              "/x/minimax-supervise")) == {"minimax-llama-server.service"}
    units = ms.render_unit(unit_params(watchdog={"url": "http://127.0.0.1:8891", "interval": 240, "timeout": 30,
                                                 "restarts": 2}), "/x/minimax-supervise", python="/usr/bin/python3")
    timer = units["minimax-llama-server-watchdog.timer"]
    assert "OnUnitActiveSec=240" in timer and "OnActiveSec=240" in timer
    assert "PartOf=minimax-llama-server.service" in timer
    oneshot = units["minimax-llama-server-watchdog.service"]
    assert "Type=oneshot" in oneshot
    exec_start = [line for line in oneshot.splitlines() if line.startswith("ExecStart=")][0]
    assert exec_start.split("=", 1)[1].split() == [
        "/usr/bin/python3", "/x/minimax-supervise", "watchdog", "minimax-llama-server.service",
        "http://127.0.0.1:8891", "30", "2", "/x/minimax-llama-server.watchdog-state.json"]
    # A changed watchdog is a changed definition: the service is rewritten (and restarted).
    assert ms.definition(unit_params()) != ms.definition(unit_params(
        watchdog={"url": "http://127.0.0.1:8891", "interval": 240}))


@pytest.fixture
def fake_systemctl(tmp_path, monkeypatch):
    """A systemctl on PATH: answers ActiveState=active and an InvocationID (a new one after each restart),
    records every call in calls.txt."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "systemctl"
    script.write_text(
        "#!/bin/sh\n"
        'echo "$*" >> %s/calls.txt\n'
        'case "$*" in\n'
        '  *ActiveState*) echo active ;;\n'
        '  *InvocationID*) echo "invocation-$(grep -c ^restart %s/calls.txt)" ;;\n'
        "esac\n" % (tmp_path, tmp_path))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", "%s:%s" % (bindir, os.environ["PATH"]))
    return tmp_path / "calls.txt"


def test_the_systemd_oneshot_restarts_then_stops_a_server_that_does_not_answer(tmp_path, fake_systemctl):
    from ansible.module_utils import minimax_spark_supervisor as sv

    listener = socket.socket()  # accepts, never answers: a frozen llama-server
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    wd = {"url": "http://127.0.0.1:%d" % listener.getsockname()[1], "timeout": 1, "restarts": 1, "key_file": ""}
    state = tmp_path / "state.json"
    try:
        assert sv.watchdog_once("head.service", wd, str(state)) == 1
        calls = fake_systemctl.read_text().splitlines()
        assert "restart head.service" in calls and "stop head.service" not in calls
        assert json.loads(state.read_text())["failures"] == 1
        # The next probe, on the invocation the watchdog itself started: past the bound, it stops the unit.
        assert sv.watchdog_once("head.service", wd, str(state)) == 1
        calls = fake_systemctl.read_text().splitlines()
        assert calls.count("restart head.service") == 1
        assert calls[-1] == "stop head.service"
        # A start by anyone else (a new invocation) begins a new count: one restart again, no stop.
        state.write_text(json.dumps({"invocation": "started-by-site.yml", "failures": 5}))
        assert sv.watchdog_once("head.service", wd, str(state)) == 1
        assert fake_systemctl.read_text().splitlines().count("restart head.service") == 2
    finally:
        listener.close()
