"""No binary crosses architectures: the build role says which host built for which CPU and refuses to
install a build made for another one (a DGX Spark is aarch64, the controller usually x86_64).

playbooks/build.yml against inventory/local, as a user runs it; the build is the cached one. The
refusal is provoked the way a mixed cluster would meet it: the node says it is aarch64 while its
build leader (this x86_64 machine) made x86_64 binaries.
"""
import json
import os
from pathlib import Path

import pytest

from helpers import changed_tasks, failed_tasks, run_playbook

FACT = Path("/etc/ansible/facts.d/minimax_llamacpp.fact")
CURRENT = Path("/opt/minimax-spark/llama.cpp/current")
MACHINE = os.uname().machine


def task_results(runner, task_name, event="runner_on_ok"):
    return [e["event_data"]["res"] for e in runner.event_list
            if e.get("event") == event and e["event_data"].get("task") == task_name]


@pytest.fixture(scope="module")
def built(llamacpp_bin):
    """build.yml on this machine (cached), and the manifest it installed."""
    runner = run_playbook("playbooks/build.yml")
    assert runner.status == "successful", failed_tasks(runner) or runner.stdout_text[-3000:]
    return runner, json.loads(FACT.read_text())


def test_build_reports_which_host_built_for_which_architecture(built):
    runner, manifest = built
    [line] = task_results(runner, "Report which host built for which architecture")
    assert line["msg"] == "llama.cpp for %s: built on localhost (build %s, binaries for %s), installed on localhost" % (
        MACHINE, manifest["build_id"], MACHINE)
    [checked] = task_results(runner, "Check every binary is built for this node's CPU (ELF header)")
    assert checked["architecture"] == MACHINE
    bin_dir = manifest["bin_dir"]
    assert set(checked["arches"]) == {bin_dir + "/llama-server", bin_dir + "/" + manifest["rpc_server"],
                                      bin_dir + "/libminimax_fnv1a.so"} | {
        os.path.join(manifest["install_dir"], rel) for rel in manifest["files"] if "/lib" in rel}
    assert set(checked["arches"].values()) == {MACHINE}


def test_install_refuses_a_build_made_for_another_architecture(built):
    _, manifest = built
    fact_before, current_before = FACT.read_text(), os.readlink(CURRENT)
    other = "aarch64" if MACHINE != "aarch64" else "x86_64"
    runner = run_playbook("playbooks/build.yml", extravars={"ansible_architecture": other})
    assert runner.status == "failed"
    assert failed_tasks(runner) == [("localhost", "Refuse a build made for another architecture",
        "build %s is for %s (built on localhost), but localhost is %s: binaries do not cross architectures; "
        "let a node of this architecture build (build_llamacpp_build_on: node)"
        % (manifest["build_id"], MACHINE, other))]
    [line] = task_results(runner, "Report which host built for which architecture")
    assert line["msg"].startswith("llama.cpp for %s: built on localhost (build %s, binaries for %s)" % (
        other, manifest["build_id"], MACHINE))
    # Nothing was installed or recorded: the node keeps the build it had.
    assert FACT.read_text() == fact_before
    assert os.readlink(CURRENT) == current_before
    assert not task_results(runner, "Unpack the build", "runner_on_ok")


def test_a_changed_or_missing_installed_file_is_put_back(built):
    """A rerun skips the unpack only when every installed file has the build's sha256 (one find over the
    install folder): a file replaced by other content, or removed, is installed again."""
    import hashlib

    _, manifest = built
    install = Path(manifest["install_dir"])
    victims = sorted(name for name in manifest["files"] if name.startswith("bin/libmtmd"))[:1] or ["bin/llama-server"]
    target = install / victims[0]
    # A new inode (running servers keep theirs): other content under the same name.
    tmp = target.with_name(target.name + ".r19-test")
    tmp.write_bytes(b"not the build\n")
    tmp.chmod(0o755)
    tmp.replace(target)
    runner = run_playbook("playbooks/build.yml", tags=["build_llamacpp"])
    assert runner.status == "successful", failed_tasks(runner)
    assert any(task == "Unpack the build" for _, task in changed_tasks(runner)), changed_tasks(runner)
    assert hashlib.sha256(target.read_bytes()).hexdigest() == manifest["files"][victims[0]]

    runner = run_playbook("playbooks/build.yml", tags=["build_llamacpp"])
    assert runner.status == "successful", failed_tasks(runner)
    assert changed_tasks(runner) == []
