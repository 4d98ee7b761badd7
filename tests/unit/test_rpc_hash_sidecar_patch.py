"""The project patch rpc-hash-sidecar reads the hash files rpc_hash_file writes, and trusts nothing else.

The patch is applied to ggml-rpc.cpp of the tree the demo builds (so it applies), and its file reader is
compiled into a small harness (no llama.cpp libraries: only the reader runs). The files come from the
project's engine; each way a file can stop describing its GGUF (other bytes, a rewrite in place with the
mtime put back, a copy renamed over it, the previous format) must make the reader refuse it, saying why,
and two files that disagree on a tensor (a draft model's tensor with the same name, size and first 4 KiB)
must leave that tensor to be hashed. The load names each file, used or ignored and why, for the
"weight hashes" line. The lab test (tests/integration/test_rpc_hash_file_load.py) runs the same
through llama-server.
"""
import hashlib
import os
import shutil
import subprocess

import gguf
import pytest
import yaml
from ansible.module_utils.minimax_spark_rpchashes import HashFiles

import make_tiny_m3 as tiny
from helpers import ROOT

PATCH = ROOT / "roles" / "build_llamacpp" / "files" / "patches" / "rpc-hash-sidecar.patch"
C_SOURCE = ROOT / "roles" / "build_llamacpp" / "files" / "minimax_fnv1a.c"
HARNESS = r'''
#include "ggml-rpc.cpp"
#include <cstdarg>
// the log goes to stderr (libggml-base is not linked)
extern "C" void ggml_log_internal(enum ggml_log_level, const char * format, ...) {
    va_list args;
    va_start(args, format);
    vfprintf(stderr, format, args);
    va_end(args);
}
int main(int argc, char ** argv) {
    rpc_hash_sidecar sc;
    if (argc == 3 && std::string(argv[1]) == "--load") {  // what a load reads from GGML_RPC_HASH_FILE
        setenv("GGML_RPC_HASH_FILE", argv[2], 1);
        rpc_hash_sidecar_load(sc);
        printf("hash files: %s\n", sc.files.c_str());
        return 0;
    }
    for (int i = 1; i < argc; i++) {
        size_t n = 0;
        std::string used;
        std::string why = rpc_hash_file_read(argv[i], sc, n, used);
        printf("file %zu %s\n", n, why.empty() ? ("ok: " + used).c_str() : why.c_str());
    }
    printf("map %zu ambiguous %zu\n", sc.hashes.size(), sc.ambiguous.size());
    return 0;
}
'''


def test_the_role_default_carries_this_patch_with_its_sha256():
    defaults = yaml.safe_load((ROOT / "roles" / "build_llamacpp" / "defaults" / "main.yml").read_text())
    [entry] = [p for p in defaults["build_llamacpp_project_patches"] if p["name"] == "rpc-hash-sidecar"]
    assert entry["sha256"] == hashlib.sha256(PATCH.read_bytes()).hexdigest()
    assert entry["src"].endswith("/files/patches/rpc-hash-sidecar.patch")


@pytest.fixture(scope="module")
def reader(tmp_path_factory, llamacpp_tree):
    cxx = shutil.which("g++") or shutil.which("c++")
    if not cxx or not shutil.which("patch"):
        pytest.skip("needs g++ and patch")
    work = tmp_path_factory.mktemp("patched")
    rpc = work / "ggml" / "src" / "ggml-rpc"
    rpc.mkdir(parents=True)
    shutil.copy(llamacpp_tree / "ggml" / "src" / "ggml-rpc" / "ggml-rpc.cpp", rpc)
    done = subprocess.run(["patch", "-p1", "--forward", "--batch", "-d", str(work), "-i", str(PATCH)],
                          capture_output=True, text=True)
    assert done.returncode == 0, "the patch does not apply to the demo's tree:\n" + done.stdout + done.stderr
    (work / "harness.cpp").write_text(HARNESS)
    out = work / "reader"
    # Only the reader runs: the rest of ggml is left unresolved (-z lazy: never bound).
    subprocess.run([cxx, "-std=c++17", "-O0", "-w", "-no-pie", "-I", str(rpc),
                    "-I", str(llamacpp_tree / "ggml/include"),
                    "-I", str(llamacpp_tree / "ggml/src"), "-I", str(llamacpp_tree / "ggml/src/ggml-rpc"),
                    str(work / "harness.cpp"), "-o", str(out), "-Wl,--unresolved-symbols=ignore-all", "-Wl,-z,lazy"],
                   check=True)
    return str(out)


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    out = tmp_path_factory.mktemp("fnv") / "libminimax_fnv1a.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(out), str(C_SOURCE)], check=True)
    return str(out)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "tiny.gguf"
    tiny.write_tiny_m3(path, template_text="{{ messages }}", layers=2, expert_ff=2688)
    return path


def _read(reader, *files):
    out = subprocess.run([reader, *map(str, files)], check=True, capture_output=True, text=True).stdout.splitlines()
    return [line.split(" ", 2)[1:] for line in out[:-1]], out[-1]


def _flip(path, offset):
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(-1, 1)
        handle.write(bytes([byte[0] ^ 0x55]))


def test_the_patch_reads_the_engines_file(reader, lib, pristine, tmp_path):
    model = tmp_path / "m.gguf"
    shutil.copy2(pristine, model)
    env = HashFiles([str(model)], library=lib).run()["env"]
    files, summary = _read(reader, env)
    assert files == [["3", "ok: size, mtime, inode and ctime of %s as recorded" % model]]
    assert summary.startswith("map 3 ambiguous 0")
    sha = "ab" * 32
    env = HashFiles([str(model)], library=lib, sha256={str(model): sha}).run()["env"]
    assert _read(reader, env)[0] == [["3", "ok: size, mtime, inode and ctime of %s as recorded, sha256 %s as the "
                                           "download verified it" % (model, sha[:16])]]


def test_a_stale_or_damaged_file_is_refused(reader, lib, pristine, tmp_path):
    model = tmp_path / "m.gguf"
    shutil.copy2(pristine, model)
    path = HashFiles([str(model)], library=lib).run()["env"]
    good = open(path).read()
    digit = good.index("\ntensor ") + 8
    damaged = {
        "digit": good[:digit] + ("0" if good[digit] != "0" else "1") + good[digit + 1:],
        "truncated": good[: len(good) // 2],
        "end": good[: good.rindex("end ")],
    }
    for name, text in damaged.items():
        (tmp_path / name).write_text(text)
    files, summary = _read(reader, *(tmp_path / n for n in damaged), tmp_path / "absent")
    assert files[0] == ["0", "corrupt (its end line does not match its content)"]
    assert files[1][0] == "0" and files[1][1].startswith("corrupt (")  # cut mid-line or after a line
    assert files[2:] == [["0", "corrupt (truncated)"], ["0", "cannot be read"]]
    assert summary == "map 0 ambiguous 0"

    # Same size, other bytes (the write moves the mtime): stale.
    big = next(t for t in gguf.GGUFReader(model).tensors if t.n_bytes > 10 << 20)
    _flip(model, int(big.data_offset) + 5000)
    assert os.path.getsize(model) == os.path.getsize(pristine)
    files, summary = _read(reader, path)
    assert files == [["0", "stale: %s is not the file it was made from (mtime, ctime differ)" % model]]
    assert summary == "map 0 ambiguous 0"


def _load(reader, env):
    return subprocess.run([reader, "--load", env], check=True, capture_output=True, text=True).stdout.strip()


def test_a_rewrite_with_the_mtime_put_back_or_a_copy_renamed_over_is_refused(reader, lib, pristine, tmp_path):
    """What cp -p, touch -r, rsync -t leave: same size and mtime. The ctime moved, or the inode is another."""
    model = tmp_path / "m.gguf"
    shutil.copy2(pristine, model)
    path = HashFiles([str(model)], library=lib).run()["env"]
    assert _load(reader, path) == "hash files: %s used (3 tensors; size, mtime, inode and ctime of %s as recorded)" % (
        path, model)
    st = os.stat(model)
    big = next(t for t in gguf.GGUFReader(model).tensors if t.n_bytes > 10 << 20)
    _flip(model, int(big.data_offset) + int(big.n_bytes) // 2)  # past its first 4 KiB: same head key
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (os.stat(model).st_size, os.stat(model).st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    why = "stale: %s is not the file it was made from (ctime differs)" % model
    assert _read(reader, path) == ([["0", why]], "map 0 ambiguous 0")
    assert _load(reader, path) == "hash files: %s ignored (%s)" % (path, why)

    path = HashFiles([str(model)], library=lib).run()["env"]
    copy = tmp_path / "copy.gguf"
    shutil.copy2(model, copy)
    os.rename(copy, model)
    files, _ = _read(reader, path)
    assert files[0][0] == "0" and files[0][1].startswith("stale: %s is not the file it was made from (inode" % model)


def test_the_previous_format_and_no_file_are_named(reader, tmp_path, pristine):
    old = tmp_path / "old.rpc-hashes"
    st = os.stat(pristine)
    old.write_text("ggml-rpc-hashes 1\ngguf %d %d %s\nend 0 0000000000000000\n" % (st.st_size, st.st_mtime_ns,
                                                                                    pristine))
    why = "written for another format ('ggml-rpc-hashes 1', this build reads 'ggml-rpc-hashes 2')"
    assert _read(reader, old)[0] == [["0", why]]
    assert _load(reader, "%s:%s" % (old, tmp_path / "absent")) == (
        "hash files: %s ignored (%s); %s ignored (cannot be read)" % (old, why, tmp_path / "absent"))
    assert _load(reader, ":") == "hash files: none (GGML_RPC_HASH_FILE names no file)"


def test_two_files_that_disagree_on_a_tensor_leave_it_to_be_hashed(reader, lib, pristine, tmp_path):
    target, draft = tmp_path / "target.gguf", tmp_path / "draft.gguf"
    shutil.copy2(pristine, target)
    shutil.copy2(pristine, draft)
    big = next(t for t in gguf.GGUFReader(draft).tensors if t.n_bytes > 10 << 20)
    _flip(draft, int(big.data_offset) + int(big.n_bytes) // 2)  # after its first 4 KiB: same key
    env = HashFiles([str(target), str(draft)], library=lib).run()["env"]
    files, summary = _read(reader, *env.split(":"))
    assert [n for n, _ in files] == ["3", "3"] and all(why.startswith("ok: ") for _, why in files)
    assert summary == "map 2 ambiguous 1"
