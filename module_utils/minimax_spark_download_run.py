"""The hf_download engine, part 3: the run (plan, disk check, download, verify, rename), one writer per
destination (an flock held for the run's whole life), and the signals that stop it cleanly.

``Downloader(params, check_mode).run()`` returns the module's result dict (without diff); ``query(dest)`` and
``stop(dest)`` report or stop the downloader holding a destination. Nothing here needs AnsibleModule.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shutil
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ansible.module_utils.minimax_spark_download import (
    DownloadError,
    PartialFile,
    PrefixHasher,
    human,
    present_and_valid,
    select_entries,
    write_json_atomic,
    write_sidecar,
)
from ansible.module_utils.minimax_spark_download_fetch import FileFetcher, LinkResolver, Settings
from ansible.module_utils.minimax_spark_download_progress import Checkpointer, Progress
from ansible.module_utils.minimax_spark_http import DEFAULT_ENDPOINT, HubClient, make_session

LOCK_NAME = ".hf_download.lock"
LOCK_WAIT = 1.0  # seconds a starting downloader retries the lock (a query may hold it shared for an instant)
STOP_WAIT = 60.0  # seconds stop() waits for a signalled downloader to checkpoint and exit
REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


class DestBusy(DownloadError):
    """Another downloader holds the destination's lock."""


class Stopped(DownloadError):
    """SIGTERM or SIGINT stopped the run; what was downloaded is checkpointed and resumes next time."""


def check_repo(repo):
    """Fail (before any request) unless ``repo`` looks like ``namespace/name``."""
    if not REPO_RE.match(repo or "") or ".." in repo:
        raise DownloadError(
            "repo %r is not a Hugging Face repo id: it must look like namespace/name (letters, digits, '-', '_', "
            "'.'; one '/'; no '..'), e.g. unsloth/MiniMax-M3-GGUF." % (repo,)
        )


def read_token_file(path):
    """The token stored in ``path`` on the node (first line, stripped)."""
    try:
        with open(path) as handle:
            token = handle.readline().strip()
    except OSError as exc:
        raise DownloadError("Cannot read token_file %s: %s." % (path, exc.strerror or exc)) from exc
    if not token:
        raise DownloadError("token_file %s is empty: write the Hub token on its first line." % path)
    return token


# -- one writer per destination --------------------------------------------------------------------------
def _holder_info(path):
    try:
        data = json.loads(Path(path).read_text() or "{}")
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


class DestLock:
    """An exclusive flock on ``dest/.hf_download.lock``, held by the downloader for its whole life.

    The kernel drops it when the process ends, however it ends (kill -9 included), so a stale lock cannot
    exist. The file names the holder (pid, start time, progress file) for query() and stop().
    """

    def __init__(self, dest):
        self.dest = Path(dest)
        self.path = self.dest / LOCK_NAME
        self.fd = None

    def acquire(self, info):
        self.dest.mkdir(parents=True, exist_ok=True)
        fd = os.open(str(self.path), os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() > deadline:
                    os.close(fd)
                    holder = _holder_info(self.path)
                    raise DestBusy(
                        "Another hf_download (pid %s, started %s) is writing to %s; not starting a second writer. "
                        "Follow it in %s, or stop it (hf_download state=stopped; the model_download role: "
                        "-e model_download_stop=true) and run again to take over its parts."
                        % (
                            holder.get("pid", "?"),
                            time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(holder["started"]))
                            if holder.get("started") else "?",
                            self.dest,
                            holder.get("progress_file") or "its progress file",
                        )
                    ) from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(dict(info, pid=os.getpid(), started=time.time())).encode())
        self.fd = fd

    def release(self):
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None


def query(dest):
    """{'running': bool, 'pid', 'started', 'progress_file'} of the downloader holding ``dest``, if any."""
    path = Path(dest) / LOCK_NAME
    if not path.exists():
        return {"running": False}
    fd = os.open(str(path), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return dict(_holder_info(path), running=True)
    finally:
        os.close(fd)
    return {"running": False}


def settle_progress(progress_file, running):
    """Make a progress file left by a process that died without a word say so (not 'downloading 49.1%').

    Returns the state the file holds afterwards (None when there is none)."""
    if not progress_file:
        return None
    try:
        data = json.loads(Path(progress_file).read_text())
    except (OSError, ValueError):
        return None
    if not running and data.get("state") in ("starting", "downloading"):
        data["state"] = "interrupted"
        data["message"] = (
            "The download process ended without reporting (killed?) at %.1f %%; its parts are kept and the next "
            "run resumes them." % (data.get("percent") or 0.0)
        )
        data["bytes_per_second"] = 0
        data["mb_per_s"] = 0.0
        try:
            write_json_atomic(Path(progress_file), data)
        except OSError:
            pass
    return data.get("state")


def stop(dest, wait=STOP_WAIT):
    """SIGTERM the downloader holding ``dest`` and wait until it checkpointed and let go; what it was."""
    holder = query(dest)
    if not holder["running"]:
        return holder
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 1:
        raise DownloadError("A downloader holds %s but its lock file names no process; stop it by hand." % dest)
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + wait
    while query(dest)["running"]:
        if time.monotonic() > deadline:
            raise DownloadError(
                "The downloader (pid %d) writing to %s did not stop within %d s of SIGTERM." % (pid, dest, wait)
            )
        time.sleep(0.2)
    return holder


# -- one file, the whole run ---------------------------------------------------------------------------------
@dataclass
class Plan:
    """What the run found: the commit, the selected entries and which of them must be fetched."""

    commit: str
    entries: list
    present: dict = field(default_factory=dict)  # repo path -> sha256 of the valid file on disk
    missing: list = field(default_factory=list)


class Downloader:
    """One run of hf_download: ``Downloader(params, check_mode).run()`` returns the module's result."""

    def __init__(self, params, check_mode=False, move=os.replace):
        self.params = params
        self.check_mode = check_mode
        self.move = move  # the module passes its atomic_move
        self.dest = Path(params["dest"])
        self.settings = Settings.from_params(params)
        self.session = make_session(
            pool_size=self.settings.connections + 2, retries=min(5, self.settings.max_retries),
            max_retry_after=params["max_retry_after"]
        )
        token = params.get("token") or None
        if params.get("token_file"):
            token = read_token_file(params["token_file"])
        self.hub = HubClient(
            self.session,
            params.get("endpoint") or DEFAULT_ENDPOINT,
            params["repo"],
            token=token,
            timeout=self.settings.timeout,
        )
        self.abort = threading.Event()
        self.progress = None
        self.stopped_by = None  # the signal that stopped the run
        self.downloading = False

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
            valid, sha256 = present_and_valid(self.local_path(entry), entry, self.params["verify_cache"],
                                              self.check_mode)
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
                "Free some space or point dest at a larger disk."
                % (self.dest, len(plan.missing), human(needed), needed, human(free))
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
            self.progress.held = 0
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
                    "alters the data. Nothing was written to %s."
                    % (entry.path, digest.describe(entry), entry.size, partial.final)
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
            self.progress.held = partial.done_bytes()
            self.progress.current = None

    def finalize(self, partial, entry, sha256):
        """Give the verified partial file its final name, drop its journal, cache the verification."""
        self.move(str(partial.path), str(partial.final))
        if partial.journal.exists():
            partial.journal.unlink()
        write_sidecar(partial.final, entry, sha256)
        return sha256

    # the run ------------------------------------------------------------------------------------------------
    def run(self):
        """Check the repo name, take the destination's lock (not in check mode), download; the result."""
        started = time.monotonic()
        check_repo(self.params["repo"])
        lock = None
        if not self.check_mode:
            lock = DestLock(self.dest)
            lock.acquire({"progress_file": self.params.get("progress_file"), "repo": self.params["repo"]})
        previous = self._trap_signals()
        try:
            return self._run(started)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            if lock:
                lock.release()

    def _trap_signals(self):
        """SIGTERM and SIGINT stop the run cleanly: the connections end, the journal is checkpointed."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {signum: signal.signal(signum, self._on_signal) for signum in (signal.SIGTERM, signal.SIGINT)}

    def _on_signal(self, signum, _frame):
        first = self.stopped_by is None
        self.stopped_by = signal.Signals(signum).name
        self.abort.set()  # the connections stop; fetch_into checkpoints what they wrote
        if first and not self.downloading:
            raise Stopped("Stopped by %s before downloading; nothing was lost, run again to continue."
                          % self.stopped_by)

    def _stopped(self):
        done = self.progress.snapshot("stopped")["bytes_done"] if self.progress else 0
        return Stopped(
            "Stopped by %s: %s of the missing bytes are saved (checkpointed) in the .partial files below %s; "
            "the next run resumes from there." % (self.stopped_by, human(done), self.dest)
        )

    def _run(self, started):
        self.progress = Progress(
            None if self.check_mode else self.params.get("progress_file"),
            self.params["progress_interval"],
            self.params["repo"],
            None,
        )
        self.progress.write("starting", force=True)
        try:
            plan = self.plan()
        except BaseException as exc:
            self.progress.write("stopped" if isinstance(exc, Stopped) else "failed", force=True, message=str(exc))
            raise
        self.progress.commit = plan.commit
        to_fetch = sum(e.size - self.partial_of(plan.commit, e).bytes_on_disk() for e in plan.missing)
        fetched = {}
        try:
            if plan.missing:
                self.check_disk_space(plan)
            if plan.missing and not self.check_mode:
                self.progress.total = sum(e.size for e in plan.missing)
                self.progress.files_total = len(plan.missing)
                self.progress.write("downloading", force=True)
                self.downloading = True
                try:
                    fetched = self.download(plan)
                except BaseException:
                    if self.stopped_by:
                        raise self._stopped() from None
                    raise
                finally:
                    self.downloading = False
        except BaseException as exc:
            self.progress.write("stopped" if isinstance(exc, Stopped) else "failed", force=True,
                                message=describe_error(exc, self.dest))
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
        return result



def describe_error(exc, dest):
    """One line for a failure: OSErrors name their file (a full disk says which file could not be written)."""
    if isinstance(exc, OSError) and not isinstance(exc, DownloadError):
        where = exc.filename or dest
        text = "Writing %s failed: %s" % (where, exc.strerror or exc)
        if exc.errno == errno.ENOSPC:
            text += " (the disk of %s is full: free space there, then run again; the download resumes)" % dest
        return text + "."
    return str(exc)
