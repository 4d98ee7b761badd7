"""Failure paths of a deployment, through site.yml as a user runs it (inventory/local, supervised services).

One verified baseline serves the module: the M3-format tiny model with the native template (auto). Each
variant deploys another scripted model or a bad setting over it and asserts the message, what serves
afterwards (the baseline again, auto's other template, or nothing) and the facts. Variants run only the
steps they change: the model, the template, the head and verify.
"""
import json
from pathlib import Path

import pytest
import requests

from helpers import changed_tasks, failed_tasks, run_playbook

FACTS = Path("/etc/ansible/facts.d")
RUN_DIR = Path("/opt/minimax-spark/services")
HEAD_LOG = Path("/var/log/minimax-spark/minimax-llama-server.log")
TEMPLATE = Path("/var/lib/minimax-spark/templates/chat-template.jinja")
API = "http://127.0.0.1:8891"
VARIANT_TAGS = ["hybrid_template", "head_server", "verify"]
SERVED_NATIVE = "Served: template mode native, chat format peg-minimax-m3, at http://127.0.0.1:8891."
NOW_BASELINE = ("Now serving: the last verified deployment again (template mode native, chat format peg-minimax-m3, "
                "verified ")


def fact(name):
    path = FACTS / ("minimax_%s.fact" % name)
    return json.loads(path.read_text()) if path.exists() else None


def tool_call():
    body = {"messages": [{"role": "user", "content": "What is the weather in Paris?"}], "temperature": 0,
            "tools": [{"type": "function", "function": {
                "name": "get_weather", "description": "Weather of a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]}
    reply = requests.post(API + "/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["message"]


def served_model():
    spec = json.loads((RUN_DIR / "minimax-llama-server.json").read_text())
    argv = spec["argv"]
    return argv[argv.index("--model") + 1]


def last_start_log():
    return HEAD_LOG.read_text(errors="replace").split("[minimax-supervise]")[-1]


def reports(runner):
    """The messages of the debug tasks that ran, in order."""
    return [e["event_data"]["res"]["msg"] for e in runner.event_list
            if e.get("event") == "runner_on_ok" and isinstance(e["event_data"].get("res", {}).get("msg"), str)]


def messages(runner):
    """The message the run ended with (a start failure that was rescued is reported before it)."""
    failures = failed_tasks(runner)
    return failures[-1][2] if failures else ""


@pytest.fixture(scope="module")
def models(tmp_path_factory, llamacpp_tree):
    """Scripted tiny models: M3 calls, M2-style calls (both with M3's template), M2 (M2's template), no calls."""
    from make_tiny_m3 import write_tiny_m3

    root = tmp_path_factory.mktemp("head_failures")
    templates = llamacpp_tree / "models" / "templates"
    m3 = (templates / "MiniMax-M3.jinja").read_text()
    m2 = (templates / "MiniMax-M2.jinja").read_text()
    made = {}
    for name, fmt, text in (("m3", "m3", m3), ("hybrid", "hybrid", m3), ("m2", "m2", m2), ("plain", "none", m3)):
        made[name] = str(write_tiny_m3(root / ("tiny-%s.gguf" % name), fmt, template_text=text)[0])
    return made


@pytest.fixture(scope="module")
def baseline(models, llamacpp_archive):
    """site.yml with the M3 model in auto: the native template, verified."""
    runner = run_playbook("site.yml", extravars={"model_download_local_file": models["m3"]})
    assert runner.status == "successful", failed_tasks(runner) or runner.stdout_text[-5000:]
    return runner


def deploy(models, which, **extravars):
    """The template, the head and verify for another model (named to both roles, as model_download would)."""
    return run_playbook("site.yml", tags=VARIANT_TAGS, extravars=dict(
        extravars, hybrid_template_model_path=models[which], head_server_model_path=models[which]))


def assert_baseline_serves(models):
    assert served_model() == models["m3"]
    assert tool_call()["tool_calls"][0]["function"]["name"] == "get_weather"
    assert fact("template")["mode"] == "native"
    assert fact("deployment")["template_mode"] == "native"
    assert fact("deployment")["model_path"] == models["m3"]


def test_baseline_is_verified_and_recorded(baseline, models):
    deployment = fact("deployment")
    template = fact("template")
    assert template["family"] == "m3" and template["requested"] == "auto"
    assert deployment["template_sha256"] == template["sha256"]
    assert (deployment["template_mode"], deployment["chat_format"]) == ("native", "peg-minimax-m3")
    assert "--chat-template-file %s" % TEMPLATE in deployment["command"]
    assert deployment["verified_at"]
    assert json.loads((RUN_DIR / "minimax-llama-server.verified.json").read_text())["note"]["template_mode"] == "native"
    # the chat format reported is the one llama-server logs
    tool_call()
    assert "chat format: peg-minimax-m3" in last_start_log()


def test_no_tool_calls_in_either_template_restores_the_baseline(baseline, models):
    runner = deploy(models, "plain")
    assert runner.status == "failed"
    msg = messages(runner)
    assert msg.startswith("Tool-call canary failed on /v1/chat/completions: no tool_calls came back "
                          "(finish_reason=stop, content='Hello! I am a tiny scripted MiniMax-M3 model.', "
                          "tool_calls=0). "
                          "Also failed: /v1/chat/completions (streamed): no tool_calls came back"), msg
    assert ("; /v1/responses: no function_call items came back (status=completed, output=[reasoning, message], "
            "text='Hello! I am a tiny scripted MiniMax-M3 model.', function_call items=0); ") in msg
    assert ("; /v1/messages (streamed): no tool_use blocks came back (stop_reason=end_turn, content=[thinking, text], "
            "text='Hello! I am a tiny scripted MiniMax-M3 model.', tool_use blocks=0). " + SERVED_NATIVE) in msg
    assert ("hybrid_template_mode is auto, so the hybrid template was tried next: Tool-call canary failed on "
            "/v1/chat/completions: no tool_calls came back") in msg
    assert "Served: template mode hybrid, chat format peg-native" in msg
    assert NOW_BASELINE in msg
    assert_baseline_serves(models)
    assert TEMPLATE.read_bytes() == (TEMPLATE.parent / (TEMPLATE.name + ".verified")).read_bytes()


def test_a_rerun_of_verify_after_a_restore_passes_on_the_baseline(baseline, models):
    runner = run_playbook("site.yml", tags=["verify"])
    assert runner.status == "successful", failed_tasks(runner)
    assert changed_tasks(runner) == []
    assert_baseline_serves(models)


#: What an agent's second turn carries on /v1/responses and /v1/messages and a chat client's does not: the reasoning
#: of the tool-calling turn, sent back (Codex replays its reasoning items, Anthropic clients must send thinking blocks
#: back with tool_use). A template that cannot render it breaks those two APIs only.
REPLAYED_REASONING = """        {%- if reasoning_content -%}
            {#- Render thinking for every assistant turn (all-turn visible) -#}"""
CANNOT_RENDER_IT = """        {%- if reasoning_content -%}
            {{- raise_exception("This template cannot render reasoning sent back in the history") }}"""


@pytest.fixture(scope="module")
def broken_reasoning_model(models, llamacpp_tree, tmp_path_factory):
    """The M3-format model whose embedded template raises on reasoning sent back in the history."""
    from make_tiny_m3 import write_tiny_m3

    m3 = (llamacpp_tree / "models" / "templates" / "MiniMax-M3.jinja").read_text()
    assert REPLAYED_REASONING in m3
    path = tmp_path_factory.mktemp("broken_reasoning") / "tiny-m3-broken-reasoning.gguf"
    return str(write_tiny_m3(path, "m3", template_text=m3.replace(REPLAYED_REASONING, CANNOT_RENDER_IT))[0])


def test_a_template_that_breaks_one_api_fails_verify_naming_it_and_restores_the_baseline(
        baseline, models, broken_reasoning_model):
    runner = run_playbook("site.yml", tags=VARIANT_TAGS, extravars=dict(
        hybrid_template_mode="native", hybrid_template_model_path=broken_reasoning_model,
        head_server_model_path=broken_reasoning_model))
    assert runner.status == "failed"
    said = reports(runner)
    # the first turn works on every API: the canary passes, with the broken template serving
    assert ('Tool-call canary passed on /v1/chat/completions, /v1/responses, /v1/messages, each streamed and not: '
            'get_weather({"city": "Paris"}). ' + SERVED_NATIVE) in said, said
    error = ("HTTP 500 (Jinja Exception: This template cannot render reasoning sent back in the history)")
    msg = messages(runner)
    assert msg.startswith("Verify failed: /v1/responses tool-result turn: %s; /v1/messages tool-result turn: %s. %s "
                          "Fix: a reply of the plain question or of a tool-result turn is wrong: "
                          % (error, error, SERVED_NATIVE)), msg
    assert "/v1/chat/completions tool-result turn" not in msg
    assert NOW_BASELINE in msg
    # the last verified deployment serves again, and takes the second turn on the broken APIs
    assert_baseline_serves(models)
    assert TEMPLATE.read_bytes() == (TEMPLATE.parent / (TEMPLATE.name + ".verified")).read_bytes()
    assert "raise_exception(\"This template cannot render reasoning" not in TEMPLATE.read_text()
    first = requests.post(API + "/v1/messages", timeout=60, json={
        "model": "minimax-m3", "max_tokens": 256, "temperature": 0, "messages": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "I will call it.", "signature": ""},
                                              {"type": "tool_use", "id": "t1", "name": "get_weather",
                                               "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}]}],
        "tools": [{"name": "get_weather", "description": "Weather of a city", "input_schema": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]})
    assert first.status_code == 200, first.text
    assert first.json()["content"][-1] == {"type": "text", "text": "It is sunny in Paris."}


def test_bad_settings_leave_the_server_serving(baseline, models):
    """Every bad value is named in one message, before anything stops."""
    pid = (RUN_DIR / "minimax-llama-server.pid").read_text()
    runner = run_playbook("site.yml", tags=["head_server"], extravars={
        "head_server_port": 70000, "head_server_ctx_size": -5, "head_server_ubatch_size": 0,
        "head_server_extra_args": ["--no-such-flag", "1"]})
    assert runner.status == "failed"
    assert messages(runner) == (
        "head_server_port=70000 is not a port (1-65535); "
        "head_server_ctx_size=-5 is negative (0 takes the model's own context); "
        "head_server_ubatch_size=0 must be positive; "
        "--no-such-flag in head_server_extra_args is not an option of this llama-server (see llama-server --help). "
        "Nothing was changed: the running llama-server (if any) keeps serving.")
    # a string given with -e is refused, not split into characters
    runner = run_playbook("site.yml", tags=["head_server"], extravars={"head_server_extra_args": "--no-warmup"})
    assert runner.status == "failed"
    assert messages(runner).startswith(
        "head_server_extra_args is '--no-warmup', not a list of strings: give a list, "
        "e.g. -e '{\"head_server_extra_args\": [\"--flag\", \"value\"]}'. Nothing was changed")
    assert changed_tasks(runner) == []
    assert (RUN_DIR / "minimax-llama-server.pid").read_text() == pid
    assert_baseline_serves(models)


def test_a_server_that_does_not_start_puts_the_baseline_back(baseline, models):
    runner = run_playbook("site.yml", tags=["head_server"],
                          extravars={"head_server_extra_args": ["--chat-template-file", "/nonexistent.jinja"]})
    assert runner.status == "failed"
    msg = messages(runner)
    assert msg.startswith("The new llama-server did not start: minimax-llama-server exited within 3 s of its "
                          "start"), msg
    assert ("error while handling argument \"--chat-template-file\": error: failed to open file "
            "'/nonexistent.jinja'") in msg
    assert NOW_BASELINE in msg
    assert_baseline_serves(models)


def test_a_crash_while_loading_fails_in_seconds_and_puts_the_baseline_back(baseline, models):
    """llama-server hangs in its load (a worker that accepts but never answers) and is killed there: the health
    wait fails at once with the log tail, not after head_server_health_timeout, and the baseline serves again."""
    import os
    import signal
    import socket
    import subprocess
    import threading
    import time

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    port = silent.getsockname()[1]
    held = []

    def hold():  # accept every connection and say nothing: llama-server waits for the RPC hello forever
        while True:
            try:
                held.append(silent.accept()[0])
            except OSError:
                return

    killed = {}

    def kill_it_mid_load():  # past the start's settle (3 s), while the health wait runs
        deadline = time.time() + 120
        while time.time() < deadline:
            pids = subprocess.run(["pgrep", "-f", "llama-server.*127.0.0.1:%d" % port],
                                  capture_output=True, text=True).stdout.split()
            if pids:
                time.sleep(15)
                for pid in pids:
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                        killed[pid] = time.time()
                    except ProcessLookupError:
                        pass
                return
            time.sleep(0.5)

    threading.Thread(target=hold, daemon=True).start()
    killer = threading.Thread(target=kill_it_mid_load, daemon=True)
    killer.start()
    try:
        runner = run_playbook("site.yml", tags=["head_server"], extravars={
            "head_server_rpc_endpoints": ["127.0.0.1:%d" % port], "head_server_health_timeout": 900})
        finished = time.time()
    finally:
        silent.close()
        for conn in held:
            conn.close()
    killer.join(5)
    assert killed, "llama-server never started against the silent worker"
    assert runner.status == "failed"
    assert finished - max(killed.values()) < 90, "the health wait did not notice the crash at once"
    msg = messages(runner)
    assert msg.startswith("llama-server exited while loading, after "), msg
    assert "it is restarted and would crash again. Last log lines:" in msg
    assert "exited with status" in msg
    assert NOW_BASELINE in msg
    assert_baseline_serves(models)


HEAD = "llama-server.*--port 8891"
WORKER = "localhost (127.0.0.1:50052)"


def head_pids():
    import subprocess

    return subprocess.run(["pgrep", "-f", HEAD], capture_output=True, text=True).stdout.split()


def assert_nothing_serves_or_restarts(seconds=8):
    """No llama-server of the head runs, nor comes back (a supervisor restarts a crash after 5 s)."""
    import time

    deadline = time.time() + seconds
    while time.time() < deadline:
        assert head_pids() == [], "a llama-server of the head runs: %s" % head_pids()
        time.sleep(0.5)
    with pytest.raises(requests.ConnectionError):
        requests.get(API + "/health", timeout=5)
    assert not (RUN_DIR / "minimax-llama-server.pid").exists()


def rpc_protocol(llamacpp_tree):
    """The RPC protocol version of the vendored llama.cpp (ggml-rpc.h)."""
    import re

    header = (llamacpp_tree / "ggml" / "include" / "ggml-rpc.h").read_text()
    return tuple(int(re.search(r"RPC_PROTO_%s_VERSION\s+(\d+)" % part, header).group(1))
                 for part in ("MAJOR", "MINOR", "PATCH"))


@pytest.fixture
def broken_worker(baseline, models):
    """The worker's RPC server stopped; the test puts something else on its port. Afterwards the real one runs
    again and the baseline is deployed and verified again (it is what the other tests start from)."""
    stopped = run_playbook("playbooks/stop.yml", tags=["worker_rpc"])
    assert stopped.status == "successful", failed_tasks(stopped)
    fakes = []
    yield fakes
    for fake in fakes:
        fake.close()
    again = run_playbook("site.yml", tags=["worker_rpc"] + VARIANT_TAGS,
                         extravars={"hybrid_template_model_path": models["m3"], "head_server_model_path": models["m3"]})
    assert again.status == "successful", failed_tasks(again)
    assert_baseline_serves(models)


def run_timed(**extravars):
    import time

    started = time.time()
    runner = run_playbook("site.yml", tags=["head_server"], extravars=extravars)
    took = time.time() - started
    print("site.yml --tags head_server %s: %.1f s" % (extravars, took))
    return runner, took


def test_a_worker_port_answered_by_garbage_ends_the_run_fast_naming_the_worker_and_stops_the_head(
        broken_worker, models):
    """Issue 26: the new start fails on the worker; the previous deployment needs the same worker and fails too
    (it is never waited on while it crash-loops): the head is stopped within two minutes, both reasons given."""
    from fake_rpc_server import FakeRpcServer

    broken_worker.append(FakeRpcServer("garbage", port=50052))
    runner, took = run_timed(head_server_ctx_size=8192)
    assert runner.status == "failed" and runner.rc != 0
    assert took < 120, "the run took %.0f s" % took
    msg = messages(runner)
    named = ("worker %s: llama-server aborted: the worker's port answered something that is not a working RPC "
             "server. llama.cpp logged: `" % WORKER)
    assert msg.startswith("The new llama-server did not start: llama-server could not load onto its workers: "
                          + named), msg
    assert ("Remote RPC server crashed or returned malformed response`. 127.0.0.1:50052 answers the RPC hello with "
            "bytes that are not RPC: 'HTTP/1.0 200 OK") in msg
    assert ("Fix: another program than ggml-rpc-server listens on localhost's port 50052: stop it "
            "(`ss -ltnp 'sport = :50052'` on localhost names it)") in msg
    # the restored deployment failed the same way, and is stopped
    then = msg.index("Then the last verified deployment (verified ")
    assert "was started again and failed too: llama-server could not load onto its workers: " + named in msg[then:]
    assert msg.endswith("Now: llama-server (minimax-llama-server) is stopped; fix the cause and run site.yml again.")
    assert_nothing_serves_or_restarts()


def test_without_a_verified_deployment_a_worker_of_another_protocol_stops_the_head_naming_it(
        broken_worker, models, llamacpp_tree):
    """Issue 23/26: an RPC server of another protocol on the worker's port; nothing verified to put back."""
    from fake_rpc_server import FakeRpcServer

    (RUN_DIR / "minimax-llama-server.verified.json").unlink()
    (FACTS / "minimax_deployment.fact").unlink()
    major, minor, patch = rpc_protocol(llamacpp_tree)
    broken_worker.append(FakeRpcServer("version", port=50052, version=(major + 1, 0, 0)))
    runner, took = run_timed(head_server_ctx_size=8192)
    assert runner.status == "failed" and took < 120, took
    msg = messages(runner)
    assert msg.startswith("The new llama-server did not start: llama-server could not load onto its workers: worker "
                          "%s: its RPC server speaks another RPC protocol than this llama-server. llama.cpp logged: `"
                          % WORKER), msg
    assert "RPC handshake failed for 127.0.0.1:50052" in msg
    assert "127.0.0.1:50052 is an RPC server of protocol %d.0.0" % (major + 1) in msg
    assert "Fix: localhost's RPC server is of another llama.cpp than the head's llama-server" in msg
    assert msg.endswith("Now: llama-server (minimax-llama-server) is stopped, since no deployment was ever verified "
                        "on localhost; fix the cause and run site.yml again."), msg
    assert_nothing_serves_or_restarts()


def test_a_worker_whose_share_never_reaches_the_head_is_caught_after_health_and_the_head_stopped(
        broken_worker, models, llamacpp_tree):
    """Issue 23: an RPC server of the head's own protocol that offers no device: llama-server adds no device for it,
    loads the whole model on the head, answers /health and logs nothing about it. The log check catches it on the
    new start and on the restored one; the head is stopped, never left serving alone."""
    from fake_rpc_server import FakeRpcServer

    broken_worker.append(FakeRpcServer("nodevices", port=50052, version=rpc_protocol(llamacpp_tree)))
    runner, took = run_timed(head_server_ctx_size=8192)
    assert runner.status == "failed" and took < 120, took
    msg = messages(runner)
    alone = ("llama-server answered /health but does not serve on every worker in --rpc: worker %s holds no part of "
             "the model: llama-server logged no model buffer on it, so the layers planned there were loaded on the "
             "head alone; 127.0.0.1:50052 is an RPC server of protocol %d.%d.%d with 0 devices. Fix: localhost's RPC "
             "server offers no device" % ((WORKER,) + rpc_protocol(llamacpp_tree)))
    assert msg.startswith(alone), msg
    assert "was started again and failed too: " + alone in msg
    assert msg.endswith("Now: llama-server (minimax-llama-server) is stopped; fix the cause and run site.yml again.")
    assert_nothing_serves_or_restarts()
    # the head did load alone: its log of the restored start has the head's buffer and no worker's
    log = HEAD_LOG.read_text(errors="replace")
    last = log[log.rfind(" starting: "):]
    assert "CPU model buffer size" in last and "RPC0[127.0.0.1:50052] model buffer size" not in last


def test_an_api_key_stays_out_of_output_argv_and_readable_files_and_goes_with_its_removal(baseline, models):
    import subprocess

    key = "sk-minimax-test-4f1c9a2b7d"
    key_file = Path("/etc/minimax-spark/api-key")
    runner = run_playbook("site.yml", tags=["head_server", "verify"], extravars={"head_server_api_key": key})
    assert runner.status == "successful", failed_tasks(runner)
    assert key not in runner.stdout_text
    assert key_file.stat().st_mode & 0o777 == 0o600
    question = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
    assert requests.post(API + "/v1/chat/completions", json=question, timeout=60).status_code == 401
    assert requests.post(API + "/v1/chat/completions", json=question, timeout=60,
                         headers={"Authorization": "Bearer " + key}).status_code == 200
    pids = subprocess.run(["pgrep", "-f", "llama-server.*--api-key-file"], capture_output=True,
                          text=True).stdout.split()
    assert pids, "llama-server does not read its key from the file"
    for pid in pids:
        assert key not in Path("/proc/%s/cmdline" % pid).read_bytes().decode(errors="replace")
    for path in RUN_DIR.iterdir():  # the service definitions and records
        if path.is_file():
            assert key not in path.read_text(errors="replace"), path
    # llama-server prints the key's last characters in its log: readable by its owner only
    assert HEAD_LOG.stat().st_mode & 0o077 == 0
    assert HEAD_LOG.parent.stat().st_mode & 0o007 == 0

    runner = run_playbook("site.yml", tags=["head_server", "verify"])
    assert runner.status == "successful", failed_tasks(runner)
    assert not key_file.exists()
    assert requests.post(API + "/v1/chat/completions", json=question, timeout=60).status_code == 200
    assert_baseline_serves(models)


def test_m2_model_gets_its_own_template_and_chat_format(baseline, models):
    runner = deploy(models, "m2")
    assert runner.status == "successful", failed_tasks(runner)
    template = fact("template")
    assert (template["family"], template["mode"], template["chat_format"]) == ("m2", "native", "peg-native")
    assert fact("deployment")["model_path"] == models["m2"]
    assert "chat format: peg-native" in last_start_log()


def test_auto_switches_to_the_hybrid_when_the_native_template_fails(baseline, models):
    runner = deploy(models, "hybrid")
    assert runner.status == "successful", failed_tasks(runner)
    said = reports(runner)
    assert any(m.startswith("Tool-call canary failed on /v1/chat/completions: tool-call or reasoning markup "
                            "<minimax:tool_call>") for m in said), said
    assert ("The canary failed with the native template: hybrid_template_mode is auto, "
            "so llama-server is restarted once with the hybrid template.") in said
    assert ('Tool-call canary passed on /v1/chat/completions, /v1/responses, /v1/messages, each streamed and not: '
            'get_weather({"city": "Paris"}). Served: template mode hybrid, chat format peg-native, '
            "at http://127.0.0.1:8891.") in said
    template, deployment = fact("template"), fact("deployment")
    assert (template["mode"], template["requested"], deployment["template_mode"]) == ("hybrid", "auto", "hybrid")
    assert "chat format: peg-native" in last_start_log()
    # auto keeps the template that passed: a rerun changes nothing
    again = deploy(models, "hybrid")
    assert again.status == "successful", failed_tasks(again)
    assert changed_tasks(again) == []


def test_without_a_verified_deployment_a_failure_stops_the_server(baseline, models):
    """An explicit mode is never switched; with nothing verified to put back, llama-server is stopped."""
    (RUN_DIR / "minimax-llama-server.verified.json").unlink()
    (FACTS / "minimax_deployment.fact").unlink()
    runner = deploy(models, "m3", hybrid_template_mode="hybrid")
    assert runner.status == "failed"
    msg = messages(runner)
    assert msg.startswith("Tool-call canary failed on /v1/chat/completions: tool-call or reasoning markup "
                          "]<]minimax[>[, <tool_call>, <invoke name= in content (finish_reason=stop, "), msg
    assert ("Served: template mode hybrid, chat format peg-native, at http://127.0.0.1:8891. "
            "Fix: the model writes") in msg
    assert "was tried next" not in msg
    assert msg.endswith("Now: llama-server (minimax-llama-server) is stopped, since no deployment was ever verified on "
                        "localhost; fix the cause and run site.yml again."), msg
    with pytest.raises(requests.ConnectionError):
        requests.get(API + "/health", timeout=5)
    # a rerun of verify finds nothing serving and says so, never success
    rerun = run_playbook("site.yml", tags=["verify"])
    assert rerun.status == "failed"
    assert messages(rerun).startswith("Tool-call canary failed on /v1/chat/completions: no answer from "
                                      "http://127.0.0.1:8891/v1/chat/completions")
