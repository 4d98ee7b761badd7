"""The llama.cpp the project builds is pinned once: tools/llama-cpp-python.version holds the llama-cpp-python sdist
(whose vendored tree the offline path and the tests build), the llama.cpp commit that tree is, and its build number.
Tools, inventories, molecule, tests and the role's git default read it; none writes them again, and the git default
is the commit the sdist vendors.

How the sdist names its llama.cpp commit: llama-cpp-python vendors llama.cpp as a git submodule and its sdist ships
the submodule's git folder, so ``vendor/llama.cpp/.git`` is a gitfile (``gitdir: ../../.git/modules/vendor/llama.cpp``)
and that folder's ``HEAD`` is the commit the vendored tree was checked out at (a shallow clone of it:
``git -C vendor/llama.cpp status`` in the unpacked sdist is clean, and ``git log`` shows that one commit).
"""
import re
import subprocess
import tarfile

import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import init_plugin_loader
from ansible.template import Templar, trust_as_template

from conftest import ROOT

PIN = ROOT / "tools" / "llama-cpp-python.version"
VALUES = yaml.safe_load(PIN.read_text())
ROLE = ROOT / "roles" / "build_llamacpp"


def written(pattern, skip=()):
    """Files of the project's code (tools, inventories, molecule, tests, roles, playbooks) that match."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    code = [f for f in files if f.split("/")[0] in ("tools", "inventory", "molecule", "tests", "roles", "playbooks")
            and f != "tools/llama-cpp-python.version" and not f.startswith(skip) and (ROOT / f).is_file()]
    return sorted(f for f in code if pattern.search((ROOT / f).read_text(errors="replace")))


def role_default_ref():
    """build_llamacpp_ref as the role's defaults render it (the lookup the role runs)."""
    init_plugin_loader()
    default = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())["build_llamacpp_ref"]
    return Templar(loader=DataLoader(), variables={"role_path": str(ROLE)}).template(trust_as_template(default))


def test_the_pin_holds_the_sdist_the_commit_and_the_build():
    assert set(VALUES) == {"llama_cpp_python", "llamacpp_commit", "llamacpp_build"}, PIN.read_text()
    assert re.fullmatch(r"\d+\.\d+\.\d+", str(VALUES["llama_cpp_python"]))
    assert re.fullmatch(r"[0-9a-f]{40}", VALUES["llamacpp_commit"])
    assert re.fullmatch(r"b\d+", VALUES["llamacpp_build"])


def test_the_version_is_written_once():
    version = re.compile(r"llama[-_]cpp[-_]python[-_ =]*v?\d+\.\d+\.\d+|\b%s\b"
                         % re.escape(str(VALUES["llama_cpp_python"])))
    found = written(version)
    assert not found, "the llama-cpp-python version is written outside tools/llama-cpp-python.version: %s" % found


def test_the_llamacpp_commit_and_build_are_written_once():
    # The project patches' headers record the commit each was made on (history, not a pin); a test may name the
    # build its captured lines came from.
    history = ("roles/build_llamacpp/files/patches/",)
    found = written(re.compile(VALUES["llamacpp_commit"]), skip=history)
    found += written(re.compile(r"\b%s\b" % VALUES["llamacpp_build"]), skip=history + ("tests/",))
    assert not found, "the llama.cpp commit or build is written outside tools/llama-cpp-python.version: %s" % found


def test_the_git_default_is_the_commit_the_sdist_vendors(llamacpp_archive):
    top = "llama_cpp_python-%s" % VALUES["llama_cpp_python"]
    with tarfile.open(llamacpp_archive) as tar:
        gitfile = tar.extractfile(top + "/vendor/llama.cpp/.git").read().decode().strip()
        assert gitfile == "gitdir: ../../.git/modules/vendor/llama.cpp"
        vendored = tar.extractfile(top + "/.git/modules/vendor/llama.cpp/HEAD").read().decode().strip()
    assert re.fullmatch(r"[0-9a-f]{40}", vendored), vendored
    assert VALUES["llamacpp_commit"] == vendored, (
        "tools/llama-cpp-python.version pins llama.cpp %s, but llama-cpp-python %s vendors %s: write the vendored "
        "commit (and its build number) there" % (VALUES["llamacpp_commit"], VALUES["llama_cpp_python"], vendored))
    assert role_default_ref() == vendored, "build_llamacpp_ref's default is not the vendored commit"


def test_no_inventory_pins_another_ref_over_the_default():
    found = written(re.compile(r"^\s*build_llamacpp_ref:", re.M), skip=("roles/", "tests/", "tools/", "playbooks/"))
    assert not found, "build_llamacpp_ref is set over the pinned default in %s" % found
