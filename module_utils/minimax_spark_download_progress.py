"""The hf_download engine: the run's counters, the progress file a role polls, and the checkpointer that makes
the partial file's journal durable every few seconds."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from ansible.module_utils.minimax_spark_download import CHECKPOINT_INTERVAL, write_json_atomic
from ansible.module_utils.minimax_spark_http import RateMeter


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
        self.held = 0  # bytes of the partial file last downloaded when it stopped short (kept on disk)
        self.meter = RateMeter()
        self.started = time.monotonic()
        self.download_seconds = 0.0
        self._last_write = 0.0

    def add_downloaded(self, nbytes):
        with self.lock:
            self.downloaded += nbytes

    def snapshot(self, state, message=None):
        with self.lock:
            current = self.current
            done = self.finished_bytes + (current.done_bytes() if current else self.held)
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
                # Nothing to fetch is 100 % only once the run says so; at the start it is 0 % of a total not yet known.
                "percent": round(100.0 * done / self.total, 1) if self.total else (100.0 if state == "done" else 0.0),
                "bytes_per_second": round(rate),
                "mb_per_s": round(rate / 1e6, 1),
                "elapsed": round(time.monotonic() - self.started, 1),
                "updated": time.time(),
                "pid": os.getpid(),
                "message": message,
            }

    def write(self, state="downloading", force=False, message=None):
        now = time.monotonic()
        if self.path is None or (not force and now - self._last_write < self.interval):
            return
        self._last_write = now
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # No fsync: rewritten every few seconds, read only while the download runs.
            write_json_atomic(self.path, self.snapshot(state, message), durable=False)
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
            except Exception:  # pylint: disable=broad-except
                pass  # retried at the next tick; the final checkpoint reports real errors
            self.progress.write()

    def sync_now(self):
        """Start a checkpoint now (the last bytes arrived: their fdatasync overlaps the end of the hashing)."""
        self._now.set()

    def stop(self):
        self._halt.set()
        self._now.set()
        self.join()


