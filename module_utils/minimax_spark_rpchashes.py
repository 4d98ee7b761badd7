"""Hash files beside a GGUF for llama.cpp's RPC client (engine of ``rpc_hash_file``).

For every weight over 10 MiB, llama.cpp's RPC client sends the FNV-1a 64 hash of the tensor's bytes
first, so a worker whose cache (``ggml-rpc-server -c``) holds them receives nothing more. Stock
llama.cpp computes that hash on every load, one byte at a time on one core (~0.3 GB/s). The project
patch ``rpc-hash-sidecar`` (``build_llamacpp``) reads it instead from the files named in
``GGML_RPC_HASH_FILE``: this engine writes one per GGUF file (``<shard>.rpc-hashes``), hashing the
tensors in parallel through the C FNV-1a library the build role compiles.

A hash file is valid only for the exact file it was made from. It records the GGUF file's path, size,
mtime, inode and ctime (ns) and the sha256 the download verified (``-`` when the file did not come
through model_download): a rewrite in place that puts the mtime back (``cp -p``, ``touch -r``,
``rsync -t``) still moves the ctime, and a copy renamed over the file has another inode. Whatever
differs makes the file stale: this engine hashes the GGUF file again, and llama.cpp ignores the file
(and hashes the tensors itself), its log naming the file and why. Each tensor line holds the hash,
the tensor's size, the FNV-1a of its first 4 KiB (so a draft model's tensor of the same name and size
is told apart) and its name. The last line counts the tensor lines and carries the FNV-1a of every
byte before it, so a truncated or altered file is ignored too. The format is read by the patch in
``ggml-rpc.cpp``: change both together.
"""
from __future__ import annotations

import os
import re
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

MAGIC = "ggml-rpc-hashes 2"
#: What a hash file records of its GGUF file, in the order of its ``gguf`` line.
IDENTITY = ("size", "mtime", "inode", "ctime")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
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


def identity(st):
    """``(size, mtime_ns, inode, ctime_ns)`` of an ``os.stat`` result: what a hash file is bound to."""
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


def render(shard, ident, sha256, entries, hasher):
    """The file's text. ``ident``: :func:`identity` of the GGUF file; ``sha256``: the download's, or None;
    ``entries``: ``[(name, nbytes, head, hash)]`` in file order."""
    lines = [MAGIC, "gguf %d %d %d %d %s %s" % (tuple(ident) + (sha256 or "-", shard))]
    lines += ["tensor %016x %d %016x %s" % (h, n, head, name) for name, n, head, h in entries]
    body = "".join(line + "\n" for line in lines)
    return body + "end %d %016x\n" % (len(entries), _fnv_text(body, hasher))


def check(path, shard, hasher, sha256=None):
    """``(ok, why)``: whether the hash file at ``path`` is complete and made from ``shard`` exactly as it is now.

    ``sha256``: what the download verified for ``shard`` (None: unknown); a file made for another one is stale."""
    try:
        with open(path, encoding="utf-8", newline="\n") as handle:
            text = handle.read()
    except FileNotFoundError:
        return False, "missing"
    except (OSError, UnicodeDecodeError) as exc:
        return False, "unreadable (%s)" % exc
    lines = text.split("\n")
    if lines[0] != MAGIC and lines[0].startswith("ggml-rpc-hashes "):
        return False, "written for another format (%r, this version writes %r)" % (lines[0], MAGIC)
    if len(lines) < 4 or lines[0] != MAGIC or lines[-1] != "":
        return False, "corrupt (not a complete hash file)"
    end = lines[-2].split(" ")
    body = "".join(line + "\n" for line in lines[:-2])
    tensors = [line for line in lines[2:-2]]
    if (len(end) != 3 or end[0] != "end" or end[1] != str(len(tensors))
            or end[2] != "%016x" % _fnv_text(body, hasher)
            or not all(line.startswith("tensor ") for line in tensors)):
        return False, "corrupt (its end line does not match its content)"
    head = lines[1].split(" ", 6)
    try:
        st = os.stat(shard)
    except OSError as exc:
        return False, "its model file is unreadable (%s)" % exc
    if len(head) != 7 or head[0] != "gguf" or head[6] != shard:
        return False, "written for another model file"
    differ = [what for what, recorded, now in zip(IDENTITY, head[1:5], identity(st)) if recorded != str(now)]
    if differ:
        return False, "stale (%s is not the file it was made from: %s %s)" % (
            shard, ", ".join(differ), "differs" if len(differ) == 1 else "differ")
    recorded = None if head[5] == "-" else head[5]
    if sha256 and recorded != sha256:
        return False, "stale (the download verified sha256 %s for %s, the hash file records %s)" % (
            sha256, shard, recorded or "none")
    return True, "current (size, mtime, inode and ctime as recorded%s)" % (
        ", sha256 %s as the download verified it" % recorded if recorded else "")


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

    def __init__(self, models, library=None, jobs=0, python_max_bytes=PYTHON_HASH_MAX_BYTES, sha256=None):
        self.models = [m for m in models if m]
        #: GGUF file path -> the sha256 the download verified (model_download's fact)
        self.sha256 = {}
        for path, digest in (sha256 or {}).items():
            if digest and not SHA256_RE.match(str(digest)):
                raise HashFileError("sha256 of %s is %r: expected 64 lowercase hex digits (the download's record, "
                                    "ansible_local.minimax_model.sha256)" % (path, digest))
            if digest:
                self.sha256[os.path.normpath(path)] = str(digest)
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
        files, stale, checked, tensors_hashed, bytes_hashed = [], [], [], 0, 0
        plans = []
        for shard in self.shards():
            path = hash_file_for(shard)
            files.append(path)
            sha256 = self.sha256.get(os.path.normpath(shard))
            ok, why = check(path, shard, self.hasher, sha256)
            state = "kept" if ok else "written" if write else "to write"
            checked.append({"path": path, "model_file": shard, "state": state, "reason": why})
            if not ok:
                plans.append((shard, path, why, sha256))
        work = []
        for shard, path, why, sha256 in plans:
            stale.append({"path": path, "reason": why})
            work.append((shard, path, sha256, shard_tensors(shard)))
        todo = sum(size for _, _, _, ts in work for _, _, size in ts)
        if todo and not self.hasher.native and todo > self.python_max_bytes:
            why = ("the C library %s did not load (%s)" % (self.hasher.library, self.hasher.load_error)
                   if self.hasher.load_error else "no C FNV-1a library was given (hash_library)")
            raise HashFileError(
                "refusing to hash %.2f GiB of %s in pure Python (a few MB/s): %s. Run the build_llamacpp role (it "
                "records fnv1a_library in ansible_local.minimax_llamacpp)"
                % (todo / 2.0 ** 30, ", ".join(shard for shard, _, _, _ in work), why))
        if write:
            for shard, path, sha256, ts in work:
                before = identity(os.stat(shard))
                with ThreadPoolExecutor(self.jobs) as pool:
                    hashes = list(pool.map(lambda t, shard=shard: _hash_tensor(self.hasher, shard, t[1], t[2]), ts))
                if identity(os.stat(shard)) != before:
                    raise HashFileError("%s changed while it was hashed: run again once it is complete" % shard)
                entries = [(name, size, head, h) for (name, _, size), (head, h) in zip(ts, hashes)]
                text = render(shard, before, sha256, entries, self.hasher)
                write_atomic(path, text.encode("utf-8"), mode=0o644)
                tensors_hashed += len(ts)
                bytes_hashed += sum(size for _, _, size in ts)
        return {
            "changed": bool(work),
            "files": files,
            "env": ":".join(files),
            "written": stale,
            "checked": checked,
            "tensors_hashed": tensors_hashed,
            "bytes_hashed": bytes_hashed,
            "native": self.hasher.native,
        }
