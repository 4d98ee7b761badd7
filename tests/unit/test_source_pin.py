"""The llama.cpp source the offline path builds (llama-cpp-python's sdist) is pinned once:
tools/llama-cpp-python.version. Tools, inventories, molecule and tests read it; none writes the version again."""
import re
import subprocess

from conftest import ROOT

PIN = ROOT / "tools" / "llama-cpp-python.version"
VERSION = re.compile(r"llama[-_]cpp[-_]python[-_ =]*v?\d+\.\d+\.\d+|\b%s\b" % re.escape(PIN.read_text().strip()))


def test_the_version_is_written_once():
    assert re.fullmatch(r"\d+\.\d+\.\d+\n", PIN.read_text()), "tools/llama-cpp-python.version: one version line"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    code = [f for f in files if f.split("/")[0] in ("tools", "inventory", "molecule", "tests", "roles", "playbooks")
            and f != "tools/llama-cpp-python.version" and (ROOT / f).is_file()]
    found = sorted(f for f in code if VERSION.search((ROOT / f).read_text(errors="replace")))
    assert not found, "the llama-cpp-python version is written outside tools/llama-cpp-python.version: %s" % found
