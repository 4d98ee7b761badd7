"""Patches to llama.cpp: what a patch touches, applying a series in order (each refused with the file and hunk that
do not fit), and re-diffing one against the tree it applies to.

* ``split_patch(text)``: the header (a DEP-3 block of ``Field: value`` lines, which ``patch`` and ``git apply`` skip)
  and the unified diff that follows it.
* ``patch_files(text)``: the files a patch touches, as ``(old, new)`` paths inside the tree (``None`` for
  ``/dev/null``).
* ``apply_series(tree, patches)``: applies ``[{name, path, ...}]`` in order with ``patch -p1``; each is tried first
  (``--dry-run``), and the first that does not fit raises ``PatchError`` naming it and its failing files and hunks.
* ``diff_files(before, after, files)``: the unified diff (``--- a/<file>`` / ``+++ b/<file>``, no dates) of the
  files from one folder to another: how the project's patches are written.

Modules import it as ``from ansible.module_utils.minimax_spark_patches import ...``; ``tools/refresh-patches``
imports it from module_utils/. Python's standard library and GNU ``patch`` / ``diff`` only.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile

PATCH_ARGS = ["patch", "-p1", "--forward", "--batch", "--no-backup-if-mismatch", "--reject-file=-"]
FILE_LINE = re.compile(r"^(?:checking|patching) file (.+?)\s*$")
HUNK_FAILED = re.compile(r"^Hunk #(\d+) FAILED at (\d+)")
REVERSED = "Reversed (or previously applied) patch detected"


class PatchError(Exception):
    """A patch that does not apply: ``name``, ``failures`` (``[(file, what)]``) and patch's ``output``."""

    def __init__(self, name, failures, output):
        self.name, self.failures, self.output = name, failures, output
        super().__init__("%s: %s" % (name, describe(failures)))


def describe(failures):
    """``file: hunk #2 FAILED at line 957; other: not in the tree`` (one entry per failing file)."""
    return "; ".join("%s: %s" % (path, ", ".join(what)) for path, what in failures)


def split_patch(text):
    """``(header, diff)``: the diff starts at the first ``--- `` line that a ``+++ `` line follows."""
    lines = text.splitlines(keepends=True)
    for i in range(len(lines) - 1):
        if lines[i].startswith("--- ") and lines[i + 1].startswith("+++ "):
            return "".join(lines[:i]), "".join(lines[i:])
    return text, ""


def _strip(path):
    path = path.split("\t", 1)[0].strip()
    if path == "/dev/null":
        return None
    return path.split("/", 1)[1] if "/" in path else path


def patch_files(text):
    """The ``(old, new)`` paths (``-p1``) of every file the diff touches, in order; None stands for /dev/null."""
    lines = split_patch(text)[1].splitlines()
    return [(_strip(lines[i][4:]), _strip(lines[i + 1][4:])) for i in range(len(lines) - 1)
            if lines[i].startswith("--- ") and lines[i + 1].startswith("+++ ")]


def touched(text):
    """The tree paths a patch reads or writes."""
    return sorted({p for pair in patch_files(text) for p in pair if p})


def _failures(output, tree, text):
    failures, current = {}, None
    for pair in patch_files(text):
        old = pair[0]
        if old and not os.path.lexists(os.path.join(tree, old)):
            failures.setdefault(old, []).append("not in the tree")
    for line in output.splitlines():
        found = FILE_LINE.match(line)
        if found:
            current = found.group(1).strip("'\"")
            continue
        hunk = HUNK_FAILED.match(line)
        if hunk:
            failures.setdefault(current or "?", []).append("hunk #%s FAILED at line %s" % hunk.groups())
        elif line.startswith(REVERSED):
            failures.setdefault(current or "?", []).append("already applied (reversed patch detected)")
    return sorted(failures.items())


def apply_patch(tree, name, path):
    """Apply one patch file to ``tree`` (``patch -p1``). Raises PatchError, the tree untouched, when it does not fit.

    The dry run comes first, so a patch that fails leaves no half-applied file and no ``.rej``."""
    with open(path, errors="replace") as handle:
        text = handle.read()
    for extra in (["--dry-run"], []):
        done = subprocess.run(PATCH_ARGS + extra + ["-d", tree, "-i", os.path.abspath(path)], capture_output=True,
                              text=True)
        if done.returncode != 0:
            output = (done.stdout + done.stderr).strip()
            failures = _failures(output, tree, text) or [("?", ["patch failed: %s" % output[-500:]])]
            raise PatchError(name, failures, output)


def apply_series(tree, patches, dry_run=False):
    """Apply ``patches`` (``[{name, path}]``) to ``tree`` in order. With ``dry_run`` the tree is not written: the
    series is applied to a scratch copy of the files it touches. Returns the names applied."""
    if not dry_run:
        for patch in patches:
            apply_patch(tree, patch["name"], patch["path"])
        return [p["name"] for p in patches]
    scratch = tempfile.mkdtemp(prefix="minimax-spark-patches-")
    try:
        copy_touched(tree, scratch, patches)
        for patch in patches:
            apply_patch(scratch, patch["name"], patch["path"])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return [p["name"] for p in patches]


def copy_touched(tree, dest, patches):
    """Copy the files ``patches`` touch from ``tree`` to ``dest`` (those that exist), keeping their mode."""
    for patch in patches:
        with open(patch["path"], errors="replace") as handle:
            paths = touched(handle.read())
        for rel in paths:
            src = os.path.join(tree, rel)
            if os.path.isfile(src) and not os.path.exists(os.path.join(dest, rel)):
                os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
                shutil.copy2(src, os.path.join(dest, rel))


def diff_files(before, after, files):
    """The unified diff of ``files`` (``(old, new)`` tree paths) from folder ``before`` to ``after``, labelled
    ``a/<path>`` and ``b/<path>`` (``/dev/null`` for a file one side lacks), without dates."""
    out = []
    for old, new in files:
        left = os.path.join(before, old) if old else os.devnull
        right = os.path.join(after, new) if new else os.devnull
        done = subprocess.run(["diff", "-u", "--label", "a/%s" % old if old else "/dev/null",
                               "--label", "b/%s" % new if new else "/dev/null", left, right],
                              capture_output=True, text=True)
        if done.returncode > 1:
            raise OSError("diff %s %s failed: %s" % (left, right, done.stderr.strip()))
        out.append(done.stdout)
    return "".join(out)
