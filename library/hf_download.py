#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Resumable, verified, parallel download of files from a Hugging Face model repo."""
from __future__ import annotations

DOCUMENTATION = r"""
---
module: hf_download
short_description: Download files of a Hugging Face model repo, resumably, in parallel, verified by sha256
description:
  - Resolves O(revision) to a commit, lists the repo's files with their sizes and sha256 from the tree API and
    downloads those matching O(include) below O(dest), keeping their repo paths.
  - Each file is fetched with O(connections) parallel range requests into one partial file beside the
    destination (C(.<name>.partial), with a JSON journal C(.<name>.partial.json)). A killed or failed run resumes
    from what the journal says is on disk. Expired signed links are resolved again, 429 answers are retried
    after their Retry-After, truncated, reset or stalled connections are retried from the last byte received,
    and a server that ignores Range is read as a single stream.
  - A file takes its final name (atomic rename) only after its size and sha256 match the Hub's. A mismatch
    downloads the file once more, then fails; a corrupt file never reaches the final path.
  - A file already present with the right size and sha256 is not touched. The verification is cached in a
    sidecar C(.<name>.verified) (size, mtime, sha256) so reruns do not hash hundreds of GB again.
  - The token is sent to the Hub host only, never to the CDN that serves the bytes.
version_added: "1.0.0"
author: minimax-spark
requirements:
  - requests (with urllib3) on the managed node
options:
  repo:
    description: Repo id, C(owner/name).
    type: str
    required: true
  revision:
    description: Branch, tag or commit sha. Resolved to a commit once; every file is fetched at that commit.
    type: str
    default: main
  include:
    description:
      - Glob patterns (fnmatch, C(*) also matches C(/)) on repo paths; a file is downloaded when one matches.
      - The module fails when no file of the repo matches.
    type: list
    elements: str
    default: ['*']
  exclude:
    description: Glob patterns of repo paths to leave out, applied after O(include).
    type: list
    elements: str
    default: []
  dest:
    description: Directory the files go to; each file keeps its repo path below it.
    type: path
    required: true
  endpoint:
    description: Hub URL. Defaults to the environment variable E(HF_ENDPOINT), then C(https://huggingface.co).
    type: str
  token:
    description:
      - Hub token (needed for gated and private repos). Defaults to the environment variable E(HF_TOKEN).
      - Sent to the Hub host only, never to the CDN; never returned or logged.
    type: str
  connections:
    description: Parallel range requests per file.
    type: int
    default: 16
  part_size:
    description: Bytes each range request asks for (the unit of work handed to a connection).
    type: int
    default: 67108864
  buffer_size:
    description:
      - Bytes each connection collects in its own reusable buffer (socket reads go straight into it) before
        writing them to disk with one call. Memory used is about O(connections) times this.
      - A slow connection does not wait for a full buffer: what it received is written about once a second,
        and always before the connection is retried or given up.
    type: int
    default: 4194304
  stall_timeout:
    description: Seconds a connection may go without receiving a byte before it is dropped and retried.
    type: float
    default: 60
  connect_timeout:
    description: Seconds to wait for a TCP/TLS connection.
    type: float
    default: 30
  max_retries:
    description:
      - Consecutive failed attempts (errors, expired links, 429, truncated bodies) of one range without any byte
        received before the download fails. Any progress resets the count.
    type: int
    default: 10
  max_retry_after:
    description: Longest wait, in seconds, honoured from a Retry-After header.
    type: float
    default: 120
  progress_file:
    description:
      - JSON file rewritten every O(progress_interval) seconds while the module runs (state, bytes done, total,
        percent, MB/s, current file), for a role polling an async run. Not written in check mode.
    type: path
  progress_interval:
    description: Seconds between two writes of O(progress_file).
    type: float
    default: 5
  verify_cache:
    description:
      - Trust the C(.<name>.verified) sidecar of a present file whose size and mtime did not change, instead of
        hashing it again. V(false) hashes every present file.
    type: bool
    default: true
notes:
  - Supports check mode (reports what would be downloaded, writes nothing) and diff mode.
  - Files over 50 GB are fine: there is no size limit and no whole-file buffering.
"""

EXAMPLES = r"""
- name: Download the UD-IQ4_XS shards of MiniMax-M3
  hf_download:
    repo: unsloth/MiniMax-M3-GGUF
    include: ["UD-IQ4_XS/*.gguf"]
    dest: /var/lib/minimax-spark/models
    token: "{{ hf_token | default(omit) }}"
    progress_file: /var/lib/minimax-spark/models/.hf_download.progress.json
  async: 21600
  poll: 0
  register: model_job
"""

RETURN = r"""
commit:
  description: Commit the revision resolved to; every file was fetched at it.
  returned: always
  type: str
files:
  description: The selected files.
  returned: always
  type: list
  elements: dict
  contains:
    path: {description: Repo path, type: str}
    dest: {description: Local path, type: str}
    size: {description: Size in bytes, type: int}
    sha256: {description: sha256 of the content, type: str}
    changed: {description: Whether this run downloaded (or would download) the file, type: bool}
bytes_downloaded:
  description: Bytes received from the network by this run (0 when nothing changed and in check mode).
  returned: always
  type: int
bytes_to_download:
  description: Bytes still missing before the run (what check mode would fetch).
  returned: always
  type: int
total_bytes:
  description: Size of all selected files.
  returned: always
  type: int
elapsed:
  description: Seconds the module ran.
  returned: always
  type: float
throughput:
  description: Bytes per second received while downloading (0 when nothing was downloaded).
  returned: always
  type: float
"""

import fnmatch
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait, FIRST_EXCEPTION
from dataclasses import dataclass, field
from pathlib import Path

from ansible.module_utils.basic import AnsibleModule, env_fallback, missing_required_lib
from ansible.module_utils.minimax_spark_http import (
    DEFAULT_ENDPOINT,
    BodyReader,
    HAS_REQUESTS,
    REQUESTS_IMPORT_ERROR,
    HubClient,
    HubError,
    RateMeter,
    make_session,
    redact_url,
    retry_after_seconds,
)

if HAS_REQUESTS:
    import requests
    import urllib3

    # What a dropped, reset, truncated or stalled connection raises while a body streams.
    NETWORK_ERRORS = (requests.RequestException, urllib3.exceptions.HTTPError, OSError)

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


def write_json_atomic(path, data):
    """Write a small JSON file through a temp file and a rename (readers never see half a file)."""
    fd, tmp = tempfile.mkstemp(dir=str(path.parent), prefix=".%s." % path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


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
        self.fd = os.open(str(self.path), os.O_RDWR | os.O_CREAT, 0o644)
        os.ftruncate(self.fd, self.entry.size)
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
            raise DiskError("Writing %s failed at offset %d: %s." % (self.path, offset + written, exc.strerror or exc)) from exc
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
        os.fdatasync(self.fd)
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


# -- progress --------------------------------------------------------------------------------------------
class Progress:
    """Counters of the run, and the periodic progress file the role reads while the module runs async."""

    def __init__(self, path, interval, repo, commit):
        self.path = Path(path) if path else None
        self.interval = interval
        self.repo = repo
        self.commit = commit
        self.lock = threading.Lock()
        self.total = 0
        self.finished_bytes = 0  # bytes of files already handled in this run
        self.downloaded = 0  # network bytes this run
        self.files_total = 0
        self.files_done = 0
        self.current = None  # PartialFile being downloaded
        self.meter = RateMeter()
        self.started = time.monotonic()
        self.download_seconds = 0.0
        self._last_write = 0.0

    def add_downloaded(self, nbytes):
        with self.lock:
            self.downloaded += nbytes

    def snapshot(self, state):
        with self.lock:
            current = self.current
            done = self.finished_bytes + (current.done_bytes() if current else 0)
            self.meter.add(self.downloaded)
            rate = self.meter.rate()
            return {
                "state": state,
                "repo": self.repo,
                "commit": self.commit,
                "file": current.entry.path if current else None,
                "files_done": self.files_done,
                "files_total": self.files_total,
                "bytes_done": done,
                "bytes_total": self.total,
                "bytes_downloaded": self.downloaded,
                "percent": round(100.0 * done / self.total, 1) if self.total else 100.0,
                "bytes_per_second": round(rate),
                "mb_per_s": round(rate / 1e6, 1),
                "elapsed": round(time.monotonic() - self.started, 1),
                "updated": time.time(),
            }

    def write(self, state="downloading", force=False):
        now = time.monotonic()
        if self.path is None or (not force and now - self._last_write < self.interval):
            return
        self._last_write = now
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.path, self.snapshot(state))
        except OSError:
            pass  # progress is best effort; the download is what matters


class Checkpointer(threading.Thread):
    """Every few seconds (or at once when asked): sync the partial file, save its journal, rewrite the progress file."""

    def __init__(self, partial, progress):
        super().__init__(daemon=True, name="checkpoint")
        self.partial = partial
        self.progress = progress
        self._halt = threading.Event()
        self._now = threading.Event()

    def run(self):
        interval = min(CHECKPOINT_INTERVAL, self.progress.interval)
        while not self._halt.is_set():
            self._now.wait(interval)
            self._now.clear()
            if self._halt.is_set():
                return
            try:
                self.partial.checkpoint()
            except (OSError, ValueError):
                pass  # retried at the next tick; the final checkpoint reports real errors
            self.progress.write()

    def sync_now(self):
        """Start a checkpoint now (the last bytes arrived: their fdatasync overlaps the end of the hashing)."""
        self._now.set()

    def stop(self):
        self._halt.set()
        self._now.set()
        self.join()


# -- fetching -----------------------------------------------------------------------------------------------
@dataclass
class Settings:
    connections: int = 16
    part_size: int = 64 << 20
    buffer_size: int = 4 << 20
    stall_timeout: float = 60.0
    connect_timeout: float = 30.0
    max_retries: int = 10
    max_retry_after: float = 120.0

    @property
    def timeout(self):
        return (self.connect_timeout, self.stall_timeout)


class LinkResolver:
    """The current signed link of one file; resolves it again (once for all threads) when it expired."""

    def __init__(self, hub, commit, entry):
        self.hub = hub
        self.commit = commit
        self.entry = entry
        self.lock = threading.Lock()
        self.refreshes = 0
        self.link = self._resolve()

    def _resolve(self):
        link = self.hub.resolve(self.commit, self.entry.path)
        if link.sha256 and self.entry.sha256 and link.sha256 != self.entry.sha256:
            raise DownloadError(
                "The Hub's metadata of %s disagree: the tree lists sha256 %s, resolve says %s."
                % (self.entry.path, self.entry.sha256, link.sha256)
            )
        return link

    @property
    def url(self):
        return self.link.url

    def headers(self):
        """Headers for a data request: the token only when the Hub itself serves the bytes."""
        return self.hub.auth_headers(self.link.url) if self.link.on_hub else {}

    def refresh(self, stale_url):
        with self.lock:
            if self.link.url == stale_url:
                self.refreshes += 1
                if self.refreshes > MAX_LINK_REFRESHES:
                    raise DownloadError("The signed link of %s kept expiring (403)." % self.entry.path)
                self.link = self._resolve()


@dataclass
class Attempt:
    """Why a range request did not finish (fed to the retry policy)."""

    reason: str
    wait: float | None = None


class FileFetcher:
    """Fetches the missing ranges of one file into its PartialFile, with retries, over N connections."""

    def __init__(self, session, resolver, partial, settings, progress, abort):
        self.session = session
        self.resolver = resolver
        self.partial = partial
        self.settings = settings
        self.progress = progress
        self.abort = abort
        self.size = partial.entry.size
        self.single_stream = False
        self._local = threading.local()

    def _buffer(self):
        """This thread's receive buffer (buffer_size bytes, allocated once, reused for every range)."""
        view = getattr(self._local, "view", None)
        if view is None:
            view = self._local.view = memoryview(bytearray(self.settings.buffer_size))
        return view

    # one request ------------------------------------------------------------------------------------
    def _request(self, start, end):
        headers = {"Range": "bytes=%d-%d" % (start, end - 1)}
        headers.update(self.resolver.headers())
        url = self.resolver.url
        return url, self.session.get(url, headers=headers, stream=True, timeout=self.settings.timeout, allow_redirects=False)

    def _check_status(self, url, response, start):
        """None when the body can be read (and from which offset it starts), else an Attempt to retry."""
        status = response.status_code
        if status == 206:
            content_range = response.headers.get("Content-Range", "")
            if not content_range.startswith("bytes %d-" % start):
                return Attempt("bad Content-Range %r for offset %d" % (content_range, start))
            return None
        if status == 200:
            if start == 0 or self.single_stream:
                return None
            raise RangeIgnored()
        if status == 403:
            self.resolver.refresh(url)
            return Attempt("signed link expired (403), resolved again", wait=0)
        if status in (429, 503):
            return Attempt("HTTP %d" % status, wait=retry_after_seconds(response, cap=self.settings.max_retry_after))
        if status == 416:
            raise DownloadError(
                "The server refused range %d- of %s (416): its size is not %d." % (start, self.partial.entry.path, self.size)
            )
        if status in (401, 404):
            raise DownloadError("Fetching %s failed with HTTP %d from %s." % (self.partial.entry.path, status, redact_url(url)))
        return Attempt("HTTP %d" % status)

    def _read_body(self, response, pos, end):
        """Write the body to the partial file from ``pos``; the new position and why it stopped short, if it did.

        The hot path: socket reads land straight in this thread's buffer (one read each, so whatever arrived
        before a cut is kept); the buffer goes to disk with one pwrite when it is full, at the end of the range,
        when the body stops, or after FLUSH_INTERVAL on a slow link. Only written bytes are recorded as done.
        """
        reader = BodyReader(response)
        view = self._buffer()
        abort = self.abort
        skip = pos if response.status_code == 200 else 0
        while skip and not abort.is_set():  # a server ignoring Range: drop what comes before pos
            try:
                count = reader.readinto(view[: min(len(view), skip)])
            except NETWORK_ERRORS as exc:
                return pos, Attempt("%s at byte %d" % (type(exc).__name__, pos - skip))
            if not count:
                return pos, Attempt("connection closed at byte %d, %d bytes short" % (pos - skip, end - pos + skip))
            skip -= count
        filled, attempt = 0, None
        flushed_at = time.monotonic()
        while pos + filled < end and not abort.is_set():
            try:
                count = reader.readinto(view[filled : min(len(view), end - pos)])
            except NETWORK_ERRORS as exc:
                attempt = Attempt("%s at byte %d" % (type(exc).__name__, pos + filled))
                break
            if not count:
                attempt = Attempt("connection closed at byte %d, %d bytes short" % (pos + filled, end - pos - filled))
                break
            filled += count
            if filled == len(view) or pos + filled == end or time.monotonic() - flushed_at >= FLUSH_INTERVAL:
                pos, filled = self._flush(view, filled, pos), 0
                flushed_at = time.monotonic()
        if filled:  # what arrived before a cut, a stall or an abort is written (and kept) too
            pos = self._flush(view, filled, pos)
        return pos, attempt

    def _flush(self, view, filled, pos):
        self.partial.write(pos, view[:filled])  # a DiskError: not retried
        self.progress.add_downloaded(filled)
        return pos + filled

    # one range with retries -----------------------------------------------------------------------------
    def fetch_range(self, start, end):
        pos, failures = start, 0
        while pos < end and not self.abort.is_set():
            before = pos
            try:
                url, response = self._request(pos, end)
                with response:
                    attempt = self._check_status(url, response, pos)
                    if attempt is None:
                        pos, attempt = self._read_body(response, pos, end)
            except NETWORK_ERRORS as exc:
                attempt = Attempt(type(exc).__name__)
            if pos >= end or self.abort.is_set():
                break
            failures = 0 if pos > before else failures + 1
            if failures > self.settings.max_retries:
                raise DownloadError(
                    "Downloading %s failed: %d attempts in a row at byte %d without progress (last: %s)."
                    % (self.partial.entry.path, failures, pos, attempt.reason)
                )
            delay = attempt.wait if attempt.wait is not None else min(30.0, 0.25 * 2 ** failures) if failures else 0
            self.abort.wait(delay)

    # whole file ------------------------------------------------------------------------------------------
    def probe(self):
        """Ask for byte 0: 206 means ranges work; 200 means the server ignores Range (single stream)."""
        for failures in range(self.settings.max_retries + 1):
            try:
                url, response = self._request(0, 1)
                with response:
                    if response.status_code == 200:
                        return False
                    attempt = self._check_status(url, response, 0)
                    if attempt is None:
                        total = response.headers.get("Content-Range", "").rpartition("/")[2]
                        if total.isdigit() and int(total) != self.size:
                            raise DownloadError(
                                "The CDN serves %s with %s bytes, the Hub lists %d." % (self.partial.entry.path, total, self.size)
                            )
                        return True
            except NETWORK_ERRORS as exc:
                attempt = Attempt(type(exc).__name__)
            self.abort.wait(attempt.wait if attempt.wait is not None else min(30.0, 0.25 * 2 ** failures))
        raise DownloadError("Cannot start downloading %s: %s." % (self.partial.entry.path, attempt.reason))

    def fetch(self, done):
        """Fetch every byte not in ``done`` (a RangeSet)."""
        gaps = done.gaps(self.size)
        if not gaps:
            return
        if self.size > 1 and self.probe() and self.settings.connections > 1:
            try:
                self._fetch_parallel(split_ranges(gaps, self.piece_size(gaps)))
                return
            except RangeIgnored:
                pass
        self.single_stream = True
        start = self.partial.prefix_end()
        self.fetch_range(start, self.size)

    def piece_size(self, gaps):
        """part_size, made smaller when needed so that every connection gets work (not under MIN_PIECE)."""
        missing = sum(end - start for start, end in gaps)
        share = -(-missing // self.settings.connections)
        return max(min(self.settings.part_size, share), min(MIN_PIECE, self.settings.part_size))

    def _fetch_parallel(self, pieces):
        queue = list(reversed(pieces))
        lock = threading.Lock()

        def worker():
            while not self.abort.is_set():
                with lock:
                    if not queue:
                        return
                    start, end = queue.pop()
                self.fetch_range(start, end)

        workers = min(self.settings.connections, len(pieces))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="range") as pool:
            futures = [pool.submit(worker) for _ in range(workers)]
            finished, _pending = wait(futures, return_when=FIRST_EXCEPTION)
            errors = [f.exception() for f in finished if f.exception() is not None]
            if errors:
                self.abort.set()
        if errors:
            self.abort.clear()
            raise errors[0]


# -- one file, the whole run ---------------------------------------------------------------------------------
@dataclass
class Plan:
    """What the run found: the commit, the selected entries and which of them must be fetched."""

    commit: str
    entries: list
    present: dict = field(default_factory=dict)  # repo path -> sha256 of the valid file on disk
    missing: list = field(default_factory=list)


class Downloader:
    def __init__(self, module, params):
        self.module = module
        self.params = params
        self.check_mode = module.check_mode
        self.dest = Path(params["dest"])
        self.settings = Settings(
            connections=max(1, params["connections"]),
            part_size=max(1, params["part_size"]),
            buffer_size=max(4096, params["buffer_size"]),
            stall_timeout=params["stall_timeout"],
            connect_timeout=params["connect_timeout"],
            max_retries=max(0, params["max_retries"]),
            max_retry_after=params["max_retry_after"],
        )
        self.session = make_session(
            pool_size=self.settings.connections + 2, retries=min(5, self.settings.max_retries), max_retry_after=params["max_retry_after"]
        )
        self.hub = HubClient(
            self.session,
            params.get("endpoint") or DEFAULT_ENDPOINT,
            params["repo"],
            token=params.get("token") or None,
            timeout=self.settings.timeout,
        )
        self.abort = threading.Event()
        self.progress = None

    def local_path(self, entry):
        path = (self.dest / entry.path).resolve()
        if not str(path).startswith(str(self.dest.resolve()) + os.sep):
            raise DownloadError("Refusing repo path %r: it points outside dest." % entry.path)
        return path

    # planning ------------------------------------------------------------------------------------------
    def plan(self):
        commit = self.hub.resolve_revision(self.params["revision"])
        entries = list(self.hub.list_files(commit))
        chosen = select_entries(entries, self.params["include"], self.params["exclude"])
        if not chosen:
            raise DownloadError(
                "No file of %s at %s matches include %s (exclude %s); the repo has %d files, e.g. %s."
                % (
                    self.params["repo"],
                    commit,
                    self.params["include"],
                    self.params["exclude"],
                    len(entries),
                    ", ".join(e.path for e in entries[:8]) or "none",
                )
            )
        plan = Plan(commit=commit, entries=chosen)
        for entry in chosen:
            valid, sha256 = present_and_valid(self.local_path(entry), entry, self.params["verify_cache"], self.check_mode)
            if valid:
                plan.present[entry.path] = sha256
            else:
                plan.missing.append(entry)
        return plan

    def partial_of(self, commit, entry):
        return PartialFile(self.local_path(entry), entry, commit)

    def check_disk_space(self, plan):
        """Fail before downloading when dest cannot hold what is missing."""
        needed = sum(max(0, e.size - self.partial_of(plan.commit, e).allocated()) for e in plan.missing)
        probe = self.dest
        while not probe.exists():
            probe = probe.parent
        free = shutil.disk_usage(str(probe)).free
        if needed > free:
            raise DownloadError(
                "Not enough free disk space in %s: %d file(s) need %s (%d bytes) more, only %s is free. "
                "Free some space or point dest at a larger disk." % (self.dest, len(plan.missing), human(needed), needed, human(free))
            )

    # downloading ---------------------------------------------------------------------------------------
    def download(self, plan):
        self.progress.total = sum(e.size for e in plan.missing)
        self.progress.files_total = len(plan.missing)
        results = {}
        began = time.monotonic()
        for entry in plan.missing:
            results[entry.path] = self.download_file(plan.commit, entry)
            self.progress.files_done += 1
            self.progress.finished_bytes += entry.size
        self.progress.download_seconds = time.monotonic() - began
        return results

    def download_file(self, commit, entry):
        """Fetch, verify and rename one file (a second full fetch after a checksum mismatch); its sha256."""
        for attempt in (1, 2):
            partial = self.partial_of(commit, entry)
            digest = self.fetch_into(partial, commit)
            if digest.matches(entry):
                return self.finalize(partial, entry, digest.sha256.hexdigest())
            partial.remove()
            if attempt == 2:
                raise DownloadError(
                    "%s is corrupt after two full downloads (%s, size %d): the server or something on the way "
                    "alters the data. Nothing was written to %s." % (entry.path, digest.describe(entry), entry.size, partial.final)
                )
        raise AssertionError("unreachable")

    def fetch_into(self, partial, commit):
        """Download what the partial file lacks; the content hash of the complete partial file."""
        done = partial.open()
        self.progress.current = partial
        hasher = PrefixHasher(partial)
        checkpoints = Checkpointer(partial, self.progress)
        hasher.start()
        checkpoints.start()
        try:
            if partial.entry.size:
                resolver = LinkResolver(self.hub, commit, partial.entry)
                FileFetcher(self.session, resolver, partial, self.settings, self.progress, self.abort).fetch(done)
            if partial.done_bytes() < partial.entry.size:
                raise DownloadError("Download of %s stopped before the end." % partial.entry.path)
            checkpoints.sync_now()  # the fdatasync of the last bytes runs while the hasher finishes
            return hasher.finish()
        finally:
            checkpoints.stop()
            hasher.cancel()
            partial.checkpoint()
            partial.close()
            self.progress.current = None

    def finalize(self, partial, entry, sha256):
        """Give the verified partial file its final name, drop its journal, cache the verification."""
        self.module.atomic_move(str(partial.path), str(partial.final))
        if partial.journal.exists():
            partial.journal.unlink()
        write_sidecar(partial.final, entry, sha256)
        return sha256

    # the run ------------------------------------------------------------------------------------------------
    def run(self):
        started = time.monotonic()
        plan = self.plan()
        self.progress = Progress(
            None if self.check_mode else self.params.get("progress_file"),
            self.params["progress_interval"],
            self.params["repo"],
            plan.commit,
        )
        to_fetch = sum(e.size - self.partial_of(plan.commit, e).bytes_on_disk() for e in plan.missing)
        if plan.missing:
            self.check_disk_space(plan)
        fetched = {}
        if plan.missing and not self.check_mode:
            self.progress.write("downloading", force=True)
            try:
                fetched = self.download(plan)
            except BaseException:
                self.progress.write("failed", force=True)
                raise
        self.progress.write("done", force=True)
        return self.result(plan, fetched, to_fetch, time.monotonic() - started)

    def result(self, plan, fetched, to_fetch, elapsed):
        files = []
        for entry in plan.entries:
            changed = entry.path not in plan.present
            files.append(
                {
                    "path": entry.path,
                    "dest": str(self.local_path(entry)),
                    "size": entry.size,
                    "sha256": plan.present.get(entry.path) or fetched.get(entry.path) or entry.sha256,
                    "changed": changed,
                }
            )
        downloaded = self.progress.downloaded
        seconds = self.progress.download_seconds
        result = {
            "changed": bool(plan.missing),
            "commit": plan.commit,
            "files": files,
            "bytes_downloaded": downloaded,
            "bytes_to_download": to_fetch,
            "total_bytes": sum(e.size for e in plan.entries),
            "elapsed": round(elapsed, 3),
            "throughput": round(downloaded / seconds, 1) if downloaded and seconds else 0.0,
        }
        if self.module._diff:
            result["diff"] = {
                "before": "".join("%s\n" % f["path"] for f in files if not f["changed"]),
                "after": "".join("%s\n" % f["path"] for f in files),
            }
        return result


ARGUMENT_SPEC = dict(
    repo=dict(type="str", required=True),
    revision=dict(type="str", default="main"),
    include=dict(type="list", elements="str", default=["*"]),
    exclude=dict(type="list", elements="str", default=[]),
    dest=dict(type="path", required=True),
    endpoint=dict(type="str", fallback=(env_fallback, ["HF_ENDPOINT"])),
    token=dict(type="str", no_log=True, fallback=(env_fallback, ["HF_TOKEN"])),
    connections=dict(type="int", default=16),
    part_size=dict(type="int", default=64 << 20),
    buffer_size=dict(type="int", default=4 << 20),
    stall_timeout=dict(type="float", default=60.0),
    connect_timeout=dict(type="float", default=30.0),
    max_retries=dict(type="int", default=10),
    max_retry_after=dict(type="float", default=120.0),
    progress_file=dict(type="path"),
    progress_interval=dict(type="float", default=5.0),
    verify_cache=dict(type="bool", default=True),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    if not HAS_REQUESTS:
        module.fail_json(msg=missing_required_lib("requests"), exception=str(REQUESTS_IMPORT_ERROR))
    try:
        result = Downloader(module, module.params).run()
    except (DownloadError, HubError) as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:
        module.fail_json(msg="Writing below %s failed: %s" % (module.params["dest"], exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
