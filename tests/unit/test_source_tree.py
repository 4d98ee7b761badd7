"""The build manifest names the source tree the build read (after patches) by its content, and the build id follows it.

``source_tree_sha256`` is defined on file paths, contents and execute bits (``.git`` left out), so an archive build
and a git checkout of the same commit are one build, and two different trees are never one. Proven on the vendored
llama.cpp tree: the tree unpacked from the sdist, and a local git repository made from that tree, checked out the way
the role's git source does (a clone of the pinned commit), give the same hash and, through the llamacpp_build
module, the same build id. The manifest also records the tree's RPC protocol version (ggml/include/ggml-rpc.h).
"""
import os
import shutil
import subprocess

import pytest
from ansible.module_utils import minimax_spark_build as engine

import llamacpp_build as lb
from helpers import run_module

GIT = ["git", "-c", "user.name=minimax-spark", "-c", "user.email=minimax-spark@localhost", "-c", "init.defaultBranch=m"]


def tree(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.fixture
def small(tmp_path):
    return tree(tmp_path / "t", {"CMakeLists.txt": "project(x)\n", "src/a.c": "int a;\n",
                                 "tools/run.sh": "#!/bin/sh\n"})


def test_the_hash_ignores_git_the_marker_times_and_other_permission_bits(small):
    before = engine.source_tree_sha256(str(small))
    (small / ".git").mkdir()
    (small / ".git" / "HEAD").write_text("ref: refs/heads/m\n")
    (small / "src" / ".git").write_text("gitdir: ../../.git/modules/x\n")  # a submodule's gitfile
    (small / engine.SOURCE_MARKER).write_text('{"type": "archive"}\n')
    os.utime(small / "src/a.c", (0, 0))
    os.chmod(small / "src/a.c", 0o600)
    assert engine.source_tree_sha256(str(small)) == before


@pytest.mark.parametrize("change", ["content", "exec bit", "rename", "new file", "link target", "removed"])
def test_the_hash_changes_with_paths_contents_exec_bits_and_links(small, change):
    os.symlink("a.c", small / "src" / "b.c")
    before = engine.source_tree_sha256(str(small))
    if change == "content":
        (small / "src/a.c").write_text("int b;\n")
    elif change == "exec bit":
        os.chmod(small / "src/a.c", 0o755)
    elif change == "rename":
        os.rename(small / "src/a.c", small / "src/c.c")
    elif change == "new file":
        (small / "src/d.c").write_text("")
    elif change == "link target":
        os.remove(small / "src/b.c")
        os.symlink("../CMakeLists.txt", small / "src" / "b.c")
    else:
        os.remove(small / "tools/run.sh")
    assert engine.source_tree_sha256(str(small)) != before


def test_rpc_protocol_is_read_from_the_header(tmp_path, llamacpp_tree):
    assert engine.rpc_protocol(str(llamacpp_tree)) == "7.0.0"
    header = tree(tmp_path, {engine.RPC_HEADER: "#define RPC_PROTO_MAJOR_VERSION    8\n"
                                                "#define RPC_PROTO_MINOR_VERSION 1\n"
                                                "#  define RPC_PROTO_PATCH_VERSION 2\n"})
    assert engine.rpc_protocol(str(header)) == "8.1.2"
    (tmp_path / engine.RPC_HEADER).write_text("#define RPC_PROTO_MAJOR_VERSION 8\n")
    assert engine.rpc_protocol(str(tmp_path)) is None
    assert engine.rpc_protocol(str(tmp_path / "none")) is None


def git_checkout_of(src, work):
    """A local git repository made from ``src``'s files, and a checkout of its commit from a clone of it (as the
    role's git source: build_llamacpp_repo file://..., build_llamacpp_ref the commit)."""
    repo = work / "repo"
    shutil.copytree(src, repo, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    subprocess.run(GIT + ["init", "-q", str(repo)], check=True)
    subprocess.run(GIT + ["-C", str(repo), "add", "-A", "--force", "."], check=True)
    subprocess.run(GIT + ["-C", str(repo), "commit", "-q", "-m", "the archive's tree"], check=True)
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True,
                            text=True).stdout.strip()
    checkout = work / "checkout"
    subprocess.run(GIT + ["clone", "-q", "--no-checkout", "file://%s" % repo, str(checkout)], check=True)
    subprocess.run(GIT + ["-C", str(checkout), "checkout", "-q", commit], check=True)
    return checkout, commit


def test_an_archive_tree_and_a_git_checkout_of_it_are_one_build(llamacpp_tree, tmp_path):
    checkout, commit = git_checkout_of(llamacpp_tree, tmp_path)
    assert (llamacpp_tree / ".git").is_file() and (checkout / ".git").is_dir()  # each has its own kind of .git
    assert engine.source_tree_sha256(str(checkout)) == engine.source_tree_sha256(str(llamacpp_tree))
    common = {"build_root": str(tmp_path / "builds"), "jobs": 1}
    # check mode: the module names the build it would make, and builds nothing
    from_archive = run_module(lb.main, dict(common, src=str(llamacpp_tree), source={"type": "archive"}),
                              check_mode=True)
    from_git = run_module(lb.main, dict(common, src=str(checkout), source={"type": "git", "commit": commit}),
                          check_mode=True)
    assert not from_archive.get("failed") and not from_git.get("failed"), (from_archive, from_git)
    assert from_archive["build_id"] == from_git["build_id"]
    # one changed byte in the checkout (a patch, a local edit): another tree, another build
    target = checkout / "src" / "llama.cpp"
    target.write_text(target.read_text() + "\n")
    other = run_module(lb.main, dict(common, src=str(checkout), source={"type": "git", "commit": commit}),
                       check_mode=True)
    assert other["build_id"] != from_archive["build_id"]
    assert not (tmp_path / "builds").exists()
