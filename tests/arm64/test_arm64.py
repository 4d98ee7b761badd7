"""The Sparks' own CPU: the project's Python, its C library and tools/bootstrap.sh on aarch64.

A Debian arm64 root (tests/support/arm64-root.sh: debootstrap under qemu, built once and cached
under ~/.cache/minimax-spark/arm64-root) runs an aarch64 python3 with the controller's requirements as aarch64
wheels. These tests skip only where this host cannot run arm64 programs at all (the script says
why, exit status 77); anything else that goes wrong is a failure.
"""
import os
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from ansible.module_utils.minimax_spark_elf import elf_header

from helpers import ROOT

SUPPORT = ROOT / "tests" / "support"
FNV_SOURCE = "roles/build_llamacpp/files/minimax_fnv1a.c"

# The modules' and module_utils' unit tests run by the aarch64 python3: those of the code that runs on
# a node (GGUF reading, the build module with the arm64 cmake and gcc, the RPC cache seeding and its C
# library through ctypes, the chat template, the bench model reader, ELF reading) and the filters.
# About 2.5 minutes under emulation on 2 cores. Not here: hf_download and minimax_service (their tests
# time HTTP stalls, signals and restarts for native speed and flake at qemu's 5-10x; nothing in them
# depends on the CPU). The whole unit suite under arm64 (about 6 minutes; those flakes and the
# exclusions below fail there):
#   tests/support/arm64-run.sh "$(tests/support/arm64-root.sh)" -- python3 -m pytest tests/unit -p no:cacheprovider
UNIT_TESTS = [
    "tests/unit/test_elf_machine.py",
    "tests/unit/test_filters.py",
    "tests/unit/test_canary.py",
    "tests/unit/test_gguf_chat_template.py",
    "tests/unit/test_gguf_info.py",
    "tests/unit/test_llamacpp_build.py",
    "tests/unit/test_rpc_cache_seed.py",
    "tests/unit/test_bench_modules.py",
    "tests/unit/test_tiny_model.py",
]
# Left out under emulation, each for a reason of the emulator, not of aarch64: qemu-user reserves the
# whole length of a memory map, so mapping the real-scale sparse M3 shards (tens of GiB) fails with
# ENOMEM (a real aarch64 kernel maps them as x86_64 does); the tests that drive ansible-playbook
# are integration-sized under emulation (the x86_64 run keeps them).
SPARSE_SHARDS = "qemu-user cannot map a sparse shard of tens of GiB"
PLAYBOOK = "drives ansible-playbook: minutes under emulation"
CCACHE = "two more builds under emulation for what ccache's keys hold, which no CPU changes"
DESELECT = {
    "tests/unit/test_gguf_info.py::test_sizes_of_the_real_scale_model": SPARSE_SHARDS,
    "tests/unit/test_gguf_info.py::test_kv_bytes_follow_the_cache_types": SPARSE_SHARDS,
    "tests/unit/test_gguf_info.py::test_truncated_shard_is_named": SPARSE_SHARDS,
    "tests/unit/test_gguf_info.py::test_sizes_without_sizes_flag_are_not_read": SPARSE_SHARDS,
    "tests/unit/test_rpc_cache_seed.py::test_the_role_seeds_reports_the_cost_first_and_a_rerun_changes_nothing":
        PLAYBOOK,
    "tests/unit/test_rpc_cache_seed.py::test_the_role_fails_when_seeding_is_required_without_a_model": PLAYBOOK,
    "tests/unit/test_rpc_cache_seed.py::test_auto_does_not_seed_without_the_hash_library_where_python_would_take_hours":
        PLAYBOOK,
    "tests/unit/test_llamacpp_build.py::test_a_patched_tree_compiles_only_what_its_patch_changed": CCACHE,
}


@pytest.fixture(scope="session")
def arm64_root():
    """The arm64 root's path; built on first use (several minutes), then cached."""
    proc = subprocess.run([str(SUPPORT / "arm64-root.sh")], capture_output=True, text=True)
    if proc.returncode == 77:
        pytest.skip(proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout.strip()


def arm64(root, *command, offline=False, rw=(), timeout=900):
    """Run ``command`` inside the arm64 root (the project read-only at its own path, cwd there)."""
    argv = [str(SUPPORT / "arm64-run.sh"), root]
    if offline:
        argv.append("--offline")
    for folder in rw:
        argv += ["--rw", str(folder)]
    return subprocess.run(argv + ["--"] + list(command), capture_output=True, text=True, timeout=timeout)


def test_the_roots_python_is_aarch64(arm64_root):
    proc = arm64(arm64_root, "python3", "-c", "import platform, numpy, gguf, ansible; print(platform.machine())")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "aarch64"
    assert elf_header(os.path.join(arm64_root, "usr/bin/python3.11"))["arch"] == "aarch64"


def test_unit_tests_pass_under_an_aarch64_python(arm64_root, llamacpp_tree, tmp_path):
    # llamacpp_tree: the source tree some of these tests read is extracted here first (the project is
    # read-only inside the root, so its fixture could not extract it there).
    report = tmp_path / "junit.xml"
    deselect = [arg for nodeid in DESELECT for arg in ("--deselect", nodeid)]
    proc = arm64(arm64_root, "python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml", str(report),
                 *deselect, *UNIT_TESTS, rw=[tmp_path])
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    cases = ET.parse(report).getroot().iter("testcase")
    outcome = {"%s::%s" % (c.get("classname").rsplit(".", 1)[-1], c.get("name")):
               "skipped" if c.find("skipped") is not None else "passed" for c in cases}
    # Every file ran (none skipped whole for want of cmake, cc or a library in the root) ...
    for path in UNIT_TESTS:
        name = Path(path).stem
        assert any(k.startswith(name + "::") and v == "passed" for k, v in outcome.items()), name
    # ... the build module's tests drove the arm64 cmake and gcc, and the C FNV-1a library compiled by
    # the root's gcc matched the published vectors through ctypes.
    assert outcome["test_rpc_cache_seed::test_c_library_matches_the_reference_fnv1a"] == "passed"
    assert not [k for k, v in outcome.items() if k.startswith("test_llamacpp_build::") and v == "skipped"]


def test_fnv_library_builds_for_aarch64_and_gives_the_published_vectors(arm64_root, tmp_path):
    lib = tmp_path / "libminimax_fnv1a.so"
    # The build role's own command line (roles/build_llamacpp/tasks/main.yml), run by the arm64 gcc.
    proc = arm64(arm64_root, "cc", "-O2", "-shared", "-fPIC", "-o", str(lib), FNV_SOURCE, rw=[tmp_path])
    assert proc.returncode == 0, proc.stderr
    assert elf_header(str(lib))["arch"] == "aarch64"
    check = (
        "import sys; sys.path.insert(0, 'module_utils'); import ansible.module_utils as m;"
        " m.__path__.append('module_utils');"
        "from ansible.module_utils.minimax_spark_rpccache import Hasher;"
        "h = Hasher(sys.argv[1]); assert h.native, h.load_error;"
        "print(' '.join('%016x' % h.hash_bytes(s) for s in (b'', b'a', b'foobar')))"
    )
    proc = arm64(arm64_root, "python3", "-c", check, str(lib), rw=[tmp_path])
    assert proc.returncode == 0, proc.stderr
    # Published FNV-1a 64 test vectors (http://www.isthe.com/chongo/tech/comp/fnv/).
    assert proc.stdout.split() == ["cbf29ce484222325", "af63dc4c8601ec8c", "85944171f73967e8"]


def test_bootstrap_on_an_aarch64_controller_offline(arm64_root, tmp_path):
    """tools/bootstrap.sh demo on an arm64 machine with no network: its packages are there (the
    root has them), so it goes straight to the venv, which pip fills from aarch64 wheels."""
    cache = os.environ.get("MINIMAX_SPARK_ARM64_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "minimax-spark", "arm64-root")
    wheels = sorted(Path(cache).resolve().glob("wheels-*"))[-1]
    script = (
        "set -e; mkdir -p /tmp/p/tools; cp tools/bootstrap.sh /tmp/p/tools/; cp requirements*.txt /tmp/p/; cd /tmp/p;"
        "tools/bootstrap.sh demo; echo '--- again' >&2; tools/bootstrap.sh demo; echo '--- done' >&2;"
        ".venv/bin/python -c 'import platform, ansible, gguf, requests, matplotlib, tokenizers;"
        " print(platform.machine())'"
    )
    proc = arm64(arm64_root, "env", "PIP_NO_INDEX=1", "PIP_FIND_LINKS=%s" % wheels, "sh", "-c", script, offline=True,
                 rw=[wheels])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    first, again = proc.stderr.split("--- again\n")
    assert "==> installing" not in first, "bootstrap wanted apt packages on the arm64 controller: " + first
    assert "==> preparing .venv" in first
    assert again == "--- done\n", "a second bootstrap changed something: " + again
    assert proc.stdout.strip() == "aarch64"


def test_a_host_that_cannot_run_arm64_says_why_and_only_then_skips():
    """Exit status 77 (the fixture's skip) is kept for hosts that cannot run arm64 at all: here, a
    user who may not chroot. It names the reason; every other failure fails the tests."""
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []
    proc = subprocess.run(as_nobody + [str(SUPPORT / "arm64-root.sh")], capture_output=True, text=True)
    assert proc.returncode == 77
    assert proc.stderr == "arm64-root: this host cannot run arm64 programs: debootstrap and chroot need root\n"
    assert proc.stdout == ""
