"""The link measured again, and checked once per worker per run, on a real link between two network namespaces
of this machine: the head in this one, the worker in its own (`ip netns exec`, which also gives it its own
/etc/ansible from /etc/netns/NAME/, so its facts are its own) joined by a veth pair. tc shapes the head's egress
to 100 Mbit/s: the probe's figure is refused and recorded as refused; the cable "fixed" (the shaping removed),
the next run at the same address measures again and passes with the new figure; a rerun measures nothing and
reads each end once; link_remeasure measures again on request. The playbook runs the link role's two passes as
site.yml does: plan.yml's (no probe), then worker_rpc's (link_probe on)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from helpers import changed_tasks, failed_tasks, run_playbook

NS = "mmlink-%s" % uuid.uuid4().hex[:6]
HEAD_IF, WORKER_IF = "mmh%s" % NS[-6:], "mmw%s" % NS[-6:]
HEAD, WORKER = "10.231.77.1", "10.231.77.2"
PORT = 5299
FACT = Path("/etc/netns") / NS / "ansible" / "facts.d" / "minimax_link.fact"


def sh(*argv):
    subprocess.run(argv, check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def link():
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("ip", "tc", "iperf3")):
        pytest.skip("needs root, ip, tc and iperf3 to join two network namespaces")
    (FACT.parent).mkdir(parents=True)
    try:
        sh("ip", "netns", "add", NS)
        sh("ip", "link", "add", HEAD_IF, "type", "veth", "peer", "name", WORKER_IF)
        sh("ip", "link", "set", WORKER_IF, "netns", NS)
        sh("ip", "addr", "add", HEAD + "/24", "dev", HEAD_IF)
        sh("ip", "link", "set", HEAD_IF, "up")
        for args in (["addr", "add", WORKER + "/24", "dev", WORKER_IF], ["link", "set", WORKER_IF, "up"],
                     ["link", "set", "lo", "up"]):
            sh("ip", "netns", "exec", NS, "ip", *args)
        yield
    finally:
        subprocess.run(["ip", "link", "del", HEAD_IF], capture_output=True)
        subprocess.run(["ip", "netns", "del", NS], capture_output=True)
        shutil.rmtree(Path("/etc/netns") / NS, ignore_errors=True)


def shape(rate):
    if rate:
        sh("tc", "qdisc", "replace", "dev", HEAD_IF, "root", "tbf", "rate", rate, "burst", "64kb", "latency", "50ms")
    else:
        subprocess.run(["tc", "qdisc", "del", "dev", HEAD_IF, "root"], capture_output=True)


@pytest.fixture(scope="module")
def playbook(link, tmp_path_factory):
    root = tmp_path_factory.mktemp("link")
    # The worker's Python runs in its namespace (ansible takes the interpreter as one path: a wrapper).
    python = root / "worker-python"
    python.write_text('#!/bin/sh\nexec ip netns exec %s %s "$@"\n' % (NS, sys.executable))
    python.chmod(0o755)
    inventory = root / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "vars": {"ansible_connection": "local", "link_min_gbit": 1},
        "children": {
            "head": {"hosts": {"link-head": {"ansible_python_interpreter": sys.executable}}},
            "workers": {"hosts": {"link-worker": {
                "ansible_python_interpreter": str(python),
                "fast_link_address": WORKER}}}},
    }}))
    play = root / "link.yml"
    play.write_text(yaml.safe_dump([
        {"name": "Plan (the link beside the plan)", "hosts": "head:workers", "gather_facts": True,
         "gather_subset": ["min"], "roles": ["link"]},
        {"name": "Start the workers (worker_rpc's pass: measure)", "hosts": "workers", "gather_facts": False,
         "tasks": [{"name": "Check and measure the link to the head", "ansible.builtin.include_role": {"name": "link"},
                    "vars": {"link_probe": True, "link_iperf_port": PORT}}]},
    ]))
    return str(play), str(inventory)


def run(playbook, **extra):
    runner = run_playbook(playbook[0], inventory=playbook[1], extravars=extra)
    runner.plain = re.sub(r"\x1b\[[0-9;]*m", "", runner.stdout_text)
    return runner


def ran(runner, task, host="link-worker"):
    """How many times ``task`` ran (not skipped) on ``host`` (None: on any host, for a run_once task)."""
    return sum(1 for e in runner.event_list if e.get("event") == "runner_on_ok"
               and e["event_data"].get("task") == task and host in (None, e["event_data"].get("host")))


def tables(runner):
    return [e["event_data"]["res"]["msg"] for e in runner.event_list if e.get("event") == "runner_on_ok"
            and e["event_data"].get("task") == "Show the links"]


def worker_row(runner):
    rows = [line for line in tables(runner)[-1] if line.startswith("link-worker")]
    assert len(rows) == 1, tables(runner)
    return rows[0]


def test_a_refused_slow_link_is_measured_again_once_fixed(playbook):
    shape("100mbit")
    try:
        slow = run(playbook)
    finally:
        shape(None)
    assert slow.status == "failed", slow.plain[-3000:]
    [(host, task, msg)] = failed_tasks(slow)
    assert task == "Refuse a slow or mismatched link", (host, task, msg)
    assert re.search(r"link-worker: iperf3 measured 0\.\d+ Gbit/s head -> worker, under 1\.0 Gbit/s", msg), msg
    refused = json.loads(FACT.read_text())
    assert (refused["address"], refused["head"], refused["passed"], refused["verdict"]) == (
        WORKER, HEAD, False, "REFUSED"), refused
    assert refused["gbit_s"] < 0.12, refused
    assert worker_row(slow).endswith("REFUSED")

    # The cable fixed at the same address: the refused figure is not reused, the next run measures again.
    fixed = run(playbook)
    assert fixed.status == "successful", failed_tasks(fixed) or fixed.plain[-3000:]
    assert ran(fixed, "Measure from the head") == 1
    figure = json.loads(FACT.read_text())
    assert figure["address"] == WORKER and figure["passed"] is True and figure["gbit_s"] >= 1, figure
    row = worker_row(fixed)
    assert row.endswith("ok") and ("%.3g Gbit/s" % figure["gbit_s"]) in row, row
    print("link figures: refused %.3f Gbit/s (shaped 100 Mbit/s), fixed %.3f Gbit/s" % (
        refused["gbit_s"], figure["gbit_s"]))


def test_a_rerun_checks_the_link_once_per_worker_and_measures_nothing(playbook):
    before = FACT.read_text()
    rerun = run(playbook)
    assert rerun.status == "successful", failed_tasks(rerun)
    # One check per worker per run: each end read once (plan's pass), judged and shown once; nothing measured.
    assert ran(rerun, "Describe the worker's end of the link") == 1
    assert ran(rerun, "Describe the head's route to the worker") == 1
    assert ran(rerun, "Judge the links", None) == 1 and len(tables(rerun)) == 1
    assert ran(rerun, "Measure from the head") == 0
    assert changed_tasks(rerun) == [] and FACT.read_text() == before
    # The recorded figure (it passed) is shown by both passes' table.
    assert "%.3g Gbit/s" % json.loads(before)["gbit_s"] in worker_row(rerun)


def test_link_remeasure_measures_again_on_request(playbook):
    again = run(playbook, link_remeasure=True)
    assert again.status == "successful", failed_tasks(again)
    assert ran(again, "Measure from the head") == 1
    assert ran(again, "Describe the worker's end of the link") == 1
    assert len(tables(again)) == 2  # the plan's, then the one with the new figure


def test_a_client_run_that_reports_nothing_is_measured_again_by_the_same_server(playbook, tmp_path, monkeypatch):
    """iperf3 3.12's client has exited 0 having printed nothing (seen under a loaded machine). Here the head's first
    client run measures for real and then prints nothing: the worker's server has served one client and must take
    a second; the probe measures again, warns, records the figure, and no iperf3 is left on the worker."""
    real = shutil.which("iperf3")
    wrapper = tmp_path / "iperf3"
    wrapper.write_text('#!/bin/sh\nif [ "$1" = -c ] && [ ! -e %s/ran ]; then\n  touch %s/ran\n'
                       '  "%s" "$@" > /dev/null\n  exit 0\nfi\nexec "%s" "$@"\n' % (tmp_path, tmp_path, real, real))
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (tmp_path, os.environ["PATH"]))
    again = run(playbook, link_remeasure=True)
    assert (tmp_path / "ran").exists(), "the head's first client run did not go through the wrapper"
    assert again.status == "successful", failed_tasks(again) or again.plain[-3000:]
    assert ran(again, "Measure from the head") == 1
    assert ("iperf3 to %s:%d, run 1 of 2: iperf3 gave no result (exit 0; its output is empty); measuring again"
            % (WORKER, PORT)) in " ".join(again.plain.split()), again.plain[-3000:]
    figure = json.loads(FACT.read_text())
    assert figure["address"] == WORKER and figure["passed"] is True and figure["gbit_s"] >= 1, figure
    listening = subprocess.run(["ip", "netns", "exec", NS, "ss", "-Hltn", "sport = :%d" % PORT],
                               capture_output=True, text=True, check=True).stdout
    assert listening == ""
    deadline = time.monotonic() + 10  # the server's async wrapper ends after it
    while (left := subprocess.run(["ip", "netns", "pids", NS], capture_output=True, text=True).stdout.split()):
        assert time.monotonic() < deadline, "processes left in the worker's namespace: %s" % left
        time.sleep(0.2)
