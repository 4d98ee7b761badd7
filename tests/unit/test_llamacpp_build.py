"""llamacpp_build: CMake options, the build id, the RPC target name, the staged manifest, a real build.

The real build runs against a fake llama.cpp tree: a CMakeLists.txt that builds a tiny llama-server and
ggml-rpc-server linked to a shared libggml, the way llama.cpp lays out its build tree (everything in
build/bin, RUNPATH from CMAKE_BUILD_RPATH_USE_ORIGIN).
"""
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from ansible.module_utils import minimax_spark_build as engine

import llamacpp_build as lb
from helpers import run_module

pytestmark = pytest.mark.skipif(not shutil.which("cmake") or not shutil.which("cc"), reason="needs cmake and cc")

# -- helpers ------------------------------------------------------------------------------------------------------


def params(**overrides):
    """llamacpp_build's parameters with the module's defaults."""
    p = {
        "src": "/src",
        "source": {"type": "git", "ref": "b7000", "commit": "0123abcd"},
        "build_root": "/builds",
        "cuda": False,
        "cuda_architectures": None,
        "native": False,
        "rdma": False,
        "openssl": False,
        "extra_cmake_args": [],
        "targets": [],
        "ccache_dir": None,
        "jobs": 0,
    }
    p.update(overrides)
    return p


TREE = "a" * 64


def build_id(tree=TREE, **overrides):
    p = params(**overrides)
    args = engine.cmake_args(p)
    targets = ["llama-server", "ggml-rpc-server"] + list(p["targets"])
    return engine.build_id_for(tree, args, targets)


def sha256(path):
    return engine.sha256_file(str(path))


# -- cmake_args ---------------------------------------------------------------------------------------------------


def test_cmake_args_cpu_build():
    args = engine.cmake_args(params())
    assert "-DGGML_RPC=ON" in args
    assert "-DCMAKE_BUILD_RPATH_USE_ORIGIN=ON" in args
    assert "-DGGML_NATIVE=OFF" in args
    assert "-DGGML_CUDA=OFF" in args
    assert "-DCMAKE_BUILD_TYPE=Release" in args
    assert not any(a.startswith("-DCMAKE_CUDA_ARCHITECTURES") for a in args)


def test_cmake_args_cuda_build_sets_the_architecture():
    args = engine.cmake_args(params(cuda=True, cuda_architectures="121"))
    assert "-DGGML_CUDA=ON" in args
    assert "-DCMAKE_CUDA_ARCHITECTURES=121" in args
    assert "-DGGML_RPC=ON" in args


def test_cmake_args_architecture_is_ignored_without_cuda():
    args = engine.cmake_args(params(cuda=False, cuda_architectures="90"))
    assert not any("CUDA_ARCHITECTURES" in a for a in args)


def test_cmake_args_native_rdma_openssl_on_request():
    args = engine.cmake_args(params(native=True, rdma=True, openssl=True))
    assert {"-DGGML_NATIVE=ON", "-DGGML_RPC_RDMA=ON", "-DLLAMA_OPENSSL=ON"} <= set(args)


def test_cmake_args_extra_args_come_last_so_they_win():
    extra = ["-DGGML_NATIVE=ON", "-DGGML_CUDA_FA_ALL_QUANTS=ON"]
    args = engine.cmake_args(params(cuda=True, cuda_architectures="90", extra_cmake_args=extra))
    assert args[-2:] == extra
    assert args.index("-DGGML_NATIVE=OFF") < args.index("-DGGML_NATIVE=ON")


# -- build_id_for ---------------------------------------------------------------------------------------------------


def test_build_id_is_stable_for_equal_input():
    assert build_id() == build_id()
    assert len(build_id()) == 16 and all(c in "0123456789abcdef" for c in build_id())


def test_build_id_follows_the_tree_not_how_it_was_obtained():
    """An archive and a git checkout of the same tree are one build; another tree is another build."""
    assert build_id(source={"type": "archive", "archive": "x.tar.gz", "archive_sha256": "f" * 64}) == build_id()
    assert build_id(tree="b" * 64) != build_id()


@pytest.mark.parametrize(
    "change",
    [
        {"cuda": True, "cuda_architectures": "121"},
        {"native": True},
        {"rdma": True},
        {"openssl": True},
        {"extra_cmake_args": ["-DGGML_CUDA_FA_ALL_QUANTS=ON"]},
        {"targets": ["llama-cli"]},
    ],
    ids=["cuda", "native", "rdma", "openssl", "extra", "targets"],
)
def test_build_id_changes_with_source_options_and_targets(change):
    assert build_id(**change) != build_id()


def test_build_id_changes_with_the_cuda_architecture():
    assert build_id(cuda=True, cuda_architectures="121") != build_id(cuda=True, cuda_architectures="90")


def test_build_id_ignores_the_order_of_targets():
    p = params()
    args = engine.cmake_args(p)
    assert engine.build_id_for(TREE, args, ["llama-server", "rpc-server", "llama-cli"]) == engine.build_id_for(
        TREE, args, ["llama-cli", "rpc-server", "llama-server"]
    )


# -- rpc_target -----------------------------------------------------------------------------------------------------


def test_rpc_target_new_tree(tmp_path):
    (tmp_path / "tools/rpc").mkdir(parents=True)
    (tmp_path / "tools/rpc/CMakeLists.txt").write_text(
        "set(TARGET ggml-rpc-server)\nadd_executable(${TARGET} rpc-server.cpp)\n")
    assert engine.rpc_target(str(tmp_path)) == "ggml-rpc-server"


def test_rpc_target_old_tree(tmp_path):
    (tmp_path / "examples/rpc").mkdir(parents=True)
    (tmp_path / "examples/rpc/CMakeLists.txt").write_text(
        "set(TARGET rpc-server)\nadd_executable(${TARGET} rpc-server.cpp)\n")
    assert engine.rpc_target(str(tmp_path)) == "rpc-server"


def test_rpc_target_none(tmp_path):
    (tmp_path / "tools/server").mkdir(parents=True)
    (tmp_path / "tools/server/CMakeLists.txt").write_text("add_executable(llama-server server.cpp)\n")
    assert engine.rpc_target(str(tmp_path)) is None


# -- stage_verifies ---------------------------------------------------------------------------------------------------


@pytest.fixture
def stage(tmp_path):
    stage = tmp_path / "stage"
    (stage / "bin").mkdir(parents=True)
    (stage / "bin/llama-server").write_bytes(b"\x7fELF server")
    (stage / "bin/ggml-rpc-server").write_bytes(b"\x7fELF rpc")
    (stage / "bin/libggml.so").write_bytes(b"\x7fELF lib")
    os.symlink("ggml-rpc-server", stage / "bin/rpc-server")
    manifest = {
        "manifest_version": engine.MANIFEST_VERSION,
        "build_id": "0123456789abcdef",
        "files": {rel: sha256(stage / rel) for rel in ("bin/llama-server", "bin/ggml-rpc-server", "bin/libggml.so")},
    }
    (stage / "manifest.json").write_text(json.dumps(manifest))
    return stage


def test_stage_verifies_a_good_stage(stage):
    manifest = engine.stage_verifies(str(stage))
    assert manifest is not None
    assert manifest["build_id"] == "0123456789abcdef"


def test_stage_verifies_rejects_a_tampered_binary(stage):
    (stage / "bin/llama-server").write_bytes(b"\x7fELF server, patched")
    assert engine.stage_verifies(str(stage)) is None


def test_stage_verifies_rejects_a_missing_file(stage):
    (stage / "bin/libggml.so").unlink()
    assert engine.stage_verifies(str(stage)) is None


@pytest.mark.parametrize("version", [None, 1, engine.MANIFEST_VERSION - 1])
def test_stage_verifies_rejects_an_old_manifest(stage, version):
    manifest = json.loads((stage / "manifest.json").read_text())
    if version is None:
        del manifest["manifest_version"]
    else:
        manifest["manifest_version"] = version
    (stage / "manifest.json").write_text(json.dumps(manifest))
    assert engine.stage_verifies(str(stage)) is None


@pytest.mark.parametrize("text", [None, "", "{not json", '{"manifest_version": %d}' % engine.MANIFEST_VERSION])
def test_stage_verifies_rejects_a_missing_or_broken_manifest(stage, text):
    if text is None:
        (stage / "manifest.json").unlink()
    else:
        (stage / "manifest.json").write_text(text)
    assert engine.stage_verifies(str(stage)) is None


# -- the module's argument errors --------------------------------------------------------------------------------------


def test_cuda_without_architectures_fails_naming_it(tmp_path):
    result = run_module(lb.main, {"src": str(tmp_path), "source": {"ref": "x"}, "build_root": str(tmp_path / "b"),
                                  "cuda": True})
    assert result.get("failed") is True
    assert "cuda_architectures" in result["msg"]
    assert not (tmp_path / "b").exists()


def test_a_folder_without_cmakelists_is_not_a_source_tree(tmp_path):
    (tmp_path / "src").mkdir()
    result = run_module(lb.main, {"src": str(tmp_path / "src"), "source": {"ref": "x"},
                                  "build_root": str(tmp_path / "b")})
    assert result.get("failed") is True
    assert str(tmp_path / "src") in result["msg"]
    assert "not a llama.cpp source tree" in result["msg"]
    assert not (tmp_path / "b").exists()


def test_a_cmake_tree_without_rpc_server_is_not_llama_cpp(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src/CMakeLists.txt").write_text("project(other C)\n")
    result = run_module(lb.main, {"src": str(tmp_path / "src"), "source": {"ref": "x"},
                                  "build_root": str(tmp_path / "b")})
    assert result.get("failed") is True
    assert "no RPC server target" in result["msg"]
    assert "tools/rpc" in result["msg"]
    assert not (tmp_path / "b").exists()


# -- a real build of a fake llama.cpp tree ---------------------------------------------------------------------------

FAKE_TOP = """\
cmake_minimum_required(VERSION 3.14)
project(fake_llama C)
# As llama.cpp: every binary and library in build/bin.
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
set(CMAKE_LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
option(GGML_RPC "RPC backend" OFF)
if (NOT GGML_RPC)
    message(FATAL_ERROR "GGML_RPC must be ON")
endif()
%(rpath)s
add_library(ggml SHARED ggml/ggml.c)
set_target_properties(ggml PROPERTIES VERSION 0.9.4 SOVERSION 0)
add_subdirectory(tools/server)
add_subdirectory(tools/rpc)
"""

FAKE_GGML = """\
const char *ggml_version(void) { return "ggml-fake"; }
"""

FAKE_SERVER = """\
#include <stdio.h>
#include <string.h>
const char *ggml_version(void);
%(mark)s
int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--version") == 0) {
        fprintf(stderr, "version: 1 (test)\\nbuilt with cc for fake\\n");
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "--help") == 0) {
        printf("----- common params -----\\n");
        printf("-m,    --model FNAME        model path\\n");
        printf("--load-mode {mmap,none}     how to load the model (%%s)\\n", ggml_version());
        printf("-fa,   --flash-attn [on|off|auto]\\n");
        printf("--rpc SERVERS               comma separated list of RPC servers\\n");
        return 0;
    }
    printf("%%s\\n", ggml_version());
    return 0;
}
"""

FAKE_RPC = """\
#include <stdio.h>
const char *ggml_version(void);
int main(void) { printf("rpc %s\\n", ggml_version()); return 0; }
"""


def fake_tree(root, m3_parser=False, origin=True, hash_file=False):
    """A llama.cpp-shaped source tree building llama-server and ggml-rpc-server against libggml."""
    files = {
        "CMakeLists.txt": FAKE_TOP % {"rpath": "" if origin else "set(CMAKE_SKIP_BUILD_RPATH ON)"},
        # rpc-hash-sidecar: the RPC client (in a library) reads GGML_RPC_HASH_FILE
        "ggml/ggml.c": FAKE_GGML + ('#include <stdlib.h>\n'
                                    'const char *hash_env(void) { return getenv("GGML_RPC_HASH_FILE"); }\n'
                                    if hash_file else ""),
        "tools/server/CMakeLists.txt":
            "add_executable(llama-server server.c)\ntarget_link_libraries(llama-server ggml)\n",
        "tools/server/server.c": FAKE_SERVER % {
            "mark": 'const char *chat_format = "peg-minimax-m3";\n'
                    'int uses_format(void) { return chat_format[0]; }' if m3_parser else ""
        },
        "tools/rpc/CMakeLists.txt": "set(TARGET ggml-rpc-server)\nadd_executable(${TARGET} rpc-server.c)\n"
                                    "target_link_libraries(${TARGET} ggml)\n",
        "tools/rpc/rpc-server.c": FAKE_RPC,
    }
    for rel, text in files.items():
        path = Path(root) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return Path(root)


def build_args(src, build_root, **extra):
    args = {"src": str(src), "source": {"type": "test", "ref": "fake"}, "build_root": str(build_root), "jobs": 4}
    args.update(extra)
    return args


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """One real build of the fake tree (shared: a build costs a few seconds)."""
    root = tmp_path_factory.mktemp("llamacpp")
    src = fake_tree(root / "src")
    result = run_module(lb.main, build_args(src, root / "builds"))
    return src, root / "builds", result


def test_a_build_stages_both_rpc_names_and_a_verified_manifest(built):
    src, build_root, result = built
    assert not result.get("failed"), result.get("msg")
    assert result["changed"] is True
    stage = Path(result["stage_dir"])
    assert stage == build_root / result["build_id"]
    assert result["steps"], "the build reports its steps"

    bin_dir = stage / "bin"
    assert (bin_dir / "llama-server").is_file() and not (bin_dir / "llama-server").is_symlink()
    assert (bin_dir / "ggml-rpc-server").is_file() and not (bin_dir / "ggml-rpc-server").is_symlink()
    # Both RPC server names run: the one the tree does not build is a link to the one it does.
    assert os.readlink(bin_dir / "rpc-server") == "ggml-rpc-server"
    # The shared library keeps its SONAME links.
    assert os.readlink(bin_dir / "libggml.so") == "libggml.so.0"
    assert os.readlink(bin_dir / "libggml.so.0") == "libggml.so.0.9.4"

    manifest = json.loads((stage / "manifest.json").read_text())
    assert manifest == result["manifest"]
    assert manifest["manifest_version"] == engine.MANIFEST_VERSION
    assert manifest["build_id"] == result["build_id"]
    assert manifest["source"] == {"type": "test", "ref": "fake"}
    assert manifest["rpc_server"] == "ggml-rpc-server"
    assert manifest["targets"][:2] == ["llama-server", "ggml-rpc-server"]
    assert manifest["version"] == "1 (test)"
    assert {"--model", "--load-mode", "--flash-attn", "--rpc"} <= set(manifest["server_options"])
    assert manifest["has_m3_parser"] is False
    assert manifest["m3_layer_inputs"] is None and manifest["patches"] == []  # a tree without an M3 graph
    # the tree the build read, by content (the build id follows it), and its RPC protocol (none in this tree)
    assert manifest["source_tree_sha256"] == engine.source_tree_sha256(str(src))
    assert result["build_id"] == engine.build_id_for(manifest["source_tree_sha256"], manifest["cmake_args"],
                                                     manifest["targets"])
    assert manifest["rpc_protocol"] is None
    assert manifest["options"]["cuda"] is False and manifest["options"]["cuda_architectures"] is None
    assert set(manifest["files"]) == {"bin/llama-server", "bin/ggml-rpc-server", "bin/libggml.so.0.9.4"}
    for rel, digest in manifest["files"].items():
        assert sha256(stage / rel) == digest, rel
    assert not Path(str(stage) + ".tmp").exists()


def test_staged_binaries_run_without_the_build_tree_or_ld_library_path(built, tmp_path):
    _, build_root, result = built
    # Copy the stage elsewhere: RUNPATH is $ORIGIN, so nothing points back at the build tree.
    moved = tmp_path / "moved"
    shutil.copytree(result["stage_dir"], moved, symlinks=True)
    env = {"PATH": "/usr/bin:/bin"}
    for name in ("llama-server", "ggml-rpc-server", "rpc-server"):
        proc = subprocess.run([str(moved / "bin" / name)], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr
        assert "ggml-fake" in proc.stdout
    if shutil.which("readelf"):
        dynamic = subprocess.run(["readelf", "-d", str(moved / "bin/llama-server")],
                                 capture_output=True, text=True).stdout
        assert "$ORIGIN" in dynamic
        assert str(build_root) not in dynamic


def test_a_second_run_does_not_build_again(built):
    src, build_root, first = built
    work = build_root / "work" / first["build_id"]
    before = {p: p.stat().st_mtime_ns for p in [work, *work.rglob("*")]}
    again = run_module(lb.main, build_args(src, build_root))
    assert again["changed"] is False
    assert "steps" not in again
    assert again["build_id"] == first["build_id"]
    assert again["manifest"] == first["manifest"]
    assert {p: p.stat().st_mtime_ns for p in [work, *work.rglob("*")]} == before


def test_check_mode_on_a_built_tree_reports_no_change(built):
    src, build_root, first = built
    again = run_module(lb.main, build_args(src, build_root), check_mode=True)
    assert again["changed"] is False
    assert again["build_id"] == first["build_id"]


def test_check_mode_builds_nothing(tmp_path):
    src = fake_tree(tmp_path / "src")
    result = run_module(lb.main, build_args(src, tmp_path / "builds"), check_mode=True)
    assert result["changed"] is True
    assert result["build_id"]
    assert not (tmp_path / "builds").exists()


def test_a_tampered_stage_is_rebuilt(tmp_path):
    src = fake_tree(tmp_path / "src")
    first = run_module(lb.main, build_args(src, tmp_path / "builds"))
    server = Path(first["stage_dir"]) / "bin/llama-server"
    good = server.read_bytes()
    server.write_bytes(good + b"tampered")
    again = run_module(lb.main, build_args(src, tmp_path / "builds"))
    assert again["changed"] is True
    assert again["build_id"] == first["build_id"]
    assert server.read_bytes() == good
    assert engine.stage_verifies(first["stage_dir"]) is not None


def test_a_server_with_the_native_m3_parser_is_recorded(tmp_path):
    src = fake_tree(tmp_path / "src", m3_parser=True)
    result = run_module(lb.main, build_args(src, tmp_path / "builds", source={"type": "test", "ref": "m3"}))
    assert not result.get("failed"), result.get("msg")
    assert result["manifest"]["has_m3_parser"] is True


def test_the_manifest_records_the_patches_and_whether_rpc_reads_hash_files(built, tmp_path):
    assert built[2]["manifest"]["patches"] == [] and built[2]["manifest"]["rpc_hash_file"] is False
    src = fake_tree(tmp_path / "src", hash_file=True)
    patches = [{"name": "rpc-hash-sidecar", "src": "/p/rpc-hash-sidecar.patch", "sha256": "ab" * 32},
               {"src": "/p/mine.patch", "sha256": "cd" * 32}]
    result = run_module(lb.main, build_args(src, tmp_path / "builds", patches=patches,
                                            source={"type": "test", "ref": "hash", "patches": ["ab" * 32, "cd" * 32]}))
    assert not result.get("failed"), result.get("msg")
    assert result["manifest"]["rpc_hash_file"] is True
    assert result["manifest"]["patches"] == [{"name": "rpc-hash-sidecar", "sha256": "ab" * 32},
                                             {"name": "mine.patch", "sha256": "cd" * 32}]


def test_an_rpc_only_build_compiles_and_stages_no_llama_server(tmp_path):
    """server=false (a worker-only architecture): the server's source does not compile, so a build that tried to
    build llama-server would fail; the RPC server alone builds, runs from its stage, and the manifest says so."""
    src = fake_tree(tmp_path / "src")
    (src / "tools/server/server.c").write_text("int main(void) { return server_is_not_wanted_x7; }\n")
    full = run_module(lb.main, build_args(src, tmp_path / "builds"))
    assert full.get("failed") is True and "server_is_not_wanted_x7" in full["msg"]

    result = run_module(lb.main, build_args(src, tmp_path / "builds", server=False))
    assert not result.get("failed"), result.get("msg")
    manifest = result["manifest"]
    assert manifest["targets"] == ["ggml-rpc-server"]
    assert set(manifest["files"]) == {"bin/ggml-rpc-server", "bin/libggml.so.0.9.4"}
    assert manifest["version"] is None and manifest["server_options"] == [] and manifest["has_m3_parser"] is False
    bin_dir = Path(result["stage_dir"]) / "bin"
    assert not (bin_dir / "llama-server").exists()
    assert os.readlink(bin_dir / "rpc-server") == "ggml-rpc-server"
    proc = subprocess.run([str(bin_dir / "rpc-server")], capture_output=True, text=True, env={"PATH": "/usr/bin"})
    assert proc.returncode == 0 and "ggml-fake" in proc.stdout, proc.stderr
    # Its own build id and tree (the targets are part of the id): the failed full build's tree is another one.
    work = sorted(p.name for p in (tmp_path / "builds" / "work").iterdir())
    assert len(work) == 2 and result["build_id"] in work
    assert engine.stage_verifies(result["stage_dir"]) == manifest
    again = run_module(lb.main, build_args(src, tmp_path / "builds", server=False))
    assert again["changed"] is False and again["build_id"] == result["build_id"]


def ccache_stats(ccache_dir):
    out = subprocess.run(["ccache", "--print-stats"], env={**os.environ, "CCACHE_DIR": str(ccache_dir)},
                         capture_output=True, text=True, check=True).stdout
    return {key: int(value) for key, value in (line.split("\t") for line in out.splitlines())}


@pytest.mark.skipif(not shutil.which("ccache"), reason="needs ccache")
def test_a_patched_tree_compiles_only_what_its_patch_changed(tmp_path):
    """A project patch changes a few files of a tree the cache has compiled: that tree lies in another folder and
    has another build id, yet only the changed file compiles; every other object comes from ccache."""
    ccache = tmp_path / "ccache"
    stock = fake_tree(tmp_path / "src" / "1111")
    patched = fake_tree(tmp_path / "src" / "2222", hash_file=True)  # ggml/ggml.c changed, the rest as is
    first = run_module(lb.main, build_args(stock, tmp_path / "builds", ccache_dir=str(ccache)))
    assert not first.get("failed"), first.get("msg")
    assert ccache_stats(ccache)["cache_miss"] == 3
    subprocess.run(["ccache", "--zero-stats"], env={**os.environ, "CCACHE_DIR": str(ccache)}, check=True,
                   capture_output=True)

    second = run_module(lb.main, build_args(patched, tmp_path / "builds", ccache_dir=str(ccache),
                                            source={"type": "test", "ref": "patched"}))
    assert not second.get("failed"), second.get("msg")
    assert second["build_id"] != first["build_id"] and second["manifest"]["rpc_hash_file"] is True
    stats = ccache_stats(ccache)
    assert (stats["direct_cache_hit"] + stats["preprocessed_cache_hit"], stats["cache_miss"]) == (2, 1), stats
    # Each build compiled from its own work folder's view of its own tree, and that tree is left as it was.
    for result, src in ((first, stock), (second, patched)):
        source = tmp_path / "builds" / "work" / result["build_id"] / "source"
        assert (source / "ggml/ggml.c").read_text() == (src / "ggml/ggml.c").read_text()
    assert "GGML_RPC_HASH_FILE" not in (stock / "ggml/ggml.c").read_text()


@pytest.mark.parametrize("links", [True, False])
def test_the_work_folders_view_of_a_tree_is_the_tree(tmp_path, monkeypatch, links):
    """Hard links where the cache can make them, copies where it cannot (another file system): either way the
    view holds the tree's files with their modes and links, and stale files of an earlier view are gone."""
    src = fake_tree(tmp_path / "src")
    (src / "tools/rpc/run.sh").write_text("#!/bin/sh\n")
    (src / "tools/rpc/run.sh").chmod(0o755)
    (src / "ggml/current.c").symlink_to("ggml.c")
    dest = tmp_path / "work" / "source"
    (dest / "old").mkdir(parents=True)
    (dest / "old/stale.c").write_text("int stale;\n")
    if not links:
        def refuse(a, b):
            raise OSError(18, "Invalid cross-device link")
        monkeypatch.setattr(engine.os, "link", refuse)
    engine.link_tree(str(src), str(dest))
    listing = sorted(str(p.relative_to(src)) for p in src.rglob("*"))
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*")) == listing
    assert (dest / "tools/rpc/run.sh").stat().st_mode & 0o777 == 0o755
    assert os.readlink(dest / "ggml/current.c") == "ggml.c"
    same_inode = (dest / "ggml/ggml.c").stat().st_ino == (src / "ggml/ggml.c").stat().st_ino
    assert same_inode is links
    assert (dest / "ggml/ggml.c").stat().st_mtime_ns == (src / "ggml/ggml.c").stat().st_mtime_ns


def test_a_work_folder_an_earlier_version_configured_in_place_is_started_over(tmp_path):
    """Earlier versions configured <work>/<id> itself from the tree's own folder: such a folder is replaced, not
    mixed with the new layout (CMake refuses a cache made for another source folder)."""
    src = fake_tree(tmp_path / "src")
    probe = run_module(lb.main, build_args(src, tmp_path / "builds"), check_mode=True)
    work = tmp_path / "builds" / "work" / probe["build_id"]
    work.mkdir(parents=True)
    (work / "CMakeCache.txt").write_text("CMAKE_HOME_DIRECTORY:INTERNAL=%s\n" % src)
    result = run_module(lb.main, build_args(src, tmp_path / "builds"))
    assert not result.get("failed"), result.get("msg")
    assert sorted(p.name for p in work.iterdir()) == ["build", "source"]


@pytest.mark.parametrize("server, expected", [
    (True, ["llama-server", "ggml-rpc-server", "llama-bench"]),
    (False, ["ggml-rpc-server", "llama-bench"]),
])
def test_build_targets_put_the_server_first_only_when_wanted(server, expected):
    p = params(server=server, targets=["llama-bench", "llama-server", "ggml-rpc-server"])
    assert engine.build_targets(p, "ggml-rpc-server") == expected


def test_a_stage_whose_binaries_cannot_find_their_libraries_is_refused(tmp_path):
    src = fake_tree(tmp_path / "src", origin=False)
    result = run_module(lb.main, build_args(src, tmp_path / "builds"))
    assert result.get("failed") is True
    assert "cannot load its libraries" in result["msg"]
    assert "libggml" in result["msg"]
    # Nothing was staged under a build id: the next run tries again.
    assert sorted(p.name for p in (tmp_path / "builds").iterdir() if not p.name.endswith(".tmp")) == ["work"]


def test_a_failing_compile_reports_the_compiler_output(tmp_path):
    src = fake_tree(tmp_path / "src")
    (src / "tools/rpc/rpc-server.c").write_text("int main(void) { return missing_symbol_x42; }\n")
    result = run_module(lb.main, build_args(src, tmp_path / "builds"))
    assert result.get("failed") is True
    assert "cmake --build" in result["msg"]
    assert "missing_symbol_x42" in result["msg"]


def test_the_m3_layer_inputs_patch_is_what_the_manifest_flag_reads(llamacpp_tree, tmp_path):
    """The project patch applies to this llama.cpp tree (patch -p1, as the role does), its sha256 is the role
    default's, and the build's capability flag is false without it and true with it."""
    import yaml

    root = Path(__file__).resolve().parents[2]
    default = yaml.safe_load((root / "roles/build_llamacpp/defaults/main.yml").read_text())
    [entry] = [p for p in default["build_llamacpp_project_patches"] if p["name"] == "m3-layer-inputs"]
    patch = root / "roles/build_llamacpp/files/patches/m3-layer-inputs.patch"
    assert sha256(patch) == entry["sha256"]
    src = tmp_path / "src"
    (src / "src" / "models").mkdir(parents=True)
    (src / engine.M3_GRAPH).write_text((llamacpp_tree / engine.M3_GRAPH).read_text())
    assert engine.m3_layer_inputs(str(src)) is False
    subprocess.run(["patch", "-p1", "--forward", "--batch", "-d", str(src), "-i", str(patch)], check=True)
    assert engine.m3_layer_inputs(str(src)) is True
    assert "res->t_layer_inp[il] = inpL;" in (src / engine.M3_GRAPH).read_text()
