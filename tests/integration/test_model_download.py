"""The model_download role as a user drives it (playbooks/model.yml through ansible-runner) against the fake Hub.

Ctrl-C of ansible-playbook leaves the download running in the background; a rerun follows it (one writer),
ends with verified files and no more traffic than the model; bad names and a truncated local GGUF fail with
their message before anything is requested or the model fact changes. Each test runs alone too (the fact the
failure tests keep is recorded first when no earlier test left one).
"""
import hashlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from ansible.module_utils import minimax_spark_download_run as download_run

from fakehub import FakeHub
from helpers import ROOT, changed_tasks, failed_tasks, kept_as_found, run_playbook

REPO = "unsloth/MiniMax-M3-GGUF"
QUANT = "TINY"
DEST = Path("/var/lib/minimax-spark/models-test")
FACT = Path("/etc/ansible/facts.d/minimax_model.fact")
PROGRESS = DEST / ".hf_download.progress.json"


@pytest.fixture(scope="module")
def repo_dir(tmp_path_factory):
    from make_tiny_m3 import write_tiny_m3

    root = tmp_path_factory.mktemp("hub")
    (root / QUANT).mkdir()
    files = write_tiny_m3(root / QUANT / "MiniMax-M3-TINY.gguf", "m3", template_text="{{ messages }}", split=2)
    assert len(files) == 2
    (root / "BROKEN").mkdir()
    (root / "BROKEN" / "MiniMax-M3-BROKEN.gguf").write_bytes(files[0].read_bytes()[:-5000])  # truncated on the Hub
    return root


@pytest.fixture(scope="module", autouse=True)
def restore_the_host():
    """Leave the model fact as found and no test download behind (other tests and a user's run read them)."""
    with kept_as_found(FACT):
        yield
        fresh_dest()


@pytest.fixture(scope="module")
def hub(repo_dir):
    with FakeHub(repo_dir, repos={REPO: ""}) as hub:
        yield hub


@pytest.fixture
def model_fact(hub, tmp_path):
    """The model fact as a finished download leaves it (the tests below prove a failure keeps it): the one an earlier
    test recorded, else one recorded now from a local tiny model, so each test runs alone too."""
    if not FACT.exists():
        from make_tiny_m3 import write_tiny_m3

        model = write_tiny_m3(tmp_path / "recorded.gguf", "m3", template_text="{{ messages }}")[0]
        runner = run_playbook("playbooks/model.yml", extravars=extravars(hub, model_download_local_file=str(model)))
        assert runner.status == "successful", failed_tasks(runner) or runner.stdout_text[-3000:]
    return FACT.read_text()


def extravars(hub, **extra):
    values = {
        "model_download_local_file": "",
        "model_download_repo": REPO,
        "model_download_quant": QUANT,
        "model_download_endpoint": hub.url,
        "model_download_dir": str(DEST),
        "model_download_connections": 2,
        "model_download_poll": 2,
    }
    values.update(extra)
    return values


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def progress():
    try:
        return json.loads(PROGRESS.read_text())
    except (OSError, ValueError):
        return {}


def model_bytes(repo_dir):
    return sum(p.stat().st_size for p in (repo_dir / QUANT).iterdir())


def start_playbook(hub, **extra):
    """ansible-playbook playbooks/model.yml as a user starts it, in a process the test can interrupt."""
    args = []
    for key, value in extravars(hub, **extra).items():
        args += ["-e", "%s=%s" % (key, value)]
    return subprocess.Popen(
        [str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", "inventory/local", "playbooks/model.yml", *args],
        cwd=ROOT,
        env=dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_for_new_writer(old_pid, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            holder = json.loads((DEST / ".hf_download.lock").read_text())["pid"]
            if holder != old_pid and progress().get("state") == "downloading":
                return True
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    return False


def wait_progress(at_least, playbook, timeout=90):
    deadline = time.monotonic() + timeout
    while (progress().get("bytes_done", 0) < at_least and time.monotonic() < deadline
           and (playbook is None or playbook.poll() is None)):
        time.sleep(0.2)
    assert progress().get("state") == "downloading", progress()


def fresh_dest():
    if DEST.exists():  # a previous run of this test: stop what it may have left running, start afresh
        download_run.stop(DEST)
        shutil.rmtree(DEST)


def test_ctrl_c_then_rerun_follows_the_one_download(hub, repo_dir):
    fresh_dest()
    hub.faults.rate_cap = 100_000  # 2 connections: ~200 KB/s, ~22 s: still running when the rerun looks
    hub.reset_stats()
    began = time.monotonic()
    args = []
    for key, value in extravars(hub).items():
        args += ["-e", "%s=%s" % (key, value)]
    playbook = subprocess.Popen(
        [str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", "inventory/local", "playbooks/model.yml", *args],
        cwd=ROOT,
        env=dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 90
    while progress().get("bytes_done", 0) < 400_000 and time.monotonic() < deadline and playbook.poll() is None:
        time.sleep(0.2)
    assert progress().get("state") == "downloading", progress()
    began_ctrl_c = time.monotonic()
    playbook.send_signal(signal.SIGINT)  # Ctrl-C: ansible-playbook ends, the async job does not
    out, _ = playbook.communicate(timeout=60)
    print("Ctrl-C after %.1f s; ansible-playbook gone after %.1f s" % (began_ctrl_c - began, time.monotonic() - began))
    assert "Ctrl-C or a lost connection leaves it running" in out
    assert "cat %s" % PROGRESS in out
    assert "ansible-playbook site.yml --tags model_download -e model_download_stop=true" in out
    time.sleep(1)
    assert progress().get("state") == "downloading"  # still going in the background

    runner = run_playbook("playbooks/model.yml", extravars=extravars(hub))
    hub.faults.rate_cap = None
    assert runner.status == "successful", failed_tasks(runner) or runner.stdout_text[-4000:]
    assert "Follow the download already running" in runner.stdout_text
    assert hub.count("api") == 2  # revision + file list: one downloader planned (the rerun started none)
    for shard in (repo_dir / QUANT).iterdir():
        assert sha256(DEST / QUANT / shard.name) == sha256(shard)
    traffic = hub.cdn_bytes()
    test_ctrl_c_then_rerun_follows_the_one_download.traffic = traffic
    print("traffic after Ctrl-C + rerun: %d bytes for a %d-byte model" % (traffic, model_bytes(repo_dir)))
    assert traffic <= model_bytes(repo_dir) + 2  # + a one-byte probe per file: nothing fetched twice
    assert progress()["state"] == "done" and progress()["percent"] == 100.0
    fact = json.loads(FACT.read_text())
    assert fact["path"].endswith("MiniMax-M3-TINY-00001-of-00002.gguf") and fact["repo"] == REPO

    again = run_playbook("playbooks/model.yml", extravars=extravars(hub), check=True)
    assert again.status == "successful", failed_tasks(again)
    assert changed_tasks(again) == []  # nothing left to do, and check mode says so


@pytest.mark.parametrize(
    "var, value, message",
    [
        (
            "model_download_repo",
            "../../etc",
            "model_download_repo='../../etc' is not a Hugging Face repo id: write it as namespace/name (letters, "
            "digits, '-', '_', '.'; exactly one '/'; no '..'), e.g. unsloth/MiniMax-M3-GGUF.",
        ),
        (
            "model_download_quant",
            "*",
            "model_download_quant='*' is not a plain folder name: give the name of one quant folder of the repo "
            "(letters, digits, '-', '_', '.'; no '/', no glob characters, no '..'), e.g. UD-IQ4_XS.",
        ),
    ],
)
def test_bad_names_fail_before_any_request(hub, var, value, message, tmp_path):
    hub.reset_stats()
    dest = tmp_path / "never"
    runner = run_playbook("playbooks/model.yml",
                          extravars=extravars(hub, **{var: value, "model_download_dir": str(dest)}))
    assert runner.status == "failed"
    assert [m for _h, _t, m in failed_tasks(runner)] == [message]
    assert hub.count() == 0 and not dest.exists()


def test_a_truncated_local_gguf_fails_and_leaves_the_fact(hub, model_fact, tmp_path):
    before = model_fact
    from make_tiny_m3 import write_tiny_m3

    good = write_tiny_m3(tmp_path / "local.gguf", "m3", template_text="{{ messages }}")[0]
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[:-5000])
    runner = run_playbook("playbooks/model.yml", extravars=extravars(hub, model_download_local_file=str(cut)))
    assert runner.status == "failed"
    (message,) = [m for _h, _t, m in failed_tasks(runner)]
    assert message.startswith("%s is not a usable GGUF model: %s has the GGUF magic but cannot be read (truncated"
                              % (cut, cut))
    assert message.endswith("The model fact was not changed; replace or re-copy the file named by "
                            "model_download_local_file.")
    assert FACT.read_text() == before


def test_a_local_split_gguf_is_recorded_with_every_shard_and_one_missing_is_refused(hub, model_fact, tmp_path):
    """model_download_local_file names shard 1: the fact lists every shard and their bytes; a shard gone is
    refused naming it, and the fact is kept."""
    before = model_fact
    from make_tiny_m3 import write_tiny_m3

    shards = write_tiny_m3(tmp_path / "local.gguf", "m3", template_text="{{ messages }}", split=3)
    assert len(shards) == 3
    try:
        runner = run_playbook("playbooks/model.yml", extravars=extravars(hub, model_download_local_file=str(shards[0])))
        assert runner.status == "successful", failed_tasks(runner)
        fact = json.loads(FACT.read_text())
        assert fact["path"] == str(shards[0]) and fact["files"] == [str(s) for s in shards]
        assert fact["total_bytes"] == sum(s.stat().st_size for s in shards) and fact["repo"] == ""
    finally:
        FACT.write_text(before)
    shards[2].unlink()
    runner = run_playbook("playbooks/model.yml", extravars=extravars(hub, model_download_local_file=str(shards[0])))
    assert runner.status == "failed"
    (message,) = [m for _h, _t, m in failed_tasks(runner)]
    assert message.startswith("%s is not a usable GGUF model: split model %s has 3 shards but 1 are missing: %s; "
                              "finish the download." % (shards[0], shards[0], shards[2]))
    assert message.endswith("The model fact was not changed; replace or re-copy the file named by "
                            "model_download_local_file.")
    assert FACT.read_text() == before


def test_a_broken_gguf_on_the_hub_fails_and_leaves_the_fact(hub, model_fact):
    before = model_fact
    runner = run_playbook("playbooks/model.yml", extravars=extravars(hub, model_download_quant="BROKEN"))
    assert runner.status == "failed"
    (message,) = [m for _h, _t, m in failed_tasks(runner)]
    path = DEST / "BROKEN" / "MiniMax-M3-BROKEN.gguf"
    assert message.startswith("%s is not a usable GGUF model: %s has the GGUF magic but cannot be read" % (path, path))
    assert message.endswith(
        "The model fact was not changed; the file matches the sha256 the Hub lists, so the repo holds it broken: "
        "choose another quant or revision."
    )
    assert FACT.read_text() == before


def test_a_draft_model_gets_its_own_fact_and_leaves_the_model_fact(hub, model_fact, tmp_path):
    """Speculative decoding's draft comes through the same role, recorded where head_server looks for it."""
    before = model_fact
    draft_fact = FACT.with_name("minimax_draft.fact")
    draft_fact.unlink(missing_ok=True)
    from make_tiny_m3 import write_tiny_m3

    draft = write_tiny_m3(tmp_path / "draft.gguf", "m3", template_text="{{ messages }}")[0]
    try:
        runner = run_playbook("playbooks/model.yml", extravars=extravars(
            hub, model_download_local_file=str(draft), model_download_fact_name="draft"))
        assert runner.status == "successful", failed_tasks(runner)
        assert json.loads(draft_fact.read_text())["path"] == str(draft)
        assert FACT.read_text() == before
        # A bad truncated draft is refused like a model, naming the draft fact.
        cut = tmp_path / "cut-draft.gguf"
        cut.write_bytes(draft.read_bytes()[:-5000])
        runner = run_playbook("playbooks/model.yml", extravars=extravars(
            hub, model_download_local_file=str(cut), model_download_fact_name="draft"))
        assert runner.status == "failed"
        (message,) = [m for _h, _t, m in failed_tasks(runner)]
        assert "The draft fact was not changed;" in message
        assert json.loads(draft_fact.read_text())["path"] == str(draft)
    finally:
        draft_fact.unlink(missing_ok=True)


def test_stop_takeover_kill_9_then_rerun_resumes(hub, repo_dir):
    """-e model_download_stop=true stops the background job cleanly; a foreign download is refused, then taken
    over; a kill -9 is one readable line; each resumes the parts."""
    fresh_dest()
    hub.faults.rate_cap = 40_000  # ~80 KB/s: the stop and the kill land mid-download
    hub.reset_stats()
    first = start_playbook(hub)
    wait_progress(300_000, first)
    stopper = run_playbook("playbooks/model.yml", extravars=extravars(hub, model_download_stop=True))
    assert stopper.status == "successful", failed_tasks(stopper)
    assert "Stopped the download (pid " in stopper.stdout_text
    assert "writing to %s; its parts are kept and the next run resumes them." % DEST in stopper.stdout_text
    out, _ = first.communicate(timeout=60)
    assert first.returncode != 0
    assert "Stopped by SIGTERM: " in out and "the next run resumes from there." in out
    assert progress()["state"] == "stopped"
    saved = progress()["bytes_done"]
    assert saved > 0

    # A download the role did not start (ad hoc): not followed blindly; takeover stops it and resumes its parts.
    subprocess.run(
        [str(ROOT / ".venv" / "bin" / "ansible"), "-i", "inventory/local", "localhost", "-B", "600", "-P", "0",
         "-m", "hf_download", "-a", "repo=%s include=%s/*.gguf dest=%s endpoint=%s connections=2 progress_file=%s "
         "progress_interval=1" % (REPO, QUANT, DEST, hub.url, PROGRESS)],
        cwd=ROOT, env=dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg")), check=True, capture_output=True,
    )
    wait_progress(saved + 100_000, None)
    foreign = json.loads((DEST / ".hf_download.lock").read_text())["pid"]
    refused = run_playbook("playbooks/model.yml", extravars=extravars(hub))
    assert [m for _h, _t, m in failed_tasks(refused)] == [
        "A download (pid %d) not started by this role is writing to %s. Wait for it, or stop it with "
        "-e model_download_stop=true (or take over its parts with -e model_download_takeover=true)." % (foreign, DEST)
    ]
    second = start_playbook(hub, model_download_takeover=True)
    assert wait_for_new_writer(foreign)
    wait_progress(progress()["bytes_done"] + 100_000, second)
    pid = json.loads((DEST / ".hf_download.lock").read_text())["pid"]
    os.kill(pid, signal.SIGKILL)
    out, _ = second.communicate(timeout=60)
    assert second.returncode != 0
    assert (
        "The download job on localhost ended without a result (killed by kill -9, the OOM killer or a reboot?); its "
        "parts are kept in %s and the next run resumes them." % DEST
    ) in out
    assert "No start of json char found" not in out
    assert progress()["state"] == "interrupted"

    hub.faults.rate_cap = None
    runner = run_playbook("playbooks/model.yml", extravars=extravars(hub))
    assert runner.status == "successful", failed_tasks(runner)
    for shard in (repo_dir / QUANT).iterdir():
        assert sha256(DEST / QUANT / shard.name) == sha256(shard)
    traffic = hub.cdn_bytes()
    print("traffic after stop + takeover + kill -9 + rerun: %d bytes for a %d-byte model"
          % (traffic, model_bytes(repo_dir)))
    assert traffic <= model_bytes(repo_dir) + (1 << 20) + 6  # at most one part lost to the kill -9
