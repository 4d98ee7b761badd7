"""The link check as a user runs it: on the demo (head and worker on this machine) the table beside the plan
names loopback and passes, changes nothing, and a bad threshold is refused before anything runs; a node without
iproute2 (no `ip` command) is read from /proc/net and sysfs; a what-if plan of Sparks that are not this machine
(memory given per host) says their link was not checked and passes, while a deploying run refuses a worker
address no interface holds. The refusals of a slow address and of an MTU mismatch, and a slow link measured again
once fixed, need two machines: molecule/link proves them."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

import sparse_m3
from helpers import ROOT, changed_tasks, failed_tasks, run_playbook

FACT = Path("/etc/ansible/facts.d/minimax_link.fact")
WHAT_IF_WORKER = "10.20.20.2"


def plain(text):
    return re.sub(r"\x1b\[[0-9;]*m", "", text)  # the callback's colours


def test_the_demo_link_is_loopback_and_passes_without_a_measurement():
    existed = FACT.exists()
    runner = run_playbook("playbooks/plan.yml", tags=["link"])
    assert runner.status == "successful", failed_tasks(runner) or runner.stdout_text[-3000:]
    out = plain(runner.stdout_text)
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


def test_a_node_without_the_ip_command_is_read_from_proc():
    """The GPU image lacks iproute2: `ip` hidden (a mount namespace puts /dev/null over it), the demo's link is
    read from /proc/net and sysfs and passes as loopback."""
    ip = shutil.which("ip")
    if os.geteuid() != 0 or ip is None or shutil.which("unshare") is None:
        pytest.skip("needs root, ip and unshare to hide ip in a mount namespace")
    ip = os.path.realpath(ip)
    playbook = str(Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin" / "ansible-playbook")
    script = ("mount --bind /dev/null %s && ! ip -V 2>/dev/null && exec %s -i inventory/local playbooks/plan.yml "
              "--tags link -v" % (ip, playbook))
    run = subprocess.run(["unshare", "-m", "sh", "-c", script], cwd=ROOT, capture_output=True, text=True,
                         env=dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0"),
                         timeout=300)
    out = plain(run.stdout + run.stderr)
    assert run.returncode == 0, out[-3000:]
    assert '"source": "read from /proc/net and sysfs: no ip command on this node"' in out
    row = next(line for line in out.splitlines() if line.strip().startswith('"localhost  127.0.0.1'))
    assert row.rstrip().rstrip('",').endswith("ok (loopback: same host)"), row


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    return sparse_m3.write_sparse_model(tmp_path_factory.mktemp("m3"), "UD-IQ4_XS")


def sparks(tmp_path, nodes=2):
    """An inventory of Sparks that are not this machine: each host runs locally with its memory given
    (plan_memory_gib: a what-if) and a fast-link address no interface here holds."""
    hosts = {"spark-%d" % i: {"fast_link_address": "10.20.20.%d" % i} for i in range(1, nodes + 1)}
    data = {"all": {
        "vars": {"ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}",
                 "plan_memory_gib": 119},
        "hosts": hosts,
        "children": {"head": {"hosts": {"spark-1": None}},
                     "workers": {"hosts": {h: None for h in hosts if h != "spark-1"}}},
    }}
    path = tmp_path / "sparks.yml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def test_a_what_if_of_absent_sparks_passes_and_says_the_link_was_not_checked(shard, tmp_path):
    runner = run_playbook("playbooks/plan.yml", sparks(tmp_path, 3),
                          extravars={"model_download_local_file": str(shard)})
    assert runner.status == "successful", failed_tasks(runner) or runner.stdout_text[-3000:]
    out = plain(runner.stdout_text)
    for worker in ("spark-2", "spark-3"):
        address = "10.20.20.%s" % worker[-1]
        assert ("link not checked for %s (%s): no interface of this host holds %s (a what-if: memory given per "
                "host, so the link is not needed for the plan; a deploying run refuses it)"
                % (worker, address, address)) in out
        row = next(line for line in out.splitlines() if "%s  %s" % (worker, address) in line)
        assert row.rstrip().rstrip('",').endswith("not checked"), row
    assert changed_tasks(runner) == []


def test_a_deploying_run_refuses_a_worker_address_no_interface_holds(shard, tmp_path):
    """The same inventory deploying the workers (services.yml, as site.yml runs it): the worker's address is
    refused before anything changes, the plan's what-if notwithstanding."""
    # The head's model named (a tag run that skips model_download does not read model_download_local_file).
    runner = run_playbook("playbooks/services.yml", sparks(tmp_path), tags=["worker_rpc"],
                          extravars={"head_server_model_path": str(shard)})
    assert runner.status == "failed"
    [(host, task, msg)] = failed_tasks(runner)
    assert host == "spark-2", (host, task, msg)
    assert msg.startswith("worker_rpc_bind_address=%s is not an address of spark-2 (" % WHAT_IF_WORKER), msg
    assert changed_tasks(runner) == []
    # Without the what-if the link check itself refuses it (the plan pass of a run without plan_memory_gib).
    runner = run_playbook("playbooks/plan.yml", sparks(tmp_path), tags=["link"],
                          extravars={"link_what_if": False})
    [(host, task, msg)] = failed_tasks(runner)
    assert (host, task, msg) == ("spark-2", "Describe the worker's end of the link",
                                 "no interface of this host holds %s" % WHAT_IF_WORKER)
