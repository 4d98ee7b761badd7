"""The deployed three-node cluster, seen from outside: what a user of the endpoint relies on.

Run by molecule's testinfra verifier after converge and idempotence. The nodes are reached through
the molecule inventory (``docker exec``); HTTP requests to the endpoint go from the controller to the
head's address on the scenario's network, as a client on the LAN would send them.
"""
from __future__ import annotations

import functools
import json
import os
import re
import sys
import time
from pathlib import Path

import pytest
import requests
import testinfra

PROJECT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(PROJECT / "tools"))
from make_tiny_m3 import TOOL_ARGUMENTS, TOOL_NAME, WEATHER_TOOL  # noqa: E402  (the served model's script)

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
RPC_UNIT = "minimax-rpc-server"
SERVER_UNIT = "minimax-llama-server"
BIN_DIR = "/opt/minimax-spark/llama.cpp/current/bin"


@functools.cache
def node(name):
    return testinfra.get_host(f"ansible://{name}?ansible_inventory={INVENTORY}")


@functools.cache
def inventory_vars():
    """The scenario's inventory variables (molecule.yml `provisioner.inventory`), as written."""
    return node(HEAD).ansible.get_variables()


HEAD = "spark-1"
WORKERS = ("spark-2", "spark-3")


@pytest.fixture(scope="module")
def head():
    return node(HEAD)


@pytest.fixture(scope="module")
def outsider():
    return node("outsider")


@pytest.fixture(params=WORKERS)
def worker(request):
    """Each worker in turn: a test that takes it runs once per worker (in place: no reordering)."""
    return node(request.param)


@pytest.fixture(scope="module")
def workers():
    return [node(name) for name in WORKERS]


def address(host):
    """The node's address on the scenario's network (its only non-loopback interface)."""
    return host.check_output("ip -4 -o addr show scope global | awk '{print $4}' | cut -d/ -f1 | head -n1")


def rpc_port():
    return int(inventory_vars()["worker_rpc_port"])


@pytest.fixture
def rpc_endpoint(worker):
    return address(worker), rpc_port()


@pytest.fixture(scope="module")
def api(head):
    return f"http://{address(head)}:{int(inventory_vars()['head_server_port'])}"


def tcp_connect(host, addr, port, timeout=5):
    """Open a TCP connection from `host`: 'open', 'refused' or 'timeout' (a DROP rule)."""
    script = (
        "import socket, sys\n"
        "try:\n"
        f"    socket.create_connection(({addr!r}, {port}), timeout={timeout}).close(); print('open')\n"
        "except ConnectionRefusedError: print('refused')\n"
        "except (socket.timeout, TimeoutError): print('timeout')\n"
        "except OSError as e: print('error', e)\n"
    )
    return host.check_output("python3 -c %s", script)


def wait_healthy(api, timeout=300):
    """Poll /health until it answers 200 {"status": "ok"}; returns the last answer."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = requests.get(f"{api}/health", timeout=5)
            if last.status_code == 200 and last.json().get("status") == "ok":
                return last
        except requests.RequestException as exc:
            last = exc
        time.sleep(2)
    pytest.fail(f"{api}/health not ok after {timeout} s: {last!r}")


def ask_weather(api):
    response = requests.post(
        f"{api}/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "What is the weather like in Paris today?"}],
            "tools": [WEATHER_TOOL],
            "temperature": 0,
            "max_tokens": 256,
        },
        timeout=120,
    )
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]


def main_pid(host, unit):
    return int(host.check_output(f"systemctl show -p MainPID --value {unit}"))


def head_log(head):
    """The journal of llama-server's current run (its systemd invocation), as printed."""
    invocation = head.check_output(f"systemctl show -p InvocationID --value {SERVER_UNIT}")
    assert invocation, f"{SERVER_UNIT} has no current invocation"
    log = head.check_output(f"journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID={invocation}")
    # A journald that does not tag the lines with the invocation: the unit's whole log (the tests
    # read the last of each line, which is this run's).
    return log or head.check_output(f"journalctl --no-pager -o cat -u {SERVER_UNIT}")


# -- services ---------------------------------------------------------------------------------------

def test_rpc_server_enabled_and_running(worker):
    service = worker.service(RPC_UNIT)
    assert service.is_enabled
    assert service.is_running


def test_llama_server_enabled_and_running(head):
    service = head.service(SERVER_UNIT)
    assert service.is_enabled
    assert service.is_running


def test_head_watches_its_workers(head):
    # llama-server cannot reconnect to a restarted worker: this unit restarts it when one drops.
    assert head.service(f"{SERVER_UNIT}-watch").is_running


def test_each_service_runs_only_where_it_belongs(head, workers, outsider):
    assert not head.service(RPC_UNIT).is_running
    for worker in workers:
        assert not worker.service(SERVER_UNIT).is_running
    for unit in (RPC_UNIT, SERVER_UNIT):
        assert not outsider.service(unit).is_running


# -- the RPC port: each worker admits the head only -------------------------------------------------

def test_rpc_server_listens_on_the_worker_address_only(worker, rpc_endpoint):
    addr, port = rpc_endpoint
    assert worker.socket(f"tcp://{addr}:{port}").is_listening
    assert not worker.socket(f"tcp://0.0.0.0:{port}").is_listening


def test_rpc_port_answers_the_head(head, rpc_endpoint):
    assert tcp_connect(head, *rpc_endpoint) == "open"


def test_rpc_port_is_closed_to_the_outsider(outsider, rpc_endpoint):
    assert tcp_connect(outsider, *rpc_endpoint) in ("refused", "timeout")


def test_rpc_port_is_closed_to_the_other_worker(worker, rpc_endpoint):
    other = node(next(name for name in WORKERS if node(name) is not worker))
    assert tcp_connect(other, *rpc_endpoint) in ("refused", "timeout")


def firewall_for_port(host, port):
    """(ACCEPTed sources, drops the rest?) for TCP `port` in the host's iptables rules.

    Follows the INPUT rules for the port, and the chain they jump to when the rules live in one.
    """
    rules = [line.split() for line in host.check_output("iptables -S").splitlines()]
    sources, drops = [], False

    def follow(rule):
        nonlocal drops
        target = rule[rule.index("-j") + 1] if "-j" in rule else ""
        if target == "ACCEPT" and "-s" in rule:
            sources.append(rule[rule.index("-s") + 1])
        elif target == "DROP" and "-s" not in rule:
            drops = True
        elif target not in ("", "ACCEPT", "DROP", "REJECT", "RETURN"):
            for chained in rules:
                if chained[:2] == ["-A", target]:
                    follow(chained)

    for rule in rules:
        if rule[:2] == ["-A", "INPUT"] and "--dport" in rule and rule[rule.index("--dport") + 1] == str(port):
            follow(rule)
    return sources, drops


def test_firewall_admits_exactly_the_head(head, worker):
    sources, drops = firewall_for_port(worker, rpc_port())
    assert sources == [f"{address(head)}/32"]
    assert drops, "nothing drops the RPC port's other traffic"


# -- identical binaries -----------------------------------------------------------------------------

def _binaries(host):
    out = host.check_output(f"cd {BIN_DIR} && find -L . -type f -exec sha256sum {{}} + | sort -k2")
    return {line.split()[1]: line.split()[0] for line in out.splitlines()}


def test_every_node_runs_the_same_build(head, workers):
    on_head = _binaries(head)
    assert "./llama-server" in on_head and "./ggml-rpc-server" in on_head
    for worker in workers:
        assert _binaries(worker) == on_head, worker.backend.host


# -- the endpoint -----------------------------------------------------------------------------------

def test_health_is_ok(api):
    wait_healthy(api, timeout=60)


def test_llama_server_offloads_to_both_workers_in_inventory_order(head, workers):
    argv = head.check_output(f"cat /proc/{main_pid(head, SERVER_UNIT)}/cmdline | tr '\\0' ' '")
    endpoints = ",".join(f"{address(worker)}:{rpc_port()}" for worker in workers)
    assert f"--rpc {endpoints} " in argv, argv


def test_layers_are_on_all_three_nodes(head, workers):
    """llama.cpp's own account in the head's log: the head's CPU keeps layers, each worker holds some."""
    log = head_log(head)
    # "llama_model_load_from_file_impl: using device RPC0 (172.19.0.4:50052) (unknown id) - 23000 MiB free"
    devices = dict(re.findall(r"using device (RPC\d+) \(([^)]+)\)", log))
    # "load_tensors: offloaded 4/5 layers to GPU": what is not offloaded stays on the head's CPU
    offloaded = re.findall(r"offloaded (\d+)/(\d+) layers", log)
    assert offloaded, "the head's log does not say how many layers went to the workers (verbosity 4 logs it)"
    sent, total = map(int, offloaded[-1])
    assert 0 < sent < total, f"{sent} of {total} layers offloaded: the head or the workers hold none"
    for worker in workers:
        endpoint = f"{address(worker)}:{rpc_port()}"
        assert endpoint in devices.values(), f"llama-server does not use {endpoint}: {devices}"
        # "load_tensors: RPC0[172.19.0.4:50052] model buffer size = 1.23 MiB": that worker's layers
        sizes = re.findall(rf"RPC\d+\[{re.escape(endpoint)}\] model buffer size =\s*([\d.]+) MiB", log)
        assert sizes and float(sizes[-1]) > 0, f"no weights on {worker.backend.host} ({endpoint})"
    # With verbosity 5 (debug) llama.cpp also names the device of each layer: check it when present.
    assigned = re.findall(r"layer\s+(\d+) assigned to device ([^,\s]+)", log)
    if assigned:
        holders = {device for _, device in assigned}
        assert {"CPU", *devices} <= holders, f"devices holding layers: {sorted(holders)}"


def test_tool_call_canary(api):
    choice = ask_weather(api)
    calls = choice["message"].get("tool_calls") or []
    assert choice["finish_reason"] == "tool_calls", choice
    assert len(calls) == 1, choice
    assert calls[0]["type"] == "function"
    assert calls[0]["function"]["name"] == TOOL_NAME
    assert json.loads(calls[0]["function"]["arguments"]) == TOOL_ARGUMENTS


# -- recovery (last: it restarts the services) ------------------------------------------------------

def test_worker_restart_brings_the_endpoint_back(head, api):
    worker = node(WORKERS[-1])
    head_pid = main_pid(head, SERVER_UNIT)
    worker_pid = main_pid(worker, RPC_UNIT)
    worker.check_output(f"systemctl restart {RPC_UNIT}")
    assert main_pid(worker, RPC_UNIT) != worker_pid
    # llama-server cannot reconnect to a restarted worker: the head must restart too and load again.
    deadline = time.monotonic() + 120
    while main_pid(head, SERVER_UNIT) in (head_pid, 0) and time.monotonic() < deadline:
        time.sleep(1)
    assert main_pid(head, SERVER_UNIT) not in (head_pid, 0), "llama-server did not restart with its worker"
    wait_healthy(api, timeout=300)
    choice = ask_weather(api)
    assert [c["function"]["name"] for c in choice["message"].get("tool_calls") or []] == [TOOL_NAME]
    assert head.service(SERVER_UNIT).is_running
    for each in WORKERS:
        assert node(each).service(RPC_UNIT).is_running
