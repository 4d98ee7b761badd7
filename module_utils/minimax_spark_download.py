"""The hf_download engine, part 1: ranges, the partial file and its journal, hashing.

Used by library/hf_download.py through minimax_spark_download_run; importable and testable without Ansible's
module wrapper (nothing here touches AnsibleModule).
"""
from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import threading

from ansible.module_utils.minimax_spark_files import write_atomic

HASH_BLOCK = 8 << 20
CHECKPOINT_INTERVAL = 2.0  # seconds between two journal checkpoints (fdatasync, then the journal)
FLUSH_INTERVAL = 1.0  # longest a connection keeps received bytes in its buffer before writing them
RELEASE_BLOCK = 64 << 20  # hashed bytes handed back to the kernel at a time
HAS_PREADV = hasattr(os, "preadv")
HAS_FADVISE = hasattr(os, "posix_fadvise") and hasattr(os, "POSIX_FADV_DONTNEED")
JOURNAL_VERSION = 1
MAX_LINK_REFRESHES = 100
MIN_PIECE = 1 << 20  # smallest range worth a request of its own


class DownloadError(Exception):
    """A failure reported to the user through fail_json."""


class DiskError(DownloadError):
    """Writing the partial file failed (disk full, I/O error): reported at once, never retried as a network error."""


class RangeIgnored(Exception):
    """The server answered 200 (whole body) to a range request: switch to a single stream."""


# -- small pure helpers -------------------------------------------------------------------------------
def human(num):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(num) < 1024 or unit == "TiB":
            return "%.1f %s" % (num, unit) if unit != "B" else "%d B" % num
        num /= 1024.0
    return str(num)


def select_entries(entries, include, exclude):
    """Entries whose path matches one include pattern and no exclude pattern, in repo order."""
    chosen = []
    for entry in entries:
        if any(fnmatch.fnmatchcase(entry.path, pat) for pat in include) and not any(
            fnmatch.fnmatchcase(entry.path, pat) for pat in exclude
        ):
            chosen.append(entry)
    return chosen


def hidden_beside(path, suffix):
    return path.parent / (".%s%s" % (path.name, suffix))


def write_json_atomic(path, data, durable=True):
    """Write a small JSON file atomically (readers never see half a file); see minimax_spark_files."""
    write_atomic(path, json.dumps(data), mode=0o644, durable=durable)


class RangeSet:
    """Sorted, merged half-open byte intervals [start, end)."""

    def __init__(self, ranges=()):
        self.ranges = []
        for start, end in ranges:
            self.add(start, end)

    def add(self, start, end):
        if end <= start:
            return
        merged, placed = [], False
        for s, e in self.ranges:
            if e < start:
                merged.append([s, e])
            elif s > end:
                if not placed:
                    merged.append([start, end])
                    placed = True
                merged.append([s, e])
            else:
                start, end = min(s, start), max(e, end)
        if not placed:
            merged.append([start, end])
        self.ranges = merged

    def total(self):
        return sum(e - s for s, e in self.ranges)

    def prefix_end(self):
        return self.ranges[0][1] if self.ranges and self.ranges[0][0] == 0 else 0

    def gaps(self, size):
        out, pos = [], 0
        for s, e in self.ranges:
            if s > pos:
                out.append((pos, min(s, size)))
            pos = max(pos, e)
        if pos < size:
            out.append((pos, size))
        return out

    def copy(self):
        return RangeSet([tuple(r) for r in self.ranges])


def split_ranges(gaps, part_size):
    """The gaps cut into pieces of at most part_size, in file order."""
    return [(pos, min(pos + part_size, end)) for start, end in gaps for pos in range(start, end, part_size)]


# -- hashing and the verification cache ---------------------------------------------------------------
class ContentHash:
    """sha256 of a content, plus its git blob sha1 for non-LFS files (the only checksum the Hub gives them)."""

    def __init__(self, size, want_git):
        self.sha256 = hashlib.sha256()
        self.git = hashlib.sha1(b"blob %d\0" % size) if want_git else None

    def update(self, data):
        self.sha256.update(data)
        if self.git is not None:
            self.git.update(data)

    def matches(self, entry):
        if entry.sha256:
            return self.sha256.hexdigest() == entry.sha256
        return self.git is not None and self.git.hexdigest() == entry.git_oid

    def describe(self, entry):
        if entry.sha256:
            return "sha256 %s, expected %s" % (self.sha256.hexdigest(), entry.sha256)
        return "git oid %s, expected %s" % (self.git.hexdigest() if self.git else "?", entry.git_oid)


def hash_file(path, entry):
    digest = ContentHash(entry.size, not entry.is_lfs)
    with open(path, "rb", buffering=0) as handle:
        buf = bytearray(HASH_BLOCK)
        view = memoryview(buf)
        while True:
            n = handle.readinto(buf)
            if not n:
                break
            digest.update(view[:n])
    return digest


def read_sidecar(path):
    try:
        return json.loads(hidden_beside(path, ".verified").read_text())
    except (OSError, ValueError):
        return None


def sidecar_matches(data, stat, entry):
    if not isinstance(data, dict):
        return False
    same_file = data.get("size") == stat.st_size and data.get("mtime_ns") == stat.st_mtime_ns
    if entry.sha256:
        return same_file and data.get("sha256") == entry.sha256
    return same_file and data.get("git_oid") == entry.git_oid


def write_sidecar(path, entry, sha256):
    stat = path.stat()
    data = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": sha256, "git_oid": entry.git_oid}
    write_json_atomic(hidden_beside(path, ".verified"), data)


def present_and_valid(path, entry, use_cache, check_mode):
    """(valid, sha256) for a file at its final path: cached sidecar first, then a full hash."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return False, None
    if stat.st_size != entry.size:
        return False, None
    sidecar = read_sidecar(path)
    if use_cache and sidecar_matches(sidecar, stat, entry):
        return True, sidecar["sha256"]
    digest = hash_file(path, entry)
    if not digest.matches(entry):
        return False, None
    sha256 = digest.sha256.hexdigest()
    if not check_mode:
        write_sidecar(path, entry, sha256)
    return True, sha256


# -- the partial file and its journal ------------------------------------------------------------------
class PartialFile:
    """One preallocated partial file written at offsets by several threads, with a journal of done ranges.

    The journal only ever lists bytes already synced to disk (snapshot, fdatasync, then journal), so after a
    kill or a power cut a rerun refetches at most what arrived since the last checkpoint.
    """

    def __init__(self, final, entry, commit):
        self.final = final
        self.entry = entry
        self.commit = commit
        self.path = hidden_beside(final, ".partial")
        self.journal = hidden_beside(final, ".partial.json")
        self.done = RangeSet()
        self.fd = None
        self.lock = threading.Lock()
        # Buffered writes to one file are serialised by the kernel (the inode lock); queueing on this lock
        # instead lets a waiting thread sleep rather than spin in the kernel and burn a core.
        self.write_lock = threading.Lock()
        self.advanced = threading.Event()  # set when the done prefix grows (wakes the hasher)

    def resumable_ranges(self):
        """Done ranges from a journal matching this file's content, else None."""
        try:
            data = json.loads(self.journal.read_text())
            if (
                data.get("version") == JOURNAL_VERSION
                and data.get("size") == self.entry.size
                and data.get("sha256") == self.entry.sha256
                and data.get("git_oid") == (None if self.entry.sha256 else self.entry.git_oid)
                and self.path.stat().st_size == self.entry.size
            ):
                return RangeSet(data.get("done", []))
        except (OSError, ValueError, TypeError):
            pass
        return None

    def bytes_on_disk(self):
        ranges = self.resumable_ranges()
        return ranges.total() if ranges else 0

    def allocated(self):
        try:
            return self.path.stat().st_blocks * 512
        except (OSError, AttributeError):
            return 0

    def open(self):
        """Open (resuming when the journal matches) and size the partial file; returns the done ranges."""
        self.final.parent.mkdir(parents=True, exist_ok=True)
        ranges = self.resumable_ranges()
        if ranges is None:
            self.remove()
            ranges = RangeSet()
        self.done = ranges
        try:
            self.fd = os.open(str(self.path), os.O_RDWR | os.O_CREAT, 0o644)
            os.ftruncate(self.fd, self.entry.size)
        except OSError as exc:
            raise DiskError("Creating %s (%d bytes) failed: %s."
                            % (self.path, self.entry.size, exc.strerror or exc)) from exc
        return ranges.copy()

    def write(self, offset, data):
        """Write ``data`` (any buffer) at ``offset`` with pwrite on the shared descriptor, then record it."""
        view = memoryview(data)
        written = 0
        try:
            with self.write_lock:
                while written < len(view):
                    written += os.pwrite(self.fd, view[written:], offset + written)
        except OSError as exc:
            raise DiskError("Writing %s failed at offset %d: %s."
                            % (self.path, offset + written, exc.strerror or exc)) from exc
        with self.lock:
            prefix = self.done.prefix_end()
            self.done.add(offset, offset + len(view))
            grew = self.done.prefix_end() != prefix
        if grew:
            self.advanced.set()

    def prefix_end(self):
        with self.lock:
            return self.done.prefix_end()

    def done_bytes(self):
        with self.lock:
            return self.done.total()

    def checkpoint(self):
        if self.fd is None:
            return
        with self.lock:
            snapshot = [list(r) for r in self.done.ranges]
        try:
            os.fdatasync(self.fd)
        except OSError as exc:
            raise DiskError("Saving %s failed: %s." % (self.path, exc.strerror or exc)) from exc
        try:
            self._write_journal(snapshot)
        except OSError as exc:
            raise DiskError("Writing the journal %s failed: %s." % (self.journal, exc.strerror or exc)) from exc

    def _write_journal(self, snapshot):
        write_json_atomic(
            self.journal,
            {
                "version": JOURNAL_VERSION,
                "path": self.entry.path,
                "commit": self.commit,
                "size": self.entry.size,
                "sha256": self.entry.sha256,
                "git_oid": None if self.entry.sha256 else self.entry.git_oid,
                "done": snapshot,
            },
        )

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def remove(self):
        self.close()
        for path in (self.path, self.journal):
            if path.exists():
                path.unlink()


class PrefixHasher(threading.Thread):
    """Hashes the partial file's contiguous done prefix while the download runs, then the rest at the end.

    Woken whenever the prefix grows; reads into one reusable buffer (no allocation per block) and hashlib
    releases the GIL on large buffers, so hashing runs beside the connections. The hashed prefix is never read
    again, so it is handed back to the kernel as it goes: its writeback starts at once, so the disk writes
    spread over the download instead of all waiting for the final fdatasync, and a block later its pages
    are dropped, so a 100 GB download does not fill the page cache (the memory llama.cpp needs) and writes
    go into recently freed memory. The journal still only records what an fdatasync made durable.
    """

    def __init__(self, partial):
        super().__init__(daemon=True, name="hasher")
        self.partial = partial
        self.digest = ContentHash(partial.entry.size, not partial.entry.is_lfs)
        self.pos = 0
        self.released = 0  # the hashed prefix handed back to the kernel (its writeback started)
        self.dropped = 0  # the part of it handed back twice (written back by then, so dropped from the cache)
        self.error = None
        self._halt = threading.Event()
        self._view = memoryview(bytearray(HASH_BLOCK))

    def _read(self, size, offset):
        view = self._view[:size]
        if HAS_PREADV:
            return view[: os.preadv(self.partial.fd, [view], offset)]
        data = os.pread(self.partial.fd, size, offset)
        view[: len(data)] = data
        return view[: len(data)]

    def _hash_to(self, end):
        while self.pos < end:
            data = self._read(min(HASH_BLOCK, end - self.pos), self.pos)
            if not data:
                raise DownloadError("Cannot read back %s at offset %d." % (self.partial.path, self.pos))
            self.digest.update(data)
            self.pos += len(data)
            if self.pos - self.released >= RELEASE_BLOCK or self.pos == self.partial.entry.size:
                self._release()

    def _release(self):
        """posix_fadvise DONTNEED from the block handed back last time: it is written back by now (usually), so
        its pages are dropped; the block just hashed is still dirty, so its writeback starts (a hint only)."""
        if HAS_FADVISE and self.pos > self.dropped:
            try:
                os.posix_fadvise(self.partial.fd, self.dropped, self.pos - self.dropped, os.POSIX_FADV_DONTNEED)
            except OSError:
                pass  # only a hint
        self.dropped, self.released = self.released, self.pos

    def run(self):
        advanced = self.partial.advanced
        try:
            while not self._halt.is_set():
                end = self.partial.prefix_end()
                if end > self.pos:
                    self._hash_to(end)
                else:
                    advanced.wait(0.5)
                    advanced.clear()
        except Exception as exc:  # pylint: disable=broad-except
            self.error = exc

    def cancel(self):
        self._halt.set()
        self.partial.advanced.set()
        if self.is_alive():
            self.join()

    def finish(self):
        """Stop following the download and hash whatever is left; the content hash."""
        self.cancel()
        if self.error:
            raise self.error
        self._hash_to(self.partial.entry.size)
        return self.digest
