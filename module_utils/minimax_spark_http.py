"""HTTP helpers the minimax-spark modules share: a retrying requests session and a small Hugging Face Hub client.

The Hub client only talks to the Hub host (API and ``resolve`` URLs) and is the only place that sends the
``Authorization`` header. Signed CDN links it returns are fetched by the caller without any credential.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from urllib.parse import quote, urljoin, urlsplit, urlunsplit

try:
    import requests
    from requests.adapters import HTTPAdapter
    from urllib3.util.retry import Retry

    HAS_REQUESTS = True
    REQUESTS_IMPORT_ERROR = None
except ImportError as exc:  # pragma: no cover - reported by the module through missing_required_lib
    HAS_REQUESTS = False
    REQUESTS_IMPORT_ERROR = exc
    Retry = object

DEFAULT_ENDPOINT = "https://huggingface.co"
USER_AGENT = "minimax-spark-hf-download/1.0"
# Statuses urllib3 retries by itself (honouring Retry-After); 403 and 404 mean something to the caller.
RETRY_STATUSES = (429, 500, 502, 503, 504)
RETRY_METHODS = frozenset({"GET", "HEAD"})
MAX_REDIRECTS = 5


class CappedRetry(Retry):
    """urllib3 Retry that honours Retry-After but never sleeps longer than ``max_retry_after`` seconds.

    (urllib3 >= 2.6 has ``retry_after_max``; older releases found on nodes do not.)
    """

    max_retry_after = 120.0

    def parse_retry_after(self, retry_after):
        return min(super().parse_retry_after(retry_after), self.max_retry_after)


def make_session(pool_size=16, retries=5, backoff_factor=0.5, max_retry_after=120.0):
    """A requests Session whose adapter retries connect errors, 429 and 5xx (with Retry-After) on GET/HEAD."""
    retry_cls = type("SessionRetry", (CappedRetry,), {"max_retry_after": float(max_retry_after)})
    retry = retry_cls(
        total=retries,
        connect=retries,
        read=retries,
        status=retries,
        other=0,
        redirect=0,
        allowed_methods=RETRY_METHODS,
        status_forcelist=RETRY_STATUSES,
        backoff_factor=backoff_factor,
        respect_retry_after_header=True,
        raise_on_status=False,
        raise_on_redirect=False,
    )
    adapter = HTTPAdapter(max_retries=retry, pool_connections=4, pool_maxsize=max(pool_size, 4))
    session = requests.Session()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    session.headers["User-Agent"] = USER_AGENT
    # Ranged binary data: never let a server compress it (offsets would be meaningless).
    session.headers["Accept-Encoding"] = "identity"
    return session


def redact_url(url):
    """The URL without its query string and credentials: signed links carry secrets in the query."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<url>"
    netloc = parts.hostname or ""
    if parts.port:
        netloc = "%s:%d" % (netloc, parts.port)
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def origin(url):
    parts = urlsplit(url)
    return (parts.scheme, parts.hostname, parts.port)


def retry_after_seconds(response, default=1.0, cap=120.0):
    """Seconds a 429/503 response asks us to wait (Retry-After in seconds or as an HTTP date)."""
    value = response.headers.get("Retry-After") if response is not None else None
    if not value:
        return default
    try:
        return min(max(float(value), 0.0), cap)
    except ValueError:
        pass
    try:
        return min(max(Retry().parse_retry_after(value), 0.0), cap)
    except Exception:  # pylint: disable=broad-except
        return default


class HubError(Exception):
    """A Hub answer the user has to act on (missing repo, gated repo, bad token, ...)."""

    def __init__(self, msg, status=None, code=None):
        super().__init__(msg)
        self.status = status
        self.code = code


@dataclass
class RepoEntry:
    """One file of a repo at a commit, as the tree API lists it."""

    path: str
    size: int
    sha256: str | None  # LFS files: sha256 of the content
    git_oid: str | None  # git blob sha1 (the only checksum of non-LFS files)

    @property
    def is_lfs(self):
        return self.sha256 is not None


@dataclass
class Link:
    """Where the bytes of one file are: a signed CDN URL (no credentials) or the Hub URL itself."""

    url: str
    on_hub: bool  # True: the Hub answered 200 itself (non-LFS file); the request needs the token
    size: int | None
    sha256: str | None
    commit: str | None


class HubClient:
    """Minimal client for the Hub endpoints the downloader needs. Sends the token to the Hub host only."""

    def __init__(self, session, endpoint, repo, token=None, timeout=(30, 60)):
        self.session = session
        self.endpoint = (endpoint or DEFAULT_ENDPOINT).rstrip("/")
        self.repo = repo
        self._token = token
        self.timeout = timeout

    # -- requests --------------------------------------------------------------------------------
    def auth_headers(self, url):
        """The Authorization header for a URL on the Hub host; nothing for any other host."""
        if self._token and origin(url) == origin(self.endpoint):
            return {"Authorization": "Bearer %s" % self._token}
        return {}

    def _get(self, url, **kwargs):
        try:
            return self.session.get(url, headers=self.auth_headers(url), timeout=self.timeout, **kwargs)
        except requests.RequestException as exc:
            raise HubError("Cannot reach the Hub at %s: %s" % (redact_url(url), type(exc).__name__)) from exc

    def check(self, response, what):
        """Raise a HubError that tells the user what to do for any non-success answer."""
        if response.status_code < 400:
            return
        code = response.headers.get("X-Error-Code", "")
        status = response.status_code
        response.close()
        if code == "GatedRepo":
            msg = (
                "Repository %s is gated: accept its licence on %s/%s with the account of your token, "
                "then pass that token (HF_TOKEN or the token option)." % (self.repo, self.endpoint, self.repo)
            )
        elif code == "RepoNotFound" or (status == 404 and what == "revision" and not code):
            msg = "Repository %s not found on %s (check the name; a private repo also needs a token)." % (
                self.repo,
                self.endpoint,
            )
        elif code == "RevisionNotFound":
            msg = "Revision not found in %s: %s" % (self.repo, what)
        elif code == "EntryNotFound":
            msg = "File not found in %s: %s" % (self.repo, what)
        elif status == 401:
            msg = "The Hub refused the credentials for %s (401): set a valid token (HF_TOKEN or the token option)." % (
                self.repo
            )
        elif status == 403:
            msg = "The Hub refused access to %s (403): check that your token can read this repo." % self.repo
        elif status == 429:
            msg = "The Hub is rate limiting requests for %s (429) and retries were exhausted; try again later." % (
                self.repo
            )
        else:
            msg = "The Hub answered HTTP %d for %s of %s." % (status, what, self.repo)
        raise HubError(msg, status=status, code=code or None)

    # -- API ---------------------------------------------------------------------------------------
    def resolve_revision(self, revision):
        """The commit sha a branch, tag or sha points to."""
        url = "%s/api/models/%s/revision/%s" % (self.endpoint, self.repo, quote(revision, safe=""))
        response = self._get(url)
        self.check(response, "revision %s" % revision)
        sha = response.json().get("sha")
        if not sha:
            raise HubError("The Hub returned no commit for %s@%s." % (self.repo, revision))
        return sha

    def list_files(self, commit):
        """All files of the repo at ``commit`` (recursive tree API, following ``Link: rel=next`` pages)."""
        url = "%s/api/models/%s/tree/%s?recursive=true&expand=false" % (self.endpoint, self.repo, commit)
        pages = 0
        while url:
            response = self._get(url)
            self.check(response, "file list at %s" % commit)
            for item in response.json():
                if item.get("type") == "file":
                    yield entry_from_tree(item)
            url = response.links.get("next", {}).get("url")
            if url:
                url = urljoin(self.endpoint + "/", url)
            pages += 1
            if pages > 100000:  # a broken server looping on the same cursor
                raise HubError("The tree API of %s does not stop paginating." % self.repo)

    def resolve_url(self, commit, path):
        return "%s/%s/resolve/%s/%s" % (self.endpoint, self.repo, commit, quote(path))

    def resolve(self, commit, path):
        """The signed link of one file, without following the redirect (the token must not reach the CDN).

        Relative redirects stay on the Hub (renamed repos, resolve caches) and are followed with the token;
        an absolute Location is the signed CDN link and is returned to the caller. A 200 means the Hub
        serves the file itself (non-LFS): the returned Link says so and the response is closed.
        """
        url = self.resolve_url(commit, path)
        for _hop in range(MAX_REDIRECTS):
            response = self._get(url, allow_redirects=False, stream=True)
            self.check(response, path)
            headers = response.headers
            size = headers.get("X-Linked-Size")
            etag = (headers.get("X-Linked-Etag") or headers.get("ETag") or "").strip('"').removeprefix("W/").strip('"')
            link = Link(
                url=url,
                on_hub=True,
                size=int(size) if size and size.isdigit() else None,
                sha256=etag if len(etag) == 64 else None,
                commit=headers.get("X-Repo-Commit"),
            )
            location = headers.get("Location")
            response.close()
            if response.status_code in (301, 302, 303, 307, 308) and location:
                if urlsplit(location).scheme:
                    link.url = location
                    link.on_hub = False
                    return link
                url = urljoin(url, location)
                continue
            return link
        raise HubError("Too many redirects on the Hub while resolving %s." % path)


def entry_from_tree(item):
    lfs = item.get("lfs") or {}
    return RepoEntry(
        path=item["path"],
        size=int(lfs.get("size", item.get("size", 0))),
        sha256=lfs.get("oid") or lfs.get("sha256"),
        git_oid=item.get("oid"),
    )


class BodyReader:
    """Reads a streamed response body (requests, ``stream=True``) into the caller's buffer, without copies.

    ``readinto(view)`` does at most one read from the socket, straight into ``view``, and returns how many bytes
    arrived (0 at the end of the body): bytes received before a cut, a reset or a stall are returned, never
    lost, and no bytes object is allocated per read. It reads the http.client response under urllib3's raw
    stream (the body is never decoded: the session asks for identity encoding and ranged bytes must stay raw)
    and stops at its Content-Length. Chunked bodies, or a urllib3/http.client without these attributes, go
    through urllib3's public ``read1``/``read`` and one copy into ``view``.

    Reading beneath urllib3 leaves its bookkeeping behind: close the response afterwards (requests does when
    the body was not consumed through it), never hand its connection back for reuse.
    """

    def __init__(self, response):
        self.raw = response.raw
        http = getattr(self.raw, "_fp", None)  # http.client.HTTPResponse
        stream = getattr(http, "fp", None)  # the io.BufferedReader over the socket
        fast = (
            http is not None
            and getattr(http, "chunked", True) is False
            and hasattr(stream, "readinto1")
            and not getattr(self.raw, "_has_decoded_content", False)
            and getattr(self.raw, "_fp_bytes_read", 0) == 0
        )
        self.stream = stream if fast else None
        self.remaining = getattr(http, "length", None) if fast else None

    def readinto(self, view):
        if self.stream is None:
            return self._readinto_copy(view)
        if self.remaining is not None:
            if self.remaining <= 0:
                return 0
            if len(view) > self.remaining:
                view = view[: self.remaining]
        count = self.stream.readinto1(view) or 0
        if self.remaining is not None:
            self.remaining -= count
        return count

    def _readinto_copy(self, view):
        read1 = getattr(self.raw, "read1", None)
        data = read1(len(view), decode_content=False) if read1 else self.raw.read(len(view), decode_content=False)
        view[: len(data)] = data
        return len(data)


class RateMeter:
    """Bytes per second over a sliding window (for progress reports)."""

    def __init__(self, window=10.0):
        self.window = window
        self.samples = []

    def add(self, total_bytes, now=None):
        now = time.monotonic() if now is None else now
        self.samples.append((now, total_bytes))
        while len(self.samples) > 2 and now - self.samples[0][0] > self.window:
            self.samples.pop(0)

    def rate(self):
        if len(self.samples) < 2:
            return 0.0
        (t0, b0), (t1, b1) = self.samples[0], self.samples[-1]
        return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0


__all__ = [
    "BodyReader",
    "DEFAULT_ENDPOINT",
    "HAS_REQUESTS",
    "REQUESTS_IMPORT_ERROR",
    "HubClient",
    "HubError",
    "Link",
    "RateMeter",
    "RepoEntry",
    "make_session",
    "redact_url",
    "retry_after_seconds",
]
