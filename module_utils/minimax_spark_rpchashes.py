"""Hash files beside a GGUF for llama.cpp's RPC client (engine of ``rpc_hash_file``).

For every weight over 10 MiB, llama.cpp's RPC client sends the FNV-1a 64 hash of the tensor's bytes
first, so a worker whose cache (``ggml-rpc-server -c``) holds them receives nothing more. Stock
llama.cpp computes that hash on every load, one byte at a time on one core (~0.3 GB/s). The project
patch ``rpc-hash-sidecar`` (``build_llamacpp``) reads it instead from the files named in
``GGML_RPC_HASH_FILE``: this engine writes one per GGUF file (``<shard>.rpc-hashes``), hashing the
tensors in parallel through the C FNV-1a library the build role compiles.

The file (text) records the GGUF file's path, size and mtime in ns; llama.cpp ignores it when they
differ. Each tensor line holds the hash, the tensor's size, the FNV-1a of its first 4 KiB (so a draft
model's tensor of the same name and size is told apart) and its name. The last line counts the tensor
lines and carries the FNV-1a of every byte before it, so a truncated or altered file is ignored too.
The format is read by the patch in ``ggml-rpc.cpp``: change both together.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.minimax_spark_gguf import open_gguf, open_reader, split_shard_paths
from ansible.module_utils.minimax_spark_rpccache import (
    CHUNK,
    FNV_OFFSET,
    HASH_THRESHOLD,
    Hasher,
    SeedError,
    write_atomic,
)

MAGIC = "ggml-rpc-hashes 1"
SUFFIX = ".rpc-hashes"
#: The patch keys a tensor by the FNV-1a of this many leading bytes too.
HEAD_BYTES = 4096
#: Pure Python FNV runs at a few MB/s: refuse above this many bytes to hash.
PYTHON_HASH_MAX_BYTES = 256 * 1024 * 1024


class HashFileError(SeedError):
    """Something the caller has to fix; the message says what."""


def hash_file_for(shard):
    """Where the hash file of a GGUF file lives: beside it."""
    return shard + SUFFIX


def _fnv_text(text, hasher):
    return hasher.hash_bytes(text.encode("utf-8"))


def render(shard, size, mtime_ns, entries, hasher):
    """The file's text. ``entries``: ``[(name, nbytes, head, hash)]`` in file order."""
    lines = [MAGIC, "gguf %d %d %s" % (size, mtime_ns, shard)]
    lines += ["tensor %016x %d %016x %s" % (h, n, head, name) for name, n, head, h in entries]
    body = "".join(line + "\n" for line in lines)
    return body + "end %d %016x\n" % (len(entries), _fnv_text(body, hasher))


def check(path, shard, hasher):
    """``(ok, why)``: whether the hash file at ``path`` is complete and matches ``shard`` as it is now."""
    try:
        with open(path, encoding="utf-8", newline="\n") as handle:
            text = handle.read()
    except FileNotFoundError:
        return False, "missing"
    except (OSError, UnicodeDecodeError) as exc:
        return False, "unreadable (%s)" % exc
    lines = text.split("\n")
    if len(lines) < 4 or lines[0] != MAGIC or lines[-1] != "":
        return False, "corrupt (not a complete hash file)"
    end = lines[-2].split(" ")
    body = "".join(line + "\n" for line in lines[:-2])
    tensors = [line for line in lines[2:-2]]
    if (len(end) != 3 or end[0] != "end" or end[1] != str(len(tensors))
            or end[2] != "%016x" % _fnv_text(body, hasher)
            or not all(line.startswith("tensor ") for line in tensors)):
        return False, "corrupt (its end line does not match its content)"
    head = lines[1].split(" ", 3)
    try:
        st = os.stat(shard)
    except OSError as exc:
        return False, "its model file is unreadable (%s)" % exc
    if len(head) != 4 or head[0] != "gguf" or head[3] != shard:
        return False, "written for another model file"
    if head[1] != str(st.st_size) or head[2] != str(st.st_mtime_ns):
        return False, "stale (the model file's size or mtime changed)"
    return True, "current"


def _hash_tensor(hasher, shard, offset, size):
    """``(head, hash)``: FNV-1a of the first HEAD_BYTES and of all ``size`` bytes at ``offset``."""
    value, head = FNV_OFFSET, None
    buf = bytearray(min(CHUNK, max(size, 1)))
    view = memoryview(buf)
    with open(shard, "rb", buffering=0) as handle:
        handle.seek(offset)
        left = size
        while left > 0:
            got = handle.readinto(view[:min(left, len(buf))])
            if not got:
                raise HashFileError("%s ended %d bytes early (offset %d, size %d): truncated model file?"
                                    % (shard, left, offset, size))
            if head is None:
                head = hasher.update(buf, min(got, HEAD_BYTES, size), FNV_OFFSET)
            value = hasher.update(buf, got, value)
            left -= got
    return head, value


def shard_tensors(shard):
    """``[(name, offset, size)]`` of the tensors of one GGUF file that go through the RPC hash cache."""
    reader = open_reader(shard)
    try:
        return [(t.name, int(t.data_offset), int(t.n_bytes)) for t in reader.tensors if int(t.n_bytes) > HASH_THRESHOLD]
    finally:
        del reader


class HashFiles:
    """Plan and write the hash files of the models whose shard 1 (or single file) is in ``models``."""

    def __init__(self, models, library=None, jobs=0, python_max_bytes=PYTHON_HASH_MAX_BYTES):
        self.models = [m for m in models if m]
        self.hasher = Hasher(library)
        self.jobs = jobs or min(8, os.cpu_count() or 1)
        self.python_max_bytes = python_max_bytes

    def shards(self):
        out = []
        for model in self.models:
            if not os.path.isfile(model):
                raise HashFileError("model %s does not exist: run the model_download tag first or fix the path" % model)
            meta = open_gguf(model)
            for shard in split_shard_paths(model, meta.split_count):
                if not os.path.isfile(shard):
                    raise HashFileError("shard %s of %s is missing: run the model_download tag again" % (shard, model))
                if shard not in out:
                    out.append(shard)
        return out

    def run(self, write=True):
        """Check every hash file, (re)write the missing or stale ones; returns a summary dict."""
        files, stale, tensors_hashed, bytes_hashed = [], [], 0, 0
        plans = []
        for shard in self.shards():
            path = hash_file_for(shard)
            files.append(path)
            ok, why = check(path, shard, self.hasher)
            if not ok:
                plans.append((shard, path, why))
        work = []
        for shard, path, why in plans:
            stale.append({"path": path, "reason": why})
            work.append((shard, path, shard_tensors(shard)))
        todo = sum(size for _, _, ts in work for _, _, size in ts)
        if todo and not self.hasher.native and todo > self.python_max_bytes:
            why = ("the C library %s did not load (%s)" % (self.hasher.library, self.hasher.load_error)
                   if self.hasher.load_error else "no C FNV-1a library was given (hash_library)")
            raise HashFileError(
                "refusing to hash %.2f GiB in pure Python (a few MB/s): %s. Run the build_llamacpp role (it records "
                "fnv1a_library in ansible_local.minimax_llamacpp)" % (todo / 2.0 ** 30, why))
        if write:
            for shard, path, ts in work:
                before = os.stat(shard)
                with ThreadPoolExecutor(self.jobs) as pool:
                    hashes = list(pool.map(lambda t, shard=shard: _hash_tensor(self.hasher, shard, t[1], t[2]), ts))
                after = os.stat(shard)
                if (before.st_size, before.st_mtime_ns) != (after.st_size, after.st_mtime_ns):
                    raise HashFileError("%s changed while it was hashed: run again once it is complete" % shard)
                entries = [(name, size, head, h) for (name, _, size), (head, h) in zip(ts, hashes)]
                text = render(shard, before.st_size, before.st_mtime_ns, entries, self.hasher)
                write_atomic(path, text.encode("utf-8"), mode=0o644)
                tensors_hashed += len(ts)
                bytes_hashed += sum(size for _, _, size in ts)
        return {
            "changed": bool(work),
            "files": files,
            "env": ":".join(files),
            "written": stale,
            "tensors_hashed": tensors_hashed,
            "bytes_hashed": bytes_hashed,
            "native": self.hasher.native,
        }
