"""rpc_cache_seed (module_utils/minimax_spark_rpccache.py): llama.cpp's RPC tensor cache written from the GGUF.

The tiny model with --expert-ff 2688 has routed-expert tensors of ~10.5 MiB, above the 10 MiB the
RPC client hashes. The C FNV-1a library is compiled from the build_llamacpp role's source, as the
role does. The comparison with a cache ggml-rpc-server wrote itself needs the llama.cpp binaries
(MINIMAX_SPARK_LLAMACPP_BIN) and a private network namespace (tests/support/rpc_cache_lab.py).
"""
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import gguf
import numpy as np
import pytest
from ansible.module_utils.minimax_spark_rpccache import HASH_THRESHOLD, Hasher, fnv1a64_python

import make_tiny_m3 as tiny
import rpc_cache_seed
from helpers import ROOT, run_module

C_SOURCE = ROOT / "roles" / "build_llamacpp" / "files" / "minimax_fnv1a.c"
EXPERT_FF = 2688


@pytest.fixture(scope="module")
def fnv_lib(tmp_path_factory) -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler (cc) to build libminimax_fnv1a.so")
    out = tmp_path_factory.mktemp("fnv") / "libminimax_fnv1a.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-o", str(out), str(C_SOURCE)], check=True)
    return str(out)


def _model(dirpath: Path, seed: int = 0) -> Path:
    path = dirpath / f"tiny-ff-{seed}.gguf"
    if not path.exists():
        tiny.write_tiny_m3(path, template_text="{{ messages }}", layers=2, seed=seed, expert_ff=EXPERT_FF)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    return _model(d, 0), _model(d, 1)


def _seed(cache: Path, model: Path, lib, check=False, **kw):
    args = dict(model=str(model), cache_dir=str(cache), hash_library=lib, jobs=2, reserve_gib=0.0)
    args.update(kw)
    return run_module(rpc_cache_seed.main, args, check_mode=check)


def _tree(path: Path) -> dict:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()} if path.exists() else {}


def test_c_library_matches_the_reference_fnv1a(fnv_lib):
    h = Hasher(fnv_lib)
    assert h.native
    # Published FNV-1a 64 test vectors.
    assert h.hash_bytes(b"") == fnv1a64_python(b"") == 0xCBF29CE484222325
    assert h.hash_bytes(b"a") == fnv1a64_python(b"a") == 0xAF63DC4C8601EC8C
    assert h.hash_bytes(b"foobar") == 0x85944171F73967E8
    data = os.urandom(100003)
    assert h.hash_bytes(data) == fnv1a64_python(data)
    # Chunked (the engine hashes in 8 MiB pieces) equals one pass.
    buf = bytearray(data)
    first = h.update(bytearray(data[:4096]), 4096, 0xCBF29CE484222325)
    assert h.update(bytearray(data[4096:]), len(data) - 4096, first) == h.update(buf, len(buf), 0xCBF29CE484222325)


def test_seed_writes_one_entry_per_distinct_tensor_and_a_rerun_changes_nothing(tmp_path, models, fnv_lib):
    model = models[0]
    expected = {}
    for t in gguf.GGUFReader(model).tensors:
        if t.n_bytes > HASH_THRESHOLD:
            raw = bytes(np.asarray(t.data).tobytes())
            expected["%016x" % Hasher(fnv_lib).hash_bytes(raw)] = raw
    # gate, up and the down projection of one MoE layer (its bytes do not depend on the seed)
    assert len(expected) == 3
    cache = tmp_path / "cache"
    res = _seed(cache, model, fnv_lib)
    assert res["changed"] and not res.get("failed"), res
    assert sorted(res["seeded"]) == sorted(expected) and res["reused"] == res["rewritten"] == res["removed"] == []
    assert res["msg"] == ("3 entries (0.03 GiB) for 3 tensors: 3 seeded, 0 reused, 0 rewritten, 0 removed (hashing: %s)"
                          % fnv_lib)
    for name, raw in expected.items():
        entry = cache / "rpc" / name
        assert entry.read_bytes() == raw
        assert entry.stat().st_mode & 0o777 == 0o600
    assert (cache.stat().st_mode & 0o777, (cache / "rpc").stat().st_mode & 0o777) == (0o700, 0o700)
    assert sorted(os.listdir(cache / "rpc")) == sorted(expected)  # no temporary file left
    manifest = json.loads((cache / "minimax-seed-manifest.json").read_text())
    assert {h: e["size"] for h, e in manifest["entries"].items()} == {h: len(r) for h, r in expected.items()}

    before = _tree(cache)
    again = _seed(cache, model, fnv_lib)
    assert not again["changed"], again
    assert sorted(again["reused"]) == sorted(expected) and again["seeded"] == again["rewritten"] == []
    assert _tree(cache) == before


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_a_bad_entry_is_detected_and_rewritten(tmp_path, models, fnv_lib, damage):
    cache = tmp_path / "cache"
    _seed(cache, models[0], fnv_lib)
    good = _tree(cache)
    victim = sorted((cache / "rpc").iterdir())[0]
    raw = bytearray(victim.read_bytes())
    if damage == "flip":
        raw[len(raw) // 2] ^= 0xFF
        victim.write_bytes(bytes(raw))
    elif damage == "truncate":
        victim.write_bytes(bytes(raw[: len(raw) // 3]))
    else:
        victim.unlink()
    res = _seed(cache, models[0], fnv_lib)
    assert res["changed"], res
    if damage == "delete":
        assert res["seeded"] == [victim.name] and res["rewritten"] == []
    else:
        assert res["rewritten"] == [victim.name] and res["seeded"] == []
        assert any(victim.name in n and "rewritten" in n for n in res["notes"]), res["notes"]
    assert len(res["reused"]) == 2
    assert _tree(cache) == good


def test_check_mode_writes_nothing(tmp_path, models, fnv_lib):
    cache = tmp_path / "cache"
    res = _seed(cache, models[0], fnv_lib, check=True)
    assert res["changed"] and len(res["seeded"]) == 3
    assert res["msg"].startswith("Check mode: 3 entries")
    assert not cache.exists()

    _seed(cache, models[0], fnv_lib)
    victim = sorted((cache / "rpc").iterdir())[1]
    victim.write_bytes(b"\0" * 10)
    cache.chmod(0o755)
    damaged = _tree(cache)
    res = _seed(cache, models[0], fnv_lib, check=True)
    assert res["changed"] and res["rewritten"] == [victim.name]
    assert _tree(cache) == damaged and cache.stat().st_mode & 0o777 == 0o755


def test_a_new_model_removes_the_old_models_entries(tmp_path, models, fnv_lib):
    cache = tmp_path / "cache"
    first = _seed(cache, models[0], fnv_lib)
    second = _seed(cache, models[1], fnv_lib)
    # the down projection (seed-independent) is the same tensor in both models
    shared = sorted(set(first["seeded"]) & set(second["reused"]))
    assert len(shared) == 1 and len(second["seeded"]) == 2
    assert sorted(second["removed"]) == sorted(set(first["seeded"]) - set(shared))
    assert sorted(os.listdir(cache / "rpc")) == sorted(second["seeded"] + second["reused"])
    # an entry the server saved itself (not in the manifest) is left alone
    (cache / "rpc" / "00000000deadbeef").write_bytes(b"x")
    third = _seed(cache, models[1], fnv_lib)
    assert not third["changed"] and (cache / "rpc" / "00000000deadbeef").exists()


def test_include_seeds_only_the_matching_tensors(tmp_path, models, fnv_lib):
    res = _seed(tmp_path / "c", models[0], fnv_lib, include=[r"ffn_(gate|up)_exps"])
    assert res["tensors"] == 2 and len(res["seeded"]) == 2


def test_refused_when_the_disk_cannot_hold_it(tmp_path, models, fnv_lib):
    cache = tmp_path / "cache"
    res = _seed(cache, models[0], fnv_lib, reserve_gib=1e9)
    assert res["failed"]
    assert res["msg"].startswith(
        "rpc_cache_seed: the RPC cache for %s needs up to 0.03 GiB more in %s" % (models[0], cache))
    assert "turn seeding off (worker_rpc_seed: false)" in res["msg"]
    assert not (cache / "rpc").exists()


def test_estimate_reports_the_cost_and_writes_nothing(tmp_path, models):
    cache = tmp_path / "cache"
    res = _seed(cache, models[0], None, state="estimate")
    assert not res["changed"] and res["to_write_bytes_max"] == res["tensor_bytes"] == 3 * 8 * EXPERT_FF * 128 * 4
    assert res["msg"].startswith("3 tensors over 10 MiB (0.03 GiB): up to 0.03 GiB to write into %s" % cache)
    assert res["msg"].endswith(": fits")
    assert not cache.exists()


def test_pure_python_is_refused_above_its_cap(tmp_path, models):
    res = _seed(tmp_path / "cache", models[0], None, python_hash_max_bytes=1024)
    assert res["failed"]
    assert res["msg"].startswith("rpc_cache_seed: refusing to hash 0.03 GiB in pure Python")
    assert "no C FNV-1a library was given (hash_library)" in res["msg"]
    res = _seed(tmp_path / "cache", models[0], str(tmp_path / "missing.so"), python_hash_max_bytes=1024)
    assert "did not load" in res["msg"]
    assert not (tmp_path / "cache" / "rpc").exists()


@pytest.mark.skipif(not os.environ.get("MINIMAX_SPARK_LLAMACPP_BIN") or os.geteuid() != 0,
                    reason="needs the llama.cpp binaries (MINIMAX_SPARK_LLAMACPP_BIN) and root (network namespaces)")
def test_entries_match_a_cache_the_rpc_server_wrote_itself(tmp_path, models, fnv_lib):
    import rpc_cache_lab

    server_cache = tmp_path / "server"
    rpc_cache_lab.load_through_rpc(Path(os.environ["MINIMAX_SPARK_LLAMACPP_BIN"]), models[0], server_cache,
                                   tmp_path / "logs")
    written = _tree(server_cache / "rpc")
    assert len(written) == 3, written
    ours = tmp_path / "ours"
    _seed(ours, models[0], fnv_lib)
    assert _tree(ours / "rpc") == written


# --- the role's entry point (roles/worker_rpc/tasks/seed.yml) through ansible-playbook --------------------
def _seed_play(tmp_path, model, lib, check=False, **role_vars):
    from helpers import run_playbook

    play = tmp_path / "seed-play.yml"
    play.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.include_role:\n        name: worker_rpc\n        tasks_from: seed.yml\n")
    extravars = dict(worker_rpc_seed_model=str(model), worker_rpc_cache_dir=str(tmp_path / "cache"),
                     worker_rpc_seed_reserve_gib=0, _worker_rpc_build={"fnv1a_library": lib})
    extravars.update(role_vars)
    return run_playbook(str(play), extravars=extravars, check=check)


def _task_results(runner, name):
    return [e["event_data"]["res"] for e in runner.event_list
            if e.get("event") in ("runner_on_ok", "runner_on_failed") and e["event_data"].get("task") == name]


def test_the_role_seeds_reports_the_cost_first_and_a_rerun_changes_nothing(tmp_path, models, fnv_lib):
    from helpers import changed_tasks

    check = _seed_play(tmp_path, models[0], fnv_lib, check=True)
    assert check.status == "successful", check.stdout_text
    assert not (tmp_path / "cache").exists()

    first = _seed_play(tmp_path, models[0], fnv_lib)
    assert first.status == "successful", first.stdout_text
    cost = _task_results(first, "Report the disk cost")[0]["msg"]
    assert cost.startswith("3 tensors over 10 MiB (0.03 GiB): up to 0.03 GiB to write into %s" % (tmp_path / "cache"))
    assert _task_results(first, "Report what was seeded")[0]["msg"] == (
        "3 entries (0.03 GiB) for 3 tensors: 3 seeded, 0 reused, 0 rewritten, 0 removed (hashing: %s)" % fnv_lib)
    assert len(os.listdir(tmp_path / "cache" / "rpc")) == 3

    second = _seed_play(tmp_path, models[0], fnv_lib)
    assert second.status == "successful" and changed_tasks(second) == [], second.stdout_text


def test_the_role_fails_when_seeding_is_required_without_a_model(tmp_path, fnv_lib):
    from helpers import failure_message

    missing = tmp_path / "nowhere.gguf"
    runner = _seed_play(tmp_path, missing, fnv_lib, worker_rpc_seed=True)
    assert runner.status == "failed"
    res = _task_results(runner, "Fail when seeding is required but the worker has no model")[0]
    assert failure_message(res) == (
        "worker_rpc_seed is true but localhost has no model to seed from (%s): copy the shards to the worker and set "
        "worker_rpc_seed_model to shard 1, or set worker_rpc_seed: auto" % missing)

    auto = _seed_play(tmp_path, missing, fnv_lib)
    assert auto.status == "successful"
    assert _task_results(auto, "Report that the cache is not seeded")[0]["msg"].startswith(
        "No copy of the model on localhost (%s): the RPC cache is not seeded" % missing)
    assert not (tmp_path / "cache").exists()


def test_auto_does_not_seed_without_the_hash_library_where_python_would_take_hours(tmp_path, models):
    runner = _seed_play(tmp_path, models[0], str(tmp_path / "missing.so"), worker_rpc_seed_python_cap=1024)
    assert runner.status == "successful", runner.stdout_text
    msg = _task_results(runner, "Report that the cache is not seeded without the hash library")[0]["msg"]
    assert msg == ("The RPC cache is not seeded on localhost: the build records no usable FNV-1a library "
                   "(fnv1a_library in ansible_local.minimax_llamacpp) and hashing 0.0 GiB in pure Python (a few MB/s) "
                   "is too slow: run the build_llamacpp tag")
    assert not (tmp_path / "cache" / "rpc").exists()


def test_a_split_model_is_seeded_from_every_shard(tmp_path, fnv_lib):
    shards = tiny.write_tiny_m3(tmp_path / "split.gguf", template_text="{{ messages }}", layers=3, split=3,
                                expert_ff=EXPERT_FF)
    assert len(shards) == 3
    res = _seed(tmp_path / "cache", shards[0], fnv_lib)
    # two MoE layers: gate and up differ, the down projections (the same in every layer) share one entry
    assert res["tensors"] == 6 and len(res["seeded"]) == 5, res
    manifest = json.loads((tmp_path / "cache" / "minimax-seed-manifest.json").read_text())
    sources = {s["path"] for s in manifest["shards"]}
    assert sources == {str(s) for s in shards}


def test_a_bad_include_pattern_names_the_variable(tmp_path, models, fnv_lib):
    res = _seed(tmp_path / "cache", models[0], fnv_lib, include=["blk.(["])
    assert res["failed"] and res["msg"].startswith("rpc_cache_seed: include has a bad regular expression (")
    assert res["msg"].endswith("): fix worker_rpc_seed_include")
