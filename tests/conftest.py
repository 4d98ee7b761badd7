"""Shared pytest fixtures: project paths, module import, the llama.cpp source tree and binaries."""
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache"

# Modules import shared code as ansible.module_utils.minimax_spark_*; make that resolve the way
# `module_utils = ./module_utils` in ansible.cfg does for a playbook run.
import ansible.module_utils  # noqa: E402  (beside the path set-up it serves)

if str(ROOT / "module_utils") not in ansible.module_utils.__path__:
    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))
for sub in ("library", "filter_plugins", "tools", "tests/support"):
    if str(ROOT / sub) not in sys.path:
        sys.path.insert(0, str(ROOT / sub))

# The llama-cpp-python sdist the offline path builds from: pinned once, in tools/llama-cpp-python.version.
# Also the llama.cpp commit that sdist vendors (llamacpp_commit: build_llamacpp_ref's default) and its build number.
LLAMACPP_PIN = yaml.safe_load((ROOT / "tools" / "llama-cpp-python.version").read_text())
LLAMACPP_VERSION = os.environ.get("LLAMA_CPP_PYTHON_VERSION") or LLAMACPP_PIN["llama_cpp_python"]
LLAMACPP_SUBDIR = f"llama_cpp_python-{LLAMACPP_VERSION}/vendor/llama.cpp"
DEMO_MODEL = CACHE / "demo" / "MiniMax-M3-tiny.gguf"

# tests/host compares this machine with what tools/test saved before the tests: only tools/test runs it, after them.
collect_ignore = [] if os.environ.get("MINIMAX_SPARK_HOST_BEFORE") else ["host"]


@pytest.fixture(scope="session")
def project_root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def llamacpp_archive() -> Path:
    """The offline llama.cpp source archive (fetched once into .cache/)."""
    out = subprocess.run(
        [str(ROOT / "tools" / "fetch-llamacpp-source")], check=True, capture_output=True, text=True
    ).stdout.strip()
    return Path(out)


@pytest.fixture(scope="session")
def llamacpp_tree(llamacpp_archive: Path) -> Path:
    """The extracted llama.cpp tree (read-only use: templates, gguf-py, sources)."""
    dest = CACHE / "llama.cpp-tree"
    tree = dest / LLAMACPP_SUBDIR
    if not (tree / "CMakeLists.txt").exists():
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(llamacpp_archive) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(LLAMACPP_SUBDIR + "/")]
            tar.extractall(dest, members=members, filter="data")
    return tree


@pytest.fixture(scope="session")
def m3_template(llamacpp_tree: Path) -> str:
    """The real MiniMax-M3 chat template that llama.cpp ships."""
    return (llamacpp_tree / "models" / "templates" / "MiniMax-M3.jinja").read_text()


@pytest.fixture(scope="session")
def demo_model(llamacpp_tree: Path) -> Path:
    """The demo's model (.cache/demo/MiniMax-M3-tiny.gguf), made as tools/demo makes it when it is absent or older
    than tools/make_tiny_m3.py."""
    from ansible.module_utils.minimax_spark_files import atomic_path

    from make_tiny_m3 import write_tiny_m3

    script = ROOT / "tools" / "make_tiny_m3.py"
    if not DEMO_MODEL.exists() or DEMO_MODEL.stat().st_mtime < script.stat().st_mtime:
        DEMO_MODEL.parent.mkdir(parents=True, exist_ok=True)
        template = (llamacpp_tree / "models" / "templates" / "MiniMax-M3.jinja").read_text()
        with atomic_path(DEMO_MODEL, suffix=".tmp.gguf") as tmp:
            write_tiny_m3(tmp, tool_format="m3", template_text=template)
    return DEMO_MODEL


@pytest.fixture(scope="session")
def llamacpp_bin(llamacpp_archive: Path) -> Path:
    """Directory holding llama-server, ggml-rpc-server (and rpc-server) and their libraries.

    Built and installed by the project's own build_llamacpp role (playbooks/build.yml against
    inventory/local, cached by source and options, so only the first session pays the build).
    MINIMAX_SPARK_LLAMACPP_BIN points at an existing bin directory instead (development only).
    """
    override = os.environ.get("MINIMAX_SPARK_LLAMACPP_BIN")
    if override:
        return Path(override)
    from helpers import run_playbook  # tests/helpers.py

    result = run_playbook("playbooks/build.yml")
    assert result.status == "successful", result.stdout_text
    import json

    manifest = json.loads(Path("/etc/ansible/facts.d/minimax_llamacpp.fact").read_text())
    return Path(manifest["bin_dir"])


@pytest.fixture(scope="session")
def builds(llamacpp_bin: Path) -> dict:
    """{"patched": the default build's bin (every project patch), "unpatched": stock llama.cpp's bin
    (build_llamacpp_project_patches: []), "lib": the patched build's fnv1a library}, both through the role.

    The stock build is installed beside the default one (cached, like it); the default is installed (current)
    again after, so the host's manifest is the default build's."""
    import json

    from helpers import run_playbook

    fact = Path("/etc/ansible/facts.d/minimax_llamacpp.fact")
    defaults = yaml.safe_load((ROOT / "roles" / "build_llamacpp" / "defaults" / "main.yml").read_text())
    patched = json.loads(fact.read_text())
    assert [p["name"] for p in patched["patches"]] == [p["name"] for p in defaults["build_llamacpp_project_patches"]]
    try:
        result = run_playbook("playbooks/build.yml", extravars={"build_llamacpp_project_patches": []})
        assert result.status == "successful", result.stdout_text
        unpatched = json.loads(fact.read_text())
    finally:
        again = run_playbook("playbooks/build.yml")
        assert again.status == "successful", again.stdout_text
    assert unpatched["patches"] == [] and unpatched["build_id"] != patched["build_id"]
    return {"patched": patched["bin_dir"], "unpatched": unpatched["bin_dir"], "lib": patched["fnv1a_library"],
            "manifests": {"patched": patched, "unpatched": unpatched}}
