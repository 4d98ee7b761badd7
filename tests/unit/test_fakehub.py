"""The fake Hub speaks the Hub protocol hf_download relies on, and its CDN refuses leaked tokens."""
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from fakehub import FakeHub

ROOT = Path(__file__).resolve().parents[2]
REPO = "org/tiny"
REL = "Q/tiny-00001-of-00001.gguf"


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "Q").mkdir()
    data = os.urandom(300_000)
    (tmp_path / REL).write_bytes(data)
    (tmp_path / "README.md").write_text("tiny\n")
    return tmp_path, data


@pytest.fixture
def hub(tree):
    with FakeHub(tree[0], repos={REPO: ""}, token="hf_tok", page_size=1) as hub:
        yield hub


def auth(token="hf_tok"):
    return {"Authorization": "Bearer %s" % token}


def test_resolve_redirects_to_a_signed_cdn_link_with_hub_headers(hub, tree):
    response = requests.get("%s/%s/resolve/main/%s" % (hub.url, REPO, REL), headers=auth(), allow_redirects=False)
    assert response.status_code == 302
    assert response.headers["X-Linked-Etag"] == '"%s"' % hashlib.sha256(tree[1]).hexdigest()
    assert response.headers["X-Linked-Size"] == str(len(tree[1]))
    assert len(response.headers["X-Repo-Commit"]) == 40
    cdn = response.headers["Location"]
    assert "/cdn/" in cdn and "X-Signature=" in cdn
    part = requests.get(cdn, headers={"Range": "bytes=10-19"})
    assert part.status_code == 206 and part.content == tree[1][10:20]
    assert part.headers["Content-Range"] == "bytes 10-19/%d" % len(tree[1])
    assert requests.head(cdn).status_code == 405
    assert requests.get(cdn, headers=auth()).status_code == 400  # a token reaching the CDN fails the request
    assert requests.get(cdn.replace("X-Signature=", "X-Signature=x")).status_code == 403
    hub.revoke_links()
    assert requests.get(cdn).status_code == 403


def test_tree_is_paginated_and_lists_lfs_checksums(hub, tree):
    url = "%s/api/models/%s/tree/main?recursive=true" % (hub.url, REPO)
    items = []
    while url:
        response = requests.get(url, headers=auth())
        items += response.json()
        url = response.links.get("next", {}).get("url")
    by_path = {i["path"]: i for i in items}
    assert set(by_path) == {REL, "README.md"}
    assert by_path[REL]["lfs"] == {"oid": hashlib.sha256(tree[1]).hexdigest(), "size": len(tree[1]), "pointerSize": 134}
    assert "lfs" not in by_path["README.md"]
    revision = requests.get("%s/api/models/%s/revision/main" % (hub.url, REPO), headers=auth()).json()
    assert len(revision["sha"]) == 40


def test_errors_carry_hub_error_codes(tree):
    with FakeHub(tree[0], repos={REPO: "", "org/gated": ""}, gated={"org/gated"}) as hub:
        assert requests.get("%s/api/models/org/none/revision/main" % hub.url).headers["X-Error-Code"] == "RepoNotFound"
        gated = requests.get("%s/org/gated/resolve/main/%s" % (hub.url, REL), allow_redirects=False)
        assert gated.status_code == 403 and gated.headers["X-Error-Code"] == "GatedRepo"
        hub.faults.rate_limit_first = 1
        hub.faults.retry_after = 7
        limited = requests.get("%s/api/models/%s/revision/main" % (hub.url, REPO))
        assert limited.status_code == 429 and limited.headers["Retry-After"] == "7"
    with FakeHub(tree[0], repos={REPO: ""}, token="hf_tok") as hub:
        assert requests.get("%s/api/models/%s/revision/main" % (hub.url, REPO)).status_code == 401


def test_cli_serves_a_repo_and_stops_on_sigterm(tree, tmp_path):
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "support" / "fakehub.py"), "--root", str(tree[0]), "--repo", REPO,
         "--port-file", str(port_file), "--ignore-range"],
        stdout=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 20
        while not (port_file.exists() and port_file.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        url = "http://127.0.0.1:%s" % port_file.read_text().strip()
        response = requests.get("%s/%s/resolve/main/%s" % (url, REPO, REL), headers={"Range": "bytes=0-9"})
        assert response.status_code == 200 and response.content == tree[1]  # --ignore-range: full body
    finally:
        proc.terminate()
        assert proc.wait(10) == 0
