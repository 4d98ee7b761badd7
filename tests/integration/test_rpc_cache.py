"""The RPC tensor cache seeded by rpc_cache_seed: a head loads the tiny model through a throttled link.

The head (llama-server) and the worker (ggml-rpc-server -c) run in two network namespaces joined by a
veth pair; tc tbf limits the head's side to 40 Mbit/s (tests/support/rpc_cache_lab.py). The tiny model
has --expert-ff 2688, so its routed-expert tensors (~10.5 MiB) go through the cache. A cold load
streams them; after rpc_cache_seed wrote the worker's cache from its copy of the GGUF, the load sends
none of them, is several times faster, and the greedy reply is the same; the entries the module wrote
are byte for byte the ones the server wrote itself during the cold load. About 20 s.
"""
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import gguf
import pytest

import make_tiny_m3 as tiny
import rpc_cache_lab
import rpc_cache_seed
from helpers import ROOT, run_module

pytestmark = pytest.mark.skipif(rpc_cache_lab.can_run() is not None,
                                reason="RPC cache lab: %s" % rpc_cache_lab.can_run())

RATE = "40mbit"


def _hash_library(bin_dir: Path, tmp_path: Path) -> str:
    lib = bin_dir / "libminimax_fnv1a.so"
    if lib.exists():
        return str(lib)
    # MINIMAX_SPARK_LLAMACPP_BIN may point at a build installed before the role built the library.
    out = tmp_path / "libminimax_fnv1a.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(out),
                    str(ROOT / "roles/build_llamacpp/files/minimax_fnv1a.c")], check=True)
    return str(out)


def test_a_seeded_worker_receives_no_large_tensor(tmp_path, llamacpp_bin, m3_template):
    model = tmp_path / "tiny-ff.gguf"
    tiny.write_tiny_m3(model, template_text=m3_template, layers=2, expert_ff=2688)
    big = [t for t in gguf.GGUFReader(model).tensors if t.n_bytes > 10 * 1024 * 1024]
    big_bytes = sum(int(t.n_bytes) for t in big)
    assert len(big) == 3

    with rpc_cache_lab.lab(llamacpp_bin, rate=RATE) as lab:
        cold = rpc_cache_lab.one_load(lab, model, tmp_path / "cold-cache", tmp_path / "logs", "cold")

        cache = tmp_path / "seeded-cache"
        res = run_module(rpc_cache_seed.main, dict(model=str(model), cache_dir=str(cache), reserve_gib=0.0,
                                                   hash_library=_hash_library(Path(llamacpp_bin), tmp_path)))
        assert res["changed"] and len(res["seeded"]) == 3, res
        seeded = rpc_cache_lab.one_load(lab, model, cache, tmp_path / "logs", "seeded")

    # cold: the server received and saved each large tensor; seeded: it had every one
    assert cold["saved"] == 3, cold
    assert seeded["saved"] == 0, open(seeded["worker_log"]).read()[-3000:]
    assert cold["sent_bytes"] > big_bytes
    assert seeded["sent_bytes"] < cold["sent_bytes"] - big_bytes, (cold, seeded)
    assert seeded["load_s"] * 2 < cold["load_s"], (cold, seeded)
    assert seeded["reply"] == cold["reply"]
    assert "get_weather" in cold["reply"]["content"]
    # the cache the server reads is the one the module wrote, untouched by the load, and byte for byte
    # the cache the server wrote itself during the cold load (same names: llama.cpp's hash)
    assert sorted(os.listdir(cache / "rpc")) == sorted(res["seeded"])
    assert _tree(cache / "rpc") == _tree(tmp_path / "cold-cache" / "rpc")
    shutil.rmtree(tmp_path / "cold-cache", ignore_errors=True)


def _tree(path: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.iterdir())}


def test_a_worker_without_the_model_gets_it_with_model_download_and_seeds(tmp_path, llamacpp_bin):
    """worker_rpc_seed_download: the worker fetches the model itself (model_download; here its local-file mode, the
    download path is model_download's own test) and seeds from it. Writes the model fact: run it in a namespace."""
    from helpers import run_playbook

    model = tmp_path / "models" / "tiny-ff.gguf"
    tiny.write_tiny_m3(model, template_text="{{ messages }}", layers=2, expert_ff=2688)
    play = tmp_path / "seed-play.yml"
    play.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.include_role:\n        name: worker_rpc\n        tasks_from: seed.yml\n")
    runner = run_playbook(str(play), extravars=dict(
        worker_rpc_seed_model=str(tmp_path / "not-here.gguf"), worker_rpc_seed_download=True,
        model_download_local_file=str(model), worker_rpc_cache_dir=str(tmp_path / "cache"),
        worker_rpc_seed_reserve_gib=0,
        # every tensor: the default (this worker's layers in the host's recorded plan) would follow whatever plan
        # the demo or another test recorded on this machine, for another model
        worker_rpc_seed_include=[],
        _worker_rpc_build={"fnv1a_library": _hash_library(Path(llamacpp_bin), tmp_path)}))
    assert runner.status == "successful", runner.stdout_text
    msgs = [e["event_data"]["res"].get("msg") for e in runner.event_list if e.get("event") == "runner_on_ok"
            and e["event_data"].get("task") == "Report what was seeded"]
    assert msgs and msgs[0].startswith("3 entries (0.03 GiB) for 3 tensors: 3 seeded, 0 reused"), runner.stdout_text
    assert len(os.listdir(tmp_path / "cache" / "rpc")) == 3
