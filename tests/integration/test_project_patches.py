"""build_llamacpp's project patches and source identity, through playbooks/build.yml as a user runs it.

* A project patch whose file does not match its sha256 stops the build before any source is laid out (check mode),
  naming the variable, the file and both checksums.
* A project patch that does not apply to the tree being built is refused before any compile, naming the patch, the
  tree (the archive here; for git: build_llamacpp_ref and its commit) and the failing file and hunk; the tree is never
  marked finished, so nothing of it is built or reused.
* The same tree from the archive and from git is one build: a local git repository made from the archive's llama.cpp
  tree, used as the git source (build_llamacpp_source: git, build_llamacpp_repo: file://..., build_llamacpp_ref: its
  commit), gives the archive build's source-tree hash and build id, so the build cache answers and nothing compiles.

build_llamacpp_project_patches: [] (llama.cpp unpatched) is built through the role by tests/integration/
test_rpc_cache_hit_mmap.py and test_rpc_hash_file_load.py.
"""
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from helpers import ROOT, changed_tasks, failed_tasks, run_playbook

PATCHES = ROOT / "roles" / "build_llamacpp" / "files" / "patches"
DEFAULTS = yaml.safe_load((ROOT / "roles" / "build_llamacpp" / "defaults" / "main.yml").read_text())
PATCH = PATCHES / "rpc-hash-sidecar.patch"
FACT = Path("/etc/ansible/facts.d/minimax_llamacpp.fact")
CACHE = Path("/var/cache/minimax-spark/llama.cpp")
BUILD_TASK = "Build llama.cpp (cached by source and options)"
GIT = ["git", "-c", "user.name=minimax-spark", "-c", "user.email=minimax-spark@localhost", "-c", "init.defaultBranch=m"]


def ran(runner, task):
    """The results of ``task`` on the hosts it ran on (not skipped)."""
    return [e for e in runner.event_list if e.get("event") in ("runner_on_ok", "runner_on_failed")
            and e["event_data"].get("task") == task]


def test_a_project_patch_with_another_sha256_is_refused_naming_it():
    actual = hashlib.sha256(PATCH.read_bytes()).hexdigest()
    runner = run_playbook("playbooks/build.yml", tags=["build_llamacpp"], check=True, extravars={
        "build_llamacpp_project_patches": [{"name": "rpc-hash-sidecar", "src": str(PATCH), "sha256": "0" * 64}]})
    assert runner.status == "failed"
    msgs = [item.get("msg", "") for e in runner.event_list if e.get("event") == "runner_on_failed"
            for item in e["event_data"]["res"].get("results", [])]
    assert any("build_llamacpp_project_patches: %s has sha256 %s, expected %s" % (PATCH, actual, "0" * 64) in m
               for m in msgs), failed_tasks(runner)


def test_a_project_patch_that_does_not_fit_the_tree_is_refused_before_the_build(tmp_path, llamacpp_archive):
    text = (PATCHES / "m3-layer-inputs.patch").read_text()
    assert text.count("\n         ggml_tensor * inpSA = inpL;\n") == 1
    broken = tmp_path / "m3-layer-inputs.patch"  # its context no longer matches the M3 graph
    broken.write_text(text.replace("\n         ggml_tensor * inpSA = inpL;\n",
                                   "\n         ggml_tensor * inpSA = inp;\n"))
    sha = hashlib.sha256(broken.read_bytes()).hexdigest()
    fact_before = FACT.read_text() if FACT.exists() else None
    runner = run_playbook("playbooks/build.yml", tags=["build_llamacpp"], extravars={
        "build_llamacpp_project_patches": [{"name": "m3-layer-inputs", "src": str(broken), "sha256": sha}]})
    assert runner.status == "failed"
    [(host, task, msg)] = failed_tasks(runner)
    assert task == "Apply the patches"
    assert msg.startswith(
        "build_llamacpp_project_patches: m3-layer-inputs does not apply to llama.cpp from build_llamacpp_archive=%s "
        "(%s/vendor/llama.cpp): src/models/minimax-m3.cpp: hunk #1 FAILED at line 301. Nothing was built: refresh "
        "the project's patches for this tree (tools/refresh-patches, docs/llamacpp.md)"
        % (llamacpp_archive.name, llamacpp_archive.name[:-len(".tar.gz")])), msg
    assert not ran(runner, BUILD_TASK), "the build ran after a patch was refused"
    # the patched tree was never marked finished: no source tree of this identity to build or reuse later
    for marker in CACHE.glob("src/*/.minimax-spark-source.json"):
        assert sha not in json.loads(marker.read_text()).get("patches", []), marker
    assert (FACT.read_text() if FACT.exists() else None) == fact_before


@pytest.fixture
def git_source(tmp_path, llamacpp_tree):
    """A local git repository made from the archive's llama.cpp tree; the role's git cache and source tree of it
    are removed afterwards."""
    repo = tmp_path / "llama.cpp"
    shutil.copytree(llamacpp_tree, repo, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    subprocess.run(GIT + ["init", "-q", str(repo)], check=True)
    subprocess.run(GIT + ["-C", str(repo), "add", "-A", "--force", "."], check=True)
    subprocess.run(GIT + ["-C", str(repo), "commit", "-q", "-m", "the archive's llama.cpp tree"], check=True)
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True,
                            text=True).stdout.strip()
    url = "file://%s" % repo
    yield url, commit
    for marker in CACHE.glob("src/*/.minimax-spark-source.json"):
        if json.loads(marker.read_text()).get("repo") == url:
            shutil.rmtree(marker.parent, ignore_errors=True)
    shutil.rmtree(CACHE / "git", ignore_errors=True)


def test_the_archive_and_a_git_checkout_of_its_tree_are_one_build(llamacpp_bin, git_source):
    archive = run_playbook("playbooks/build.yml", tags=["build_llamacpp"])
    assert archive.status == "successful", failed_tasks(archive)
    from_archive = json.loads(FACT.read_text())
    assert from_archive["source"]["type"] == "archive"
    assert len(from_archive["source_tree_sha256"]) == 64 and from_archive["rpc_protocol"] == "7.0.0"

    url, commit = git_source
    runner = run_playbook("playbooks/build.yml", tags=["build_llamacpp"], extravars={
        "build_llamacpp_source": "git", "build_llamacpp_repo": url, "build_llamacpp_ref": commit})
    assert runner.status == "successful", failed_tasks(runner) or runner.stdout_text[-3000:]
    [build] = [e["event_data"]["res"] for e in ran(runner, BUILD_TASK)]
    assert build["build_id"] == from_archive["build_id"]
    assert build["manifest"]["source_tree_sha256"] == from_archive["source_tree_sha256"]
    assert build["changed"] is False, "the git checkout of the archive's tree was compiled again"
    assert ("localhost", BUILD_TASK) not in changed_tasks(runner)
    # it was a git checkout of that commit, patched as the archive was
    [marker] = [m for m in CACHE.glob("src/*/.minimax-spark-source.json")
                if json.loads(m.read_text()).get("repo") == url]
    identity = json.loads(marker.read_text())
    assert identity["type"] == "git" and identity["commit"] == commit
    assert identity["patches"] == [p["sha256"] for p in DEFAULTS["build_llamacpp_project_patches"]]
    assert json.loads(FACT.read_text())["build_id"] == from_archive["build_id"]
