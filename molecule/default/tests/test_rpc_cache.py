"""The seeded RPC tensor cache, seen from outside: a seeded worker receives no tensor over 10 MiB when the
head loads, and loads several times faster than a cold one through a slow link, with the same reply.

Runs after test_cluster.py (alphabetical), on the converged scenario: the workers downloaded the model
themselves (worker_rpc_seed_download) and seeded their caches with the layers the plan gives them. The
head's link is throttled with tc (tbf on its egress: what it uploads to the workers) for the two timed loads
and put back afterwards; spark-2's cache is set aside for the cold load and put back too.
"""
from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path

import pytest
import requests
import testinfra

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
RPC_UNIT = "minimax-rpc-server"
SERVER_UNIT = "minimax-llama-server"
HEAD = "spark-1"
WORKER = "spark-2"
RATE = "20mbit"


@functools.cache
def node(name):
    return testinfra.get_host(f"ansible://{name}?ansible_inventory={INVENTORY}")


def api():
    head = node(HEAD)
    variables = head.ansible.get_variables()
    addr = head.check_output("hostname -I").split()[0]
    return f"http://{addr}:{variables['head_server_port']}"


def cache_dir(worker):
    return json.loads(worker.file("/etc/ansible/facts.d/minimax_rpc.fact").content_string)["cache_dir"]


def rpc_files(worker, folder):
    out = worker.check_output(f"ls -1 {folder}/rpc 2>/dev/null || true")
    return {name for name in out.split() if name and not name.startswith(".")}


def wait_healthy(timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            reply = requests.get(f"{api()}/health", timeout=5)
            if reply.status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    pytest.fail(f"llama-server not healthy within {timeout} s")


def greedy():
    reply = requests.post(f"{api()}/v1/completions", timeout=120, json={
        "prompt": "The weather in Paris is", "max_tokens": 16, "temperature": 0, "cache_prompt": False})
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["text"]


def timed_load():
    """Restart llama-server (its workers keep running) and time it until /health is ok."""
    start = time.monotonic()
    node(HEAD).check_output(f"systemctl restart {SERVER_UNIT}")
    wait_healthy()
    return time.monotonic() - start


@pytest.fixture(scope="module")
def throttled():
    head = node(HEAD)
    head.check_output(f"tc qdisc replace dev eth0 root tbf rate {RATE} burst 32kbit latency 400ms")
    try:
        yield node(WORKER)
    finally:
        head.run("tc qdisc del dev eth0 root")


def test_the_seeded_caches_hold_only_what_the_seeder_wrote():
    """After converge the head loaded through seeded caches: no worker saved a tensor it received."""
    for name in ("spark-2", "spark-3"):
        worker = node(name)
        folder = cache_dir(worker)
        manifest = json.loads(worker.file(f"{folder}/minimax-seed-manifest.json").content_string)
        assert manifest["entries"], f"{name}: nothing seeded (the model has tensors over 10 MiB)"
        # only this worker's layers, from the plan (the cold load below shows they are exactly what the head sends)
        include = manifest["include"]
        assert include and all(p.startswith(("^blk", "^output")) for p in include), include
        assert rpc_files(worker, folder) == set(manifest["entries"]), (
            f"{name}: the RPC server saved tensors the head sent: the seeded cache missed them")
        assert worker.file(folder).mode == 0o700


def test_a_seeded_load_is_faster_than_a_cold_one_and_replies_the_same(throttled):
    worker = throttled
    folder = cache_dir(worker)
    seeded_entries = rpc_files(worker, folder)
    seeded = timed_load()
    seeded_reply = greedy()
    assert rpc_files(worker, folder) == seeded_entries, "a seeded load made the worker save tensors"

    # cold: the same worker with an empty cache (the seeded one set aside)
    head = node(HEAD)
    head.check_output(f"systemctl stop {SERVER_UNIT}")
    worker.check_output(f"systemctl stop {RPC_UNIT} && mv {folder}/rpc {folder}/rpc.seeded && "
                        f"install -d -m 0700 {folder}/rpc && systemctl start {RPC_UNIT}")
    try:
        cold = timed_load()
        cold_reply = greedy()
        received = rpc_files(worker, folder)
    finally:
        head.check_output(f"systemctl stop {SERVER_UNIT}")
        worker.check_output(f"systemctl stop {RPC_UNIT} && rm -rf {folder}/rpc && mv {folder}/rpc.seeded {folder}/rpc "
                            f"&& systemctl start {RPC_UNIT}")
        head.check_output(f"systemctl start {SERVER_UNIT}")
        wait_healthy()
    figures = (f"load through {RATE}: cold {cold:.1f} s, seeded {seeded:.1f} s "
               f"({len(seeded_entries)} entries on {WORKER})")
    print(figures)
    out = Path(__file__).resolve().parents[3] / ".cache" / "molecule" / "rpc-cache-load.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(figures + "\n")
    assert received == seeded_entries, "the cold load did not send the tensors the seeder wrote (same hashes)"
    assert cold_reply == seeded_reply
    assert cold > 2 * seeded, f"cold {cold:.1f} s, seeded {seeded:.1f} s"
