"""The one atomic-write helper (module_utils/minimax_spark_files.py): a reader sees the old file or the
new one, a failed write leaves the old file and no temporary file behind, modes and owners are as asked.
"""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest
from ansible.module_utils import minimax_spark_files as files

ROOT = Path(__file__).resolve().parents[2]


def mode_of(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_write_replaces_the_file_by_a_rename_not_in_place(tmp_path):
    target = tmp_path / "manifest.json"
    target.write_text("old")
    reader = open(target)  # a reader that opened the old file keeps reading all of it
    before = os.stat(target).st_ino
    files.write_atomic(target, "new ✓")
    assert target.read_text(encoding="utf-8") == "new ✓"
    assert os.stat(target).st_ino != before
    assert reader.read() == "old"
    reader.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]


def test_mode_is_the_umask_default_or_the_one_asked_for(tmp_path):
    old = os.umask(0o027)
    try:
        files.write_atomic(tmp_path / "a", b"x")
        files.write_atomic(tmp_path / "b", b"x", mode=0o600)
    finally:
        os.umask(old)
    assert mode_of(tmp_path / "a") == 0o640
    assert mode_of(tmp_path / "b") == 0o600


def test_a_failing_writer_leaves_the_old_file_and_no_temporary_file(tmp_path):
    target = tmp_path / "bench.png"
    target.write_bytes(b"old plot")
    with pytest.raises(RuntimeError, match="savefig broke"):
        with files.atomic_path(target, suffix=".tmp.png") as tmp:
            assert os.path.dirname(tmp) == str(tmp_path) and tmp.endswith(".tmp.png")
            Path(tmp).write_bytes(b"half a pl")
            raise RuntimeError("savefig broke")
    assert target.read_bytes() == b"old plot"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.png"]


def test_a_failing_move_leaves_the_old_file_and_no_temporary_file(tmp_path):
    target = tmp_path / "unit.service"
    target.write_text("old unit")

    def move(src, dest):
        raise OSError(18, "Invalid cross-device link")

    with pytest.raises(OSError, match="cross-device"):
        files.write_atomic(target, "new unit", move=move)
    assert target.read_text() == "old unit"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["unit.service"]


def test_a_module_move_gets_a_synced_file_beside_the_target_and_the_mode_survives_it(tmp_path):
    target = tmp_path / "minimax-supervise"
    seen = []

    def atomic_move(src, dest):  # as AnsibleModule.atomic_move: a new file gets the umask's mode
        seen.append((os.path.dirname(src), Path(src).read_text()))
        os.rename(src, dest)
        os.chmod(dest, 0o644)

    files.write_atomic(target, "#!/bin/sh\n", mode=0o755, move=atomic_move)
    assert seen == [(str(tmp_path), "#!/bin/sh\n")]
    assert mode_of(target) == 0o755


def test_a_missing_folder_fails_with_the_folder_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "absent"))):
        files.write_atomic(tmp_path / "absent" / "x.json", "{}")


def test_no_other_file_renames_or_replaces_files_itself():
    # Every atomic write goes through minimax_spark_files; the exceptions are named with their reason.
    allowed = {
        # the build stage is a folder swapped into place (its manifest is written with write_atomic)
        "library/llamacpp_build.py": 1,
        # RPC cache entries are streamed to a temporary file while hashed, then renamed to their hash
        "module_utils/minimax_spark_rpccache.py": 1,
        # the proxy GGUF is written by gguf's own writer to a .part file, renamed into place when whole
        "tools/make_m3_proxy.py": 1,
        # the supervisor imports the standard library only (it runs without Ansible): its watchdog count
        "module_utils/minimax_spark_supervisor.py": 1,
    }
    found = {}
    for folder in ("library", "module_utils", "filter_plugins", "tools"):
        for path in sorted((ROOT / folder).glob("*")):
            if not path.is_file() or path.name == "minimax_spark_files.py":
                continue
            text = path.read_text(errors="replace")
            if not (path.suffix == ".py" or text.startswith("#!/usr/bin/env python")):
                continue
            count = len(re.findall(r"\bos\.(?:replace|rename)\(|NamedTemporaryFile|mkstemp\(", text))
            if count:
                found[str(path.relative_to(ROOT))] = count
    assert found == allowed
