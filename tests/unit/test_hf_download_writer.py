"""hf_download's new guarantees: one writer per destination, clean stops on SIGTERM/SIGINT, a truthful progress
file, names checked before any request, the token read from a file on the node, defaults written once."""
import contextlib
import json
import os
import signal
import time

import pytest
import yaml
from ansible.module_utils import minimax_spark_download_fetch as fetch
from ansible.module_utils import minimax_spark_download_run as runner

import hf_download
from fakehub import FakeHub, Faults
from helpers import run_module
from hf_download_cases import SHARD1, SIZES, TOKEN, assert_verified, module_args, start_module_process

BIG = "BIG/MiniMax-M3-BIG-00001-of-00001.gguf"
BIG_SIZE = 6_000_000


@pytest.fixture
def repo_dir(tmp_path):
    root = tmp_path / "repo"
    for rel, size in dict(SIZES, **{BIG: BIG_SIZE}).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size) if size else b"# readme\n")
    return root


@pytest.fixture
def dest(tmp_path):
    return tmp_path / "models"


@pytest.fixture
def slow_hub(repo_dir):
    with FakeHub(repo_dir, repos={"unsloth/MiniMax-M3-GGUF": ""}, faults=Faults(rate_cap=300_000)) as hub:
        yield hub


def journal_done(dest):
    final = dest / BIG
    with contextlib.suppress(OSError, ValueError):
        return sum(e - s for s, e in json.loads((final.parent / (".%s.partial.json" % final.name)).read_text())["done"])
    return 0


def wait_for(predicate, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def started_slow_download(hub, dest, tmp_path):
    progress = tmp_path / "progress.json"
    args = module_args(hub, dest, include=[BIG], progress_file=str(progress), progress_interval=0.3)
    proc = start_module_process(args, tmp_path)
    assert wait_for(lambda: journal_done(dest) > 300_000), "the first downloader never started"
    return proc, args, progress


def test_a_second_downloader_on_the_same_dest_refuses_and_names_the_first(slow_hub, dest, tmp_path):
    proc, args, progress = started_slow_download(slow_hub, dest, tmp_path)
    try:
        result = run_module(hf_download.main, args)
        assert result["failed"]
        assert result["msg"].startswith("Another hf_download (pid %d, started " % proc.pid)
        assert str(progress) in result["msg"] and "model_download_stop=true" in result["msg"]
        assert json.loads(progress.read_text())["state"] == "downloading"  # the second wrote nothing
        status = run_module(hf_download.main, {"state": "query", "dest": str(dest)})
        assert status["running"] is True and status["pid"] == proc.pid and status["changed"] is False
    finally:
        proc.kill()
        proc.communicate()


def test_stopped_sends_sigterm_the_job_checkpoints_and_a_rerun_resumes(slow_hub, repo_dir, dest, tmp_path):
    proc, args, progress = started_slow_download(slow_hub, dest, tmp_path)
    result = run_module(hf_download.main, {"state": "stopped", "dest": str(dest), "progress_file": str(progress)})
    out, _err = proc.communicate(timeout=30)
    assert result["changed"] is True and result["pid"] == proc.pid and result["progress_state"] == "stopped"
    job = json.loads(out)
    assert job["failed"] and job["msg"].startswith("Stopped by SIGTERM: ")
    assert "the next run resumes from there" in job["msg"]
    saved = journal_done(dest)
    state = json.loads(progress.read_text())
    assert state["state"] == "stopped" and state["message"] == job["msg"]
    assert 0 < saved < BIG_SIZE and state["bytes_done"] == saved  # the checkpoint holds what was written
    slow_hub.faults.rate_cap = None
    assert slow_hub.wait_idle()
    slow_hub.reset_stats()
    again = run_module(hf_download.main, args)
    assert_verified(again, dest, repo_dir, paths=[BIG])
    assert again["bytes_downloaded"] == BIG_SIZE - saved
    assert run_module(hf_download.main, {"state": "stopped", "dest": str(dest)})["changed"] is False


def test_sigint_stops_cleanly_too(slow_hub, dest, tmp_path):
    proc, _args, progress = started_slow_download(slow_hub, dest, tmp_path)
    proc.send_signal(signal.SIGINT)
    out, _err = proc.communicate(timeout=30)
    assert json.loads(out)["msg"].startswith("Stopped by SIGINT: ")
    assert json.loads(progress.read_text())["state"] == "stopped"
    assert runner.query(dest) == {"running": False}


def test_a_killed_downloader_leaves_no_lock_and_its_progress_is_settled(slow_hub, dest, tmp_path):
    proc, _args, progress = started_slow_download(slow_hub, dest, tmp_path)
    proc.kill()
    proc.communicate()
    assert json.loads(progress.read_text())["state"] == "downloading"  # what a kill -9 leaves
    status = run_module(hf_download.main, {"state": "query", "dest": str(dest), "progress_file": str(progress)})
    assert status["running"] is False and status["progress_state"] == "interrupted"
    data = json.loads(progress.read_text())
    assert data["state"] == "interrupted" and "the next run resumes them" in data["message"]


def test_progress_starts_at_zero_percent_and_says_failed_with_the_reason(repo_dir, dest, tmp_path, monkeypatch):
    progress = tmp_path / "progress.json"
    seen = []
    real = runner.Progress.write

    def spy(self, state="downloading", force=False, message=None):
        real(self, state, force, message)
        if self.path and self.path.exists():
            seen.append(json.loads(self.path.read_text()))

    monkeypatch.setattr(runner.Progress, "write", spy)
    import errno

    def disk_full(fd, data, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runner.os, "pwrite", disk_full)
    with FakeHub(repo_dir, repos={"unsloth/MiniMax-M3-GGUF": ""}) as hub:
        result = run_module(hf_download.main, module_args(hub, dest, include=[SHARD1], progress_file=str(progress)))
    assert result["failed"] and ".MiniMax-M3-UD-IQ4_XS-00001-of-00002.gguf.partial" in result["msg"]
    assert seen[0]["state"] == "starting" and seen[0]["percent"] == 0.0
    assert all(s["percent"] < 100 for s in seen)
    assert seen[-1]["state"] == "failed" and seen[-1]["message"] == result["msg"]


def test_enospc_outside_the_data_names_the_file(tmp_path):
    exc = OSError(28, "No space left on device", "/m/.x.gguf.partial.json")
    text = runner.describe_error(exc, "/m")
    assert text.startswith("Writing /m/.x.gguf.partial.json failed: No space left on device (the disk of /m is full")


@pytest.mark.parametrize("repo", ["../../etc", "unsloth", "a/b/c", "unsloth/..", "/etc/passwd", "a/b?x=1", "a/.."])
def test_bad_repo_names_fail_before_any_request(repo, tmp_path):
    with FakeHub(tmp_path, repos={}) as hub:
        result = run_module(hf_download.main, module_args(hub, tmp_path / "models", repo=repo))
        assert hub.count() == 0
    assert result["failed"]
    assert result["msg"].startswith("repo %r is not a Hugging Face repo id: it must look like namespace/name" % repo)
    assert not (tmp_path / "models").exists()


def test_token_file_keeps_the_token_out_of_the_arguments(repo_dir, dest, tmp_path):
    token_file = tmp_path / "hf_token"
    token_file.write_text(TOKEN + "\n")
    with FakeHub(repo_dir, repos={"unsloth/MiniMax-M3-GGUF": ""}, token=TOKEN) as hub:
        result = run_module(hf_download.main, module_args(hub, dest, token_file=str(token_file)))
        assert_verified(result, dest, repo_dir, paths=[p for p in SIZES if p.startswith("UD-IQ4_XS/")])
        empty = tmp_path / "empty"
        empty.write_text("")
        failed = run_module(hf_download.main, module_args(hub, dest, token_file=str(empty)))
    assert failed["msg"] == "token_file %s is empty: write the Hub token on its first line." % empty
    assert TOKEN not in json.dumps(result)


def test_defaults_are_written_once_and_the_documentation_agrees():
    options = yaml.safe_load(hf_download.DOCUMENTATION)["options"]
    for name, (kind, value) in fetch.DEFAULTS.items():
        assert hf_download.ARGUMENT_SPEC[name] == {"type": kind.__name__, "default": value}
        assert options[name]["default"] == value and options[name]["type"] == kind.__name__, name
        assert getattr(fetch.Settings(), name) == value
    for name, spec in hf_download.ARGUMENT_SPEC.items():
        assert options[name]["type"] == spec["type"], name
        assert options[name].get("default") == spec.get("default"), name


def test_the_module_file_stays_small():
    assert len(open(hf_download.__file__).read().splitlines()) < 500


def test_the_engine_runs_without_the_module_wrapper(repo_dir, dest):
    with FakeHub(repo_dir, repos={"unsloth/MiniMax-M3-GGUF": ""}) as hub:
        params = {name: value for name, (_kind, value) in fetch.DEFAULTS.items()}
        params.update(module_args(hub, dest), revision="main", exclude=[], token=None, token_file=None,
                      progress_file=None, progress_interval=1.0, verify_cache=True)
        result = runner.Downloader(params).run()
    assert_verified(result, dest, repo_dir)
    assert result["changed"] is True and "diff" not in result
    assert runner.query(dest) == {"running": False}  # the lock went with the run
