"""The deployment as one transaction (issue 26): a worker-side change under which each RPC server starts and listens
but the head cannot load as planned is rolled back on every node, and the run fails naming the worker.

The change: worker_rpc_devices [CPU, CPU]. Each worker's ggml-rpc-server then offers its CPU twice (two devices on
one endpoint); llama-server's --tensor-split has one share per worker, so the first worker's two devices take both
shares (more than the plan gives spark-2) and the second worker holds nothing: the head's log check refuses the
start naming both workers. The converge playbook (site.yml) is rerun as a user reruns it, with the setting given
as -e. Afterwards the deployment record, the plan, each worker's record and the command lines of llama-server and
ggml-rpc-server on spark-1/2/3 are the previous ones, and the endpoint answers the canary again.

Runs last (alphabetical: after test_rpc_cache.py, which needs caches only the seeder wrote; the broken load leaves
tensors the head sent in the workers' caches), on the converged scenario.
"""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest
import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "support"))
import molecule_nodes  # noqa: E402  (the scenario's nodes and converge)
from molecule_nodes import node  # noqa: E402

CONVERGE = Path(__file__).resolve().parents[1] / "converge.yml"
RPC_UNIT = "minimax-rpc-server"
SERVER_UNIT = "minimax-llama-server"
RUN_DIR = "/opt/minimax-spark/services"
HEAD = "spark-1"
WORKERS = ("spark-2", "spark-3")
BROKEN = {"worker_rpc_devices": ["CPU", "CPU"]}


def converge(*extra):
    """converge.yml rerun as a user reruns site.yml, with extra arguments."""
    return molecule_nodes.converge(CONVERGE, *extra, timeout=900)


def fact(host, name):
    path = f"/etc/ansible/facts.d/minimax_{name}.fact"
    return json.loads(node(host).file(path).content_string)


def argv(host, unit):
    """The running command line of the unit's main process (with its pid)."""
    pid = int(node(host).check_output(f"systemctl show -p MainPID --value {unit}"))
    assert pid, f"{unit} does not run on {host}"
    return node(host).check_output(f"tr '\\0' ' ' < /proc/{pid}/cmdline")


def verified_record(host, unit):
    return json.loads(node(host).file(f"{RUN_DIR}/{unit}.verified.json").content_string)


def state():
    """What serves and what is recorded, on every node."""
    return {
        "deployment": fact(HEAD, "deployment"),
        "plan": {host: fact(host, "plan") for host in (HEAD, *WORKERS)},
        "rpc": {host: fact(host, "rpc") for host in WORKERS},
        "head_argv": argv(HEAD, SERVER_UNIT),
        "worker_argv": {host: argv(host, RPC_UNIT) for host in WORKERS},
        "records": {host: verified_record(host, RPC_UNIT) for host in WORKERS}
        | {HEAD: verified_record(HEAD, SERVER_UNIT)},
    }


def api():
    head = node(HEAD)
    return f"http://{head.check_output('hostname -I').split()[0]}:{head.ansible.get_variables()['head_server_port']}"


def tool_call_name():
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{api()}/health", timeout=5).status_code == 200:
                break
        except requests.RequestException:
            pass
        time.sleep(1)
    reply = requests.post(f"{api()}/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": "What is the weather like in Paris today?"}],
        "tools": [{"type": "function", "function": {
            "name": "get_weather", "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
        "temperature": 0, "max_tokens": 256})
    assert reply.status_code == 200, reply.text
    return [call["function"]["name"] for call in reply.json()["choices"][0]["message"].get("tool_calls") or []]


@pytest.fixture(scope="module")
def before():
    taken = state()
    # the record of the last verified deployment names both workers, with their verified definitions
    workers = taken["deployment"]["workers"]
    assert [w["host"] for w in workers] == list(WORKERS)
    for w in workers:
        assert w["endpoint"] == taken["rpc"][w["host"]]["endpoint"]
        assert w["build_id"] and len(w["definition_sha256"]) == 64
    assert taken["deployment"]["plan"] == taken["plan"][HEAD]
    return taken


@pytest.fixture(scope="module")
def broken_run(before):
    rc, out = converge("-e", json.dumps(BROKEN))
    return rc, out


def test_the_broken_worker_setting_fails_the_run_naming_the_worker(broken_run):
    rc, out = broken_run
    assert rc != 0, out[-4000:]
    # the head's log check names both workers: the one that holds more than its share, the one that holds nothing
    assert re.search(r"worker spark-2 \([^)]+\) holds [0-9.]+ MiB of the model; the plan gives it [0-9.]+ MiB",
                     out), out[-6000:]
    assert re.search(r"worker spark-3 \([^)]+\) holds no part of the model", out), out[-6000:]
    assert "Now serving: the last verified deployment again" in out, out[-6000:]
    assert re.search(r"The verified RPC servers of spark-2 \([^)]+\), spark-3 \([^)]+\) run again\.", out), out[-6000:]


def test_every_node_serves_and_records_the_previous_deployment(before, broken_run):
    after = state()
    assert after["deployment"] == before["deployment"]
    assert after["plan"] == before["plan"]
    assert after["rpc"] == before["rpc"]
    assert after["records"] == before["records"]
    assert after["head_argv"] == before["head_argv"]
    assert after["worker_argv"] == before["worker_argv"]
    for host in WORKERS:
        assert "-d CPU,CPU" not in after["worker_argv"][host]
        assert node(host).service(RPC_UNIT).is_running
    assert node(HEAD).service(SERVER_UNIT).is_running


def test_the_previous_deployment_answers_the_canary(broken_run):
    assert tool_call_name() == ["get_weather"]
