"""The project patch rpc-load-mapped: listed with its sha256, applies to the loader, compiles.

The patch changes only llama.cpp's model loader (a weight placed on an RPC device is set from a mapping of the
GGUF, not read into a scratch buffer); what it promises (the head reads none of a seeded worker's weights, a cache
miss still sends them whole, the replies do not change) is tested through llama-server in
tests/integration/test_rpc_cache_hit_mmap.py. Here: the role carries it and the patched loader compiles.
"""
import hashlib
import shutil
import subprocess

import pytest
import yaml

from helpers import ROOT

PATCH = ROOT / "roles" / "build_llamacpp" / "files" / "patches" / "rpc-load-mapped.patch"


def test_the_role_default_carries_this_patch_with_its_sha256():
    defaults = yaml.safe_load((ROOT / "roles" / "build_llamacpp" / "defaults" / "main.yml").read_text())
    [entry] = [p for p in defaults["build_llamacpp_project_patches"] if p["name"] == "rpc-load-mapped"]
    assert entry["sha256"] == hashlib.sha256(PATCH.read_bytes()).hexdigest()
    assert entry["src"].endswith("/files/patches/rpc-load-mapped.patch")


def test_the_patch_applies_to_the_loader_alone_and_compiles(tmp_path, llamacpp_tree):
    cxx = shutil.which("g++") or shutil.which("c++")
    if not cxx or not shutil.which("patch"):
        pytest.skip("needs g++ and patch")
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(llamacpp_tree / "src" / "llama-model-loader.cpp", src)
    done = subprocess.run(["patch", "-p1", "--forward", "--batch", "-d", str(tmp_path), "-i", str(PATCH)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in src.iterdir()) == ["llama-model-loader.cpp"]  # no other file touched
    source = (src / "llama-model-loader.cpp").read_text()
    assert "rpc-load-mapped" in source and "std::make_unique<llama_mmap>(file.get(), 0, false)" in source
    shutil.copytree(llamacpp_tree / "src", tmp_path / "tree-src", ignore=shutil.ignore_patterns("*.o"))
    (tmp_path / "tree-src" / "llama-model-loader.cpp").write_text(source)
    done = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror=unused-variable",
                           "-I", str(llamacpp_tree / "include"), "-I", str(llamacpp_tree / "ggml/include"),
                           "-I", str(tmp_path / "tree-src"), str(tmp_path / "tree-src" / "llama-model-loader.cpp")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
