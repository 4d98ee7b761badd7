"""tools/refresh-patches carries the project's llama.cpp patches to another tree, or names what does not fit.

On the tree the patches were made on (the vendored tree the tests build) it reproduces every committed patch byte
for byte and rewrites nothing. On a tree where one hunk cannot apply (a copy with the hunk's context edited) it
names the patch, the file and the hunk, and leaves every patch file and the defaults' sha256 as they were. On a
tree where a patch applies with an offset, it re-diffs that patch (its header kept, Last-Update and Base-Commit
rewritten) and its sha256 in the defaults follows, and the role's own check accepts the result.
"""
import hashlib
import shutil
import subprocess

import pytest
import yaml

from conftest import ROOT

TOOL = ROOT / "tools" / "refresh-patches"
ROLE = ROOT / "roles" / "build_llamacpp"
M3 = "src/models/minimax-m3.cpp"

pytestmark = pytest.mark.skipif(not shutil.which("patch") or not shutil.which("diff"), reason="needs patch and diff")


@pytest.fixture
def role(tmp_path):
    """A copy of the role's defaults and patches: what the tool rewrites."""
    copy = tmp_path / "role"
    shutil.copytree(ROLE / "defaults", copy / "defaults")
    shutil.copytree(ROLE / "files" / "patches", copy / "files" / "patches")
    return copy


def snapshot(role):
    return {p.relative_to(role): p.read_bytes() for p in sorted(role.rglob("*")) if p.is_file()}


def small_tree(llamacpp_tree, dest):
    """The files the patches touch, copied from the vendored tree (all the tool reads)."""
    touched = {line[6:] for patch in (ROLE / "files" / "patches").glob("*.patch")
               for line in patch.read_text().splitlines() if line.startswith("+++ b/")}
    assert M3 in touched
    for rel in sorted(touched):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(llamacpp_tree / rel, dest / rel)
    return dest


def run(role, *args):
    return subprocess.run([str(TOOL), "--role", str(role), "--date", "2031-01-02", *args], capture_output=True,
                          text=True)


def test_on_the_vendored_tree_it_reproduces_the_committed_patches_byte_for_byte(llamacpp_tree, role):
    before = snapshot(role)
    done = run(role, str(llamacpp_tree))
    assert done.returncode == 0, done.stdout + done.stderr
    names = [p["name"] for p in yaml.safe_load((ROLE / "defaults/main.yml").read_text())[
        "build_llamacpp_project_patches"]]
    for name in names:
        assert "%-20s unchanged" % name in done.stdout, (
            "tools/refresh-patches rewrites %s on the tree it was made on: run tools/refresh-patches on the vendored "
            "tree (.cache/llama.cpp-tree/...) and commit the result\n%s" % (name, done.stdout))
    assert snapshot(role) == before


def test_a_hunk_that_cannot_apply_is_named_and_nothing_changes(llamacpp_tree, role, tmp_path):
    tree = small_tree(llamacpp_tree, tmp_path / "tree")
    graph = tree / M3
    source = graph.read_text()
    assert source.count("        ggml_tensor * inpSA = inpL;\n") == 1
    graph.write_text(source.replace("        ggml_tensor * inpSA = inpL;\n", "        ggml_tensor * inpSA = inp;\n"))
    before, tree_before = snapshot(role), snapshot(tree)
    done = run(role, str(tree))
    assert done.returncode == 1
    assert ("refresh-patches: m3-layer-inputs (%s/files/patches/m3-layer-inputs.patch) does not apply to %s: "
            "%s: hunk #1 FAILED at line 301. Nothing was changed." % (role, tree, M3)) in done.stderr, done.stderr
    assert snapshot(role) == before and snapshot(tree) == tree_before


def test_a_file_missing_from_the_tree_is_named(llamacpp_tree, role, tmp_path):
    tree = small_tree(llamacpp_tree, tmp_path / "tree")
    (tree / "src/llama-model-loader.cpp").unlink()
    before = snapshot(role)
    done = run(role, str(tree))
    assert done.returncode == 1
    assert "rpc-load-mapped" in done.stderr and "src/llama-model-loader.cpp: not in the tree" in done.stderr
    assert snapshot(role) == before


def test_a_moved_hunk_is_rediffed_and_its_sha256_follows(llamacpp_tree, role, tmp_path):
    tree = small_tree(llamacpp_tree, tmp_path / "tree")
    graph = tree / M3
    graph.write_text("// three lines more\n//\n//\n" + graph.read_text())
    done = run(role, "--base", "f" * 40, str(tree))
    assert done.returncode == 0, done.stderr
    assert "m3-layer-inputs      refreshed" in done.stdout and "rpc-load-mapped      unchanged" in done.stdout
    patch = role / "files/patches/m3-layer-inputs.patch"
    text, old = patch.read_text(), (ROLE / "files/patches/m3-layer-inputs.patch").read_text()
    assert "@@ -304,6 +304,8 @@" in text and "@@ -301,6 +301,8 @@" in old
    assert "Base-Commit: %s\n" % ("f" * 40) in text and "Last-Update: 2031-01-02\n" in text
    assert text.split("Base-Commit")[0] == old.split("Base-Commit")[0]  # Description, Forwarded... kept
    [entry] = [p for p in yaml.safe_load((role / "defaults/main.yml").read_text())["build_llamacpp_project_patches"]
               if p["name"] == "m3-layer-inputs"]
    assert entry["sha256"] == hashlib.sha256(patch.read_bytes()).hexdigest()
    # the refreshed patch applies without an offset; a second refresh changes nothing
    again = run(role, "--base", "f" * 40, str(tree))
    assert "m3-layer-inputs      unchanged" in again.stdout, again.stdout


def test_a_ref_of_a_local_repository_is_fetched_and_named(llamacpp_tree, role, tmp_path):
    tree = small_tree(llamacpp_tree, tmp_path / "repo")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@localhost", "-C", str(tree)]
    subprocess.run(git[:5] + ["init", "-q", str(tree)], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "the patched files of the vendored tree"], check=True)
    subprocess.run(git + ["tag", "b99999"], check=True)
    commit = subprocess.run(git + ["rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    by_ref = run(role, "--check", "--repo", "file://%s" % tree, "b99999")
    by_tree = run(role, "--check", str(tree))
    assert by_ref.stdout.splitlines()[:-1] == by_tree.stdout.splitlines()[:-1], by_ref.stderr
    assert by_ref.stdout.splitlines()[-1] == "onto b99999 of file://%s (commit %s)" % (tree, commit)
    missing = run(role, "--repo", "file://%s" % tree, "b00000")
    assert missing.returncode == 1 and "b00000" in missing.stderr and "Nothing was changed." in missing.stderr
