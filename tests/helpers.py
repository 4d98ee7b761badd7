"""Test helpers: drive the project's playbooks through ansible-runner, as a user would run them, and run one
module's main() in-process, as Ansible would on a node."""
import contextlib
import io
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import ansible_runner
from ansible.module_utils.testing import patch_module_args

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def kept_as_found(*paths):
    """Each file put back as it was when the block began, or removed if there was none: for tests that rewrite what
    a host records (its facts, a service's verified state), which later tests and a user's run read."""
    saved = {Path(p): Path(p).read_bytes() if Path(p).exists() else None for p in paths}
    try:
        yield
    finally:
        for path, data in saved.items():
            if data is None:
                path.unlink(missing_ok=True)
            else:
                path.write_bytes(data)


def run_module(main, args, check_mode=False, diff=False):
    """Run a module's ``main`` in-process with ``args``; return the result dict it exits with.

    The module runs unpatched: exit_json/fail_json print their JSON (no_log values masked, ``invocation``
    added) and exit, as on a node; that JSON is the result. On fail_json it holds ``failed: True`` and ``msg``.
    """
    args = dict(args, _ansible_check_mode=check_mode, _ansible_diff=diff)
    out = io.StringIO()
    with patch_module_args(args), contextlib.redirect_stdout(out):
        try:
            main()
        except SystemExit:
            pass
        else:
            raise AssertionError("%s returned without exit_json or fail_json" % main.__module__)
    return json.loads(out.getvalue())


def run_playbook(playbook, inventory=None, extravars=None, tags=None, check=False, limit=None, quiet=True,
                 skip_tags=None):
    """Run ROOT/playbook with the project's ansible.cfg; return the ansible_runner Runner.

    The private data dir is temporary so runs do not share artifacts; the project root is the
    working directory, so ansible.cfg, roles, library and filter plugins resolve as for a user.
    """
    private = tempfile.mkdtemp(prefix="minimax-spark-runner-")
    started = time.monotonic()
    cmdline = []
    if check:
        cmdline.append("--check")
    try:
        runner = ansible_runner.run(
            private_data_dir=private,
            project_dir=str(ROOT),
            playbook=str(ROOT / playbook),
            inventory=str(ROOT / (inventory or "inventory/local")),
            extravars=extravars or {},
            tags=",".join(tags) if tags else None,
            skip_tags=",".join(skip_tags) if skip_tags else None,
            limit=limit,
            cmdline=" ".join(cmdline) or None,
            envvars={"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_FORCE_COLOR": "0"},
            quiet=quiet,
        )
        # Keep the text: the private dir goes away.
        runner.stdout_text = runner.stdout.read()
        runner.event_list = list(runner.events)
        record_run(playbook, tags, check, runner, time.monotonic() - started)
        return runner
    finally:
        shutil.rmtree(private, ignore_errors=True)


def record_run(playbook, tags, check, runner, seconds):
    """One line per playbook run in $MINIMAX_SPARK_PLAYBOOK_LOG (tools/test sets it for each node): which test ran
    which playbook, with which tags, for how long, and how many tasks it ran: where the suite's time goes."""
    log = os.environ.get("MINIMAX_SPARK_PLAYBOOK_LOG")
    if not log:
        return
    tasks = sum(1 for e in runner.event_list if e.get("event") in ("runner_on_ok", "runner_on_failed",
                                                                    "runner_on_skipped", "runner_on_unreachable"))
    line = {"test": os.environ.get("PYTEST_CURRENT_TEST", ""), "playbook": playbook, "tags": tags or [],
            "check": check, "status": runner.status, "seconds": round(seconds, 1), "tasks": tasks}
    with open(log, "a") as out:
        out.write(json.dumps(line) + "\n")


def changed_tasks(runner):
    """(host, task name) of every task that reported a change."""
    return [
        (e["event_data"].get("host"), e["event_data"].get("task"))
        for e in runner.event_list
        if e.get("event") == "runner_on_ok" and e["event_data"].get("res", {}).get("changed")
    ]


def failure_message(res):
    """The message of a failed task, with the messages of its failed loop items."""
    parts = [str(res.get("msg", ""))]
    parts += [str(r.get("msg", "")) for r in res.get("results", []) if isinstance(r, dict) and r.get("failed")]
    return " | ".join(p for p in parts if p)


def failed_tasks(runner):
    """(host, task name, message) of every task that failed and was not ignored."""
    return [
        (e["event_data"].get("host"), e["event_data"].get("task"), failure_message(e["event_data"].get("res", {})))
        for e in runner.event_list
        if e.get("event") == "runner_on_failed" and not e["event_data"].get("ignore_errors")
    ]
