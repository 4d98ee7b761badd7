"""The link check as a user runs it on the demo (head and worker on this machine): the table beside the plan
names loopback and passes, changes nothing, and a bad threshold is refused before anything runs. The refusals of
a slow address and of an MTU mismatch need two machines: molecule/link proves them."""
from __future__ import annotations

import re
from pathlib import Path

from helpers import failed_tasks, run_playbook

FACT = Path("/etc/ansible/facts.d/minimax_link.fact")


def test_the_demo_link_is_loopback_and_passes_without_a_measurement():
    existed = FACT.exists()
    runner = run_playbook("playbooks/plan.yml", tags=["link"])
    assert runner.status == "successful", failed_tasks(runner) or runner.stdout_text[-3000:]
    out = re.sub(r"\x1b\[[0-9;]*m", "", runner.stdout_text)  # the callback's colours
    row = next(line for line in out.splitlines() if "localhost" in line and "127.0.0.1" in line and "loopback" in line)
    assert "lo loopback" in row and row.rstrip().rstrip('",').endswith("ok (loopback: same host)"), row
    assert "The link (RPC head -> worker; threshold 10.0 Gbit/s):" in out
    assert FACT.exists() == existed  # nothing measured, nothing recorded


def test_a_negative_threshold_is_refused_first():
    runner = run_playbook("playbooks/plan.yml", tags=["link"], extravars={"link_min_gbit": -1})
    assert runner.status == "failed"
    [(host, task, msg)] = failed_tasks(runner)
    assert task == "Check the link settings"
    assert msg == ("link_min_gbit=-1 and link_probe_seconds=3: give a threshold of 0 or more Gbit/s (0 checks no "
                   "speed) and a measurement of at least 1 second")
