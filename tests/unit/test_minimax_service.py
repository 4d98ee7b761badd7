"""minimax_service: the systemd unit it writes, and the supervisor it runs where there is no systemd.

The unit is checked by reading it back the way systemd does (quotes, C escapes, % specifiers and, on
Exec lines only, $ variables). The supervisor is run for real, in tmp_path, with small Python commands
standing in for llama-server and the RPC server.
"""
import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import minimax_service as ms
from helpers import run_module

PY = sys.executable

# -- helpers ----------------------------------------------------------------------------------------------------


def systemd_words(value, exec_line):
    """Split a unit setting into words the way systemd reads it (systemd.syntax(7) "Quoting").

    Whitespace separates words; double or single quotes group; backslash escapes C-style. Then
    ``%%`` is a literal ``%`` (any other ``%x`` is a specifier systemd would expand) and, on Exec
    lines only, ``$$`` is a literal ``$`` (any other ``$`` would be variable expansion). Anything
    systemd would expand raises AssertionError: a quoted argument must reach the process unchanged.
    """
    escapes = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "s": " "}
    words, word, quote, in_word, i = [], [], None, False, 0
    while i < len(value):
        c = value[i]
        if c == "\\":
            i += 1
            word.append(escapes[value[i]])
            in_word = True
        elif quote:
            if c == quote:
                quote = None
            else:
                word.append(c)
        elif c in "\"'":
            quote, in_word = c, True
        elif c.isspace():
            if in_word:
                words.append("".join(word))
            word, in_word = [], False
        else:
            word.append(c)
            in_word = True
        i += 1
    assert quote is None, "unterminated quote in %r" % value
    if in_word:
        words.append("".join(word))

    def literal(word, char):
        out, j = [], 0
        while j < len(word):
            if word[j] == char:
                assert word[j + 1 : j + 2] == char, "systemd would expand %r in %r" % (word[j : j + 2], word)
                j += 1
            out.append(word[j])
            j += 1
        return "".join(out)

    words = [literal(w, "%") for w in words]
    if exec_line:
        words = [literal(w, "$") for w in words]
    return words


def unit_params(**overrides):
    """minimax_service's parameters with the module's defaults."""
    params = {
        "name": "minimax-llama-server",
        "description": "",
        "argv": ["/opt/minimax-spark/llama.cpp/current/bin/llama-server", "--port", "8891"],
        "env": {},
        "pre_start": [],
        "watch_ports": [],
        "fingerprint": "",
        "restart_sec": 5,
        "stop_timeout": 60,
        "after": [],
    }
    params.update(overrides)
    return params


def settings(unit_text, key):
    """Values of every ``key=`` line of a unit, in order."""
    return [line.split("=", 1)[1] for line in unit_text.splitlines() if line.startswith(key + "=")]


def environment(unit_text):
    env = {}
    for value in settings(unit_text, "Environment"):
        for word in systemd_words(value, exec_line=False):
            key, _, val = word.partition("=")
            env[key] = val
    return env


TRICKY_ARGS = [
    "--alias", "MiniMax M3 (hybrid)",
    "--chat-template-kwargs", '{"reasoning": "on", "note": "100% \\"sure\\""}',
    "--api-key", "pa$$word$HOME${USER}",
    "--grammar", "root ::= 'a'\tnext\\n",
    "--empty", "",
    "--pct", "50%",
]

# -- the systemd unit -------------------------------------------------------------------------------------------


def test_unit_restarts_on_failure_and_starts_at_boot():
    units = ms.render_unit(unit_params(restart_sec=7, stop_timeout=90, description="minimax-spark llama-server"),
                           "/srv/run/minimax-supervise")
    assert list(units) == ["minimax-llama-server.service"]
    unit = units["minimax-llama-server.service"]
    assert settings(unit, "Restart") == ["on-failure"]
    assert settings(unit, "RestartSec") == ["7"]
    assert settings(unit, "TimeoutStopSec") == ["90"]
    assert settings(unit, "Description") == ["minimax-spark llama-server"]
    assert settings(unit, "WantedBy") == ["multi-user.target"]
    # The sections are in the order systemd expects the settings in.
    assert unit.index("[Unit]") < unit.index("[Service]") < unit.index("ExecStart=") < unit.index("[Install]")


def test_unit_description_defaults_to_the_name():
    unit = ms.render_unit(unit_params(), "/x")["minimax-llama-server.service"]
    assert settings(unit, "Description") == ["minimax-llama-server"]


def test_exec_start_passes_every_argument_unchanged():
    argv = ["/opt/minimax-spark/llama.cpp/current/bin/llama-server"] + TRICKY_ARGS
    unit = ms.render_unit(unit_params(argv=argv), "/x")["minimax-llama-server.service"]
    (exec_start,) = settings(unit, "ExecStart")
    assert systemd_words(exec_start, exec_line=True) == argv


def test_plain_arguments_stay_unquoted():
    argv = ["/opt/bin/ggml-rpc-server", "-H", "10.20.20.2", "-p", "50052", "--rpc", "10.0.0.2:50052,10.0.0.3:50052"]
    unit = ms.render_unit(unit_params(argv=argv), "/x")["minimax-llama-server.service"]
    assert settings(unit, "ExecStart") == [" ".join(argv)]


def test_environment_lines_pass_values_unchanged():
    env = {"GGML_NO_BACKTRACE": 1, "LLAMA_CACHE": "/var/lib/minimax spark/cache", "ODD": 'p$$ 100% "q" $HOME \\'}
    params = unit_params(env=env, fingerprint="template=abc build=12% model=$x")
    unit = ms.render_unit(params, "/x")["minimax-llama-server.service"]
    assert environment(unit) == {
        "GGML_NO_BACKTRACE": "1",
        "LLAMA_CACHE": "/var/lib/minimax spark/cache",
        "ODD": 'p$$ 100% "q" $HOME \\',
        "MINIMAX_SPARK_FINGERPRINT": "template=abc build=12% model=$x",
    }


def test_no_fingerprint_no_fingerprint_line():
    unit = ms.render_unit(unit_params(), "/x")["minimax-llama-server.service"]
    assert settings(unit, "Environment") == []


def test_exec_start_pre_lines_in_order_before_exec_start():
    pre = [
        [PY, "/srv/run/minimax-supervise", "wait-tcp", "10.0.0.2:50052", "[fd00::3]:50052", "--timeout", "600"],
        ["/bin/sh", "-c", "iptables -C INPUT -p tcp --dport 50052 -j DROP 2>/dev/null || iptables -A INPUT -j DROP"],
    ]
    unit = ms.render_unit(unit_params(pre_start=pre), "/x")["minimax-llama-server.service"]
    lines = settings(unit, "ExecStartPre")
    assert [systemd_words(line, exec_line=True) for line in lines] == pre
    assert unit.index("ExecStartPre=") < unit.index("ExecStart=/")


def test_after_orders_and_wants_the_local_rpc_server():
    unit = ms.render_unit(unit_params(after=["minimax-rpc-server.service"]), "/x")["minimax-llama-server.service"]
    assert settings(unit, "After")[0].split() == ["network-online.target", "minimax-rpc-server.service"]
    assert settings(unit, "Wants")[0].split() == ["network-online.target", "minimax-rpc-server.service"]


def test_watch_unit_only_with_watch_ports():
    assert "minimax-llama-server-watch.service" not in ms.render_unit(unit_params(), "/srv/run/minimax-supervise")
    units = ms.render_unit(unit_params(watch_ports=[50052, 50053]), "/srv/run/minimax-supervise")
    assert set(units) == {"minimax-llama-server.service", "minimax-llama-server-watch.service"}
    watch = units["minimax-llama-server-watch.service"]
    (exec_start,) = settings(watch, "ExecStart")
    words = systemd_words(exec_start, exec_line=True)
    assert words[1:] == ["/srv/run/minimax-supervise", "watch", "minimax-llama-server.service", "50052,50053"]
    assert settings(watch, "BindsTo") == ["minimax-llama-server.service"]
    assert settings(watch, "WantedBy") == ["minimax-llama-server.service"]
    assert settings(watch, "Restart") == ["always"]


# -- what restarts a service ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        {"argv": ["/opt/bin/llama-server", "--port", "8892"]},
        {"env": {"LLAMA_ARG_THREADS": "8"}},
        {"fingerprint": "template=0123"},
        {"pre_start": [["/bin/true"]]},
        {"watch_ports": [50052]},
    ],
)
def test_definition_changes_with_what_the_service_runs(change):
    before = ms.definition(unit_params())
    after = ms.definition(unit_params(**change))
    assert before != after
    assert ms.render_unit(unit_params(), "/x") != ms.render_unit(unit_params(**change), "/x")


def test_definition_is_stable_for_equal_input():
    one = ms.definition(unit_params(env={"A": 1, "B": "x"}))
    two = ms.definition(unit_params(env={"B": "x", "A": "1"}))
    assert json.dumps(one, sort_keys=True) == json.dumps(two, sort_keys=True)


# -- the supervisor, for real ------------------------------------------------------------------------------------


def proc_state(pid):
    """The process state letter, or None when there is no such process."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def alive(pid):
    return proc_state(pid) not in (None, "Z")


def wait_for(predicate, timeout=10.0, interval=0.1):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()


def pids_in(path):
    try:
        return [int(x) for x in Path(path).read_text().split()]
    except FileNotFoundError:
        return []


class Supervised:
    """minimax_service with manager=supervisor in tmp_path; kills every process group it started.

    On a node the supervisor outlives the module run and init reaps it when it ends. Here it is a
    child of the test process, so a thread reaps the supervisors the tests know of (otherwise an
    exited supervisor stays a zombie and the module's stop waits out stop_timeout).
    """

    def __init__(self, tmp_path):
        self.tmp = tmp_path
        self.run_dir = tmp_path / "run"
        self.log_dir = tmp_path / "log"
        self.groups = set()
        self._reap = set()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._reaper, daemon=True)
        self._thread.start()

    def _reaper(self):
        while not self._done.is_set():
            with self._lock:
                pids = list(self._reap)
            for pid in pids:
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done = pid
                if done:
                    with self._lock:
                        self._reap.discard(pid)
            time.sleep(0.05)

    def args(self, name="minimax-test", **extra):
        args = {
            "name": name,
            "manager": "supervisor",
            "run_dir": str(self.run_dir),
            "log_dir": str(self.log_dir),
            "restart_sec": 1,
            "stop_timeout": 5,
        }
        args.update(extra)
        return args

    def run(self, check_mode=False, **extra):
        try:
            return run_module(ms.main, self.args(**extra), check_mode=check_mode)
        finally:
            for pidfile in self.run_dir.glob("*.pid"):
                pid = int(pidfile.read_text())
                with self._lock:
                    self.groups.add(pid)
                    self._reap.add(pid)

    def log(self, name="minimax-test"):
        path = self.log_dir / (name + ".log")
        return path.read_text() if path.exists() else ""

    def cleanup(self):
        for group in self.groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)
        for group in self.groups:
            wait_for(lambda group=group: not group_alive(group), timeout=5)
        self._done.set()
        self._thread.join(5)
        for group in self.groups:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(group, os.WNOHANG)


def group_alive(pgid):
    """Some live (non-zombie) process is in process group pgid."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[2]) == pgid:
                return True
    return False


@pytest.fixture
def sup(tmp_path):
    supervised = Supervised(tmp_path)
    yield supervised
    supervised.cleanup()


def sleeper(pidfile, *extra):
    """A stand-in service: appends its pid (and MINIMAX_TEST from its environment) to pidfile, then sleeps."""
    code = (
        "import os, sys, time\n"
        "with open(sys.argv[1], 'a') as f: f.write('%d\\n' % os.getpid())\n"
        "if 'MINIMAX_TEST' in os.environ:\n"
        "    open(sys.argv[1] + '.env', 'w').write(os.environ['MINIMAX_TEST'])\n"
        "time.sleep(600)\n"
    )
    return [PY, "-c", code, str(pidfile)] + list(extra)


def test_start_runs_the_command_and_a_second_run_changes_nothing(sup, tmp_path):
    pidfile = tmp_path / "child.pid"
    order = tmp_path / "order"
    pre = [[PY, "-c", "open(%r, 'a').write('pre-start\\n')" % str(order)]]
    args = dict(argv=sleeper(pidfile), env={"MINIMAX_TEST": "a $b 100% c"}, pre_start=pre)

    first = sup.run(**args)
    assert first["changed"] is True, first
    assert first["manager"] == "supervisor"
    pid = first["pid"]
    assert alive(pid)
    assert first["definition"] == str(sup.run_dir / "minimax-test.json")
    assert first["log"] == str(sup.log_dir / "minimax-test.log")
    assert (sup.run_dir / "minimax-test.pid").read_text().strip() == str(pid)
    assert os.access(sup.run_dir / "minimax-supervise", os.X_OK)
    # The command runs under the supervisor, after its pre-start command, with the environment given.
    (child,) = wait_for(lambda: pids_in(pidfile))
    assert alive(child)
    assert os.getpgid(child) == pid
    assert order.read_text() == "pre-start\n"
    assert wait_for(lambda: (tmp_path / "child.pid.env").exists())
    assert (tmp_path / "child.pid.env").read_text() == "a $b 100% c"
    assert "starting: " in sup.log()

    second = sup.run(**args)
    assert second["changed"] is False, second
    assert second["pid"] == pid
    assert alive(pid) and alive(child)
    assert pids_in(pidfile) == [child]


@pytest.mark.parametrize(
    "change",
    [{"argv_extra": ["--port", "8892"]}, {"fingerprint": "template=new"}, {"env": {"MINIMAX_OTHER": "1"}}],
    ids=["argv", "fingerprint", "env"],
)
def test_a_changed_definition_restarts_the_service(sup, tmp_path, change):
    pidfile = tmp_path / "child.pid"
    first = sup.run(argv=sleeper(pidfile), fingerprint="template=old")
    (old_child,) = wait_for(lambda: pids_in(pidfile))

    args = {"argv": sleeper(pidfile, *change.get("argv_extra", [])),
            "fingerprint": change.get("fingerprint", "template=old")}
    if "env" in change:
        args["env"] = change["env"]
    second = sup.run(**args)
    assert second["changed"] is True
    assert second["pid"] != first["pid"]
    assert alive(second["pid"])
    assert not group_alive(first["pid"]), "the old supervisor or its command still runs"
    new_children = wait_for(lambda: pids_in(pidfile)[1:])
    assert new_children and alive(new_children[0]) and not alive(old_child)
    assert sup.run(**args)["changed"] is False


def test_state_restarted_always_restarts(sup, tmp_path):
    pidfile = tmp_path / "child.pid"
    first = sup.run(argv=sleeper(pidfile))
    second = sup.run(argv=sleeper(pidfile), state="restarted")
    assert second["changed"] is True
    assert second["pid"] != first["pid"] and alive(second["pid"]) and not group_alive(first["pid"])


def test_check_mode_reports_and_starts_nothing(sup, tmp_path):
    pidfile = tmp_path / "child.pid"
    result = sup.run(check_mode=True, argv=sleeper(pidfile))
    assert result["changed"] is True
    assert result.get("pid") is None
    assert not sup.run_dir.exists() or not list(sup.run_dir.iterdir())
    time.sleep(0.5)
    assert not pidfile.exists()


def test_check_mode_leaves_a_running_service_alone(sup, tmp_path):
    pidfile = tmp_path / "child.pid"
    started = sup.run(argv=sleeper(pidfile))
    pid = started["pid"]
    (child,) = wait_for(lambda: pids_in(pidfile))
    spec = (sup.run_dir / "minimax-test.json").read_text()

    assert sup.run(check_mode=True, argv=sleeper(pidfile))["changed"] is False
    changed = sup.run(check_mode=True, argv=sleeper(pidfile, "--new"))
    assert changed["changed"] is True
    stopped = sup.run(check_mode=True, state="stopped")
    assert stopped["changed"] is True

    assert alive(pid) and alive(child)
    assert (sup.run_dir / "minimax-test.json").read_text() == spec
    assert (sup.run_dir / "minimax-test.pid").read_text().strip() == str(pid)
    assert pids_in(pidfile) == [child]


def test_a_command_that_fails_at_once_is_restarted(sup):
    result = sup.run(argv=[PY, "-c", "import sys; sys.exit(3)"])
    assert result["changed"] is True and not result.get("failed")
    assert wait_for(lambda: sup.log().count("exited with status 3") >= 2, timeout=10), sup.log()
    log = sup.log()
    assert "restarting in 1 s" in log
    assert log.count("starting: ") >= 2
    assert alive(result["pid"])


def test_settle_fails_fast_on_a_command_that_exits_and_stops_it(sup):
    """A bad flag must fail the play at once, with the log, not loop until a health timeout."""
    result = sup.run(argv=[PY, "-c", "import sys; print('error: invalid argument: --bogus'); sys.exit(1)"], settle=5)
    assert result.get("failed")
    assert "exited within 5 s" in result["msg"] and "invalid argument: --bogus" in result["msg"]
    assert sup.run(state="stopped")["changed"] is False  # already stopped by the failure


def test_settle_passes_a_command_that_keeps_running(sup):
    result = sup.run(argv=[PY, "-c", "import time; time.sleep(600)"], settle=2)
    assert result["changed"] is True and not result.get("failed")
    assert alive(result["pid"])


def test_stopped_stops_the_whole_process_group_and_is_idempotent(sup, tmp_path):
    pidfile = tmp_path / "child.pid"
    grandchild_file = tmp_path / "grandchild.pid"
    # The service forks a helper of its own (llama-server's children, a shell wrapper's command...).
    code = (
        "import os, subprocess, sys, time\n"
        "p = subprocess.Popen(['sleep', '600'])\n"
        "open(sys.argv[2], 'w').write('%d\\n' % p.pid)\n"
        "open(sys.argv[1], 'w').write('%d\\n' % os.getpid())\n"
        "time.sleep(600)\n"
    )
    started = sup.run(argv=[PY, "-c", code, str(pidfile), str(grandchild_file)])
    pid = started["pid"]
    (child,) = wait_for(lambda: pids_in(pidfile))
    (grandchild,) = wait_for(lambda: pids_in(grandchild_file))
    assert alive(child) and alive(grandchild)

    began = time.time()
    stopped = sup.run(state="stopped")
    assert stopped["changed"] is True
    assert time.time() - began < 5, "a clean stop must not wait out stop_timeout"
    assert wait_for(lambda: not any(alive(p) for p in (pid, child, grandchild)), timeout=5)
    assert not group_alive(pid)
    assert not (sup.run_dir / "minimax-test.pid").exists()
    assert "stopped" in sup.log().splitlines()[-1]

    again = sup.run(state="stopped")
    assert again["changed"] is False


def test_stopped_when_never_started_changes_nothing(sup):
    assert sup.run(state="stopped")["changed"] is False


def test_a_command_that_cannot_start_fails_the_module_with_the_log(sup, tmp_path):
    missing = str(tmp_path / "no-such-llama-server")
    result = sup.run(argv=[missing, "--port", "8891"])
    assert result.get("failed") is True
    msg = result["msg"]
    assert "minimax-test stopped at once" in msg
    assert str(sup.log_dir / "minimax-test.log") in msg
    # The log tail is in the message: the user sees why without logging in.
    assert "No such file or directory" in msg
    assert missing in msg


def test_an_empty_argv_fails_clearly(sup):
    result = sup.run(argv=[])
    assert result.get("failed") is True
    assert "argv" in result["msg"]


# -- wait-tcp --------------------------------------------------------------------------------------------------


@pytest.fixture
def supervisor_script(sup, tmp_path):
    """The supervisor script as the module writes it to run_dir."""
    sup.run(argv=sleeper(tmp_path / "child.pid"))
    return sup.run_dir / "minimax-supervise"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def listener():
    sockets = []

    def listen(host="127.0.0.1", family=socket.AF_INET):
        s = socket.socket(family)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, 0))
        s.listen(16)
        sockets.append(s)
        return s, s.getsockname()[1]

    yield listen
    for s in sockets:
        s.close()


def wait_tcp(script, *args, timeout=30):
    began = time.time()
    proc = subprocess.run([PY, str(script), "wait-tcp"] + list(args), capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr, time.time() - began


def test_wait_tcp_returns_at_once_for_a_listening_port(supervisor_script, listener):
    _, port = listener()
    rc, out, seconds = wait_tcp(supervisor_script, "127.0.0.1:%d" % port, "--timeout", "5")
    assert rc == 0, out
    assert seconds < 3
    assert "127.0.0.1:%d answers" % port in out


def test_wait_tcp_understands_bracketed_ipv6(supervisor_script, listener):
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        _, port = listener("::1", socket.AF_INET6)
    except OSError:
        pytest.skip("no IPv6 loopback")
    rc, out, _ = wait_tcp(supervisor_script, "[::1]:%d" % port, "--timeout", "5")
    assert rc == 0, out


def test_wait_tcp_fails_after_the_timeout_for_a_closed_port(supervisor_script, listener):
    _, port = listener()
    closed = free_port()
    rc, out, seconds = wait_tcp(supervisor_script, "127.0.0.1:%d" % port, "127.0.0.1:%d" % closed, "--timeout", "2")
    assert rc == 1, out
    assert 2 <= seconds < 8
    assert "127.0.0.1:%d did not answer within 2 s" % closed in out


def test_wait_tcp_waits_for_a_port_that_opens_later(supervisor_script):
    port = free_port()
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    timer = threading.Timer(1.5, lambda: (server.bind(("127.0.0.1", port)), server.listen(4)))
    timer.start()
    try:
        rc, out, seconds = wait_tcp(supervisor_script, "127.0.0.1:%d" % port, "--timeout", "20")
    finally:
        timer.cancel()
        timer.join()
        server.close()
    assert rc == 0, out
    assert seconds >= 1


# -- watch_ports: a worker that drops the connection restarts the head ------------------------------------------


@pytest.fixture
def dropping_server():
    """A TCP server on 127.0.0.1 that accepts each connection and closes it (a restarted RPC worker)."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.2)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            time.sleep(0.2)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(5)
    server.close()


def client(port, pidfile):
    """A stand-in llama-server: connects to its worker on port, records its pid, then sleeps."""
    code = (
        "import os, socket, sys, time\n"
        "s = socket.create_connection(('127.0.0.1', int(sys.argv[1])))\n"
        "open(sys.argv[2], 'a').write('%d\\n' % os.getpid())\n"
        "time.sleep(600)\n"
    )
    return [PY, "-c", code, str(port), str(pidfile)]


def test_a_connection_closed_on_a_watched_port_restarts_the_service(sup, tmp_path, dropping_server):
    watched, unwatched = tmp_path / "watched.pid", tmp_path / "unwatched.pid"
    sup.run(name="head-watched", argv=client(dropping_server, watched), watch_ports=[dropping_server])
    # Same connection, same drop, but the port is not watched: this one must keep running.
    sup.run(name="head-unwatched", argv=client(dropping_server, unwatched), watch_ports=[free_port()])

    restarted = wait_for(lambda: len(pids_in(watched)) >= 2, timeout=15)
    assert restarted, sup.log("head-watched")
    assert "a worker closed its connection: restarting" in sup.log("head-watched")
    first = pids_in(watched)[0]
    assert wait_for(lambda: not alive(first), timeout=5)

    # The unwatched service has had its connection closed for a while, through several checks.
    time.sleep(2)
    (only,) = pids_in(unwatched)
    assert alive(only)
    assert "closed its connection" not in sup.log("head-unwatched")


# -- the supervisor is a real file, shipped as it is ------------------------------------------------------------


def test_the_shipped_supervisor_is_the_project_file(supervisor_script, project_root):
    shipped = supervisor_script.read_text()
    assert shipped == (project_root / "module_utils" / "minimax_spark_supervisor.py").read_text()
    assert os.access(supervisor_script, os.X_OK)
    # It runs on its own (no Ansible on the node's path): a usage line for no arguments.
    proc = subprocess.run([sys.executable, "-I", str(supervisor_script)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1 and "usage: minimax-supervise run DEF" in proc.stderr


def test_the_log_is_readable_by_its_owner_only(sup, tmp_path):
    sup.run(argv=sleeper(tmp_path / "child.pid"))
    log = sup.log_dir / "minimax-test.log"
    assert log.stat().st_mode & 0o777 == 0o600
    assert sup.log_dir.stat().st_mode & 0o777 == 0o750


# -- wait_for: the head waits for its workers without knowing the supervisor's path ----------------------------


def test_wait_for_holds_the_start_until_the_endpoint_answers(sup, tmp_path):
    pidfile = tmp_path / "child.pid"
    port = free_port()
    result = sup.run(argv=sleeper(pidfile), wait_for=["127.0.0.1:%d" % port], wait_timeout=60)
    spec = json.loads((sup.run_dir / "minimax-test.json").read_text())
    assert spec["pre_start"][0][1:] == [str(sup.run_dir / "minimax-supervise"), "wait-tcp",
                                        "127.0.0.1:%d" % port, "--timeout", "60"]
    time.sleep(2)
    assert pids_in(pidfile) == [], "the command started before its worker answered"
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(4)
        assert wait_for(lambda: pids_in(pidfile), timeout=15), sup.log()
    assert "127.0.0.1:%d answers" % port in sup.log()
    assert result["changed"] is True


# -- verified and restored: a failed deployment is rolled back to the last one that passed its checks ----------


def test_verified_needs_a_running_service(sup):
    result = sup.run(state="verified")
    assert result["failed"] is True
    assert result["msg"] == "minimax-test is not running: only a running service can be recorded as verified"


def test_restored_puts_the_verified_definition_back_and_runs_it(sup, tmp_path):
    good, bad = tmp_path / "good.pid", tmp_path / "bad.pid"
    sup.run(argv=sleeper(good), fingerprint="template=good")
    recorded = sup.run(state="verified", note={"template": "good"})
    assert recorded["changed"] is True
    assert recorded["verified"]["exists"] and recorded["verified"]["serving"]
    assert recorded["verified"]["note"] == {"template": "good"}
    assert sup.run(state="verified", note={"template": "good"})["changed"] is False

    sup.run(argv=sleeper(bad), fingerprint="template=bad")
    (bad_child,) = wait_for(lambda: pids_in(bad))
    status = sup.run(argv=sleeper(bad), fingerprint="template=bad")
    assert status["verified"]["serving"] is False

    restored = sup.run(state="restored", settle=2)
    assert restored["changed"] is True and restored["restored"] is True
    assert restored["running"] is True and restored["verified"]["serving"] is True
    assert restored["verified"]["note"] == {"template": "good"}
    assert wait_for(lambda: not alive(bad_child))
    assert wait_for(lambda: len(pids_in(good)) == 2), "the verified command was not started again"
    spec = json.loads((sup.run_dir / "minimax-test.json").read_text())
    assert spec["fingerprint"] == "template=good"
    # Restoring what already serves changes nothing.
    assert sup.run(state="restored")["changed"] is False


def test_verified_returns_the_command_line_it_recorded(sup, tmp_path):
    """The head's deployment fact records the command the verified definition runs, from the module's result."""
    pidfile = tmp_path / "child.pid"
    argv = sleeper(pidfile, "--alias", "it's a $HOME test")
    sup.run(argv=argv)
    recorded = sup.run(state="verified")
    assert recorded["command"] == " ".join(shlex.quote(a) for a in argv)
    assert shlex.split(recorded["command"]) == argv
    # what is recorded, not what this call names: a later check records the same line
    assert sup.run(state="verified", argv=["/bin/other"])["command"] == recorded["command"]


def test_verified_returns_the_sha256_of_the_definition_a_rollback_compares(sup, tmp_path):
    """verify records each worker's definition sha256 from this result; a rollback compares the file on disk with it."""
    import hashlib

    sup.run(argv=sleeper(tmp_path / "one.pid"))
    recorded = sup.run(state="verified")
    assert recorded["definition_sha256"] == hashlib.sha256(Path(recorded["definition"]).read_bytes()).hexdigest()
    sup.run(argv=sleeper(tmp_path / "two.pid"))
    changed = hashlib.sha256(Path(recorded["definition"]).read_bytes()).hexdigest()
    assert changed != recorded["definition_sha256"]
    assert sup.run(state="verified")["definition_sha256"] == changed


def test_a_units_command_line_is_its_exec_start_as_written():
    argv = ["/opt/minimax-spark/llama.cpp/current/bin/llama-server"] + TRICKY_ARGS
    params = unit_params(argv=argv, pre_start=[["/usr/sbin/iptables-restore", "--noflush"]])
    unit = ms.render_unit(params, "/x")["minimax-llama-server.service"]
    command = ms.defined_command("systemd", unit)
    assert settings(unit, "ExecStartPre") and [command] == settings(unit, "ExecStart")
    assert systemd_words(command, exec_line=True) == argv
    assert ms.defined_command("systemd", "") == "" and ms.defined_command("supervisor", "not json") == ""


def test_restored_without_a_verified_definition_stops_the_service(sup, tmp_path):
    pidfile = tmp_path / "child.pid"
    first = sup.run(argv=sleeper(pidfile))
    (child,) = wait_for(lambda: pids_in(pidfile))
    result = sup.run(state="restored")
    assert result["changed"] is True and result["restored"] is False
    assert result["running"] is False and result["verified"] == {"exists": False}
    assert wait_for(lambda: not group_alive(first["pid"]))
    assert not alive(child)
    assert sup.run(state="restored")["changed"] is False


def test_restored_in_check_mode_changes_nothing(sup, tmp_path):
    good, bad = tmp_path / "good.pid", tmp_path / "bad.pid"
    sup.run(argv=sleeper(good))
    sup.run(state="verified")
    second = sup.run(argv=sleeper(bad))
    (bad_child,) = wait_for(lambda: pids_in(bad))
    result = sup.run(state="restored", check_mode=True)
    assert result["changed"] is True and result["restored"] is True
    time.sleep(1)
    assert alive(bad_child) and pids_in(good)[-1:] and len(pids_in(good)) == 1
    assert json.loads((sup.run_dir / "minimax-test.json").read_text())["argv"] == sleeper(bad)
    assert second["pid"] == sup.run(argv=sleeper(bad))["pid"]


def test_a_corrupt_record_counts_as_none(sup, tmp_path):
    sup.run(argv=sleeper(tmp_path / "child.pid"))
    (sup.run_dir / "minimax-test.verified.json").write_text("{not json")
    result = sup.run(state="restored")
    assert result["restored"] is False and result["running"] is False


class _FailJson(Exception):
    pass


class _SystemdModule:
    """Just enough AnsibleModule for SystemdService.settle, with systemctl answered from a script."""

    def __init__(self, active_states):
        self.params = {"name": "minimax-rpc-server", "run_dir": "/nonexistent", "settle": 2}
        self.states = list(active_states)
        self.calls = []
        self.check_mode = False

    def run_command(self, argv):
        self.calls.append(argv)
        if argv[:3] == ["systemctl", "show", "-p"] and argv[3] == "ActiveState":
            return 0, (self.states.pop(0) if len(self.states) > 1 else self.states[0]) + "\n", ""
        if argv[:3] == ["systemctl", "show", "-p"] and argv[3] == "NRestarts":
            return 0, "0\n", ""
        if argv[0] == "journalctl":
            return 0, "ggml-rpc-server: unknown argument: --bogus\n", ""
        return 0, "", ""

    def fail_json(self, msg, **_kw):
        raise _FailJson(msg)


@pytest.mark.parametrize("state", ["inactive", "failed"])
def test_systemd_settle_fails_a_unit_that_exits_even_with_status_0(monkeypatch, state):
    """ggml-rpc-server exits 0 on an unknown flag: the unit goes inactive, which is a failed start too."""
    from ansible.module_utils.minimax_spark_service import SystemdService

    module = _SystemdModule(["active", state])
    monkeypatch.setattr(time, "sleep", lambda _s: None)
    with pytest.raises(_FailJson) as failure:
        SystemdService(module).settle(0)
    assert str(failure.value).startswith("minimax-rpc-server exited within 2 s of its start and is stopped now.")
    assert "unknown argument: --bogus" in str(failure.value)
    assert ["systemctl", "stop", "minimax-rpc-server"] in module.calls


def test_systemd_settle_passes_a_unit_that_stays_active(monkeypatch):
    from ansible.module_utils.minimax_spark_service import SystemdService

    module = _SystemdModule(["active"])
    clock = iter(range(0, 100))
    monkeypatch.setattr(time, "sleep", lambda _s: None)
    monkeypatch.setattr(time, "time", lambda: next(clock))
    SystemdService(module).settle(0)
    assert not [c for c in module.calls if c[:2] == ["systemctl", "stop"]]
