#!/usr/bin/env python3
"""A fake Hugging Face Hub: serves local directories as model repos over the Hub's download protocol.

What it speaks (the parts hf_download uses, the Hub protocol as roles/model_download/README.md describes it):

* ``GET /api/models/{repo}/revision/{rev}``      -> ``{"id": repo, "sha": commit, "siblings": [...]}``
* ``GET /api/models/{repo}/tree/{rev}?recursive=true`` -> file list with ``lfs.oid`` / ``lfs.size``,
  paginated (``page_size``) with a ``Link: <...>; rel="next"`` header.
* ``GET /{repo}/resolve/{rev}/{path}``            -> LFS files: 302 with ``X-Repo-Commit``, ``X-Linked-Etag``
  (quoted sha256), ``X-Linked-Size`` and a ``Location`` on ``/cdn/...`` of this server carrying a signed,
  expiring query. Small non-LFS files: 200 with the body, like the Hub.
* ``GET /cdn/...``                                -> the bytes; honours one ``Range`` (206), rejects HEAD (405)
  and FAILS (400) any request that carries an ``Authorization`` header: the token must never leave the Hub.

Errors: unknown repo 404 ``X-Error-Code: RepoNotFound``; gated repo 403 ``X-Error-Code: GatedRepo`` unless the
request bears the hub's token; with ``token`` set every Hub request needs ``Authorization: Bearer <token>`` (401).

Faults (``hub.faults``, or CLI flags): 429 + Retry-After on the first N requests; 403 "expired" for the first N
CDN requests or for every link issued before ``revoke_links()``; corrupt bytes of a file range; ignore Range
(200 + full body); truncate bodies (clean close) or reset connections (RST) after K bytes; stall (send nothing)
after K bytes; a per-connection rate cap in bytes/s.

Library::

    with FakeHub(root, repos={"org/model": "subdir"}) as hub:
        hub.faults.truncate_after = 100_000
        ... hub.url ...
        hub.cdn_bytes()

CLI::

    python tests/support/fakehub.py --root DIR --repo org/name[=subdir] --host 0.0.0.0 --port 8080
"""
from __future__ import annotations

import argparse
import base64
import fnmatch
import hashlib
import hmac
import json
import os
import re
import secrets
import signal
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

DEFAULT_LFS_PATTERNS = ("*.gguf", "*.safetensors", "*.bin", "*.pt", "*.pth", "*.onnx", "*.npz")
LFS_MIN_SIZE = 10 * 1024 * 1024
BLOCK = 256 * 1024


@dataclass
class Faults:
    """Fault injection switches. Counters (``*_first``, ``*_times``) count down as faults fire; None = always."""

    rate_limit_first: int = 0  # first N requests (any endpoint) answer 429
    retry_after: float = 1.0  # Retry-After of those 429s (seconds)
    expire_first: int = 0  # first N CDN requests answer 403 "Request has expired"
    ignore_range: bool = False  # CDN answers 200 with the full body to ranged requests
    corrupt: list = field(default_factory=list)  # [[start, end, times|None], ...] file offsets to flip
    truncate_after: int | None = None  # close (FIN) a CDN body after K bytes
    truncate_times: int | None = None
    reset_after: int | None = None  # reset (RST) a CDN connection after K body bytes
    reset_times: int | None = None
    stall_after: int | None = None  # stop sending after K bytes for stall_seconds, then drop the connection
    stall_seconds: float = 30.0
    stall_times: int | None = 1
    rate_cap: float | None = None  # bytes/s per connection on CDN bodies

    def __post_init__(self):
        self._lock = threading.Lock()

    def take(self, counter):
        """True when the counted fault named ``counter`` fires now (and count it)."""
        with self._lock:
            left = getattr(self, counter)
            if left is None:
                return True
            if left > 0:
                setattr(self, counter, left - 1)
                return True
            return False

    def corruption_for(self, start, end):
        """Corrupt ranges (file offsets) overlapping [start, end) that fire for this response."""
        hits = []
        with self._lock:
            for item in self.corrupt:
                c_start, c_end, times = item[0], item[1], item[2] if len(item) > 2 else None
                if c_start < end and c_end > start and (times is None or times > 0):
                    if times is not None:
                        item[2] = times - 1
                    hits.append((c_start, c_end))
        return hits


@dataclass
class _Plan:
    """What to do to one CDN body."""

    corrupt: list
    cut_at: int | None = None
    reset: bool = False
    stall_at: int | None = None
    rate_cap: float | None = None

    @property
    def plain(self):
        return not (self.corrupt or self.cut_at is not None or self.stall_at is not None or self.rate_cap)


class _Repo:
    def __init__(self, name, path, lfs_patterns):
        self.name = name
        self.path = Path(path)
        self.lfs_patterns = lfs_patterns

    def files(self):
        """Sorted repo paths of regular files (hidden ones skipped, like .git)."""
        out = []
        for dirpath, dirnames, filenames in os.walk(self.path):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in filenames:
                if not name.startswith("."):
                    out.append(Path(dirpath, name).relative_to(self.path).as_posix())
        return sorted(out)

    def commit(self):
        digest = hashlib.sha1(self.name.encode())
        for rel in self.files():
            st = (self.path / rel).stat()
            digest.update(("%s\0%d\0%d\n" % (rel, st.st_size, st.st_mtime_ns)).encode())
        return digest.hexdigest()

    def is_lfs(self, rel, size):
        return size >= LFS_MIN_SIZE or any(fnmatch.fnmatch(rel, p) for p in self.lfs_patterns)


class FakeHub:
    """Threaded fake Hub serving ``repos`` (``{"org/name": dir}``; a relative dir is below ``root``)."""

    def __init__(
        self,
        root,
        repos=None,
        host="127.0.0.1",
        port=0,
        token=None,
        gated=(),
        link_ttl=3600.0,
        page_size=1000,
        lfs_patterns=DEFAULT_LFS_PATTERNS,
        faults=None,
        verbose=False,
    ):
        self.root = Path(root)
        repos = repos or {"fake/model": ""}
        if isinstance(repos, (list, tuple)):
            repos = {name: "" for name in repos}
        self.repos = {
            name: _Repo(name, self.root / (sub or ""), tuple(lfs_patterns)) for name, sub in repos.items()
        }
        self.host = host
        self.port = port
        self.token = token
        self.gated = set(gated)
        self.link_ttl = float(link_ttl)
        self.page_size = int(page_size)
        self.faults = faults or Faults()
        self.verbose = verbose
        self.requests = []  # one dict per request: t, method, kind, path, status, auth, range, sent, client (port)
        self._lock = threading.Lock()
        self._secret = secrets.token_bytes(16)
        self._revoked_before = 0.0
        self._sha_cache = {}
        self._server = None
        self._thread = None
        self.stopping = threading.Event()
        self._active = 0

    # -- lifecycle -----------------------------------------------------------------------------------
    def start(self):
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        self._server = _Server((self.host, self.port), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
        self._thread.start()
        return self

    def stop(self):
        self.stopping.set()
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def url(self):
        host = "127.0.0.1" if self.host in ("0.0.0.0", "", "::") else self.host
        return "http://%s:%d" % (host, self.port)

    # -- controls and statistics ---------------------------------------------------------------------
    def revoke_links(self):
        """Expire every signed link issued so far (the next CDN request with one gets 403)."""
        self._revoked_before = time.time() + 1e-6

    def record(self, **entry):
        with self._lock:
            self.requests.append(entry)
        if self.verbose:
            print("fakehub: %(method)s %(kind)s %(path)s -> %(status)s (%(sent)d B)" % entry, file=sys.stderr)

    def log(self, kind=None, status=None):
        with self._lock:
            return [r for r in self.requests
                    if (kind is None or r["kind"] == kind) and (status is None or r["status"] == status)]

    def count(self, kind=None, status=None):
        return len(self.log(kind, status))

    def cdn_bytes(self):
        """Body bytes the CDN sent (what a client downloaded)."""
        return sum(r["sent"] for r in self.log("cdn"))

    def wait_idle(self, timeout=30.0):
        """Wait until no request is being answered (e.g. the bodies a killed client left behind)."""
        deadline = time.monotonic() + timeout
        while self._active and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self._active

    def reset_stats(self):
        with self._lock:
            self.requests.clear()

    # -- repo data -----------------------------------------------------------------------------------
    def sha256(self, path):
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns)
        if key not in self._sha_cache:
            digest = hashlib.sha256()
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(8 << 20), b""):
                    digest.update(block)
            self._sha_cache[key] = digest.hexdigest()
        return self._sha_cache[key]

    @staticmethod
    def git_oid(path):
        data = path.read_bytes()
        return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()

    def tree_entry(self, repo, rel):
        path = repo.path / rel
        size = path.stat().st_size
        entry = {"type": "file", "path": rel, "size": size}
        if repo.is_lfs(rel, size):
            entry["oid"] = hashlib.sha1(("lfs-pointer:%s" % self.sha256(path)).encode()).hexdigest()
            entry["lfs"] = {"oid": self.sha256(path), "size": size, "pointerSize": 134}
        else:
            entry["oid"] = self.git_oid(path)
        return entry

    def sign(self, target, expires, issued):
        msg = ("%s|%.6f|%.6f" % (target, expires, issued)).encode()
        return base64.urlsafe_b64encode(hmac.new(self._secret, msg, hashlib.sha256).digest()).decode().rstrip("=")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def handle_error(self, request, client_address):
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError, OSError)):
            return  # the client went away (or we cut it on purpose)
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakeHub/1.0"
    hub: FakeHub = None

    def log_message(self, format, *args):  # pylint: disable=redefined-builtin
        pass

    def do_GET(self):
        self._dispatch("GET")

    def do_HEAD(self):
        self._dispatch("HEAD")

    # -- plumbing ------------------------------------------------------------------------------------
    def _dispatch(self, method):
        self.method = method
        self.sent = 0
        self.status = None
        split = urlsplit(self.path)
        self.query = parse_qs(split.query)
        path = unquote(split.path)
        self.kind = "cdn" if path.startswith("/cdn/") else "api" if path.startswith("/api/") else "resolve"
        with self.hub._lock:
            self.hub._active += 1
        try:
            if self.hub.faults.rate_limit_first and self.hub.faults.take("rate_limit_first"):
                self._error(429, "RateLimited", "Too many requests",
                            {"Retry-After": "%g" % self.hub.faults.retry_after})
            elif self.kind == "cdn":
                self._cdn(path[len("/cdn/"):])
            elif self.kind == "api":
                self._api(path[len("/api/"):])
            else:
                self._resolve(path.lstrip("/"))
        finally:
            self.hub.record(
                t=time.time(),
                method=method,
                kind=self.kind,
                path=path,
                status=self.status,
                auth="Authorization" in self.headers,
                range=self.headers.get("Range"),
                sent=self.sent,
                client=self.client_address[1],
            )
            with self.hub._lock:
                self.hub._active -= 1

    def _base(self):
        return "http://%s" % (self.headers.get("Host") or "%s:%d" % (self.hub.host, self.hub.port))

    def _head(self, status, headers=None, length=0, content_type="application/json"):
        self.status = status
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(length))
        self.end_headers()

    def _json(self, status, obj, headers=None):
        body = json.dumps(obj).encode()
        self._head(status, headers, len(body))
        if self.method != "HEAD":
            self.wfile.write(body)
            self.sent += len(body)

    def _error(self, status, code, message, headers=None):
        headers = dict(headers or {})
        if code:
            headers["X-Error-Code"] = code
        headers["X-Error-Message"] = message
        self._json(status, {"error": message}, headers)

    def _auth_ok(self):
        return bool(self.hub.token) and self.headers.get("Authorization") == "Bearer %s" % self.hub.token

    def _repo(self, name):
        """The repo, or None after answering the error (unknown, private without token, gated)."""
        repo = self.hub.repos.get(name)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return None
        if self.hub.token and not self._auth_ok():
            self._error(401, None, "Invalid credentials in Authorization header")
            return None
        if name in self.hub.gated and not self._auth_ok():
            self._error(403, "GatedRepo", "Access to model %s is restricted. You must have access to it." % name)
            return None
        return repo

    def _revision(self, repo, rev):
        commit = repo.commit()
        if rev in ("main", commit):
            return commit
        self._error(404, "RevisionNotFound", "Invalid rev id: %s" % rev)
        return None

    # -- API -----------------------------------------------------------------------------------------
    def _api(self, rest):
        match = re.match(r"models/([^/]+/[^/]+)/(revision|tree)/([^/]+)(?:/(.*))?$", rest)
        if not match:
            self._error(404, None, "Not found")
            return
        repo = self._repo(match.group(1))
        if repo is None:
            return
        commit = self._revision(repo, match.group(3))
        if commit is None:
            return
        if match.group(2) == "revision":
            siblings = [{"rfilename": rel} for rel in repo.files()]
            self._json(200, {"id": repo.name, "sha": commit, "siblings": siblings})
            return
        self._tree(repo, match.group(3), commit, (match.group(4) or "").strip("/"))

    def _tree(self, repo, rev, commit, prefix):
        recursive = self.query.get("recursive", ["false"])[0].lower() in ("1", "true")
        entries, dirs = [], set()
        for rel in repo.files():
            if prefix and not rel.startswith(prefix + "/"):
                continue
            below = rel[len(prefix) + 1:] if prefix else rel
            if not recursive and "/" in below:
                dirs.add((prefix + "/" if prefix else "") + below.split("/")[0])
                continue
            entries.append(rel)
        items = [{"type": "directory", "path": d, "oid": "0" * 40, "size": 0} for d in sorted(dirs)]
        items += [self.hub.tree_entry(repo, rel) for rel in entries]
        cursor = int(self.query.get("cursor", ["0"])[0] or 0)
        page = items[cursor:cursor + self.hub.page_size]
        headers = {}
        if cursor + self.hub.page_size < len(items):
            nxt = "%s/api/models/%s/tree/%s%s?recursive=%s&cursor=%d" % (
                self._base(),
                repo.name,
                quote(rev, safe=""),
                "/" + quote(prefix) if prefix else "",
                "true" if recursive else "false",
                cursor + self.hub.page_size,
            )
            headers["Link"] = '<%s>; rel="next"' % nxt
        self._json(200, page, headers)

    # -- resolve -------------------------------------------------------------------------------------
    def _resolve(self, rest):
        match = re.match(r"([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", rest)
        if not match:
            self._error(404, "RepoNotFound" if "/resolve/" not in rest else None, "Not found")
            return
        repo = self._repo(match.group(1))
        if repo is None:
            return
        commit = self._revision(repo, match.group(2))
        if commit is None:
            return
        rel = match.group(3)
        path = repo.path / rel
        if rel not in repo.files():
            self._error(404, "EntryNotFound", "Entry not found")
            return
        size = path.stat().st_size
        headers = {"X-Repo-Commit": commit}
        if not repo.is_lfs(rel, size):
            data = path.read_bytes()
            headers["ETag"] = '"%s"' % self.hub.git_oid(path)
            self._head(200, headers, len(data), "application/octet-stream")
            if self.method != "HEAD":
                self.wfile.write(data)
                self.sent += len(data)
            return
        now = time.time()
        target = "%s/%s/%s" % (repo.name, commit, quote(rel))
        expires = now + self.hub.link_ttl
        sig = self.hub.sign(target, expires, now)
        headers.update(
            {
                "X-Linked-Etag": '"%s"' % self.hub.sha256(path),
                "X-Linked-Size": str(size),
                "ETag": '"%s"' % self.hub.sha256(path),
                "Location": "%s/cdn/%s?X-Expires=%.6f&X-Issued=%.6f&X-Signature=%s"
                % (self._base(), target, expires, now, sig),
            }
        )
        self._head(302, headers, 0)

    # -- CDN -----------------------------------------------------------------------------------------
    def _cdn(self, rest):
        faults = self.hub.faults
        if self.method == "HEAD":
            self._head(405, {"Allow": "GET"}, 0, "text/plain")
            return
        if "Authorization" in self.headers:
            self._error(400, "AuthorizationForwarded", "Only one auth mechanism allowed: the token reached the CDN")
            return
        target = "/".join(quote(unquote(part)) for part in rest.split("/"))
        try:
            expires = float(self.query["X-Expires"][0])
            issued = float(self.query["X-Issued"][0])
            signature = self.query["X-Signature"][0]
        except (KeyError, ValueError, IndexError):
            self._error(403, None, "Missing signature")
            return
        if not hmac.compare_digest(signature, self.hub.sign(target, expires, issued)):
            self._error(403, None, "Signature does not match")
            return
        if (expires < time.time() or issued < self.hub._revoked_before
                or (faults.expire_first and faults.take("expire_first"))):
            self._error(403, None, "Request has expired")
            return
        parts = rest.split("/")
        repo = self.hub.repos.get("/".join(parts[:2]))
        path = repo.path / "/".join(parts[3:]) if repo else None
        if path is None or not path.is_file():
            self._error(404, None, "Not found")
            return
        self._send_file(path)

    def _parse_range(self, size):
        """(start, end_exclusive, partial) or None after answering 416."""
        header = self.headers.get("Range")
        if not header or self.hub.faults.ignore_range:
            return 0, size, False
        match = re.fullmatch(r"bytes=(\d*)-(\d*)", header.strip())
        if not match or (not match.group(1) and not match.group(2)):
            return 0, size, False
        if match.group(1):
            start = int(match.group(1))
            end = int(match.group(2)) + 1 if match.group(2) else size
        else:  # suffix range
            start, end = max(size - int(match.group(2)), 0), size
        end = min(end, size)
        if start >= size or start >= end:
            self._head(416, {"Content-Range": "bytes */%d" % size}, 0, "text/plain")
            return None
        return start, end, True

    def _plan(self, start, end):
        faults = self.hub.faults
        plan = _Plan(corrupt=faults.corruption_for(start, end), rate_cap=faults.rate_cap)
        if faults.truncate_after is not None and faults.take("truncate_times"):
            plan.cut_at = faults.truncate_after
        elif faults.reset_after is not None and faults.take("reset_times"):
            plan.cut_at, plan.reset = faults.reset_after, True
        if faults.stall_after is not None and faults.take("stall_times"):
            plan.stall_at = faults.stall_after
        return plan

    def _send_file(self, path):
        size = path.stat().st_size
        parsed = self._parse_range(size)
        if parsed is None:
            return
        start, end, partial = parsed
        headers = {"Accept-Ranges": "bytes", "ETag": '"%s"' % self.hub.sha256(path)}
        if partial:
            headers["Content-Range"] = "bytes %d-%d/%d" % (start, end - 1, size)
        plan = self._plan(start, end)
        self._head(206 if partial else 200, headers, end - start, "application/octet-stream")
        with open(path, "rb") as handle:
            if plan.plain:
                self.wfile.flush()
                self.sent += self.connection.sendfile(handle, start, end - start) if end > start else 0
            else:
                self._send_slow(handle, start, end, plan)

    def _send_slow(self, handle, start, end, plan):
        began = time.monotonic()
        block = BLOCK if not plan.rate_cap else max(4096, min(BLOCK, int(plan.rate_cap / 20)))
        pos = start
        while pos < end:
            limit = end
            for mark in (plan.cut_at, plan.stall_at):
                if mark is not None:
                    limit = min(limit, start + mark)
            if pos >= limit:
                self._interrupt(plan)
                return
            handle.seek(pos)
            data = bytearray(handle.read(min(block, limit - pos)))
            for c_start, c_end in plan.corrupt:
                lo, hi = max(c_start, pos), min(c_end, pos + len(data))
                for i in range(lo - pos, hi - pos):
                    data[i] ^= 0xFF
            self.wfile.write(data)
            pos += len(data)
            self.sent += len(data)
            if plan.rate_cap:
                ahead = (pos - start) / plan.rate_cap - (time.monotonic() - began)
                if ahead > 0:
                    time.sleep(ahead)

    def _interrupt(self, plan):
        """Apply the cut or the stall planned for this body once its byte budget is spent."""
        self.close_connection = True
        if plan.stall_at is not None and (plan.cut_at is None or plan.stall_at <= plan.cut_at):
            self.hub.stopping.wait(self.hub.faults.stall_seconds)
        if plan.reset:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        else:
            try:
                self.connection.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def handle(self):
        try:
            super().handle()
        except (ConnectionError, TimeoutError, OSError):
            pass


# -- CLI ---------------------------------------------------------------------------------------------
def _counted(value):
    """'K' or 'K:TIMES' -> (K, TIMES|None)."""
    parts = value.split(":")
    return int(parts[0]), (int(parts[1]) if len(parts) > 1 else None)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Serve directories as Hugging Face model repos (fake Hub).")
    parser.add_argument("--root", required=True, help="directory holding the repo(s)")
    parser.add_argument(
        "--repo", action="append", default=[], metavar="ORG/NAME[=SUBDIR]",
        help="repo id served from SUBDIR of root (default: root itself); repeatable"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--port-file", help="write the bound port to this file once listening")
    parser.add_argument("--token", help="require 'Authorization: Bearer TOKEN' on Hub requests")
    parser.add_argument("--gated", action="append", default=[], metavar="ORG/NAME",
                        help="repo answering 403 GatedRepo without the token")
    parser.add_argument("--link-ttl", type=float, default=3600.0, help="seconds a signed CDN link stays valid")
    parser.add_argument("--page-size", type=int, default=1000, help="tree API entries per page")
    parser.add_argument("--rate-limit", metavar="N[:RETRY_AFTER]", help="answer 429 to the first N requests")
    parser.add_argument("--expire-first", type=int, default=0, metavar="N",
                        help="first N CDN requests answer 403 expired")
    parser.add_argument("--ignore-range", action="store_true", help="CDN ignores Range (200 + full body)")
    parser.add_argument("--corrupt", action="append", default=[], metavar="START:END[:TIMES]",
                        help="flip bytes [START,END) of served files")
    parser.add_argument("--truncate-after", metavar="K[:TIMES]", help="close CDN bodies after K bytes")
    parser.add_argument("--reset-after", metavar="K[:TIMES]", help="reset CDN connections after K bytes")
    parser.add_argument("--stall-after", metavar="K[:SECONDS[:TIMES]]", help="stop sending after K bytes")
    parser.add_argument("--rate-cap", type=float, help="bytes/s per CDN connection")
    parser.add_argument("--verbose", action="store_true", help="log each request to stderr")
    return parser.parse_args(argv)


def faults_from_args(args):
    faults = Faults(expire_first=args.expire_first, ignore_range=args.ignore_range, rate_cap=args.rate_cap)
    if args.rate_limit:
        parts = args.rate_limit.split(":")
        faults.rate_limit_first = int(parts[0])
        if len(parts) > 1:
            faults.retry_after = float(parts[1])
    for item in args.corrupt:
        parts = [int(p) for p in item.split(":")]
        faults.corrupt.append([parts[0], parts[1], parts[2] if len(parts) > 2 else None])
    if args.truncate_after:
        faults.truncate_after, faults.truncate_times = _counted(args.truncate_after)
    if args.reset_after:
        faults.reset_after, faults.reset_times = _counted(args.reset_after)
    if args.stall_after:
        parts = args.stall_after.split(":")
        faults.stall_after = int(parts[0])
        if len(parts) > 1:
            faults.stall_seconds = float(parts[1])
        faults.stall_times = int(parts[2]) if len(parts) > 2 else None
    return faults


def main(argv=None):
    args = parse_args(argv)
    repos = {}
    for spec in args.repo or ["fake/model"]:
        name, _, sub = spec.partition("=")
        repos[name] = sub
    hub = FakeHub(
        args.root,
        repos=repos,
        host=args.host,
        port=args.port,
        token=args.token,
        gated=args.gated,
        link_ttl=args.link_ttl,
        page_size=args.page_size,
        faults=faults_from_args(args),
        verbose=args.verbose,
    )
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    with hub:
        if args.port_file:
            Path(args.port_file).write_text("%d\n" % hub.port)
        print("fakehub: serving %s on http://%s:%d" % (", ".join(repos), args.host, hub.port), flush=True)
        while not done.wait(0.5):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
