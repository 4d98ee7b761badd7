"""The hf_download engine, part 2: fetching one file over N range requests (requests + urllib3 Retry), with
signed-link refresh, 429/Retry-After, stall and truncation retries, and the single-stream fallback.

DEFAULTS is the one table of the engine's tunables: Settings and the module's argument spec both read it.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from ansible.module_utils.minimax_spark_download import (
    FLUSH_INTERVAL,
    MAX_LINK_REFRESHES,
    MIN_PIECE,
    DownloadError,
    RangeIgnored,
    split_ranges,
)
from ansible.module_utils.minimax_spark_http import HAS_REQUESTS, BodyReader, redact_url, retry_after_seconds

if HAS_REQUESTS:
    import requests
    import urllib3

    # What a dropped, reset, truncated or stalled connection raises while a body streams.
    NETWORK_ERRORS = (requests.RequestException, urllib3.exceptions.HTTPError, OSError)
else:  # pragma: no cover - the module reports the missing library first
    NETWORK_ERRORS = (OSError,)

# The engine's tunables and their defaults, written once (Settings and hf_download's argument spec use them).
DEFAULTS = {
    "connections": (int, 16),
    "part_size": (int, 64 << 20),
    "buffer_size": (int, 4 << 20),
    "stall_timeout": (float, 60.0),
    "connect_timeout": (float, 30.0),
    "max_retries": (int, 10),
    "max_retry_after": (float, 120.0),
}


def _default(name):
    return field(default=DEFAULTS[name][1])


@dataclass
class Settings:
    connections: int = _default("connections")
    part_size: int = _default("part_size")
    buffer_size: int = _default("buffer_size")
    stall_timeout: float = _default("stall_timeout")
    connect_timeout: float = _default("connect_timeout")
    max_retries: int = _default("max_retries")
    max_retry_after: float = _default("max_retry_after")

    @classmethod
    def from_params(cls, params):
        """Settings from module parameters, clamped to workable values."""
        return cls(
            connections=max(1, params["connections"]),
            part_size=max(1, params["part_size"]),
            buffer_size=max(4096, params["buffer_size"]),
            stall_timeout=params["stall_timeout"],
            connect_timeout=params["connect_timeout"],
            max_retries=max(0, params["max_retries"]),
            max_retry_after=params["max_retry_after"],
        )

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
        return url, self.session.get(url, headers=headers, stream=True, timeout=self.settings.timeout,
                                     allow_redirects=False)

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
                "The server refused range %d- of %s (416): its size is not %d."
                % (start, self.partial.entry.path, self.size)
            )
        if status in (401, 404):
            raise DownloadError("Fetching %s failed with HTTP %d from %s."
                                % (self.partial.entry.path, status, redact_url(url)))
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
                                "The CDN serves %s with %s bytes, the Hub lists %d."
                                % (self.partial.entry.path, total, self.size)
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

