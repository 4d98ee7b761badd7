"""tests/support/host_state.py tells a deployment left serving on this machine from one the tests touched: a serving
process stopped, restarted or started, a fact rewritten, an install switched; processes of the tests' own nodes
(tests/support/own-root.sh) are not this machine's."""
import subprocess
import time
from pathlib import Path

import host_state  # tests/support

ROOT = Path(__file__).resolve().parents[2]


def serving(name="llama-server"):
    """A process whose argv[0] is a serving executable's name (sleep under that name)."""
    return subprocess.Popen(["bash", "-c", 'exec -a "$0" sleep 300', name])


def wait_listed(pid, present=True):
    for _ in range(100):
        if (str(pid) in host_state.processes()) == present:
            return
        time.sleep(0.05)
    raise AssertionError("process %s %s listed" % (pid, "never" if present else "still"))


def test_an_untouched_deployment_has_no_differences(tmp_path):
    facts, installs = tmp_path / "facts.d", tmp_path / "opt"
    facts.mkdir()
    (facts / "minimax_head.fact").write_text("{}")
    proc = serving()
    try:
        wait_listed(proc.pid)
        assert host_state.differences(host_state.snapshot(facts, installs), host_state.snapshot(facts, installs)) == []
    finally:
        proc.kill()
        proc.wait()


def test_a_restarted_server_a_rewritten_fact_and_a_switched_install_are_named(tmp_path):
    facts, installs = tmp_path / "facts.d", tmp_path / "opt"
    facts.mkdir()
    (installs / "llama.cpp" / "aaaa").mkdir(parents=True)
    (installs / "llama.cpp" / "current").symlink_to("aaaa")
    (facts / "minimax_head.fact").write_text('{"ctx_size": 8192}')
    proc = serving()
    wait_listed(proc.pid)
    before = host_state.snapshot(facts, installs)
    proc.kill()
    proc.wait()
    again = serving()
    try:
        wait_listed(again.pid)
        (facts / "minimax_head.fact").write_text('{"ctx_size": 4096}')
        (installs / "llama.cpp" / "current").unlink()
        (installs / "llama.cpp" / "current").symlink_to("bbbb")
        lines = host_state.differences(before, host_state.snapshot(facts, installs))
    finally:
        again.kill()
        again.wait()
    assert "process %s (llama-server 300) is gone" % proc.pid in lines
    assert "process %s (llama-server 300) started" % again.pid in lines
    assert [line for line in lines if line.startswith("facts ")] == [
        "facts minimax_head.fact: %s -> %s" % (before["facts"]["minimax_head.fact"],
                                               host_state.facts(facts)["minimax_head.fact"])]
    assert "installs %s: aaaa -> bbbb" % (installs / "llama.cpp" / "current") in lines


def running_anywhere(argv):
    """PIDs (this machine's numbering) of every process with this argv, in any PID namespace."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "cmdline").read_bytes().split(b"\0")[:-1] == [a.encode() for a in argv]:
                found.append(proc.name)
        except OSError:
            continue
    return found


def test_a_server_on_a_test_node_is_not_this_machines(tmp_path):
    """own-root.sh's node has its own PID namespace: its llama-server is not listed here, this machine's is."""
    ours = serving()
    node = subprocess.Popen([str(ROOT / "tests" / "support" / "own-root.sh"), "bash", "-c",
                             'exec -a llama-server sleep 300'])
    try:
        wait_listed(ours.pid)
        for _ in range(200):  # the node's llama-server runs (seen from here, under this machine's PID)
            if len(running_anywhere(["llama-server", "300"])) == 2:
                break
            time.sleep(0.05)
        assert len(running_anywhere(["llama-server", "300"])) == 2
        listed = host_state.processes()
        assert [pid for pid, p in listed.items() if p["argv"] == ["llama-server", "300"]] == [str(ours.pid)]
    finally:
        for p in (ours, node):
            p.terminate()
            p.wait()
