"""Seed llama.cpp's RPC tensor cache from a local copy of the GGUF (engine of ``rpc_cache_seed``).

How the cache works (``ggml-rpc.cpp``): for every weight tensor larger than 10 MiB the RPC client
computes FNV-1a 64 over the tensor's bytes and asks the server (``ggml-rpc-server -c``) whether
``$LLAMA_CACHE/rpc/<hash as %016x>`` exists; on a hit it sends nothing. The bytes the client sends
are the tensor's raw bytes in the GGUF, so a worker holding the GGUF can write those files itself.

The server trusts whatever file carries the name (a truncated or corrupt file changes the output),
so this engine writes every entry atomically (temporary file, fsync, rename), keeps a manifest of
size and hash per entry (``<cache_dir>/minimax-seed-manifest.json``) and verifies the entries on
every run: a bad entry is rewritten, never left behind. Entries the manifest lists that the current
model does not need (a previous model) are removed.

Hashing uses a tiny C library (``libminimax_fnv1a.so``, built by the build_llamacpp role) through
ctypes, in parallel across tensors; pure Python (a few MB/s) is only accepted up to a size cap.
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.minimax_spark_files import fsync_dir, write_atomic
from ansible.module_utils.minimax_spark_gguf import GGUFError, open_gguf, open_reader, split_shard_paths

#: ggml-rpc.cpp: tensors strictly larger than this go through the hash cache.
HASH_THRESHOLD = 10 * 1024 * 1024
FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
_MASK = 0xFFFFFFFFFFFFFFFF
#: Subfolder of LLAMA_CACHE the server looks in (rpc-server.cpp: fs_get_cache_directory() / "rpc").
RPC_SUBDIR = "rpc"
MANIFEST_NAME = "minimax-seed-manifest.json"
MANIFEST_VERSION = 1
TMP_PREFIX = ".minimax-seed-"
CHUNK = 8 * 1024 * 1024
#: Pure Python FNV runs at a few MB/s: refuse above this many bytes to hash.
PYTHON_HASH_MAX_BYTES = 256 * 1024 * 1024
_ENTRY_RE = re.compile(r"^[0-9a-f]{16}$")


class SeedError(Exception):
    """Something the caller has to fix; the message says what."""


# --- hashing --------------------------------------------------------------------------------------
def fnv1a64_python(data, value=FNV_OFFSET):
    """FNV-1a 64 of ``data`` continuing from ``value`` (pure Python, slow)."""
    for byte in bytes(data):
        value = ((value ^ byte) * FNV_PRIME) & _MASK
    return value


class Hasher:
    """FNV-1a 64 through the C library when one is given and loads, else pure Python."""

    def __init__(self, library=None):
        self.library = None
        self.load_error = None
        self._fn = None
        if library:
            try:
                lib = ctypes.CDLL(library)
                fn = lib.minimax_fnv1a64
                fn.restype = ctypes.c_uint64
                fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint64]
                self._fn = fn
                self.library = library
            except (OSError, AttributeError) as exc:
                self.load_error = "%s: %s" % (library, exc)

    @property
    def native(self):
        return self._fn is not None

    def update(self, buf, length, value):
        """Hash ``buf[:length]`` (a bytearray) continuing from ``value``. ctypes releases the GIL."""
        if self._fn is not None:
            if length == 0:
                return value
            ptr = (ctypes.c_char * len(buf)).from_buffer(buf)
            return self._fn(ctypes.addressof(ptr), length, value)
        return fnv1a64_python(memoryview(buf)[:length], value)

    def hash_bytes(self, data):
        buf = bytearray(data)
        return self.update(buf, len(buf), FNV_OFFSET)


def entry_name(value):
    """The cache file name llama.cpp uses for a hash (``%016`` PRIx64)."""
    return "%016x" % value


# --- the model's tensors --------------------------------------------------------------------------
def model_tensors(path, include=None, min_size=HASH_THRESHOLD):
    """Tensors of the model whose shard 1 is ``path`` that go through the hash cache.

    Returns ``(shards, tensors)``: shards ``[{path, size, mtime_ns}]`` and tensors
    ``[{name, shard, offset, size}]`` (absolute byte offset in the shard), in file order.
    ``include``: regular expressions on the tensor name (``re.search``); empty: every tensor.
    """
    meta = open_gguf(path)
    shard_paths = split_shard_paths(path, meta.split_count)
    try:
        patterns = [re.compile(p) for p in (include or [])]
    except re.error as exc:
        raise SeedError("include has a bad regular expression (%s): fix worker_rpc_seed_include" % exc) from exc
    shards, tensors = [], []
    for shard in shard_paths:
        try:
            st = os.stat(shard)
        except OSError as exc:
            raise SeedError("shard %s of %s is missing: %s" % (shard, path, exc.strerror or exc)) from exc
        shards.append({"path": shard, "size": st.st_size, "mtime_ns": st.st_mtime_ns})
        reader = open_reader(shard)
        for t in reader.tensors:
            size = int(t.n_bytes)
            if size <= min_size:
                continue
            if patterns and not any(p.search(t.name) for p in patterns):
                continue
            tensors.append({"name": t.name, "shard": shard, "offset": int(t.data_offset), "size": size})
        del reader
    return shards, tensors


# --- manifest -------------------------------------------------------------------------------------
def read_manifest(cache_dir):
    """The manifest, or an empty one (with a note) when it is missing or unreadable."""
    path = os.path.join(cache_dir, MANIFEST_NAME)
    empty = {"version": MANIFEST_VERSION, "shards": [], "tensors": {}, "entries": {}}
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return empty, None
    except (OSError, ValueError) as exc:
        return empty, "manifest %s unreadable (%s): every entry is verified again" % (path, exc)
    if not isinstance(data, dict) or data.get("version") != MANIFEST_VERSION:
        return empty, "manifest %s has an unknown format: every entry is verified again" % path
    for key in ("shards", "tensors", "entries"):
        data.setdefault(key, [] if key == "shards" else {})
    return data, None




# --- the seeding ----------------------------------------------------------------------------------
class Seeder:
    """Plan and run one seeding of ``<cache_dir>/rpc`` from the model at ``model``.

    ``write=False`` (check mode, state=estimate) reads but writes nothing. ``hash_sources=False``
    (state=estimate) does not read the model either: tensors whose hash the manifest does not know
    are counted as to be written (an upper bound).
    """

    def __init__(self, model, cache_dir, include=None, library=None, jobs=2, uid=-1, gid=-1,
                 verify="full", reserve_bytes=0, python_max_bytes=PYTHON_HASH_MAX_BYTES, min_size=HASH_THRESHOLD):
        self.model = model
        self.cache_dir = cache_dir
        self.rpc_dir = os.path.join(cache_dir, RPC_SUBDIR)
        self.include = include or []
        self.hasher = Hasher(library)
        self.jobs = max(1, int(jobs))
        self.uid, self.gid = uid, gid
        self.verify = verify
        self.reserve_bytes = reserve_bytes
        self.python_max_bytes = python_max_bytes
        self.min_size = min_size
        self.notes = []
        self._lock = threading.Lock()

    # -- reading ---------------------------------------------------------------------------------
    def _hash_file_range(self, path, offset, size, out_fd=None):
        """FNV-1a of ``size`` bytes of ``path`` at ``offset``; copies them to ``out_fd`` when given."""
        value = FNV_OFFSET
        buf = bytearray(min(CHUNK, max(size, 1)))
        view = memoryview(buf)
        with open(path, "rb", buffering=0) as handle:
            handle.seek(offset)
            left = size
            while left > 0:
                want = min(left, len(buf))
                got = handle.readinto(view[:want])
                if not got:
                    raise SeedError("%s ended %d bytes early (offset %d, size %d): truncated model file?"
                                    % (path, left, offset, size))
                value = self.hasher.update(buf, got, value)
                if out_fd is not None:
                    mv = view[:got]
                    while len(mv):
                        n = os.write(out_fd, mv)
                        mv = mv[n:]
                left -= got
        return value

    def _entry_ok(self, name, size):
        """(state, detail): 'ok', 'missing' or 'bad' for the entry file ``name`` of ``size`` bytes."""
        path = os.path.join(self.rpc_dir, name)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return "missing", None
        if st.st_size != size:
            return "bad", "size %d, expected %d" % (st.st_size, size)
        if self.verify == "size":
            return "ok", None
        got = entry_name(self._hash_file_range(path, 0, size))
        if got != name:
            return "bad", "content hashes to %s" % got
        return "ok", None

    def _write_entry(self, tensor):
        """Copy the tensor's bytes to a temporary file in rpc/, hashing them; (hash name, tmp path)."""
        tmp = os.path.join(self.rpc_dir, "%s%s-%d-%d" % (TMP_PREFIX, re.sub(r"[^A-Za-z0-9_.]", "_", tensor["name"]),
                                                           os.getpid(), threading.get_ident()))
        fd_tmp = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            try:
                value = self._hash_file_range(tensor["shard"], tensor["offset"], tensor["size"], out_fd=fd_tmp)
                os.fsync(fd_tmp)
                if self.uid != -1 or self.gid != -1:
                    os.fchown(fd_tmp, self.uid, self.gid)
            finally:
                os.close(fd_tmp)
        except BaseException:
            _unlink(tmp)
            raise
        return entry_name(value), tmp

    # -- planning --------------------------------------------------------------------------------
    def _check_hash_budget(self, nbytes):
        if self.hasher.native or nbytes <= self.python_max_bytes:
            return
        why = ("the C library %s did not load (%s)" % (self.hasher.library, self.hasher.load_error)
               if self.hasher.load_error else "no C FNV-1a library was given (hash_library)")
        raise SeedError(
            "refusing to hash %.2f GiB in pure Python (a few MB/s: about %d minutes): %s. Run the build_llamacpp "
            "role (it builds libminimax_fnv1a.so and records it as fnv1a_library in ansible_local.minimax_llamacpp) "
            "or raise python_hash_max_bytes above %d"
            % (nbytes / 2.0 ** 30, -(-nbytes // (3 * 10 ** 6 * 60)), why, self.python_max_bytes))

    def run(self, write=True, hash_sources=True):
        shards, tensors = model_tensors(self.model, self.include, self.min_size)
        manifest, note = read_manifest(self.cache_dir)
        if note:
            self.notes.append(note)
        known_shards = {s["path"]: s for s in manifest.get("shards", [])}
        unchanged = set(
            s["path"] for s in shards
            if known_shards.get(s["path"], {}).get("size") == s["size"]
            and known_shards.get(s["path"], {}).get("mtime_ns") == s["mtime_ns"]
        )
        old_tensors = manifest.get("tensors", {})
        old_entries = manifest.get("entries", {})

        def tkey(t):
            return "%s@%d+%d" % (t["shard"], t["offset"], t["size"])

        known, unknown = {}, []  # hash name -> size; tensors to hash
        tensor_hash = {}
        for t in tensors:
            h = old_tensors.get(tkey(t)) if t["shard"] in unchanged else None
            if h and old_entries.get(h, {}).get("size") == t["size"]:
                known.setdefault(h, t)
                tensor_hash[tkey(t)] = h
            else:
                unknown.append(t)

        total_bytes = sum(t["size"] for t in tensors)
        unique_known = sum(t["size"] for t in known.values())
        report = {
            "cache_dir": self.cache_dir, "model": self.model, "tensors": len(tensors),
            "tensor_bytes": total_bytes, "hash_library": self.hasher.library,
            "seeded": [], "reused": [], "rewritten": [], "removed": [],
        }

        # Verify what the manifest knows (reading only).
        states = {}
        verify_bytes = unique_known if self.verify == "full" else 0
        if hash_sources:
            self._check_hash_budget(verify_bytes + sum(t["size"] for t in unknown))
            with ThreadPoolExecutor(self.jobs) as pool:
                for h, st in zip(known, pool.map(lambda h: self._entry_ok(h, known[h]["size"]), known)):
                    states[h] = st
        else:
            for h in known:
                states[h] = self._entry_ok_size(h, known[h]["size"])

        bad_known = [h for h in known if states[h][0] != "ok"]
        to_write_bytes = sum(known[h]["size"] for h in bad_known) + sum(t["size"] for t in unknown)

        # Old entries (a previous model): listed in the manifest, not needed now.
        # Hashes of the unknown tensors are not known yet: decide after hashing (see below).
        free = _free_bytes(self.cache_dir)
        report.update({
            "to_write_bytes_max": to_write_bytes, "disk_free_bytes": free,
            "reserve_bytes": self.reserve_bytes,
        })
        old_bytes = sum(int(e.get("size", 0)) for h, e in old_entries.items() if h not in known)
        fits = free is None or to_write_bytes + self.reserve_bytes <= free + old_bytes
        report["fits"] = fits

        if not write:
            report["dirs_changed"] = self.prepare_dirs(apply=False)
        if not hash_sources:
            # estimate: nothing read but sizes.
            report["estimate"] = True
            report["would_write_tensors"] = len(bad_known) + len(unknown)
            report["would_reuse"] = sorted(h for h in known if states[h][0] == "ok")
            return report
        if write and not fits:
            raise SeedError(
                "the RPC cache for %s needs up to %.2f GiB more in %s, which has %.2f GiB free (%.2f GiB kept free, "
                "%.2f GiB of old entries to remove): free disk space, set worker_rpc_cache_dir to a bigger disk or "
                "turn seeding off (worker_rpc_seed: false)"
                % (self.model, to_write_bytes / 2.0 ** 30, self.cache_dir, free / 2.0 ** 30,
                   self.reserve_bytes / 2.0 ** 30, old_bytes / 2.0 ** 30))

        if write:
            report["dirs_changed"] = self.prepare_dirs()
            if free is not None and to_write_bytes + self.reserve_bytes > free:
                # Make room first: entries of a previous model go before the new ones are written
                # (one the new model shares is written again).
                for h in sorted(old_entries):
                    if h not in known:
                        _unlink(os.path.join(self.rpc_dir, h))

        new_entries = {}
        for h in known:
            st, detail = states[h]
            if st == "ok":
                report["reused"].append(h)
                new_entries[h] = {"size": known[h]["size"], "tensor": known[h]["name"]}
            else:
                unknown.append(known[h])
                if st == "bad":
                    self.notes.append("entry %s (%s) is bad (%s): rewritten" % (h, known[h]["name"], detail))

        # Hash (and in seed mode write) every tensor whose entry is not known good.
        seen_bad = set(h for h in known if states[h][0] == "bad")
        done = set(new_entries)

        def work(t):
            if write:
                return self._write_entry(t)
            return entry_name(self._hash_file_range(t["shard"], t["offset"], t["size"])), None

        with ThreadPoolExecutor(self.jobs) as pool:
            results = list(pool.map(work, unknown))
        for t, (h, tmp) in zip(unknown, results):
            tensor_hash[tkey(t)] = h
            if h in done:
                _unlink(tmp)
                continue
            done.add(h)
            new_entries[h] = {"size": t["size"], "tensor": t["name"]}
            if h in seen_bad:
                state = "bad"
            else:
                state, detail = self._entry_ok(h, t["size"])
                if state == "bad":
                    self.notes.append("entry %s (%s) is bad (%s): rewritten" % (h, t["name"], detail))
            if state == "ok":
                _unlink(tmp)
                report["reused"].append(h)
            else:
                report["rewritten" if state == "bad" else "seeded"].append(h)
                if tmp:
                    os.rename(tmp, os.path.join(self.rpc_dir, h))

        for h in sorted(old_entries):
            if h in new_entries:
                continue
            report["removed"].append(h)
            if write:
                _unlink(os.path.join(self.rpc_dir, h))
        if write:
            stale = [n for n in _listdir(self.rpc_dir) if n.startswith(TMP_PREFIX)]
            for n in stale:
                _unlink(os.path.join(self.rpc_dir, n))
            fsync_dir(self.rpc_dir)
        new_manifest = {
            "version": MANIFEST_VERSION, "model": self.model, "include": self.include,
            "shards": shards, "tensors": dict(sorted(tensor_hash.items())),
            "entries": dict(sorted(new_entries.items())),
        }
        data = json.dumps(new_manifest, indent=1, sort_keys=True).encode("utf-8")
        manifest_path = os.path.join(self.cache_dir, MANIFEST_NAME)
        old = None
        try:
            with open(manifest_path, "rb") as handle:
                old = handle.read()
        except OSError:
            pass
        report["manifest_changed"] = old != data
        if write and old != data:
            write_atomic(manifest_path, data, mode=0o600, uid=self.uid, gid=self.gid)
        for key in ("seeded", "reused", "rewritten", "removed"):
            report[key] = sorted(report[key])
        report["entries"] = len(new_entries)
        report["entry_bytes"] = sum(e["size"] for e in new_entries.values())
        return report

    def _entry_ok_size(self, name, size):
        try:
            st = os.stat(os.path.join(self.rpc_dir, name))
        except FileNotFoundError:
            return "missing", None
        return ("ok", None) if st.st_size == size else ("bad", "size %d, expected %d" % (st.st_size, size))

    def prepare_dirs(self, apply=True):
        """cache_dir and rpc/ exist, owned by the service, mode 0700 (FNV is not collision-resistant,
        so nobody else may plant an entry). Returns whether anything was (or would be) changed."""
        changed = False
        for d in (self.cache_dir, self.rpc_dir):
            if not os.path.isdir(d):
                changed = True
                if not apply:
                    continue
                os.makedirs(d, 0o700)
            st = os.stat(d)
            wrong_owner = (self.uid != -1 and st.st_uid != self.uid) or (self.gid != -1 and st.st_gid != self.gid)
            if st.st_mode & 0o7777 != 0o700 or wrong_owner:
                changed = True
                if apply:
                    os.chmod(d, 0o700)
                    if wrong_owner:
                        os.chown(d, self.uid, self.gid)
        return changed


def _free_bytes(path):
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    try:
        st = os.statvfs(path or "/")
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _unlink(path):
    if not path:
        return
    try:
        os.unlink(path)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise


def _listdir(path):
    try:
        return os.listdir(path)
    except OSError:
        return []


__all__ = ["HASH_THRESHOLD", "GGUFError", "Hasher", "SeedError", "Seeder", "entry_name", "fnv1a64_python",
           "model_tensors", "read_manifest"]
