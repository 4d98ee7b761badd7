"""rpc_hash_file (module_utils/minimax_spark_rpchashes.py): the weight hashes llama.cpp's patched RPC client reads.

A wrong hash in the file would make a worker serve another tensor's bytes from its cache, so every
way the file can stop describing the GGUF (other mtime, same size with other bytes, bytes rewritten
in place with the mtime put back, a copy renamed over it, another sha256 from the download, a
corrupt or truncated file, the previous format) must make the engine write it again; the patch in
llama.cpp checks the same record.
"""
import os
import shutil
import subprocess

import gguf
import pytest
from ansible.module_utils.minimax_spark_rpccache import FNV_OFFSET, HASH_THRESHOLD, Hasher
from ansible.module_utils.minimax_spark_rpchashes import HEAD_BYTES, HashFiles, check, hash_file_for

import make_tiny_m3 as tiny
import rpc_hash_file
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


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    paths = []
    for seed in (0, 1):
        path = d / f"tiny-ff-{seed}.gguf"
        tiny.write_tiny_m3(path, template_text="{{ messages }}", layers=2, seed=seed, expert_ff=EXPERT_FF)
        paths.append(path)
    return paths


@pytest.fixture
def model(tmp_path, pristine):
    path = tmp_path / "model.gguf"
    shutil.copy2(pristine[0], path)
    return path


def _run(models, lib, check=False, **kw):
    args = dict(models=[str(m) for m in models], hash_library=lib, jobs=2)
    args.update(kw)
    return run_module(rpc_hash_file.main, args, check_mode=check)


def _entries(path):
    """{name: (hash, nbytes, head)} from a hash file."""
    out = {}
    for line in open(path).read().splitlines():
        if line.startswith("tensor "):
            _, h, n, head, name = line.split(" ", 4)
            out[name] = (int(h, 16), int(n), int(head, 16))
    return out


def _expected(model):
    h = Hasher()
    out = {}
    for t in gguf.GGUFReader(model).tensors:
        if int(t.n_bytes) > HASH_THRESHOLD:
            data = bytes(t.data.tobytes())
            out[t.name] = (h.hash_bytes(data), int(t.n_bytes), h.hash_bytes(data[:HEAD_BYTES]))
    return out


def test_hash_file_holds_each_large_tensor_and_a_rerun_changes_nothing(model, fnv_lib):
    plan = _run([model], fnv_lib, check=True)
    assert plan["changed"] and plan["written"] == [{"path": str(model) + ".rpc-hashes", "reason": "missing"}]
    assert not os.path.exists(hash_file_for(str(model))), "check mode wrote a file"

    first = _run([model], fnv_lib)
    path = hash_file_for(str(model))
    assert first["changed"] and first["files"] == [path] and first["env"] == path
    expected = _expected(model)
    assert len(expected) >= 2, "the tiny model has no tensor over 10 MiB: the test proves nothing"
    assert _entries(path) == expected
    assert first["tensors_hashed"] == len(expected)
    stamp = os.stat(path).st_mtime_ns

    again = _run([model], fnv_lib)
    assert not again["changed"] and again["written"] == [] and again["tensors_hashed"] == 0
    assert os.stat(path).st_mtime_ns == stamp
    assert not _run([model], fnv_lib, check=True)["changed"]


def test_a_changed_model_file_is_hashed_again(model, fnv_lib):
    _run([model], fnv_lib)
    path = hash_file_for(str(model))
    before = _entries(path)
    # Same size, other bytes: one byte in the middle of a large tensor (its head stays the same).
    name, (old_hash, nbytes, head) = next(iter(before.items()))
    tensor = next(t for t in gguf.GGUFReader(model).tensors if t.name == name)
    size = os.path.getsize(model)
    with open(model, "r+b") as handle:
        handle.seek(int(tensor.data_offset) + nbytes // 2)
        byte = handle.read(1)
        handle.seek(-1, 1)
        handle.write(bytes([byte[0] ^ 0xFF]))
    assert os.path.getsize(model) == size
    assert check(path, str(model), Hasher(fnv_lib)) == (
        False, "stale (%s is not the file it was made from: mtime, ctime differ)" % model)

    result = _run([model], fnv_lib)
    assert result["changed"] and result["written"][0]["reason"].startswith("stale")
    after = _entries(path)
    assert after[name][2] == head and after[name][0] != old_hash
    assert after == _expected(model)


def test_an_other_mtime_alone_makes_the_file_stale(model, fnv_lib):
    _run([model], fnv_lib)
    st = os.stat(model)
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    result = _run([model], fnv_lib)
    assert result["changed"] and result["written"][0]["reason"].startswith("stale")
    assert "gguf %d %d " % (st.st_size, st.st_mtime_ns + 1) in open(hash_file_for(str(model))).read()


@pytest.mark.parametrize("damage", ["digit", "truncated", "empty"])
def test_a_corrupt_hash_file_is_written_again(model, fnv_lib, damage):
    _run([model], fnv_lib)
    path = hash_file_for(str(model))
    good = open(path).read()
    if damage == "digit":
        line = next(x for x in good.splitlines() if x.startswith("tensor "))
        bad = good.replace(line, line[:7] + ("0" if line[7] != "0" else "1") + line[8:])
    elif damage == "truncated":
        bad = good[: len(good) // 2]
    else:
        bad = ""
    open(path, "w").write(bad)
    ok, why = check(path, str(model), Hasher(fnv_lib))
    assert not ok and why.startswith("corrupt")
    result = _run([model], fnv_lib)
    assert result["changed"] and result["written"][0]["reason"].startswith("corrupt")
    assert open(path).read() == good


def test_a_draft_and_a_target_with_the_same_tensor_names_are_told_apart(pristine, tmp_path, fnv_lib):
    target, draft = tmp_path / "target.gguf", tmp_path / "draft.gguf"
    shutil.copy2(pristine[0], target)
    shutil.copy2(pristine[1], draft)
    result = _run([target, draft], fnv_lib)
    assert result["env"] == "%s:%s" % (hash_file_for(str(target)), hash_file_for(str(draft)))
    a, b = _entries(hash_file_for(str(target))), _entries(hash_file_for(str(draft)))
    shared = set(a) & set(b)
    assert shared, "the two models share no tensor name: the test proves nothing"
    told_apart = 0
    for name in shared:
        assert a[name][1] == b[name][1]
        # Same name and size: either the key the patch looks up (name, size, head of 4 KiB) differs, or
        # the bytes are the same. (Same key, other bytes: the patch finds two hashes and hashes the tensor.)
        assert a[name][2] != b[name][2] or a[name][0] == b[name][0], name
        told_apart += a[name][2] != b[name][2]
    assert told_apart, "no shared tensor differs between the models: the test proves nothing"


def test_a_missing_model_fails_with_what_to_do(tmp_path, fnv_lib):
    result = _run([tmp_path / "nope.gguf"], fnv_lib)
    assert result["failed"]
    assert result["msg"] == ("rpc_hash_file: model %s does not exist: run the model_download tag first or fix the path"
                             % (tmp_path / "nope.gguf"))


def test_pure_python_refuses_a_large_model(model):
    result = _run([model], None, python_hash_max_bytes=1024)
    assert result["failed"]
    assert result["msg"].startswith("rpc_hash_file: refusing to hash") and "fnv1a_library" in result["msg"]
    assert not os.path.exists(hash_file_for(str(model)))


def test_head_hash_is_fnv_of_the_first_4_kib(model, fnv_lib):
    _run([model], fnv_lib)
    reader = gguf.GGUFReader(model)
    for name, (_, _, head) in _entries(hash_file_for(str(model))).items():
        t = next(t for t in reader.tensors if t.name == name)
        assert head == Hasher(fnv_lib).update(bytearray(t.data.tobytes()[:HEAD_BYTES]), HEAD_BYTES, FNV_OFFSET)


def _rewrite_past_the_head(model):
    """Flip a byte past the first 4 KiB of every tensor over 10 MiB, in place; the mtime put back (cp -p, touch -r)."""
    st = os.stat(model)
    with open(model, "r+b") as handle:
        for t in gguf.GGUFReader(model).tensors:
            if int(t.n_bytes) > HASH_THRESHOLD:
                handle.seek(int(t.data_offset) + HEAD_BYTES + int(t.n_bytes) // 3)
                byte = handle.read(1)
                handle.seek(-1, 1)
                handle.write(bytes([byte[0] ^ 0xFF]))
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = os.stat(model)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)
    return st


def test_a_rewrite_in_place_with_the_mtime_put_back_is_hashed_again(model, fnv_lib):
    first = _run([model], fnv_lib)
    path = hash_file_for(str(model))
    assert first["checked"] == [{"path": path, "model_file": str(model), "state": "written", "reason": "missing"}]
    before = _entries(path)
    _rewrite_past_the_head(model)
    why = "stale (%s is not the file it was made from: ctime differs)" % model
    assert check(path, str(model), Hasher(fnv_lib)) == (False, why)

    plan = _run([model], fnv_lib, check=True)
    assert plan["changed"] and plan["checked"][0]["state"] == "to write" and plan["checked"][0]["reason"] == why
    result = _run([model], fnv_lib)
    assert result["changed"] and result["written"] == [{"path": path, "reason": why}]
    assert result["msg"] == "1 hash files, 1 written (%d tensors, %.2f GiB hashed): %s written, %s" % (
        result["tensors_hashed"], result["bytes_hashed"] / 2.0 ** 30, path, why)
    after = _entries(path)
    assert after == _expected(model)
    # every large tensor has new bytes past its first 4 KiB: same head, new hash
    assert all(after[n][2] == before[n][2] and after[n][0] != before[n][0] for n in before)
    again = _run([model], fnv_lib)
    assert not again["changed"]
    assert again["checked"][0]["state"] == "kept" and again["checked"][0]["reason"].startswith("current (size, mtime")


def test_a_copy_renamed_over_the_model_is_hashed_again(model, fnv_lib, tmp_path):
    """cp -p to a temporary name, then mv over the model (rsync's default): same bytes, size and mtime, new inode."""
    _run([model], fnv_lib)
    copy = tmp_path / ".model.gguf.tmp"
    shutil.copy2(model, copy)
    os.rename(copy, model)
    ok, why = check(hash_file_for(str(model)), str(model), Hasher(fnv_lib))
    assert not ok and why.startswith("stale (%s is not the file it was made from: inode" % model), why
    result = _run([model], fnv_lib)
    assert result["changed"] and _entries(hash_file_for(str(model))) == _expected(model)


SHA_A, SHA_B = "a" * 64, "b" * 64


def test_the_sha256_the_download_verified_is_recorded_and_binds_the_file(model, fnv_lib):
    first = _run([model], fnv_lib, sha256={str(model): SHA_A})
    path = hash_file_for(str(model))
    assert first["changed"] and (" %s %s\n" % (SHA_A, model)) in open(path).read()
    kept = _run([model], fnv_lib, sha256={str(model): SHA_A})
    assert not kept["changed"]
    assert kept["checked"][0]["reason"] == (
        "current (size, mtime, inode and ctime as recorded, sha256 %s as the download verified it)" % SHA_A)
    # the download now verified other content for this path (a new revision): the hash file is not for it
    moved = _run([model], fnv_lib, sha256={str(model): SHA_B})
    assert moved["changed"] and moved["written"][0]["reason"] == (
        "stale (the download verified sha256 %s for %s, the hash file records %s)" % (SHA_B, model, SHA_A))
    assert (" %s %s\n" % (SHA_B, model)) in open(path).read()
    # a model file the download does not know (model_download_local_file) records none; a download verifying one
    # later is not taken for the content the file was made from
    os.unlink(path)
    _run([model], fnv_lib)
    assert " - %s\n" % model in open(path).read()
    later = _run([model], fnv_lib, sha256={str(model): SHA_A})
    assert later["changed"] and later["written"][0]["reason"] == (
        "stale (the download verified sha256 %s for %s, the hash file records none)" % (SHA_A, model))


def test_a_malformed_sha256_fails_with_what_to_fix(model, fnv_lib):
    result = _run([model], fnv_lib, sha256={str(model): "not-a-digest"})
    assert result["failed"] and result["msg"] == (
        "rpc_hash_file: sha256 of %s is 'not-a-digest': expected 64 lowercase hex digits (the download's record, "
        "ansible_local.minimax_model.sha256)" % model)
    assert not os.path.exists(hash_file_for(str(model)))


def test_a_hash_file_of_the_previous_format_is_written_again(model, fnv_lib):
    """Format 1 recorded only size and mtime: it cannot tell a rewrite that put the mtime back."""
    path = hash_file_for(str(model))
    st = os.stat(model)
    open(path, "w").write("ggml-rpc-hashes 1\ngguf %d %d %s\nend 0 0000000000000000\n"
                          % (st.st_size, st.st_mtime_ns, model))
    assert check(path, str(model), Hasher(fnv_lib)) == (
        False, "written for another format ('ggml-rpc-hashes 1', this version writes 'ggml-rpc-hashes 2')")
    assert _run([model], fnv_lib)["changed"] and _entries(path) == _expected(model)


def test_a_model_changed_while_it_is_hashed_is_refused_by_name(model, fnv_lib, monkeypatch):
    import ansible.module_utils.minimax_spark_rpchashes as engine

    real = engine._hash_tensor

    def hash_and_touch(hasher, shard, offset, size):
        os.utime(shard)  # a copy still being written
        return real(hasher, shard, offset, size)

    monkeypatch.setattr(engine, "_hash_tensor", hash_and_touch)
    with pytest.raises(engine.HashFileError, match="^%s changed while it was hashed: run again once it is complete$"
                       % str(model).replace(".", r"\.")):
        HashFiles([str(model)], library=fnv_lib, jobs=2).run()
    assert not os.path.exists(hash_file_for(str(model)))
