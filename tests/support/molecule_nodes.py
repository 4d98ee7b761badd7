"""What a molecule scenario's tests share: its nodes as testinfra hosts, and its converge playbook run again as a
user reruns site.yml (with extra arguments), from the scenario's own inventory and the project's roles, modules and
filters."""
from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import testinfra

PROJECT = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY", Path(__file__).resolve().parents[2]))


def inventory():
    return os.environ["MOLECULE_INVENTORY_FILE"]


@functools.cache
def node(name):
    """The scenario's node `name`, reached through its Ansible inventory."""
    return testinfra.get_host(f"ansible://{name}?ansible_inventory={inventory()}")


def converge(playbook, *extra, timeout=600):
    """ansible-playbook `playbook` as `molecule converge` runs it, with extra arguments: (rc, stdout + stderr)."""
    env = dict(os.environ, ANSIBLE_ROLES_PATH=str(PROJECT / "roles"), ANSIBLE_LIBRARY=str(PROJECT / "library"),
               ANSIBLE_MODULE_UTILS=str(PROJECT / "module_utils"),
               ANSIBLE_FILTER_PLUGINS=str(PROJECT / "filter_plugins"), ANSIBLE_PIPELINING="1",
               ANSIBLE_FORCE_COLOR="0", NO_COLOR="1")
    ansible_playbook = str(Path(sys.executable).parent / "ansible-playbook")
    run = subprocess.run([ansible_playbook, "-i", inventory(), str(playbook), *extra], capture_output=True, text=True,
                         env=env, timeout=timeout)
    return run.returncode, run.stdout + run.stderr
