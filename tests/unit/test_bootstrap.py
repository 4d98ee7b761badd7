"""tools/bootstrap.sh test installs what the integration tests' nodes need: those nodes reach no network, so every
tool a node gets (common_packages) must already be on the machine that runs the tests.

The script runs from a copy of the project's files with dpkg-query and apt-get replaced by stand-ins that record
what apt was asked for (nothing is installed here) and a venv already up to date.
"""
import hashlib
import os
import shutil
import subprocess

import pytest
import yaml

from helpers import ROOT

COMMON = yaml.safe_load((ROOT / "roles/common/defaults/main.yml").read_text())


@pytest.fixture
def project(tmp_path):
    """A copy of what bootstrap.sh reads, stand-ins on PATH, and a log of apt-get's arguments."""
    copy = tmp_path / "project"
    for rel in ("tools/bootstrap.sh", "requirements.txt", "requirements-test.txt", "roles/common/defaults/main.yml"):
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, copy / rel)
    # The venv is current for either set-up: its stamp names the requirements' hash (as bootstrap.sh computes it).
    (copy / ".venv/bin").mkdir(parents=True)
    base = (copy / "requirements.txt").read_bytes()
    for extra in ("requirements.txt", "requirements-test.txt"):
        digest = hashlib.sha256(base + (copy / extra).read_bytes()).hexdigest()[:16]
        (copy / (".venv/.requirements-" + digest)).touch()
    stubs = tmp_path / "bin"
    stubs.mkdir()
    log = tmp_path / "apt.log"
    (stubs / "dpkg-query").write_text("#!/bin/sh\nexit 1\n")  # nothing is installed
    (stubs / "apt-get").write_text('#!/bin/sh\necho "$*" >> %s\n' % log)
    (stubs / "sudo").write_text('#!/bin/sh\nexec "$@"\n')
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    env = {**os.environ, "PATH": "%s:%s" % (stubs, os.environ["PATH"])}
    return copy, env, log


def requested(log):
    installs = [line.split() for line in log.read_text().splitlines() if line.split()[:1] == ["install"]]
    assert len(installs) == 1, log.read_text()
    return [word for word in installs[0][1:] if not word.startswith("-")]


def test_the_test_set_up_installs_every_tool_a_node_gets(project):
    copy, env, log = project
    proc = subprocess.run([str(copy / "tools/bootstrap.sh"), "test"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    wanted = requested(log)
    assert {"iperf3", "ethtool"} <= set(COMMON["common_packages"])
    assert set(COMMON["common_packages"]) <= set(wanted), wanted
    assert {"tini", "qemu-user-static", "docker.io"} <= set(wanted)


def test_the_demo_set_up_installs_no_test_tools(project):
    copy, env, log = project
    proc = subprocess.run([str(copy / "tools/bootstrap.sh"), "demo"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    wanted = requested(log)
    assert not {"tini", "qemu-user-static", "docker.io", "iperf3", "ethtool"} & set(wanted), wanted


def test_a_role_without_the_list_stops_the_set_up_naming_the_file(project):
    copy, env, log = project
    defaults = copy / "roles/common/defaults/main.yml"
    defaults.write_text(defaults.read_text().replace("common_packages:", "common_node_packages:"))
    proc = subprocess.run([str(copy / "tools/bootstrap.sh"), "test"], env=env, capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr == "bootstrap: no common_packages list in roles/common/defaults/main.yml\n"
    assert not log.exists()
