"""The embedded demo, deployed as a user deploys it: site.yml against inventory/local.

One deployment serves the module: it must end with a verified tool call, layers on both the
head and the worker, and a second run that changes nothing. Bad input must fail before anything
changes, with a message that names the variable to fix.
"""
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests

from helpers import ROOT, changed_tasks, failed_tasks, run_playbook

MODEL = ROOT / ".cache" / "demo" / "MiniMax-M3-tiny.gguf"
HEAD_LOG = Path("/var/log/minimax-spark/minimax-llama-server.log")
RUN_DIR = Path("/opt/minimax-spark/services")
API = "http://127.0.0.1:8891"


def supervisor_managed():
    return not Path("/run/systemd/system").is_dir()


@pytest.fixture(scope="module")
def deployed(demo_model, llamacpp_archive):
    """site.yml, first run (builds llama.cpp when its cache is cold)."""
    runner = run_playbook("site.yml")
    assert runner.status == "successful", failed_tasks(runner) or runner.stdout_text[-5000:]
    return runner


def task_result(runner, task_name):
    for event in runner.event_list:
        data = event.get("event_data", {})
        if event.get("event") == "runner_on_ok" and data.get("task") == task_name:
            return data["res"]
    raise AssertionError("task %r did not run" % task_name)


def last_start(log_text):
    """The log of the latest llama-server start."""
    return log_text.split("[minimax-supervise]")[-1] if supervisor_managed() else log_text


def tool_call_request():
    return {
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [{"type": "function", "function": {
            "name": "get_weather", "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
        "temperature": 0,
    }


def test_verify_proves_a_structured_tool_call(deployed):
    results = task_result(deployed, "Summarise the verification")["ansible_facts"]["verify_results"]
    assert results["tool_call"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert results["reasoning"], "reasoning_content must be separate and non-empty"
    assert "<mm:think>" not in results["multi_turn"]
    assert results["multi_turn"] == "It is sunny in Paris."


def test_layers_are_on_head_and_worker(deployed):
    log = HEAD_LOG.read_text(errors="replace") if supervisor_managed() else subprocess.run(
        ["journalctl", "-u", "minimax-llama-server", "--no-pager"], capture_output=True, text=True).stdout
    start = log[log.rfind("load_tensors: offloaded"):] if "load_tensors: offloaded" in log else ""
    placed = re.findall(r"layer +(\d+) assigned to device (\w+)", log)
    assert placed, "no layer placement in the head's log"
    devices = {dev for _, dev in placed[-5:]}
    assert {"CPU", "RPC0"} <= devices, placed[-5:]
    assert re.search(r"offloaded (\d+)/(\d+) layers", start)


def test_the_head_takes_the_weight_hashes_from_the_hash_file(deployed):
    """The default build carries rpc-hash-sidecar: head_server writes the hash file beside the model, names it
    in GGML_RPC_HASH_FILE and records from llama.cpp's log that no weight was hashed at the load."""
    build = json.loads(Path("/etc/ansible/facts.d/minimax_llamacpp.fact").read_text())
    assert build["rpc_hash_file"] is True
    assert [p["name"] for p in build["patches"]] == ["rpc-hash-sidecar", "rpc-cache-hit-mmap", "rpc-load-mapped",
                                                       "m3-layer-inputs", "m3-final-tool-args"]
    model = json.loads(Path("/etc/ansible/facts.d/minimax_model.fact").read_text())["path"]
    load = json.loads(Path("/etc/ansible/facts.d/minimax_head_load.fact").read_text())
    assert load["rpc_hash_file_env"] == model + ".rpc-hashes" and os.path.exists(model + ".rpc-hashes")
    assert load["hash_files"] == [{"path": model + ".rpc-hashes", "used": True, "reason": "",
                                   "tensors": load["hash_files"][0]["tensors"]}], load
    assert load["weights"]["hashed_bytes"] == 0 and load["weights"]["hashed_tensors"] == 0, load
    assert load["weights"]["weights"] > 0, "no weight was set on the worker: the demo split is gone"
    definition = (RUN_DIR / "minimax-llama-server.json") if supervisor_managed() else \
        Path("/etc/systemd/system/minimax-llama-server.service")
    assert "GGML_RPC_HASH_FILE" in definition.read_text()


def test_second_run_changes_nothing(deployed):
    runner = run_playbook("site.yml")
    assert runner.status == "successful", failed_tasks(runner)
    assert changed_tasks(runner) == []


def test_check_mode_changes_nothing(deployed):
    runner = run_playbook("site.yml", check=True)
    assert runner.status == "successful", failed_tasks(runner)
    assert changed_tasks(runner) == []


def test_one_step_reruns_alone(deployed):
    runner = run_playbook("site.yml", tags=["head_server"])
    assert runner.status == "successful", failed_tasks(runner)
    assert changed_tasks(runner) == []
    # Argument validation is tagged `always` by Ansible: every role checks its inputs, only one acts.
    played = {
        e["event_data"].get("role") for e in runner.event_list
        if e.get("event") == "runner_on_ok" and not e["event_data"].get("task", "").startswith("Validating arguments")
    } - {None}
    # A tag run of the head plans again for its settings and checks the link first (plan, link); head_server
    # calls the entry points of common (quiet_node, local_fact); no other step of site.yml runs.
    assert "head_server" in played
    assert played <= {"head_server", "common", "plan", "link"}, played


def serving_argv():
    """(pid, argv) of the llama-server answering on the API's port."""
    for pid in subprocess.run(["pgrep", "-x", "llama-server"], capture_output=True, text=True).stdout.split():
        argv = Path("/proc/%s/cmdline" % pid).read_bytes().decode().split("\0")
        if "8891" in argv:
            return pid, argv
    raise AssertionError("no llama-server serves :8891")


def recorded_plan():
    return json.loads(Path("/etc/ansible/facts.d/minimax_plan.fact").read_text())


def test_a_tag_run_replans_for_the_head_settings_or_is_refused(deployed):
    """The README's day-2 example: the plan the head starts with is the plan for its settings; back on the
    inventory's settings, the tag run records the plan the full run recorded."""
    full_run = recorded_plan()
    try:
        runner = run_playbook("site.yml", tags=["head_server"], extravars={"head_server_ctx_size": 8192})
        assert runner.status == "successful", failed_tasks(runner)
        pid, argv = serving_argv()
        assert argv[argv.index("--ctx-size") + 1] == "8192"
        plan = recorded_plan()
        assert (plan["ctx_size"], plan["ubatch_size"], plan["cache_type_k"]) == (
            8192, int(argv[argv.index("--ubatch-size") + 1]), argv[argv.index("--cache-type-k") + 1])
        split = argv[argv.index("--tensor-split") + 1] if "--tensor-split" in argv else ""
        assert ",".join(str(x) for x in plan["tensor_split"]) == split

        # The plan play skipped: the recorded plan (8192) is not the one for the settings;
        # refused before anything stops.
        runner = run_playbook("site.yml", tags=["head_server"], skip_tags=["plan"],
                              extravars={"head_server_ctx_size": 2048, "head_server_ubatch_size": 512})
        assert runner.status == "failed"
        assert " ".join(str(f[2]) for f in failed_tasks(runner)) == (
            "The recorded plan (ansible_local.minimax_plan) was made for other settings: "
            "head_server_ctx_size=2048 (the plan: 8192), head_server_ubatch_size=512 (the plan: 2048). "
            "Nothing was changed: the running llama-server (if any) keeps serving. Plan for these settings first: "
            "run site.yml or playbooks/services.yml with the same -e, without skipping the plan play.")
        assert changed_tasks(runner) == []
        assert serving_argv() == (pid, argv)
        assert recorded_plan()["ctx_size"] == 8192
        assert requests.get(API + "/health", timeout=5).status_code == 200
    finally:
        # Back to the inventory's settings: the plan follows again.
        runner = run_playbook("site.yml", tags=["head_server"])
    assert runner.status == "successful", failed_tasks(runner)
    _, argv = serving_argv()
    assert argv[argv.index("--ctx-size") + 1] == str(recorded_plan()["ctx_size"]) == "65536"
    assert recorded_plan() == full_run


@pytest.mark.parametrize(
    "playbook, extravars, variable",
    [
        ("playbooks/build.yml", {"build_llamacpp_cuda": True}, "build_llamacpp_cuda_architectures"),
        ("playbooks/build.yml", {"build_llamacpp_source": "tarball"}, "build_llamacpp_source"),
        ("playbooks/build.yml", {"build_llamacpp_archive": "/nonexistent/llama.cpp.tar.gz"}, "build_llamacpp_archive"),
        ("playbooks/model.yml", {"model_download_local_file": "/nonexistent/model.gguf"}, "model_download_local_file"),
        ("playbooks/services.yml", {"worker_rpc_port": "fifty"}, "worker_rpc_port"),
        ("playbooks/services.yml", {"worker_rpc_bind_address": "0.0.0.0"}, "worker_rpc_bind_address"),
    ],
    ids=["cuda-without-arch", "unknown-source", "missing-archive", "missing-model", "bad-port", "public-bind"],
)
def test_bad_input_fails_early_naming_the_variable(deployed, playbook, extravars, variable):
    runner = run_playbook(playbook, extravars=extravars)
    assert runner.status == "failed"
    failures = failed_tasks(runner)
    assert failures and variable in str(failures[0][2]), failures
    assert changed_tasks(runner) == []


def test_unknown_ref_fails_naming_the_ref(deployed, tmp_path):
    repo = tmp_path / "llama.cpp"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "CMakeLists.txt").write_text("project(x)\n")
    subprocess.run(git + ["add", "."], check=True)
    subprocess.run(git + ["commit", "-qm", "x"], check=True)
    runner = run_playbook("playbooks/build.yml", extravars={
        "build_llamacpp_source": "git", "build_llamacpp_repo": "file://%s" % repo,
        "build_llamacpp_ref": "no-such-ref", "build_llamacpp_cache_dir": str(tmp_path / "cache")})
    assert runner.status == "failed"
    messages = " ".join(str(f[2]) for f in failed_tasks(runner))
    assert "build_llamacpp_ref=no-such-ref" in messages, messages


def test_head_refuses_a_worker_that_does_not_answer(deployed):
    runner = run_playbook("playbooks/services.yml", tags=["head_server"],
                          extravars={"head_server_rpc_endpoints": ["127.0.0.1:9"]})
    assert runner.status == "failed"
    messages = " ".join(str(f[2]) for f in failed_tasks(runner))
    assert "127.0.0.1:9 does not answer" in messages
    assert changed_tasks(runner) == []
    # The running deployment is untouched.
    assert requests.get(API + "/health", timeout=5).status_code == 200


def test_worker_crash_restarts_the_head(deployed):
    """llama-server cannot reconnect to a restarted worker: its supervisor restarts it."""
    if not supervisor_managed():
        pytest.skip("systemd host: covered by the molecule scenario")
    head_pid = int((RUN_DIR / "minimax-llama-server.pid").read_text())
    worker_pid = int((RUN_DIR / "minimax-rpc-server.pid").read_text())
    rpc = subprocess.run(["pgrep", "-P", str(worker_pid)], capture_output=True, text=True).stdout.split()
    head = subprocess.run(["pgrep", "-P", str(head_pid)], capture_output=True, text=True).stdout.split()
    assert rpc and head
    os.kill(int(rpc[0]), signal.SIGKILL)
    deadline = time.time() + 120
    answer = None
    while time.time() < deadline:
        time.sleep(2)
        new_head = subprocess.run(["pgrep", "-P", str(head_pid)], capture_output=True, text=True).stdout.split()
        if not new_head or new_head == head:
            continue
        try:
            if requests.get(API + "/health", timeout=5).status_code == 200:
                answer = requests.post(API + "/v1/chat/completions", json=tool_call_request(), timeout=60)
                break
        except requests.RequestException:
            continue
    assert answer is not None, "the head did not come back after the worker restarted"
    assert answer.status_code == 200
    assert answer.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"


def port_open(port):
    import socket

    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_stop_with_a_tag_stops_that_service_only(deployed):
    """Last in this module: it takes the demo down, one tagged step at a time."""
    runner = run_playbook("playbooks/stop.yml", tags=["head_server"])
    assert runner.status == "successful", failed_tasks(runner)
    assert [task for _, task in changed_tasks(runner)], "stop --tags head_server changed nothing"
    assert not port_open(8891), "llama-server still listens after stop --tags head_server"
    assert port_open(50052), "stop --tags head_server also stopped the worker"

    runner = run_playbook("playbooks/stop.yml", tags=["worker_rpc"])
    assert runner.status == "successful", failed_tasks(runner)
    assert not port_open(50052), "ggml-rpc-server still listens after stop --tags worker_rpc"
