"""The x86_64 head and the aarch64 worker after site.yml: which node built what for which CPU, and the endpoint.

Run by molecule's testinfra verifier after converge and idempotence (molecule/arm64). What a user of a mixed
cluster (an x86 head, aarch64 Sparks as workers) relies on: each node runs binaries of its own CPU, built on a node
of that CPU; the worker-only architecture has the RPC server and nothing the head needs; the head serves the tool
call with layers on the emulated worker.
"""
from __future__ import annotations

import functools
import json
import os
import re
import sys
from pathlib import Path

import requests
import testinfra

PROJECT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(PROJECT / "tools"))
from make_tiny_m3 import TOOL_ARGUMENTS, TOOL_NAME, WEATHER_TOOL  # noqa: E402  (the served model's script)

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
HEAD, WORKER = "arm64-head", "arm64-worker"
FACT = "/etc/ansible/facts.d/minimax_llamacpp.fact"
BIN_DIR = "/opt/minimax-spark/llama.cpp/current/bin"
# ELF e_machine (bytes 18-19, little endian): what the kernel of each CPU runs.
E_MACHINE = {62: "x86_64", 183: "aarch64"}


@functools.cache
def node(name):
    return testinfra.get_host(f"ansible://{name}?ansible_inventory={INVENTORY}")


def fact(name):
    return json.loads(node(name).file(FACT).content_string)


def address(host):
    return host.check_output("ip -4 -o addr show scope global | awk '{print $4}' | cut -d/ -f1 | head -n1")


def elf_machines(host):
    """{file name: CPU} of every ELF file in the installed bin folder (links followed)."""
    out = host.check_output(
        "cd %s && for f in *; do [ -f \"$f\" ] && printf '%%s %%s %%s\\n' \"$f\" "
        "\"$(od -An -tu2 -j18 -N2 \"$f\" | tr -d ' ')\" \"$(head -c4 \"$f\" | od -An -c | tr -d ' ')\"; done"
        % BIN_DIR)
    machines = {}
    for line in out.splitlines():
        name, number, magic = line.split()
        if magic == "177ELF":
            machines[name] = E_MACHINE.get(int(number), number)
    return machines


def test_each_node_runs_binaries_built_for_its_own_cpu_on_a_node_of_that_cpu():
    head, worker = fact(HEAD), fact(WORKER)
    assert node(HEAD).system_info.arch == "x86_64" and node(WORKER).system_info.arch == "aarch64"
    assert head["machine"] == "x86_64" and worker["machine"] == "aarch64"
    assert head["build_id"] != worker["build_id"]
    for name, manifest in ((HEAD, head), (WORKER, worker)):
        machines = elf_machines(node(name))
        assert "ggml-rpc-server" in machines and "libminimax_fnv1a.so" in machines, machines
        assert set(machines.values()) == {manifest["machine"]}, (name, machines)


def test_the_worker_only_architecture_built_the_rpc_server_alone():
    head, worker = fact(HEAD), fact(WORKER)
    assert worker["targets"] == ["ggml-rpc-server"]
    assert "bin/llama-server" not in worker["files"] and "server" not in worker
    assert not node(WORKER).file(BIN_DIR + "/llama-server").exists
    assert not any(rel.startswith("bin/libllama") for rel in worker["files"]), worker["files"]
    assert head["targets"][:2] == ["llama-server", "ggml-rpc-server"] and head["server"].endswith("/llama-server")


def test_the_head_serves_the_tool_call_with_layers_on_the_arm64_worker():
    head = node(HEAD)
    endpoint = "%s:%s" % (address(node(WORKER)), head.ansible.get_variables()["worker_rpc_port"])
    assert node(WORKER).service("minimax-rpc-server").is_running
    pid = head.check_output("systemctl show -p MainPID --value minimax-llama-server")
    argv = head.check_output(f"cat /proc/{pid}/cmdline | tr '\\0' ' '")
    assert f"--rpc {endpoint} " in argv, argv
    log = head.check_output("journalctl --no-pager -o cat -u minimax-llama-server")
    sizes = re.findall(rf"RPC\d+\[{re.escape(endpoint)}\] model buffer size =\s*([\d.]+) MiB", log)
    assert sizes and float(sizes[-1]) > 0, "no weights on the arm64 worker"

    api = "http://%s:%s" % (address(head), head.ansible.get_variables()["head_server_port"])
    response = requests.post(f"{api}/v1/chat/completions", timeout=600, json={
        "messages": [{"role": "user", "content": "What is the weather like in Paris today?"}],
        "tools": [WEATHER_TOOL], "temperature": 0, "max_tokens": 256})
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    calls = choice["message"].get("tool_calls") or []
    assert choice["finish_reason"] == "tool_calls", choice
    assert [c["function"]["name"] for c in calls] == [TOOL_NAME]
    assert json.loads(calls[0]["function"]["arguments"]) == TOOL_ARGUMENTS
