"""The hash file (project patch rpc-hash-sidecar): a seeded load where the head hashes nothing.

Stock llama.cpp hashes every weight over 10 MiB it places on an RPC worker, on every load, at ~0.3-0.7 GB/s
on one core, even when the worker's cache holds them. The patched build takes the hash from the files
rpc_hash_file writes beside the GGUF. In the RPC cache lab (tests/support/rpc_cache_lab.py, unthrottled
veth) with a ~470 MiB tiny model whose large tensors are ~50 MiB: the seeded load with the patch and the
hash file hashes 0 bytes (llama.cpp's own "weight hashes" line), loads within 1.5x of the same model in one
process, and replies exactly as the unpatched build does. A hash file that no longer matches the GGUF is
ignored (the tensors are hashed, the reply is the same); two hash files that disagree on a tensor of the
same name, size and head make the patch hash that tensor; a worker cache entry with other bytes is rewritten
by the seeder (its manifest) and the load still replies the same. The figures are printed (-s). About 2 min.
"""
import os
import re
import shutil

import gguf
import pytest

import make_tiny_m3 as tiny
import rpc_cache_lab
import rpc_cache_seed
import rpc_hash_file
from helpers import run_module

pytestmark = pytest.mark.skipif(rpc_cache_lab.can_run() is not None,
                                reason="RPC cache lab: %s" % rpc_cache_lab.can_run())

EXPERT_FF = 13440  # 5x the default tiny width: ~52 MiB per routed-expert tensor
LAYERS = 4


@pytest.fixture(scope="module")
def model(tmp_path_factory, m3_template):
    path = tmp_path_factory.mktemp("hash-file-model") / "tiny-wide.gguf"
    tiny.write_tiny_m3(path, template_text=m3_template, layers=LAYERS, expert_ff=EXPERT_FF)
    return path


def _big(model):
    return [t for t in gguf.GGUFReader(model).tensors if int(t.n_bytes) > 10 * 1024 * 1024]


def test_a_seeded_load_with_the_hash_file_hashes_nothing_and_replies_as_the_unpatched_build(tmp_path, builds, model):
    manifests = builds["manifests"]
    assert (manifests["patched"]["rpc_hash_file"], manifests["unpatched"]["rpc_hash_file"]) == (True, False)
    big = _big(model)
    big_bytes = sum(int(t.n_bytes) for t in big)
    assert big_bytes > 300 * 2 ** 20, "the model is too small for the hash to show"
    cache = tmp_path / "cache"
    seeded = run_module(rpc_cache_seed.main, dict(model=str(model), cache_dir=str(cache), reserve_gib=0.0,
                                                  hash_library=builds["lib"]))
    assert seeded["changed"] and seeded["tensors"] == len(big), seeded
    hashes = run_module(rpc_hash_file.main, dict(models=[str(model)], hash_library=builds["lib"]))
    assert hashes["changed"] and hashes["tensors_hashed"] == len(big), hashes

    with rpc_cache_lab.lab(builds["patched"]) as lab:
        res = rpc_cache_lab.hash_file_loads(lab, builds, model, cache, hashes["env"], tmp_path / "logs", reps=3)
    print("\n" + "\n".join(rpc_cache_lab.figures(res)))

    replies = {name: [r["reply"] for r in runs] for name, runs in res.items()}
    reference = replies["seeded-unpatched"][0]
    assert "get_weather" in reference["content"], reference
    for name, got in replies.items():
        assert all(r == reference for r in got), (name, got, reference)
    for run in res["seeded-patched"]:
        assert run["weight_hashes"]["hashed_bytes"] == 0, run
        assert run["weight_hashes"]["file_tensors"] == len(big) and run["weight_hashes"]["file_bytes"] == big_bytes
        assert run["weight_hashes"]["sent_tensors"] == 0 and run["saved"] == 0, run
    assert all(run["weight_hashes"] is None for run in res["seeded-unpatched"])
    # The load times are a benchmark, printed above (median, min, max, ratio to one process), not asserted.


def test_a_hash_file_that_does_not_match_is_never_trusted(tmp_path, builds, model, m3_template):
    big = _big(model)
    big_bytes = sum(int(t.n_bytes) for t in big)
    work = tmp_path / "m"
    work.mkdir()
    target = work / "target.gguf"
    shutil.copy2(model, target)
    cache = tmp_path / "cache"
    seeded = run_module(rpc_cache_seed.main, dict(model=str(target), cache_dir=str(cache), reserve_gib=0.0,
                                                  hash_library=builds["lib"]))
    assert seeded["changed"] and seeded["tensors"] == len(big), seeded
    env = run_module(rpc_hash_file.main, dict(models=[str(target)], hash_library=builds["lib"]))["env"]

    # A "draft" with a tensor of the same name, size and first 4 KiB but other bytes after them, and its own
    # hash file: the two files disagree on that key, so the patch hashes that tensor (and only that one).
    draft = work / "draft.gguf"
    shutil.copy2(model, draft)
    victim = big[0]
    with open(draft, "r+b") as handle:
        handle.seek(int(victim.data_offset) + int(victim.n_bytes) // 2)
        byte = handle.read(1)
        handle.seek(-1, 1)
        handle.write(bytes([byte[0] ^ 0x55]))
    both = run_module(rpc_hash_file.main, dict(models=[str(target), str(draft)], hash_library=builds["lib"]))["env"]

    # The worker's entry for another tensor gets other bytes (same size): the seeder's manifest catches it.
    entries = sorted((cache / "rpc").iterdir())
    bad = entries[0]
    data = bytearray(bad.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad.write_bytes(bytes(data))
    reseed = run_module(rpc_cache_seed.main, dict(model=str(target), cache_dir=str(cache), reserve_gib=0.0,
                                                  hash_library=builds["lib"]))
    assert reseed["changed"] and reseed["rewritten"] == [bad.name], reseed

    with rpc_cache_lab.lab(builds["patched"]) as lab:
        reference = rpc_cache_lab.one_load(lab, target, cache, tmp_path / "logs", "reference", rpc=False)
        ambiguous = rpc_cache_lab.one_load(lab, target, cache, tmp_path / "logs", "ambiguous",
                                           env={"GGML_RPC_HASH_FILE": both})
        # Same size, other mtime (a GGUF rewritten in place): the file is stale and ignored.
        st = os.stat(target)
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 10 ** 9))
        stale = rpc_cache_lab.one_load(lab, target, cache, tmp_path / "logs", "stale", env={"GGML_RPC_HASH_FILE": env})

    assert ambiguous["weight_hashes"]["hashed_tensors"] == 1, ambiguous
    assert ambiguous["weight_hashes"]["hashed_bytes"] == int(victim.n_bytes)
    assert ambiguous["weight_hashes"]["sent_tensors"] == 0
    log = open(stale["head_log"]).read()
    assert "ggml_rpc: hash file %s ignored, stale: %s is not the file it was made from (mtime, ctime differ): " \
           "its tensors are hashed" % (env, target) in log
    assert re.search(r"ggml_rpc: weight hashes: file_tensors=0 .*; hash files: %s ignored \(stale: %s is not the file "
                     r"it was made from \(mtime, ctime differ\)\)$" % (re.escape(env), re.escape(str(target))),
                     log, re.M), log[-3000:]
    assert stale["weight_hashes"]["file_tensors"] == 0 and stale["weight_hashes"]["hashed_bytes"] == big_bytes
    assert stale["weight_hashes"]["sent_tensors"] == 0, stale
    assert ambiguous["reply"] == stale["reply"] == reference["reply"]
    assert "get_weather" in reference["reply"]["content"]
