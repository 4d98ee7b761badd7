"""tools/test's schedule, run from a copy of the project whose every part is a stand-in that records when it ran:
line 1 runs ansible-lint, the unit tests, then integration node 1 (once the build cache is warm); line 2 warms the
build cache, then runs molecule, then node 2; line 3 runs the arm64 tests; a part that fails fails the run and every
other part still runs; tests/host is last."""
import os
import shutil
import signal
import subprocess
import time

import pytest

from helpers import ROOT

#: Every command tools/test runs; the parts record their start and end under a name, take TT_SLEEP_<name> seconds
#: and exit TT_RC_<name>.
STAND_IN = r'''#!/usr/bin/env bash
# A stand-in for one of tools/test's commands: records its start and end in $TT_EVENTS.
args="$*"
case "$(basename "$0") $args" in
  "bootstrap.sh"*|"fetch-llamacpp-source"*|"yamllint"*|"ruff"*) exit 0 ;;
  "ansible-lint --profile production") name=ansible-lint ;;
  "own-root.sh"*) export TT_ON_NODE=1; exec "$@" ;;
  "python "*host_state.py*|"python "*agent_clients.py*) exit 0 ;;
  "python -m pytest tests/host"*) name=host ;;
  "python -m pytest tests --ignore=tests/integration"*) name=unit ;;
  "python -m pytest tests/arm64"*) name=arm64 ;;
  "python -m pytest "*"--ignore=tests/integration/"*) name=node-2 ;;
  "python -m pytest "*) name=node-1 ;;
  "ansible-playbook "*build_llamacpp_project_patches*) name=build-stock ;;
  "ansible-playbook "*) name=build ;;
  "molecule-test "*) name=molecule ;;
  *) echo "stand-in: unexpected $0 $args" >&2; exit 99 ;;
esac
[ -z "${TT_ON_NODE:-}" ] || [ "${name#build}" != "$name" ] || [ "${name#node-}" != "$name" ] || {
  echo "stand-in: $name ran on a node" >&2; exit 98; }
echo "start $name $(date +%s.%N) $args" >>"$TT_EVENTS"
var="TT_SLEEP_${name//-/_}"; sleep "${!var:-0}"
echo "end $name $(date +%s.%N)" >>"$TT_EVENTS"
echo "$name says hello"
var="TT_RC_${name//-/_}"; exit "${!var:-0}"
'''


@pytest.fixture
def project(tmp_path):
    copy = tmp_path / "project"
    (copy / "tools").mkdir(parents=True)
    shutil.copy2(ROOT / "tools" / "test", copy / "tools" / "test")
    stand_in = tmp_path / "stand-in"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)
    for rel in ("tools/bootstrap.sh", "tools/fetch-llamacpp-source", "tools/molecule-test",
                "tests/support/own-root.sh", ".venv/bin/python", ".venv/bin/yamllint", ".venv/bin/ansible-lint",
                ".venv/bin/ruff", ".venv/bin/ansible-playbook"):
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        (copy / rel).symlink_to(stand_in)
    return copy


def run(project, tmp_path, **env):
    events = tmp_path / "events"
    proc = subprocess.run([str(project / "tools" / "test")], cwd=project, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TT_EVENTS": str(events), **{k: str(v) for k, v in env.items()}})
    times, args = {}, {}
    for line in events.read_text().splitlines():
        what, name, when, *rest = line.split(" ")
        assert (what, name) not in times, "%s %s twice" % (what, name)
        times[what, name] = float(when)
        if what == "start":
            args[name] = rest
    return proc, times, args


def test_node_1_starts_when_the_unit_tests_and_the_build_end_and_node_2_when_molecule_ends(project, tmp_path):
    # molecule takes longer than the unit tests: node 1 runs beside it instead of waiting for it
    proc, t, args = run(project, tmp_path, TT_SLEEP_ansible_lint=1, TT_SLEEP_unit=1, TT_SLEEP_build=1,
                        TT_SLEEP_build_stock=1, TT_SLEEP_molecule=6, TT_SLEEP_node_1=1, TT_SLEEP_node_2=1,
                        TT_SLEEP_arm64=4)
    assert proc.returncode == 0, proc.stderr
    assert t["start", "build"] < t["end", "ansible-lint"] <= t["start", "unit"], "ansible-lint beside the build"
    assert t["start", "build"] < t["end", "unit"], "the build warms beside the unit tests"
    assert t["end", "build"] <= t["start", "build-stock"], "one build at a time: two of one entry would race"
    assert t["end", "build-stock"] <= t["start", "molecule"], "molecule finds the builds in the cache"
    assert max(t["end", "unit"], t["end", "build-stock"]) <= t["start", "node-1"] < t["end", "molecule"]
    assert t["end", "molecule"] <= t["start", "node-2"]
    assert t["start", "host"] >= max(t["end", "node-1"], t["end", "node-2"], t["end", "arm64"]), "tests/host last"
    # the arm64 tests (qemu, minutes of one core) run beside the first parts, and no other part waits for them
    assert t["start", "arm64"] < t["end", "ansible-lint"] and t["start", "arm64"] < t["end", "build"]
    assert t["start", "node-1"] < t["end", "arm64"], "node 1 does not wait for the arm64 tests"
    assert "--ignore=tests/arm64" in args["unit"], "the unit tests leave the arm64 tests to their line"
    node_1 = [a for a in args["node-1"] if a.startswith("tests/integration")]
    assert "tests/integration/test_demo.py" in node_1 and "tests/integration" not in node_1
    assert args["node-2"][2] == "tests/integration"
    assert sorted(a.split("=", 1)[1] for a in args["node-2"] if a.startswith("--ignore=")) == sorted(node_1)
    # every part's output is printed, molecule's and each node's whole, after its exit status
    assert "unit says hello" in proc.stdout
    for part in ("==> ansible-lint --profile production (exit 0)\nansible-lint says hello",
                 "==> tools/molecule-test test (exit 0)\nmolecule says hello",
                 "==> integration tests, node 1 (exit 0)\nnode-1 says hello",
                 "==> integration tests, node 2 (exit 0)\nnode-2 says hello",
                 "==> the arm64 tests (tests/arm64) (exit 0)\narm64 says hello"):
        assert part in proc.stderr
    assert "tests: integration done after" in proc.stderr


def test_a_part_that_fails_fails_the_run_and_the_others_still_run(project, tmp_path):
    proc, t, _ = run(project, tmp_path, TT_RC_molecule=1, TT_RC_build=1)
    assert proc.returncode == 1
    # the stock build follows a successful patched one only
    assert {name for _, name in t} == {"ansible-lint", "unit", "arm64", "build", "molecule", "node-1", "node-2",
                                       "host"}
    assert "==> the build cache warm-up failed:" in proc.stderr
    assert "==> tools/molecule-test test (exit 1)" in proc.stderr
    assert "tests: node-2 done after" in proc.stderr


@pytest.mark.parametrize("failing", ["ansible_lint", "unit", "arm64", "build_stock", "node_1", "node_2", "host"])
def test_any_failed_part_is_a_failed_run(project, tmp_path, failing):
    proc, _, _ = run(project, tmp_path, **{"TT_RC_" + failing: 1})
    assert proc.returncode == 1, (failing, proc.stderr)


def test_one_node_runs_every_integration_file_after_the_unit_tests(project, tmp_path):
    proc, t, args = run(project, tmp_path, MINIMAX_SPARK_TEST_NODES=1, TT_SLEEP_molecule=2)
    assert proc.returncode == 0, proc.stderr
    assert ("start", "node-2") not in t
    assert args["node-1"][2] == "tests/integration" and not [a for a in args["node-1"] if "--ignore" in a]
    assert t["start", "node-1"] >= max(t["end", "unit"], t["end", "build-stock"])
    assert "integration tests, node 2" not in proc.stderr


def test_stopping_tools_test_stops_every_part_it_started(project, tmp_path):
    """A TERM (CI's timeout, a kill) ends tools/test with 143 and leaves none of its parts running: each line's
    part and what that part started (here each stand-in's sleep), in all three lines at once."""
    events = tmp_path / "events"
    env = {**os.environ, "TT_EVENTS": str(events), "TT_SLEEP_unit": "41.5", "TT_SLEEP_build": "41.5",
           "TT_SLEEP_arm64": "41.5"}
    proc = subprocess.Popen([str(project / "tools" / "test")], cwd=project, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        started = events.read_text() if events.exists() else ""
        if all("start %s" % name in started for name in ("unit", "build", "arm64")):
            break
        time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("the unit tests, the build and the arm64 tests did not all start")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-f", "sleep 41.5"], capture_output=True, text=True).stdout.split()
    assert not left, "parts still running after tools/test stopped: %s" % left
    assert not [name for name in ("unit", "build", "arm64") if "end %s" % name in events.read_text()]
