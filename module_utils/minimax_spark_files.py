"""Atomic file writes for every module, engine and tool of minimax-spark: a reader sees the old file or
the new one, never half of one, and after a crash the new one is on disk or the old one still is.

* ``write_atomic(path, data, ...)``: bytes or text to ``path``.
* ``atomic_path(path, ...)``: a context manager giving a temporary path for writers that only take a
  file name (matplotlib's ``savefig``, tokenizers' ``save``); the file moves into place when the block
  ends without an error.
* ``fsync_dir(path)``: make a rename in ``path`` durable (what both do after the move).

Each writes a temporary file in the target's own folder (a rename never crosses file systems), fsyncs
it, sets its mode (and owner), renames it over the target and fsyncs the folder. The temporary file is
removed when anything fails. ``move`` replaces the rename: modules pass ``module.atomic_move`` to keep
Ansible's handling of SELinux contexts and ``unsafe_writes``.

Modules import it as ``from ansible.module_utils.minimax_spark_files import ...``.
"""
from __future__ import annotations

import contextlib
import os
import tempfile


def default_mode():
    """The mode ``open(path, "w")`` gives a new file: 0666 less the umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def fsync_dir(path):
    """fsync a folder so that a rename in it survives a crash (best effort: some file systems refuse)."""
    try:
        fd = os.open(path or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _unlink_quietly(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _finish(tmp, path, mode, uid, gid, move, durable):
    if durable:
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    os.chmod(tmp, default_mode() if mode is None else mode)
    if uid != -1 or gid != -1:
        os.chown(tmp, uid, gid)
    if move is None:
        os.replace(tmp, path)
    else:
        move(tmp, path)
        if mode is not None:
            # Ansible's atomic_move gives the target the old file's mode (or the umask's): keep the one asked for.
            os.chmod(path, mode)
    if durable:
        fsync_dir(os.path.dirname(os.path.abspath(path)))


@contextlib.contextmanager
def atomic_path(path, mode=None, uid=-1, gid=-1, suffix=".tmp", move=None, durable=True):
    """Yield a temporary path beside ``path``; move it over ``path`` when the block succeeds.

    ``mode`` defaults to what a new file gets from ``open`` (0666 less the umask); ``uid``/``gid`` -1
    leave the owner as it is; ``suffix`` ends the temporary name (``.tmp.png`` for matplotlib, which
    picks the format by it); ``durable=False`` skips the fsyncs (files rewritten every few seconds that
    nobody needs after a crash).
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".%s." % os.path.basename(path), suffix=suffix)
    os.close(fd)
    try:
        yield tmp
        _finish(tmp, path, mode, uid, gid, move, durable)
    except BaseException:
        _unlink_quietly(tmp)
        raise


def write_atomic(path, data, mode=None, uid=-1, gid=-1, move=None, durable=True):
    """Write ``data`` (bytes, or text as UTF-8) to ``path`` atomically; the options are ``atomic_path``'s."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    with atomic_path(path, mode=mode, uid=uid, gid=gid, move=move, durable=durable) as tmp:
        with open(tmp, "wb") as handle:
            handle.write(data)
