"""llamacpp_patch: the role's patch step. The project's series applies in order to the tree the tests build; a patch
that does not fit is refused naming the variable, the patch, the tree and the failing file and hunk, with nothing
half-applied; check mode writes nothing; an empty series (build_llamacpp_project_patches: []) changes nothing.

Each project patch starts with a DEP-3 header (Description, Forwarded, Upstream-Status, Base-Commit, Last-Update),
which ``patch -p1`` (the role) and ``git apply`` both skip: proven here on the real patches.
"""
import hashlib
import re
import shutil
import subprocess

import pytest
import yaml

import llamacpp_patch as lp
from conftest import ROOT
from helpers import run_module

PATCHES = ROOT / "roles" / "build_llamacpp" / "files" / "patches"
DEFAULTS = yaml.safe_load((ROOT / "roles" / "build_llamacpp" / "defaults" / "main.yml").read_text())
SERIES = DEFAULTS["build_llamacpp_project_patches"]
#: The files the series touches, read from the patches' own "+++ b/" lines.
TOUCHED = sorted({line[6:].split("\t")[0] for e in SERIES
                  for line in (PATCHES / ("%s.patch" % e["name"])).read_text().splitlines()
                  if line.startswith("+++ b/")})
TREE = "llama.cpp build_llamacpp_ref=test (commit 0123)"

pytestmark = pytest.mark.skipif(not shutil.which("patch"), reason="needs patch")


@pytest.fixture
def work(tmp_path, llamacpp_tree):
    """A tree of the files the patches touch (from the vendored tree) and the role's patch folder
    (``<sha256>.patch``, as the role copies them to the build host)."""
    tree = tmp_path / "tree"
    for rel in TOUCHED:
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(llamacpp_tree / rel, tree / rel)
    patch_dir = tmp_path / "patches"
    patch_dir.mkdir()
    for entry in SERIES:
        shutil.copy(PATCHES / ("%s.patch" % entry["name"]), patch_dir / ("%s.patch" % entry["sha256"]))
    return tree, patch_dir


def args(tree, patch_dir, series=None):
    patches = [dict(e, var="build_llamacpp_project_patches") for e in (SERIES if series is None else series)]
    return {"src": str(tree), "patch_dir": str(patch_dir), "patches": patches, "tree": TREE}


def contents(tree):
    return {p.relative_to(tree): p.read_bytes() for p in sorted(tree.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name", [e["name"] for e in SERIES])
def test_every_project_patch_carries_a_dep3_header(name):
    text = (PATCHES / ("%s.patch" % name)).read_text()
    header = text[:text.index("--- a/")]
    for field in ("Description", "Author", "Forwarded", "Upstream-Status", "Base-Commit", "Last-Update"):
        assert re.search(r"^%s: \S" % field, header, re.M), "%s.patch: no %s field" % (name, field)
    assert re.search(r"^Base-Commit: [0-9a-f]{40}\b", header, re.M)
    assert re.search(r"^Last-Update: \d{4}-\d{2}-\d{2}$", header, re.M)
    assert not re.search(r"^(--- |\+\+\+ |diff |Index: |\*\*\* )", header, re.M), "a header line reads as a diff"


def test_the_series_applies_in_order_with_patch_and_with_git_apply(work, tmp_path):
    tree, patch_dir = work
    copy = tmp_path / "git-apply"
    shutil.copytree(tree, copy)
    result = run_module(lp.main, args(tree, patch_dir))
    assert not result.get("failed"), result.get("msg")
    assert result["changed"] is True and result["applied"] == [e["name"] for e in SERIES]
    assert "res->t_layer_inp[il] = inpL;" in (tree / "src/models/minimax-m3.cpp").read_text()
    assert not [p for p in tree.rglob("*") if p.suffix in (".orig", ".rej")]
    if shutil.which("git"):
        for entry in SERIES:  # git apply skips the header as patch does, and makes the same tree
            done = subprocess.run(["git", "apply", "--directory=", str(PATCHES / ("%s.patch" % entry["name"]))],
                                  cwd=copy, capture_output=True, text=True)
            assert done.returncode == 0, done.stderr
        assert contents(copy) == contents(tree)


def test_check_mode_writes_nothing(work):
    tree, patch_dir = work
    before = contents(tree)
    result = run_module(lp.main, args(tree, patch_dir), check_mode=True)
    assert result["changed"] is True and not result.get("failed")
    assert contents(tree) == before


def test_a_patch_that_does_not_fit_is_refused_naming_it_the_tree_and_the_file(work):
    tree, patch_dir = work
    graph = tree / "src/models/minimax-m3.cpp"
    graph.write_text(graph.read_text().replace("        ggml_tensor * inpSA = inpL;\n",
                                               "        ggml_tensor * inpSA = inp;\n"))
    before = graph.read_bytes()
    result = run_module(lp.main, args(tree, patch_dir))
    assert result.get("failed") is True
    assert result["msg"].startswith(
        "build_llamacpp_project_patches: m3-layer-inputs does not apply to %s: src/models/minimax-m3.cpp: hunk #1 "
        "FAILED at line 301. Nothing was built: refresh the project's patches for this tree (tools/refresh-patches"
        % TREE), result["msg"]
    assert "build_llamacpp_project_patches: [] to build llama.cpp unpatched" in result["msg"]
    assert result["patch"] == "m3-layer-inputs"
    assert graph.read_bytes() == before  # tried first: nothing half-applied, no reject file
    assert not [p for p in tree.rglob("*") if p.suffix in (".orig", ".rej")]


def test_a_missing_file_and_a_reapplied_patch_are_named(work):
    tree, patch_dir = work
    (tree / "src/llama-model-loader.cpp").unlink()
    result = run_module(lp.main, args(tree, patch_dir))
    assert "rpc-load-mapped does not apply" in result["msg"]
    assert "src/llama-model-loader.cpp: not in the tree" in result["msg"]
    [first] = [e for e in SERIES if e["name"] == "m3-layer-inputs"]
    run_module(lp.main, args(tree, patch_dir, [first]))
    again = run_module(lp.main, args(tree, patch_dir, [first]))
    assert "src/models/minimax-m3.cpp: already applied" in again["msg"], again["msg"]


def test_a_patch_file_with_another_sha256_is_refused(work):
    tree, patch_dir = work
    [first] = SERIES[:1]
    path = patch_dir / ("%s.patch" % first["sha256"])
    path.write_text(path.read_text() + "\n")
    result = run_module(lp.main, args(tree, patch_dir, [first]))
    assert result["msg"] == "build_llamacpp_project_patches: patch %s: %s has sha256 %s, expected %s" % (
        first["name"], path, hashlib.sha256(path.read_bytes()).hexdigest(), first["sha256"])


def test_no_patches_change_nothing(work):
    tree, patch_dir = work
    before = contents(tree)
    result = run_module(lp.main, args(tree, patch_dir, []))
    assert result == {"changed": False, "applied": []} or (result["changed"] is False and result["applied"] == [])
    assert contents(tree) == before
