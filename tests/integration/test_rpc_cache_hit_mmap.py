"""A worker's cache hit (project patch rpc-cache-hit-mmap): mapped, not copied into a zero-filled buffer; and the
head's side of it (project patch rpc-load-mapped): the weights placed on a worker are set from a mapping of the GGUF.

Stock ggml-rpc-server answers a cache hit by zero-filling a buffer the size of the cache file, reading the file
into it and copying it into the tensor; the patched one maps the file and sets the tensor from the mapping.
In the RPC cache lab (tests/support/rpc_cache_lab.py, unthrottled veth) with a seeded cache and the hash file
(the head neither hashes nor sends the large weights): the cached bytes reach the worker exactly (greedy reply
identical to a one-process load and to a worker without the patch), and an entry too large for its tensor's
buffer is refused with stock llama.cpp's message, the entry left as it was. With rpc-load-mapped, llama-server
reads (read(2), /proc/PID/io rchar) none of the worker's weights when the worker has them, and on a cache miss
the RPC client sends them whole from the mapping. The load figures (median, min, max of 3) are printed (-s).
About 3 min once both builds are cached.
"""
import os
from pathlib import Path

import gguf
import pytest

import make_tiny_m3 as tiny
import rpc_cache_lab
import rpc_cache_seed
import rpc_hash_file
from helpers import run_module

pytestmark = pytest.mark.skipif(rpc_cache_lab.can_run() is not None,
                                reason="RPC cache lab: %s" % rpc_cache_lab.can_run())

EXPERT_FF = 13440  # ~52 MiB per routed-expert tensor
LAYERS = 3


@pytest.fixture(scope="module")
def seeded(tmp_path_factory, builds, m3_template):
    """(model, its seeded worker cache, GGML_RPC_HASH_FILE, the large tensors)."""
    work = tmp_path_factory.mktemp("cache-hit")
    model = work / "tiny-wide.gguf"
    tiny.write_tiny_m3(model, template_text=m3_template, layers=LAYERS, expert_ff=EXPERT_FF)
    big = [t for t in gguf.GGUFReader(model).tensors if int(t.n_bytes) > 10 * 1024 * 1024]
    cache = work / "cache"
    seed = run_module(rpc_cache_seed.main, dict(model=str(model), cache_dir=str(cache), reserve_gib=0.0,
                                                hash_library=builds["lib"]))
    assert seed["changed"] and seed["tensors"] == len(big), seed
    env = run_module(rpc_hash_file.main, dict(models=[str(model)], hash_library=builds["lib"]))["env"]
    return model, cache, env, big


def test_a_cache_hit_reaches_the_worker_exactly(tmp_path, builds, seeded):
    model, cache, env, big = seeded
    with rpc_cache_lab.lab(builds["patched"]) as lab:
        res = rpc_cache_lab.cache_hit_loads(lab, builds, model, cache, env, tmp_path / "logs", reps=3)
    print("\n" + "\n".join(rpc_cache_lab.figures(res)))

    reference = res["one-process"][0]["reply"]
    assert "get_weather" in reference["content"], reference
    for name, runs in res.items():
        assert all(r["reply"] == reference for r in runs), (name, [r["reply"] for r in runs], reference)
    for run in res["seeded-patched"] + res["seeded-unpatched"]:
        # every large weight came from the worker's cache: none hashed or sent by the head, none saved
        wh = run["weight_hashes"]
        assert wh["file_tensors"] == len(big) and wh["hashed_bytes"] == 0 and wh["sent_tensors"] == 0, run
        assert run["saved"] == 0, run


@pytest.mark.parametrize("build", ["patched", "unpatched"])
def test_a_cache_entry_too_large_for_its_tensor_is_refused(tmp_path, builds, seeded, build):
    model, cache, env, big = seeded
    mine = tmp_path / "cache"
    (mine / "rpc").mkdir(parents=True)
    for entry in (cache / "rpc").iterdir():
        os.link(entry, mine / "rpc" / entry.name)
    bad = sorted((mine / "rpc").iterdir())[0]
    (mine / "rpc" / bad.name).unlink()
    data = (cache / "rpc" / bad.name).read_bytes()
    bad.write_bytes(data)
    size = len(data) + 2 ** 30  # more than the worker's whole weight buffer; sparse
    os.truncate(bad, size)

    with rpc_cache_lab.lab(builds[build]) as lab:
        with pytest.raises(RuntimeError, match="exited .* waiting for llama-server to load"):
            rpc_cache_lab.one_load(lab, model, mine, tmp_path / "logs", "too-large", env={"GGML_RPC_HASH_FILE": env})
    log = (tmp_path / "logs" / "too-large-worker.log").read_text(errors="replace")
    assert "[set_tensor_hash] tensor data region (" in log and \
        "size=%d, hash=0x%x) out of buffer bounds" % (size, int(bad.name, 16)) in log, log[-2000:]
    assert bad.stat().st_size == size and "saved to" not in log


def test_the_head_reads_none_of_the_weights_a_seeded_worker_holds(tmp_path, builds, seeded):
    """rpc-load-mapped: the head sets the worker's weights from a mapping of the GGUF, so with the hash file and a
    seeded worker it reads none of them; a stock head reads every one into a scratch buffer (and hashes it). On a
    cache miss the client reads them from the mapping and sends them whole: the worker saves exactly those, and
    every reply is the one-process reply."""
    model, cache, env, big = seeded
    big_bytes = sum(int(t.n_bytes) for t in big)
    empty = tmp_path / "empty-cache"
    empty.mkdir()
    logs = tmp_path / "logs"
    hash_env = {"GGML_RPC_HASH_FILE": env}
    with rpc_cache_lab.lab(builds["patched"]) as lab:
        one = rpc_cache_lab.one_load(lab, model, None, logs, "one-process", rpc=False)
        hit = rpc_cache_lab.one_load(lab, model, cache, logs, "seeded", env=hash_env)
        miss = rpc_cache_lab.one_load(lab, model, empty, logs, "cold", env=hash_env)
        lab.bin = Path(builds["unpatched"])
        stock = rpc_cache_lab.one_load(lab, model, cache, logs, "stock-seeded")
    for run in (one, hit, miss, stock):
        print("%-13s %6.2f s, the head read %6.1f MiB" % (run["label"], run["load_s"],
                                                          run["head_read_bytes"] / 2 ** 20))

    assert one["head_read_bytes"] >= big_bytes  # one process reads the whole model
    assert stock["head_read_bytes"] >= big_bytes and stock["rpc_mapped"] is None
    # every layer is on the worker: the head maps them all, and reads less than a tenth of the large ones' bytes
    # (the GGUF's header and what stays on the head: the token embeddings)
    assert hit["rpc_mapped"] is not None and hit["rpc_mapped"][1] >= big_bytes, hit["rpc_mapped"]
    assert hit["head_read_bytes"] < big_bytes / 10, hit["head_read_bytes"]
    assert hit["weight_hashes"]["file_tensors"] == len(big) and hit["weight_hashes"]["sent_tensors"] == 0
    assert miss["head_read_bytes"] < big_bytes / 10, miss["head_read_bytes"]
    entries = sorted(p.name for p in (cache / "rpc").iterdir())  # one per distinct hash (equal down projections share)
    assert miss["weight_hashes"]["sent_tensors"] == len(entries) and miss["saved"] == len(entries), miss
    assert sorted(p.name for p in (empty / "rpc").iterdir()) == entries
    for name in entries:  # the bytes sent from the mapping are the bytes the seeder read from the file
        assert (empty / "rpc" / name).read_bytes() == (cache / "rpc" / name).read_bytes(), name
    for run in (hit, miss, stock):
        assert run["reply"] == one["reply"], (run["label"], run["reply"], one["reply"])


NO_FILE_MMAP = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sys/mman.h>
#include <sys/types.h>
/* A file system that cannot map files: every mapping of 1 MiB or more of a file fails (anonymous ones work). */
static void *refuse(void *addr, size_t len, int prot, int flags, int fd, off_t off, const char *name) {
    void *(*real)(void *, size_t, int, int, int, off_t) = dlsym(RTLD_NEXT, name);
    if (fd >= 0 && !(flags & MAP_ANONYMOUS) && len >= (1u << 20)) { errno = ENODEV; return MAP_FAILED; }
    return real(addr, len, prot, flags, fd, off);
}
void *mmap(void *a, size_t l, int p, int f, int fd, off_t o) { return refuse(a, l, p, f, fd, o, "mmap"); }
void *mmap64(void *a, size_t l, int p, int f, int fd, off_t o) { return refuse(a, l, p, f, fd, o, "mmap64"); }
"""


def test_a_model_file_that_cannot_be_mapped_is_read_as_before(tmp_path, builds, seeded):
    """rpc-load-mapped where the GGUF cannot be mapped (LD_PRELOAD makes every file mapping fail, as on a file
    system without mmap): the head says so, reads the worker's weights as stock llama.cpp does, still takes their
    hashes from the hash file, and serves the one-process reply."""
    import subprocess

    model, cache, env, big = seeded
    big_bytes = sum(int(t.n_bytes) for t in big)
    (tmp_path / "no_file_mmap.c").write_text(NO_FILE_MMAP)
    shim = tmp_path / "no_file_mmap.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(shim), str(tmp_path / "no_file_mmap.c"), "-ldl"],
                   check=True)
    logs = tmp_path / "logs"
    with rpc_cache_lab.lab(builds["patched"]) as lab:
        one = rpc_cache_lab.one_load(lab, model, None, logs, "one-process", rpc=False)
        unmapped = rpc_cache_lab.one_load(lab, model, cache, logs, "unmappable",
                                          env={"GGML_RPC_HASH_FILE": env, "LD_PRELOAD": str(shim)})
    log = Path(unmapped["head_log"]).read_text(errors="replace")
    assert "load_all_data: rpc-load-mapped: cannot map model file 0, reading its RPC weights: " in log, log[-3000:]
    assert unmapped["rpc_mapped"] is None  # no weight was set from a mapping
    assert unmapped["head_read_bytes"] >= big_bytes, unmapped["head_read_bytes"]
    assert unmapped["weight_hashes"]["file_tensors"] == len(big) and unmapped["weight_hashes"]["sent_tensors"] == 0
    assert unmapped["saved"] == 0 and unmapped["reply"] == one["reply"], unmapped
