"""The canary's verdict: one message per kind, each saying what came back, what was served and what to do."""
import pytest
from ansible.module_utils.minimax_spark_canary import answers_verdict, canary_verdict

SERVED = dict(mode="native", chat_format="peg-minimax-m3", url="http://10.0.0.1:8891", max_tokens=512)
TAIL = "Served: template mode native, chat format peg-minimax-m3, at http://10.0.0.1:8891. Fix: "


def reply(content="", tool_calls=None, finish_reason="tool_calls", status=200, reasoning="I will call get_weather."):
    message = {"role": "assistant", "content": content, "reasoning_content": reasoning}
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    return {"status": status, "json": {"choices": [{"message": message, "finish_reason": finish_reason}]}}


def call(name="get_weather", arguments='{"city": "Paris"}'):
    return [{"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}]


def test_a_structured_call_passes():
    v = canary_verdict(reply(tool_calls=call()), **SERVED)
    assert v["ok"] and v["kind"] == "ok"
    assert v["tool_call"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert v["msg"] == ('Tool-call canary passed on /v1/chat/completions: get_weather({"city": "Paris"}). '
                        "Served: template mode native, chat format peg-minimax-m3, at http://10.0.0.1:8891.")


def test_arguments_already_a_dict_pass():
    assert canary_verdict(reply(tool_calls=call(arguments={"city": "Paris"})), **SERVED)["ok"]


@pytest.mark.parametrize("result, kind, what", [
    ({"status": -1, "msg": "Connection refused"}, "unreachable",
     "no answer from http://10.0.0.1:8891/v1/chat/completions (Connection refused)"),
    ({"status": 500, "content": "template error", "json": {"error": "x"}}, "http", "HTTP 500 (template error)"),
    ({"status": 401, "msg": "HTTP Error 401: Unauthorized"}, "http", "HTTP 401 (HTTP Error 401: Unauthorized)"),
    (reply(tool_calls=call(arguments='{"city": "Par'), finish_reason="length"), "length",
     "cut at max_tokens=512 (finish_reason=length, content='', tool_calls=1, "
     "first call get_weather({\"city\": \"Par))"),
    (reply(content="]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name=\"get_weather\">", finish_reason="stop"),
     "markup",
     "tool-call or reasoning markup ]<]minimax[>[, <tool_call>, <invoke name= in content (finish_reason=stop, "
     "content='" + ']<]minimax[>[<tool_call>\\\\n]<]minimax[>[<invoke name="get_weather">' + "', tool_calls=0)"),
    (reply(content="<minimax:tool_call><invoke name=\"get_weather\">", finish_reason="stop"), "markup",
     "tool-call or reasoning markup <minimax:tool_call>, <invoke name= in content"),
    (reply(content="<mm:think>hm</mm:think>Hello", finish_reason="stop"), "markup",
     "tool-call or reasoning markup <mm:think>, </mm:think> in content"),
    (reply(content="Hello!", finish_reason="stop"), "no_tool_calls",
     "no tool_calls came back (finish_reason=stop, content='Hello!', tool_calls=0)"),
    (reply(tool_calls=call(name="get_time")), "wrong_name", "the tool call names 'get_time', not 'get_weather'"),
    (reply(tool_calls=call(arguments='{"city": ')), "bad_arguments", "arguments are not JSON"),
    (reply(tool_calls=call(arguments='["Paris"]')), "bad_arguments", "arguments are a JSON list, not an object"),
    (reply(tool_calls=call(arguments=None)), "bad_arguments", "arguments are a JSON NoneType, not an object"),
])
def test_each_failure_has_its_own_message(result, kind, what):
    v = canary_verdict(result, **SERVED)
    assert not v["ok"] and v["kind"] == kind
    assert v["msg"].startswith("Tool-call canary failed on /v1/chat/completions: ")
    assert what in v["msg"], v["msg"]
    assert TAIL in v["msg"]
    assert v["msg"].endswith(".")


def test_missing_everything_is_not_a_crash():
    for result in (None, {}, {"status": 200}, {"status": 200, "json": {"choices": []}}, {"status": "x"}):
        v = canary_verdict(result)
        assert not v["ok"] and "Served: template mode unknown, chat format unknown" in v["msg"]


def test_long_content_is_cut():
    v = canary_verdict(reply(content="x" * 1000, finish_reason="stop"), **SERVED)
    assert "x" * 160 + "..." in v["msg"] and "x" * 161 not in v["msg"]


def test_answers_verdict_finds_markup_and_errors():
    clean = reply(content="Hello", finish_reason="stop")
    assert answers_verdict({"chat": clean, "multi_turn": clean})["ok"]
    v = answers_verdict({"chat": reply(content="<think>x</think>Hi", finish_reason="stop"),
                         "multi_turn": {"status": 500}},
                        mode="hybrid", chat_format="peg-native", url="http://h:1")
    assert not v["ok"]
    assert v["msg"].startswith("Verify failed: chat: markup <think>, </think> in content '<think>x</think>Hi'; "
                               "multi_turn: HTTP 500 (). Served: template mode hybrid, chat format peg-native, at http://h:1.")


# --- head_server's settings, checked before anything stops ------------------------------------------

from minimax_settings import head_settings  # noqa: E402

GOOD = dict(port=8891, ctx_size=4096, parallel=1, batch_size=2048, ubatch_size=512, health_timeout=1800,
            health_interval=15, extra_args=["--no-warmup", "-v", "--seed=3"])
OPTIONS = ["--no-warmup", "--seed", "--port"]


def test_good_settings_have_no_problem():
    assert head_settings(GOOD, OPTIONS) == []
    assert head_settings(dict(GOOD, port="8891", ctx_size=0), []) == []


@pytest.mark.parametrize("change, problem", [
    (dict(port=70000), "head_server_port=70000 is not a port (1-65535)"),
    (dict(port=0), "head_server_port=0 is not a port (1-65535)"),
    (dict(port="x"), "head_server_port='x' is not a whole number"),
    (dict(ctx_size=-5), "head_server_ctx_size=-5 is negative (0 takes the model's own context)"),
    (dict(ubatch_size=0), "head_server_ubatch_size=0 must be positive"),
    (dict(parallel=-1), "head_server_parallel=-1 must be positive"),
    (dict(extra_args="--no-warmup"), "head_server_extra_args is '--no-warmup', not a list of strings: give a list, "
                                     "e.g. -e '{\"head_server_extra_args\": [\"--flag\", \"value\"]}'"),
    (dict(extra_args={"flag": "v" * 80}), "head_server_extra_args is '{\"flag\": \"%s...', not a list of strings: "
                                          "give a list, e.g. -e '{\"head_server_extra_args\": [\"--flag\", \"value\"]}'"
                                          % ("v" * 50)),
    (dict(extra_args=["--no-such-flag", "1"]),
     "--no-such-flag in head_server_extra_args is not an option of this llama-server (see llama-server --help)"),
    (dict(extra_args=[{"a": 1}]), "head_server_extra_args holds {'a': 1}, not a string"),
])
def test_each_bad_setting_is_named(change, problem):
    assert head_settings(dict(GOOD, **change), OPTIONS) == [problem]


def test_unknown_flags_are_not_checked_without_the_option_list():
    assert head_settings(dict(GOOD, extra_args=["--no-such-flag"]), []) == []


# --- the health wait: a crash while loading fails at once ---------------------------------------------

import subprocess  # noqa: E402  (each section imports what it tests)
import sys  # noqa: E402  (idem)
import time  # noqa: E402  (idem)

from helpers import ROOT  # noqa: E402  (idem)

WAIT = ROOT / "roles" / "head_server" / "files" / "wait_healthy.py"


def test_a_crash_in_the_log_fails_the_wait_at_once(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("[minimax-supervise] 2026 exited with status 1\nold run\n")
    offset = log.stat().st_size
    log.write_text(log.read_text()
                   + "load_tensors: ...\nGGML_ASSERT failed\n[minimax-supervise] 2026 exited with status 134\n")
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(WAIT), "http://127.0.0.1:9", "60", "5", "--log", str(log),
                           "--offset", str(offset)], capture_output=True, text=True)
    assert done.returncode == 1 and time.monotonic() - started < 5
    assert done.stdout.startswith("llama-server exited while loading, after 0 s (/health: -1)")
    assert "GGML_ASSERT failed" in done.stdout and "old run" not in done.stdout


def test_no_crash_and_no_answer_ends_in_a_timeout(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("[minimax-supervise] exited with status 1\n")
    done = subprocess.run([sys.executable, str(WAIT), "http://127.0.0.1:9", "1", "1", "--log", str(log),
                           "--offset", str(log.stat().st_size)], capture_output=True, text=True)
    assert done.returncode == 2, done.stdout
    assert "did not become healthy within head_server_health_timeout=1 s (/health: -1)" in done.stdout


def test_a_plain_question_may_answer_with_a_tool_call_as_text_but_never_leak_reasoning():
    as_text = reply(content="]<]minimax[>[<tool_call>get_weather", finish_reason="stop")
    assert answers_verdict({"chat": as_text})["ok"]
    assert not answers_verdict({"multi_turn": as_text})["ok"]
    assert not answers_verdict({"chat": reply(content="<mm:think>x", finish_reason="stop")})["ok"]


# --- the health wait: speculation asked for but not set up is a failed start -----------------------------

def _fake_server(slots):
    """A stand-in llama-server answering /health 200 and /slots with ``slots``; (server, url)."""
    import http.server
    import json
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the http.server API
            body = b"{}" if self.path == "/health" else json.dumps(slots).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, "http://127.0.0.1:%d" % server.server_port


SPEC_ARGS = ["--spec-type", "draft-simple", "--spec-failure", "failed to initialize speculative decoding context",
             "--spec-failure", "speculative decoding not supported by this context"]


def test_a_start_whose_speculation_did_not_initialise_fails_with_llama_servers_line(tmp_path):
    """Only the current start's log counts (after the supervisor's last 'starting:' line)."""
    log = tmp_path / "server.log"
    log.write_text(
        "[minimax-supervise] 2026 starting: llama-server --old\n"
        "E srv load_model: failed to initialize speculative decoding context: an older start\n"
        "[minimax-supervise] 2026 starting: llama-server --spec-type draft-simple\n"
        "0.01.2 E srv    load_model: failed to initialize speculative decoding context: draft model vocab type "
        "must match target model to use speculation\n")
    server, url = _fake_server([{"id": 0, "speculative": False}])
    try:
        done = subprocess.run([sys.executable, str(WAIT), url, "10", "1", "--log", str(log), "--offset", "0"]
                              + SPEC_ARGS, capture_output=True, text=True)
    finally:
        server.shutdown()
    assert done.returncode == 3, done.stdout
    assert done.stdout == (
        "llama-server started without the speculative decoding it was asked for (head_server_spec_type=draft-simple) "
        "and would serve every request without it: 0.01.2 E srv    load_model: failed to initialize speculative "
        "decoding context: draft model vocab type must match target model to use speculation\n")


def test_slots_without_speculation_fail_the_start_even_without_a_log_line(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("[minimax-supervise] 2026 starting: llama-server\nmain: server is listening\n")
    server, url = _fake_server([{"id": 0, "speculative": False}])
    try:
        done = subprocess.run([sys.executable, str(WAIT), url, "10", "1", "--log", str(log)] + SPEC_ARGS,
                              capture_output=True, text=True)
    finally:
        server.shutdown()
    assert done.returncode == 3 and done.stdout.endswith('without it: its /slots report "speculative": false\n')


def test_a_start_that_speculates_is_healthy_and_an_old_failure_does_not_count(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("[minimax-supervise] 2026 starting: llama-server --old\n"
                   "failed to initialize speculative decoding context: an older start\n"
                   "[minimax-supervise] 2026 starting: llama-server\nmain: server is listening\n")
    server, url = _fake_server([{"id": 0, "speculative": True}])
    try:
        done = subprocess.run([sys.executable, str(WAIT), url, "10", "1", "--log", str(log)] + SPEC_ARGS,
                              capture_output=True, text=True)
        plain = subprocess.run([sys.executable, str(WAIT), url, "10", "1", "--log", str(log)],
                               capture_output=True, text=True)
    finally:
        server.shutdown()
    assert done.returncode == 0 and done.stdout.startswith("llama-server is healthy after 0 s"), done.stdout
    assert plain.returncode == 0
