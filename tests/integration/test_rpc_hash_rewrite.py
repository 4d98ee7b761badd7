"""A GGUF rewritten in place with its mtime put back: the restarted head sends the worker the new bytes.

Through site.yml on the demo inventory, as issue 26 found it: the large tiny model (tools/make_tiny_m3.py
--expert-ff 26880 --layers 5: 24 tensors over 10 MiB, which the worker's RPC cache serves) deployed with the
worker's cache seeded; then the bytes past the first 4 KiB of each of those tensors are rewritten in place and the
file's mtime put back (what cp -p, touch -r, rsync -t or a re-download into the same path can leave), and
``site.yml --tags head_server -e head_server_ctx_size=8192`` restarts the head. The hash file was bound to size
and mtime only, so the head trusted it and the worker served its cached old bytes; now it records the inode and
the ctime too: the head's run hashes the file again, llama.cpp's log names the hash file it used and why, the
worker receives the tensors that changed, and the greedy reply equals one process's on the rewritten file. The
rewrite (make_tiny_m3 ``rewritten=True``) keeps the tool call and changes the thought, so one process on the
original file replies otherwise: the reply shows which bytes served it.

The worker keeps every large tensor it receives in its cache, named by the hash of its bytes, and seeding removes
only the entries it wrote itself: a worker cache that ever served this rewrite holds its new bytes already, and the
head would send nothing. So the deployment gets a cache of its own (worker_rpc_cache_dir in the test's folder),
holding only what seeding wrote, and the test asserts that every entry the worker saved is a rewritten tensor. The
demo is deployed again after, on its own cache, and the test's folder removed: nothing is left behind. About 5 min.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import gguf
import pytest
from ansible.module_utils.minimax_spark_rpccache import Hasher, entry_name

import make_tiny_m3 as tiny
from helpers import failed_tasks, run_playbook
from tiny_replies import greedy, one_process, reply_of

FACTS = Path("/etc/ansible/facts.d")
HEAD_LOG = Path("/var/log/minimax-spark/minimax-llama-server.log")
API = "http://127.0.0.1:8891"
BIG = 10 * 1024 * 1024
HEAD_BYTES = 4096
HASH_TASK = "Write the weight-hash files beside the model for the RPC workers"


def fact(name):
    return json.loads((FACTS / ("minimax_%s.fact" % name)).read_text())


def task_results(runner, name):
    return [e["event_data"]["res"] for e in runner.event_list
            if e.get("event") in ("runner_on_ok", "runner_on_failed") and e["event_data"].get("task") == name]


def head_log_of_last_start():
    if Path("/run/systemd/system").is_dir():
        import subprocess

        return subprocess.run(["journalctl", "-u", "minimax-llama-server", "--no-pager"], capture_output=True,
                              text=True).stdout
    return HEAD_LOG.read_text(errors="replace").split("[minimax-supervise]")[-1]


@pytest.fixture(scope="module")
def deployed(tmp_path_factory, m3_template, llamacpp_bin, demo_model):
    """The large tiny model served by the demo (head and worker on this box), the worker's cache (its own, in the
    test's folder) seeded; after the module the demo's own model is deployed again, on the default cache."""
    d = tmp_path_factory.mktemp("rewrite")
    kw = dict(template_text=m3_template, layers=5, expert_ff=26880)
    model = tiny.write_tiny_m3(d / "models" / "MiniMax-M3-large.gguf", "m3", **kw)[0]
    rewritten = tiny.write_tiny_m3(d / "rewritten.gguf", "m3", rewritten=True, **kw)[0]
    pristine = d / "pristine.gguf"
    shutil.copyfile(model, pristine)
    cache = d / "rpc-cache"
    extravars = {"model_download_local_file": str(model), "worker_rpc_cache_dir": str(cache)}
    try:
        runner = run_playbook("site.yml", extravars=extravars)
        assert runner.status == "successful", failed_tasks(runner) or runner.stdout_text[-5000:]
        yield {"model": model, "rewritten": rewritten, "pristine": pristine, "dir": d, "cache": cache,
               "extravars": extravars}
    finally:
        again = run_playbook("site.yml")
        shutil.rmtree(d, ignore_errors=True)
        assert again.status == "successful", failed_tasks(again) or again.stdout_text[-5000:]


def test_a_rewrite_that_keeps_the_mtime_makes_the_head_send_the_new_bytes(deployed, llamacpp_bin):
    model, rewritten, pristine = deployed["model"], deployed["rewritten"], deployed["pristine"]
    big = [t for t in gguf.GGUFReader(model).tensors if int(t.n_bytes) > BIG]
    assert len(big) == 24

    # deployed: the worker's cache was seeded, so the head sent none of its large tensors
    load = fact("head_load")
    assert load["hash_files"] == [{"path": str(model) + ".rpc-hashes", "used": True, "reason": "",
                                   "tensors": load["hash_files"][0]["tensors"]}], load
    worker_big = load["weights"]["file_tensors"]
    assert worker_big > 0 and worker_big % 6 == 0, load  # the worker's MoE layers: 6 tensors over 10 MiB each
    assert load["weights"]["sent_tensors"] == 0 and load["weights"]["hashed_tensors"] == 0, load
    assert fact("rpc")["cache_dir"] == str(deployed["cache"])
    seeded = set(os.listdir(deployed["cache"] / "rpc"))
    before = greedy(API)
    assert before == {"content": "", "reasoning": tiny.THOUGHT_CALL,
                      "calls": [("get_weather", tiny.TOOL_ARGUMENTS)]}, before

    # rewrite past the first 4 KiB of each tensor over 10 MiB, in place, and put the mtime back
    st = os.stat(model)
    with open(model, "r+b") as out, open(rewritten, "rb") as src:
        for t in big:
            offset, size = int(t.data_offset) + HEAD_BYTES, int(t.n_bytes) - HEAD_BYTES
            src.seek(offset)
            out.seek(offset)
            out.write(src.read(size))
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    now = os.stat(model)
    assert (now.st_size, now.st_mtime_ns, now.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)
    assert now.st_ctime_ns != st.st_ctime_ns

    runner = run_playbook("site.yml", tags=["head_server"], extravars=dict(deployed["extravars"],
                                                                          head_server_ctx_size=8192))
    assert runner.status == "successful", failed_tasks(runner) or runner.stdout_text[-5000:]

    # the run hashed the file again, saying why
    hashes = task_results(runner, HASH_TASK)
    assert hashes and hashes[-1]["changed"], hashes
    why = "stale (%s is not the file it was made from: ctime differs)" % model
    assert hashes[-1]["written"] == [{"path": str(model) + ".rpc-hashes", "reason": why}], hashes[-1]
    assert why in hashes[-1]["msg"]

    # llama.cpp took the hashes from the new file, names it and why, and sent the worker the tensors that changed
    load = fact("head_load")
    assert load["hash_files"][0]["used"] and load["weights"]["hashed_tensors"] == 0, load
    assert load["weights"]["file_tensors"] == worker_big
    # the rewrite changed the routed and the shared down projections of each layer; they are the same bytes in every
    # layer, so the worker saves the first it receives and has the others: 2 sent, or one per changed tensor
    assert 2 <= load["weights"]["sent_tensors"] <= worker_big // 3, load
    line = re.findall(r"ggml_rpc: weight hashes: .*", head_log_of_last_start())[-1]
    assert line.endswith("; hash files: %s.rpc-hashes used (%d tensors; size, mtime, inode and ctime of %s as "
                         "recorded)" % (model, load["hash_files"][0]["tensors"], model)), line
    assert "sent_tensors=%d " % load["weights"]["sent_tensors"] in line
    # what the worker received is the rewritten bytes: it saved them in its cache, named by their hash
    build = fact("llamacpp")
    hasher = Hasher(build["fnv1a_library"])
    assert hasher.native, hasher.load_error
    new = {entry_name(hasher.hash_bytes(t.data.tobytes())) for t in gguf.GGUFReader(model).tensors
           if int(t.n_bytes) > BIG}
    # (which of the file's tensors the worker holds follows the plan's split: compare with what it received)
    received = set(os.listdir(deployed["cache"] / "rpc")) - seeded
    assert received and received <= new - seeded, (received, new, seeded)
    assert len(received) <= load["weights"]["sent_tensors"], (received, load)

    # the greedy reply is one process's on the rewritten file; with the old bytes it would differ
    after = greedy(API)
    assert after == reply_of(Path(llamacpp_bin), model, deployed["dir"] / "one-process-rewritten.log")
    assert after == dict(before, reasoning=tiny.rewritten_thought("m3")), after
    with one_process(Path(llamacpp_bin), pristine, deployed["dir"] / "one-process-original.log") as url:
        assert greedy(url) == before != after
