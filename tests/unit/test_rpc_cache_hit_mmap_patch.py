"""The project patch rpc-cache-hit-mmap: listed after rpc-hash-sidecar with its sha256, applies on top of it.

The patch changes only the worker's cache-hit path (ggml-rpc-server maps the cache file instead of reading it
into a zero-filled buffer); what it promises (the same bytes reach the worker; an entry too large for its
tensor's buffer is refused as before) is tested through llama-server in
tests/integration/test_rpc_cache_hit_mmap.py. Here: the role applies it, in order, and the patched file
compiles (on POSIX with the mapping, and with it compiled out as on Windows).
"""
import hashlib
import shutil
import subprocess

import pytest
import yaml

from helpers import ROOT

PATCHES = ROOT / "roles" / "build_llamacpp" / "files" / "patches"
PATCH = PATCHES / "rpc-cache-hit-mmap.patch"


def test_the_role_default_carries_this_patch_after_the_sidecar_with_its_sha256():
    defaults = yaml.safe_load((ROOT / "roles" / "build_llamacpp" / "defaults" / "main.yml").read_text())
    names = [p["name"] for p in defaults["build_llamacpp_project_patches"]]
    assert names.index("rpc-cache-hit-mmap") == names.index("rpc-hash-sidecar") + 1, names
    [entry] = [p for p in defaults["build_llamacpp_project_patches"] if p["name"] == "rpc-cache-hit-mmap"]
    assert entry["sha256"] == hashlib.sha256(PATCH.read_bytes()).hexdigest()
    assert entry["src"].endswith("/files/patches/rpc-cache-hit-mmap.patch")


@pytest.mark.parametrize("windows", [False, True], ids=["posix", "no-mmap"])
def test_the_patch_applies_after_the_sidecar_and_compiles(tmp_path, llamacpp_tree, windows):
    cxx = shutil.which("g++") or shutil.which("c++")
    if not cxx or not shutil.which("patch"):
        pytest.skip("needs g++ and patch")
    rpc = tmp_path / "ggml" / "src" / "ggml-rpc"
    rpc.mkdir(parents=True)
    shutil.copy(llamacpp_tree / "ggml" / "src" / "ggml-rpc" / "ggml-rpc.cpp", rpc)
    alone = subprocess.run(["patch", "-p1", "--dry-run", "--batch", "-d", str(tmp_path), "-i", str(PATCH)],
                           capture_output=True, text=True)
    assert alone.returncode != 0, "applies without rpc-hash-sidecar: the order in the role default is not needed"
    for patch in (PATCHES / "rpc-hash-sidecar.patch", PATCH):
        done = subprocess.run(["patch", "-p1", "--forward", "--batch", "-d", str(tmp_path), "-i", str(patch)],
                              capture_output=True, text=True)
        assert done.returncode == 0, "%s does not apply:\n%s%s" % (patch.name, done.stdout, done.stderr)
    source = (rpc / "ggml-rpc.cpp").read_text()
    assert "std::vector<uint8_t> cached_file;" not in source and "MAP_PRIVATE" in source
    if windows:
        # Only the mapping is compiled out (the rest of the file is not Windows-ready on this host).
        (rpc / "ggml-rpc.cpp").write_text(source.replace("#if !defined(_WIN32)", "#if 0"))
    done = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror=unused-variable",
                           "-I", str(llamacpp_tree / "ggml/include"), "-I", str(llamacpp_tree / "ggml/src"),
                           "-I", str(llamacpp_tree / "ggml/src/ggml-rpc"), str(rpc / "ggml-rpc.cpp")],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
