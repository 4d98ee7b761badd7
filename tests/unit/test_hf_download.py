"""hf_download against the fake Hub: every fault ends with verified files or a clear failure, never a bad file."""
import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest
from ansible.module_utils import minimax_spark_download as engine
from ansible.module_utils import minimax_spark_download_fetch as fetch
from ansible.module_utils import minimax_spark_download_run as runner

import hf_download
from fakehub import FakeHub, Faults
from helpers import run_module
from hf_download_cases import (
    INCLUDE,
    SHARD1,
    SHARD2,
    SIZES,
    TOKEN,
    assert_failed_clean,
    assert_verified,
    leftovers,
    module_args,
    sha256,
    start_module_process,
)


# -- fixtures and helpers -----------------------------------------------------------------------------------
@pytest.fixture
def repo_dir(tmp_path):
    """A small model repo: two IQ4 shards, another quant, a README (non-LFS)."""
    root = tmp_path / "repo"
    for rel, size in SIZES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size) if size else b"# tiny MiniMax-M3 test repo\n")
    return root


@pytest.fixture
def hub(repo_dir):
    hub = FakeHub(repo_dir, repos={"unsloth/MiniMax-M3-GGUF": ""}, gated={"org/gated"}, token=None)
    hub.start()
    yield hub
    hub.stop()


@pytest.fixture
def dest(tmp_path):
    return tmp_path / "models"


# -- the happy path, idempotence, check mode -----------------------------------------------------------------
def test_downloads_included_files_at_the_resolved_commit(hub, repo_dir, dest):
    result = run_module(hf_download.main, module_args(hub, dest))
    assert_verified(result, dest, repo_dir)
    assert result["changed"] is True
    assert len(result["commit"]) == 40
    assert result["bytes_downloaded"] == SIZES[SHARD1] + SIZES[SHARD2]
    assert result["total_bytes"] == SIZES[SHARD1] + SIZES[SHARD2]
    assert result["throughput"] > 0
    assert all(f["changed"] for f in result["files"])
    assert not (dest / "UD-Q4_K_XL").exists()
    pieces = -(-SIZES[SHARD1] // (256 * 1024)) - (-SIZES[SHARD2] // (256 * 1024))
    assert hub.count("cdn", 206) == pieces + 2  # ranged pieces, plus a one-byte probe per file
    assert len({r["client"] for r in hub.log("cdn")}) >= 4  # over several connections


def test_second_run_changes_nothing_and_fetches_zero_bytes(hub, repo_dir, dest):
    run_module(hf_download.main, module_args(hub, dest))
    hub.reset_stats()
    result = run_module(hf_download.main, module_args(hub, dest))
    assert result["changed"] is False
    assert result["bytes_downloaded"] == 0
    assert not any(f["changed"] for f in result["files"])
    assert hub.count("cdn") == 0 and hub.count("resolve") == 0
    assert_verified(result, dest, repo_dir)


def test_verification_is_cached_until_mtime_or_size_changes(hub, repo_dir, dest, monkeypatch):
    run_module(hf_download.main, module_args(hub, dest))
    hashed = []
    real = engine.hash_file
    monkeypatch.setattr(engine, "hash_file", lambda path, entry: hashed.append(path) or real(path, entry))
    run_module(hf_download.main, module_args(hub, dest))
    assert hashed == []  # the sidecar vouches for both shards
    os.utime(dest / SHARD1, ns=(1, 1))
    result = run_module(hf_download.main, module_args(hub, dest))
    assert [Path(p).name for p in hashed] == [Path(SHARD1).name]  # re-hashed, still valid: no download
    assert result["changed"] is False


def test_a_damaged_present_file_is_downloaded_again(hub, repo_dir, dest):
    run_module(hf_download.main, module_args(hub, dest))
    with open(dest / SHARD2, "r+b") as handle:  # same size, other bytes, new mtime
        handle.write(b"\0" * 16)
    result = run_module(hf_download.main, module_args(hub, dest))
    assert result["changed"] is True
    assert [f["path"] for f in result["files"] if f["changed"]] == [SHARD2]
    assert result["bytes_downloaded"] == SIZES[SHARD2]
    assert_verified(result, dest, repo_dir)


def test_check_mode_reports_and_writes_nothing(hub, repo_dir, dest, tmp_path):
    progress = tmp_path / "progress.json"
    result = run_module(hf_download.main, module_args(hub, dest, progress_file=str(progress)),
                        check_mode=True, diff=True)
    assert result["changed"] is True
    assert result["bytes_downloaded"] == 0
    assert result["bytes_to_download"] == SIZES[SHARD1] + SIZES[SHARD2]
    assert all(f["changed"] for f in result["files"])
    assert SHARD1 in result["diff"]["after"] and SHARD1 not in result["diff"]["before"]
    assert not dest.exists() and not progress.exists()
    assert hub.count("cdn") == 0


def test_check_mode_after_a_download_reports_no_change(hub, repo_dir, dest):
    run_module(hf_download.main, module_args(hub, dest))
    result = run_module(hf_download.main, module_args(hub, dest), check_mode=True)
    assert result["changed"] is False and result["bytes_to_download"] == 0


def test_progress_file_reports_the_finished_run(hub, repo_dir, dest, tmp_path):
    progress = tmp_path / "progress.json"
    run_module(hf_download.main, module_args(hub, dest, progress_file=str(progress)))
    report = json.loads(progress.read_text())
    assert report["state"] == "done"
    assert report["bytes_done"] == report["bytes_total"] == SIZES[SHARD1] + SIZES[SHARD2]
    assert report["percent"] == 100.0
    assert report["files_done"] == report["files_total"] == 2


def test_non_lfs_files_are_verified_by_their_git_oid(hub, repo_dir, dest):
    result = run_module(hf_download.main, module_args(hub, dest, include=["README.md"]))
    assert_verified(result, dest, repo_dir, paths=["README.md"])


def test_tree_pages_are_all_read(repo_dir, dest):
    with FakeHub(repo_dir, repos={"unsloth/MiniMax-M3-GGUF": ""}, page_size=1) as hub:
        result = run_module(hf_download.main, module_args(hub, dest, include=["*.gguf", "*/*.gguf"]))
    assert sorted(f["path"] for f in result["files"]) == sorted(p for p in SIZES if p.endswith(".gguf"))


def test_a_pinned_commit_is_honoured_and_an_unknown_revision_fails(hub, repo_dir, dest):
    first = run_module(hf_download.main, module_args(hub, dest))
    again = run_module(hf_download.main, module_args(hub, dest, revision=first["commit"]))
    assert again["commit"] == first["commit"] and again["changed"] is False
    result = run_module(hf_download.main, module_args(hub, dest, revision="v9.9"))
    assert result["failed"] and "v9.9" in result["msg"]


# -- refusals -------------------------------------------------------------------------------------------------
def test_missing_repo_fails_clearly(hub, dest):
    result = run_module(hf_download.main, module_args(hub, dest, repo="unsloth/No-Such-Model"))
    assert_failed_clean(result, dest)
    assert "unsloth/No-Such-Model not found" in result["msg"]


def test_gated_repo_tells_to_accept_the_licence_and_set_a_token(repo_dir, dest):
    with FakeHub(repo_dir, repos={"unsloth/MiniMax-M3-GGUF": ""}, gated={"unsloth/MiniMax-M3-GGUF"}) as hub:
        result = run_module(hf_download.main, module_args(hub, dest))
    assert_failed_clean(result, dest)
    assert "gated" in result["msg"] and "licence" in result["msg"] and "HF_TOKEN" in result["msg"]


def test_nothing_matching_include_fails_and_lists_what_exists(hub, dest):
    result = run_module(hf_download.main, module_args(hub, dest, include=["UD-Q9_NOPE/*.gguf"]))
    assert_failed_clean(result, dest)
    assert "UD-Q9_NOPE/*.gguf" in result["msg"] and SHARD1 in result["msg"]


def test_not_enough_disk_space_fails_before_downloading(hub, dest, monkeypatch):
    class Usage:
        total, used, free = 10**9, 10**9 - 1000, 1000

    monkeypatch.setattr(runner.shutil, "disk_usage", lambda path: Usage)
    result = run_module(hf_download.main, module_args(hub, dest))
    assert_failed_clean(result, dest)
    assert "Not enough free disk space" in result["msg"] and str(SIZES[SHARD1] + SIZES[SHARD2]) in result["msg"]
    assert hub.count("cdn") == 0


# -- the token -------------------------------------------------------------------------------------------------
def test_token_goes_to_the_hub_only_and_is_never_returned(repo_dir, dest, tmp_path, capfd):
    progress = tmp_path / "progress.json"
    with FakeHub(repo_dir, repos={"unsloth/MiniMax-M3-GGUF": ""}, token=TOKEN,
                 gated={"unsloth/MiniMax-M3-GGUF"}) as hub:
        hub.faults.expire_first = 2  # re-resolving must not leak it either
        result = run_module(hf_download.main, module_args(hub, dest, token=TOKEN, include=INCLUDE + ["README.md"],
                                                          progress_file=str(progress)))
        raw = json.dumps(result)  # all the module returned, as text
        assert_verified(result, dest, repo_dir, paths=[SHARD1, SHARD2, "README.md"])
        cdn = hub.log("cdn")
        assert cdn and not any(r["auth"] for r in cdn)
        assert hub.count("cdn", 400) == 0  # the CDN fails any request carrying Authorization
        assert all(r["auth"] for r in hub.log("api") + hub.log("resolve"))
    captured = capfd.readouterr()
    for text in (raw, captured.out, captured.err, progress.read_text()):
        assert TOKEN not in text
    for path in dest.rglob("*"):
        if path.is_file() and path.stat().st_size < 10_000:
            assert TOKEN not in path.read_text(errors="replace")


def test_token_from_hf_token_environment(repo_dir, dest, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    with FakeHub(repo_dir, repos={"unsloth/MiniMax-M3-GGUF": ""}, token=TOKEN) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        args = module_args(hub, dest)
        del args["endpoint"]
        result = run_module(hf_download.main, args)
        raw = json.dumps(result)  # all the module returned, as text
    assert_verified(result, dest, repo_dir)
    assert TOKEN not in raw


def test_wrong_token_fails_with_401_advice(repo_dir, dest):
    with FakeHub(repo_dir, repos={"unsloth/MiniMax-M3-GGUF": ""}, token=TOKEN) as hub:
        result = run_module(hf_download.main, module_args(hub, dest, token="hf_wrong"))
        raw = json.dumps(result)  # all the module returned, as text
    assert_failed_clean(result, dest)
    assert "401" in result["msg"] and "token" in result["msg"]
    assert "hf_wrong" not in raw


# -- faults ------------------------------------------------------------------------------------------------------
def test_expired_links_are_resolved_again(hub, repo_dir, dest):
    hub.faults.expire_first = 3
    result = run_module(hf_download.main, module_args(hub, dest))
    assert_verified(result, dest, repo_dir)
    assert hub.count("cdn", 403) == 3
    assert hub.count("resolve") >= 2 + 1


def test_links_expiring_mid_download_are_resolved_again(repo_dir, dest):
    faults = Faults(rate_cap=600_000)
    with FakeHub(repo_dir, repos={"unsloth/MiniMax-M3-GGUF": ""}, link_ttl=0.4, faults=faults) as hub:
        result = run_module(hf_download.main, module_args(hub, dest))
        assert hub.count("cdn", 403) >= 1
    assert_verified(result, dest, repo_dir)


def test_a_corrupted_range_is_refetched_once(hub, repo_dir, dest):
    hub.faults.corrupt = [[1_000_000, 1_000_100, 1]]  # hits SHARD1 (and only the first response covering it)
    result = run_module(hf_download.main, module_args(hub, dest))
    assert_verified(result, dest, repo_dir)
    assert result["bytes_downloaded"] == 2 * SIZES[SHARD1] + SIZES[SHARD2]


def test_persistent_corruption_fails_and_leaves_no_file(hub, repo_dir, dest):
    hub.faults.corrupt = [[2_000_000, 2_000_001, None]]
    result = run_module(hf_download.main, module_args(hub, dest, include=[SHARD1]))
    assert_failed_clean(result, dest, paths=[SHARD1])
    assert "corrupt after two full downloads" in result["msg"] and sha256(repo_dir / SHARD1) in result["msg"]
    assert not leftovers(dest, SHARD1)


def test_rate_limits_are_retried_after_retry_after(hub, repo_dir, dest):
    hub.faults.rate_limit_first = 2
    hub.faults.retry_after = 1
    result = run_module(hf_download.main, module_args(hub, dest))
    assert_verified(result, dest, repo_dir)
    log = hub.log()
    assert [r["status"] for r in log[:2]] == [429, 429]
    assert log[1]["t"] - log[0]["t"] >= 0.9 and log[2]["t"] - log[1]["t"] >= 0.9


def test_rate_limits_on_the_cdn_are_retried(hub, repo_dir, dest):
    # warm: the next 429s land on CDN requests
    run_module(hf_download.main, module_args(hub, dest, include=["README.md"]))
    hub.reset_stats()
    result_first = run_module(hf_download.main, module_args(hub, dest, include=[SHARD2]))
    assert result_first["changed"]
    hub.faults.rate_limit_first = 1_000_000  # endless 429: a clear failure, no file
    hub.faults.retry_after = 0
    result = run_module(hf_download.main, module_args(hub, dest, include=[SHARD1], max_retries=1))
    assert_failed_clean(result, dest, paths=[SHARD1])
    assert "429" in result["msg"] or "rate" in result["msg"]


def test_a_server_ignoring_range_is_read_as_one_stream(hub, repo_dir, dest):
    hub.faults.ignore_range = True
    result = run_module(hf_download.main, module_args(hub, dest))
    assert_verified(result, dest, repo_dir)
    assert hub.count("cdn", 206) == 0
    assert result["bytes_downloaded"] == SIZES[SHARD1] + SIZES[SHARD2]


def test_truncated_bodies_resume_where_they_stopped(hub, repo_dir, dest):
    hub.faults.truncate_after = 100_000  # every CDN body is cut after 100 kB
    result = run_module(hf_download.main, module_args(hub, dest))
    assert_verified(result, dest, repo_dir)
    probes = hub.count("cdn") - hub.count("cdn", 206) + len([r for r in hub.log("cdn") if r["range"] == "bytes=0-0"])
    assert probes >= 2
    # every byte crossed the wire once (plus the one-byte probes)
    assert hub.cdn_bytes() == SIZES[SHARD1] + SIZES[SHARD2] + 2


def test_reset_connections_are_retried(hub, repo_dir, dest):
    hub.faults.reset_after = 150_000
    hub.faults.reset_times = 5
    result = run_module(hf_download.main, module_args(hub, dest))
    assert_verified(result, dest, repo_dir)


def test_a_stalled_connection_is_dropped_by_the_watchdog(hub, repo_dir, dest):
    hub.faults.stall_after = 50_000
    hub.faults.stall_seconds = 60
    hub.faults.stall_times = 2
    started = time.monotonic()
    result = run_module(hf_download.main, module_args(hub, dest, stall_timeout=1))
    assert_verified(result, dest, repo_dir)
    assert time.monotonic() - started < 20


def test_kill_and_resume_fetches_only_the_missing_bytes(repo_dir, dest, tmp_path):
    big = "%s/MiniMax-M3-%s-00001-of-00001.gguf" % ("BIG", "BIG")
    (repo_dir / "BIG").mkdir()
    (repo_dir / big).write_bytes(os.urandom(6_000_000))
    faults = Faults(rate_cap=400_000)  # 4 connections: ~1.6 MB/s, the first run cannot finish in time
    with FakeHub(repo_dir, repos={"unsloth/MiniMax-M3-GGUF": ""}, faults=faults) as hub:
        args = module_args(hub, dest, include=[big], progress_interval=0.3)
        proc = start_module_process(args, tmp_path)
        final = dest / big
        journal = final.parent / (".%s.partial.json" % final.name)
        try:
            deadline = time.monotonic() + 30
            done = 0
            while done < 1_500_000 and time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.1)
                with contextlib.suppress(OSError, ValueError):
                    done = sum(e - s for s, e in json.loads(journal.read_text())["done"])
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
        assert proc.returncode == -signal.SIGKILL, "the first run should have been killed mid-way"
        assert not final.exists()
        on_disk = sum(e - s for s, e in json.loads(journal.read_text())["done"])
        assert 0 < on_disk < 6_000_000

        hub.faults.rate_cap = None
        assert hub.wait_idle()  # the killed run's connections are gone before counting
        hub.reset_stats()
        result = run_module(hf_download.main, args)
        assert_verified(result, dest, repo_dir, paths=[big])
        assert result["bytes_downloaded"] == 6_000_000 - on_disk
        assert hub.cdn_bytes() == 6_000_000 - on_disk + 1  # + the one-byte probe


def test_a_partial_file_of_another_version_is_not_resumed(hub, repo_dir, dest):
    final = dest / SHARD2
    final.parent.mkdir(parents=True)
    (final.parent / (".%s.partial" % final.name)).write_bytes(b"x" * SIZES[SHARD2])
    (final.parent / (".%s.partial.json" % final.name)).write_text(
        json.dumps({"version": 1, "size": SIZES[SHARD2], "sha256": "0" * 64, "git_oid": None,
                    "done": [[0, SIZES[SHARD2]]]})
    )
    result = run_module(hf_download.main, module_args(hub, dest))
    assert_verified(result, dest, repo_dir)
    assert result["bytes_downloaded"] == SIZES[SHARD1] + SIZES[SHARD2]


def test_a_server_ignoring_range_after_a_cut_is_skipped_to_where_it_stopped(hub, repo_dir, dest):
    hub.faults.ignore_range = True  # every retry gets the whole body again, from byte 0
    hub.faults.truncate_after = 1_000_000
    hub.faults.truncate_times = 3
    result = run_module(hf_download.main, module_args(hub, dest))
    assert_verified(result, dest, repo_dir)
    assert result["bytes_downloaded"] == SIZES[SHARD1] + SIZES[SHARD2]


# -- the hot path: one buffer per connection, written with pwrite -------------------------------------------------
def test_the_body_reader_reads_straight_into_the_buffer_and_stops_at_the_body_end(hub, repo_dir):
    import requests
    from ansible.module_utils.minimax_spark_http import BodyReader

    session = requests.Session()
    link = session.get("%s/unsloth/MiniMax-M3-GGUF/resolve/main/%s" % (hub.url, SHARD2), allow_redirects=False)
    data = (repo_dir / SHARD2).read_bytes()
    with session.get(link.headers["Location"], headers={"Range": "bytes=1000-300999"}, stream=True) as response:
        reader = BodyReader(response)
        assert reader.stream is not None  # the direct path, not the copying fallback
        buf = bytearray(1 << 20)
        view, got = memoryview(buf), 0
        while True:
            count = reader.readinto(view[got:])
            if not count:
                break
            got += count
    assert got == 300_000 and bytes(buf[:got]) == data[1000:301000]


def test_the_copying_body_reader_keeps_every_byte_too(hub, repo_dir, dest, monkeypatch):
    class CopyingReader(fetch.BodyReader):
        """What a urllib3 or http.client without the attributes of the direct path gets."""

        def __init__(self, response):
            super().__init__(response)
            self.stream = None

    monkeypatch.setattr(fetch, "BodyReader", CopyingReader)
    hub.faults.truncate_after = 100_000
    result = run_module(hf_download.main, module_args(hub, dest))
    assert_verified(result, dest, repo_dir)
    assert hub.cdn_bytes() == SIZES[SHARD1] + SIZES[SHARD2] + 2


def test_a_disk_error_fails_at_once_and_is_not_retried_as_a_network_error(hub, repo_dir, dest, monkeypatch):
    import errno

    def disk_full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(engine.os, "pwrite", disk_full)
    result = run_module(hf_download.main, module_args(hub, dest))
    assert_failed_clean(result, dest)
    assert "No space left on device" in result["msg"] and "Writing" in result["msg"]
    assert hub.count("cdn") <= 1 + 4  # the probe and one range per connection: no retries


def test_a_slow_connection_writes_what_it_received_without_waiting_for_a_full_buffer(repo_dir, dest, tmp_path):
    faults = Faults(rate_cap=200_000)  # one connection, one 3 MB range: a 4 MiB buffer would take 15 s to fill
    with FakeHub(repo_dir, repos={"unsloth/MiniMax-M3-GGUF": ""}, faults=faults) as hub:
        args = module_args(hub, dest, include=[SHARD1], connections=1, part_size=8 << 20, buffer_size=4 << 20,
                           progress_interval=0.3)
        proc = start_module_process(args, tmp_path)
        final = dest / SHARD1
        journal = final.parent / (".%s.partial.json" % final.name)
        started, done = time.monotonic(), 0
        try:
            while not done and time.monotonic() - started < 10 and proc.poll() is None:
                time.sleep(0.1)
                with contextlib.suppress(OSError, ValueError):
                    done = sum(e - s for s, e in json.loads(journal.read_text())["done"])
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
        assert 0 < done < SIZES[SHARD1]
        assert time.monotonic() - started < 6  # about a second of data, synced and journaled, not 15 s of it
        assert not final.exists()


# -- pieces --------------------------------------------------------------------------------------------------------
def test_rangeset_merges_and_lists_gaps():
    ranges = engine.RangeSet([(10, 20), (0, 5), (5, 8), (19, 30)])
    assert ranges.ranges == [[0, 8], [10, 30]]
    assert ranges.total() == 28 and ranges.prefix_end() == 8
    assert ranges.gaps(40) == [(8, 10), (30, 40)]
    assert engine.split_ranges([(0, 10), (20, 25)], 4) == [(0, 4), (4, 8), (8, 10), (20, 24), (24, 25)]


def test_select_entries_by_include_and_exclude():
    from ansible.module_utils.minimax_spark_http import RepoEntry

    entries = [RepoEntry(p, 1, "a" * 64, None) for p in (SHARD1, SHARD2, "README.md", "UD-Q4_K_XL/x.gguf")]
    chosen = engine.select_entries(entries, INCLUDE, ["*00002-of-*"])
    assert [e.path for e in chosen] == [SHARD1]
