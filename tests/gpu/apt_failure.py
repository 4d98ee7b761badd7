#!/usr/bin/env python3
"""gpu-check: did an ansible-playbook log fail at one of the roles' apt tasks (an offline node)?

    apt_failure.py LOG [ROLES_DIR]   prints the failed task's name and exits 0 when it did, exits 1 when not.

The apt tasks are read from the roles (roles/*/tasks/*.yml, any task using ansible.builtin.apt), so a renamed
task is still recognised; a failure whose message is apt's own offline error counts too.
"""
import glob
import os
import re
import sys

import yaml

APT_MODULES = {"apt", "ansible.builtin.apt", "ansible.legacy.apt"}
OFFLINE_MESSAGES = re.compile(r"python3-apt|No package matching|has no installation candidate|"
                              r"Failed to update apt cache|Could not import python modules: apt")


def _tasks(items):
    for task in items or []:
        if not isinstance(task, dict):
            continue
        yield task
        for key in ("block", "rescue", "always"):
            yield from _tasks(task.get(key))


def apt_task_names(roles_dir):
    """The names of the roles' apt tasks, as ansible-playbook prints them ('role : name')."""
    names = set()
    for path in sorted(glob.glob(os.path.join(roles_dir, "*", "tasks", "*.yml"))):
        role = path.split(os.sep)[-3]
        with open(path, encoding="utf-8") as handle:
            data = yaml.safe_load(handle)
        for task in _tasks(data if isinstance(data, list) else []):
            if APT_MODULES & set(task) and task.get("name"):
                names.add("%s : %s" % (role, task["name"]))
    return names


def failed_apt_task(log_text, roles_dir):
    """The first failed task's header when it is an apt task of the roles or failed with apt's offline error."""
    names = apt_task_names(roles_dir)
    task = None
    lines = log_text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("TASK ["):
            task = line[len("TASK ["):line.rfind("]")]
        elif line.startswith("fatal:") and task is not None:
            message = " ".join(lines[i:i + 3])
            if task in names or OFFLINE_MESSAGES.search(message):
                return task
            return None
    return None


def main(argv):
    roles = argv[2] if len(argv) > 2 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "roles")
    with open(argv[1], encoding="utf-8", errors="replace") as handle:
        task = failed_apt_task(handle.read(), roles)
    if task:
        print(task)
        return 0
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
