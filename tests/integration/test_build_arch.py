"""No binary crosses architectures: the build role says which host built for which CPU and refuses to
install a build made for another one (a DGX Spark is aarch64, the controller usually x86_64).

playbooks/build.yml against inventory/local, as a user runs it; the build is the cached one. The
refusal is provoked the way a mixed cluster would meet it: the node says it is aarch64 while its
build leader (this x86_64 machine) made x86_64 binaries. The mixed inventory (an x86_64 head, a worker
that says it is aarch64, both this machine) shows the per-architecture targets: the worker-only
architecture builds the RPC server alone. molecule/arm64 runs the same with a real arm64 worker under qemu.
"""
import json
import os
from pathlib import Path

import pytest
import yaml

from helpers import ROOT, changed_tasks, failed_tasks, run_playbook

FACT = Path("/etc/ansible/facts.d/minimax_llamacpp.fact")
CURRENT = Path("/opt/minimax-spark/llama.cpp/current")
MACHINE = os.uname().machine


def task_results(runner, task_name, event="runner_on_ok"):
    return [e["event_data"]["res"] for e in runner.event_list
            if e.get("event") == event and e["event_data"].get("task") == task_name]


@pytest.fixture(scope="module")
def built(llamacpp_bin):
    """build.yml on this machine (cached), and the manifest it installed. The node's record of its build goes first
    (an earlier test's deployment leaves one, and a node that has the build asked for builds nothing): the leader
    builds, from the cache."""
    FACT.unlink(missing_ok=True)
    runner = run_playbook("playbooks/build.yml")
    assert runner.status == "successful", failed_tasks(runner) or runner.stdout_text[-3000:]
    return runner, json.loads(FACT.read_text())


def test_build_reports_which_host_built_for_which_architecture(built):
    runner, manifest = built
    [line] = task_results(runner, "Report which host built for which architecture")
    assert line["msg"] == ("llama.cpp for %s: built on localhost (build %s, binaries for %s: llama-server, %s), "
                           "installed on localhost" % (MACHINE, manifest["build_id"], MACHINE, manifest["rpc_server"]))
    [checked] = task_results(runner, "Check every binary is built for this node's CPU (ELF header)")
    assert checked["architecture"] == MACHINE
    bin_dir = manifest["bin_dir"]
    assert set(checked["arches"]) == {bin_dir + "/llama-server", bin_dir + "/" + manifest["rpc_server"],
                                      bin_dir + "/libminimax_fnv1a.so"} | {
        os.path.join(manifest["install_dir"], rel) for rel in manifest["files"] if "/lib" in rel}
    assert set(checked["arches"].values()) == {MACHINE}


def test_a_rerun_that_asks_for_the_installed_build_builds_and_installs_nothing(built):
    """The node's fact records the build it asked for and the sha256 of every file installed: a rerun asking for the
    same build reads the install folder once and neither builds, packs, copies nor unpacks."""
    _, manifest = built
    fact_before = FACT.read_text()
    runner = run_playbook("playbooks/build.yml")
    assert runner.status == "successful", failed_tasks(runner)
    assert changed_tasks(runner) == []
    [line] = task_results(runner, "Report which host built for which architecture")
    assert line["msg"] == ("llama.cpp for %s: nothing to build, localhost already has the build asked for "
                           "(build %s: llama-server, %s)" % (MACHINE, manifest["build_id"], manifest["rpc_server"]))
    for task in ("Build llama.cpp (cached by source and options)", "Pack the build for the nodes", "Unpack the build",
                 "Check every binary is built for this node's CPU (ELF header)"):
        assert not task_results(runner, task), task
    assert [r["changed"] for r in task_results(runner, "Point current at the build")] == [False]
    assert FACT.read_text() == fact_before
    recorded = json.loads(fact_before)
    assert recorded["installed"]["bin/llama-server"] == manifest["files"]["bin/llama-server"]
    assert recorded["request"]["source"]["type"] == "archive" and len(recorded["request"]["patches"]) >= 1


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
    assert line["msg"].startswith("llama.cpp for %s: built on localhost (build %s, binaries for %s: llama-server" % (
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


def test_a_worker_only_architecture_builds_the_rpc_server_alone_and_nothing_crosses(built, tmp_path):
    """A head of this machine's CPU and a worker that says it is aarch64 (this machine too, so the binaries its
    build makes are this machine's): the worker's architecture has no head, so its leader builds ggml-rpc-server
    alone; the worker then refuses that build (made for this CPU, not aarch64) and the head keeps its own."""
    _, manifest = built
    other = "aarch64" if MACHINE != "aarch64" else "x86_64"
    fact_before, current_before = FACT.read_text(), os.readlink(CURRENT)
    local = yaml.safe_load((ROOT / "inventory/local/hosts.yml").read_text())["all"]["hosts"]["localhost"]
    group_vars = yaml.safe_load((ROOT / "inventory/local/group_vars/all.yml").read_text())
    version = yaml.safe_load((ROOT / "tools/llama-cpp-python.version").read_text())["llama_cpp_python"]
    group_vars.update(build_llamacpp_archive_subdir="llama_cpp_python-%s/vendor/llama.cpp" % version,
                      build_llamacpp_archive=str(ROOT / (".cache/llama.cpp-src/llama_cpp_python-%s.tar.gz" % version)))
    inventory = tmp_path / "mixed.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "hosts": {"localhost": local, "arm-worker": local},
        "vars": group_vars,
        "children": {"head": {"hosts": {"localhost": None}}, "workers": {"hosts": {"arm-worker": None}}}}}))
    # Each host's CPU as the play sees it (a host's own facts would say this machine's for both).
    runner = run_playbook("playbooks/build.yml", inventory=str(inventory), extravars={
        "ansible_architecture": "{{ '%s' if inventory_hostname == 'arm-worker' else '%s' }}" % (other, MACHINE)})
    assert runner.status == "failed"

    # The head has the build asked for (the fixture installed it): only the worker's architecture builds.
    build_task = "Build llama.cpp (cached by source and options)"
    builds = {e["event_data"]["host"]: e["event_data"]["res"] for e in runner.event_list
              if e.get("event") == "runner_on_ok" and e["event_data"].get("task") == build_task}
    assert set(builds) == {"arm-worker"}
    worker = builds["arm-worker"]["manifest"]
    assert worker["targets"] == [manifest["rpc_server"]]
    assert "bin/llama-server" not in worker["files"] and "bin/" + manifest["rpc_server"] in worker["files"]
    assert not os.path.exists(os.path.join(builds["arm-worker"]["stage_dir"], "bin", "llama-server"))
    assert worker["version"] is None and worker["server_options"] == []

    lines = sorted(r["msg"] for r in task_results(runner, "Report which host built for which architecture"))
    assert lines == sorted([
        "llama.cpp for %s: nothing to build, localhost already has the build asked for (build %s: llama-server, %s)"
        % (MACHINE, manifest["build_id"], manifest["rpc_server"]),
        "llama.cpp for %s: built on arm-worker (build %s, binaries for %s: %s), installed on arm-worker"
        % (other, worker["build_id"], MACHINE, manifest["rpc_server"])])
    # The worker's build was made on a machine of another CPU: refused before anything is installed there.
    assert failed_tasks(runner) == [("arm-worker", "Refuse a build made for another architecture",
        "build %s is for %s (built on arm-worker), but arm-worker is %s: binaries do not cross architectures; "
        "let a node of this architecture build (build_llamacpp_build_on: node)" % (worker["build_id"], MACHINE, other))]
    assert [e["event_data"]["host"] for e in runner.event_list if e.get("event") == "runner_on_ok"
            and e["event_data"].get("task") == "Point current at the build"] == ["localhost"]
    # The head (this machine) keeps its full build: the same fact, the same current.
    assert FACT.read_text() == fact_before
    assert os.readlink(CURRENT) == current_before


def test_a_missing_source_archive_fails_once_naming_it_and_the_nodes_keep_their_build(built, tmp_path):
    """Two nodes of one CPU (both this machine) and an archive moved away: the leader says which path to fix, the
    other node reports no error of its own, and the installed build, its fact and current are as they were."""
    _, manifest = built
    fact_before, current_before = FACT.read_text(), os.readlink(CURRENT)
    local = yaml.safe_load((ROOT / "inventory/local/hosts.yml").read_text())["all"]["hosts"]["localhost"]
    group_vars = yaml.safe_load((ROOT / "inventory/local/group_vars/all.yml").read_text())
    version = yaml.safe_load((ROOT / "tools/llama-cpp-python.version").read_text())["llama_cpp_python"]
    missing = tmp_path / ("llama_cpp_python-%s.tar.gz" % version)  # where a user's copy was, before a cleanup
    group_vars.update(build_llamacpp_archive_subdir="llama_cpp_python-%s/vendor/llama.cpp" % version,
                      build_llamacpp_archive=str(missing))
    inventory = tmp_path / "two.yml"
    inventory.write_text(yaml.safe_dump({"all": {
        "hosts": {"localhost": local, "spark-2": local},
        "vars": group_vars,
        "children": {"head": {"hosts": {"localhost": None}}, "workers": {"hosts": {"spark-2": None}}}}}))
    runner = run_playbook("playbooks/build.yml", inventory=str(inventory))
    assert runner.status == "failed"
    assert failed_tasks(runner) == [("localhost", "Check the source archive exists",
        "build_llamacpp_archive=%s does not exist on the controller: run tools/fetch-llamacpp-source or fix the path"
        % missing)]
    assert not task_results(runner, "Build llama.cpp (cached by source and options)")
    assert not task_results(runner, "Unpack the build")
    assert not task_results(runner, "Report what check mode would build")  # a real run, that built nothing
    assert FACT.read_text() == fact_before and json.loads(fact_before)["build_id"] == manifest["build_id"]
    assert os.readlink(CURRENT) == current_before
