"""The modules' attributes are written once, in ``doc_fragments/minimax_attributes.py``, and every module
renders with them.

``ansible.cfg`` names the folder (``doc_fragment_plugins = doc_fragments``) and each module's DOCUMENTATION says
``extends_documentation_fragment: [minimax_attributes]``, keeping under ``attributes`` only what is its own (check
mode support and details; diff mode when it returns a diff; platform when Linux only). What a user reads is what
``ansible-doc -M library <module>`` prints with the project's ansible.cfg: the check here.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "library"
MODULES = sorted(p.stem for p in LIBRARY.glob("*.py"))
FRAGMENT_NAME = "minimax_attributes"
FRAGMENT_FILE = ROOT / "doc_fragments" / f"{FRAGMENT_NAME}.py"
ANSIBLE_DOC = str(Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin" / "ansible-doc")
if not os.path.exists(ANSIBLE_DOC):
    ANSIBLE_DOC = shutil.which("ansible-doc") or "ansible-doc"


def fragment_attributes() -> dict:
    spec = importlib.util.spec_from_file_location(FRAGMENT_NAME, FRAGMENT_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return yaml.safe_load(module.ModuleDocFragment.DOCUMENTATION)["attributes"]


def module_documentation(name: str) -> dict:
    text = (LIBRARY / f"{name}.py").read_text()
    match = re.search(r'^DOCUMENTATION = r?"""(.*?)^"""', text, re.S | re.M)
    assert match, f"library/{name}.py: no DOCUMENTATION"
    return yaml.safe_load(match.group(1))


def ansible_doc(name: str, config: Path = ROOT / "ansible.cfg") -> subprocess.CompletedProcess:
    """`ansible-doc -M library -t module NAME` as a user runs it in the project (its ansible.cfg in effect)."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(config), ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    env.pop("ANSIBLE_DOC_FRAGMENT_PLUGINS", None)
    return subprocess.run([ANSIBLE_DOC, "-M", str(LIBRARY), "-t", "module", name], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def flat(text: str) -> str:
    return " ".join(text.split())


def test_ansible_cfg_names_the_fragment_folder():
    cfg = (ROOT / "ansible.cfg").read_text()
    assert re.search(r"(?m)^doc_fragment_plugins\s*=\s*doc_fragments\s*$", cfg), \
        "ansible.cfg: add `doc_fragment_plugins = doc_fragments` under [defaults]"
    assert set(fragment_attributes()) == {"check_mode", "diff_mode", "platform"}


@pytest.mark.parametrize("name", MODULES)
def test_module_extends_the_fragment_and_pastes_none_of_it(name):
    doc = module_documentation(name)
    fragments = doc.get("extends_documentation_fragment") or []
    fragments = fragments.split(",") if isinstance(fragments, str) else fragments
    assert FRAGMENT_NAME in [f.strip() for f in fragments], \
        f"library/{name}.py: add `extends_documentation_fragment: [{FRAGMENT_NAME}]` to DOCUMENTATION"
    pasted = sorted(
        f"{attribute}.{key}"
        for attribute, fields in (doc.get("attributes") or {}).items()
        for key, value in (fields or {}).items()
        if key == "description" and value == fragment_attributes().get(attribute, {}).get("description")
    )
    assert not pasted, f"library/{name}.py repeats the fragment's {pasted}: keep only the module's own values"


@pytest.mark.parametrize("name", MODULES)
def test_ansible_doc_renders_the_module_with_the_shared_attributes(name):
    result = ansible_doc(name)
    assert result.returncode == 0, f"ansible-doc {name} failed: {result.stderr.strip()}"
    assert "[WARNING]" not in result.stderr and "ERROR" not in result.stderr, result.stderr
    text = result.stdout
    assert re.search(r"(?m)^> MODULE %s\b" % re.escape(name), text), text[:400]
    assert "ATTRIBUTES:" in text, f"ansible-doc {name}: no ATTRIBUTES section"
    section = flat(text.split("ATTRIBUTES:", 1)[1].split("NOTES:", 1)[0].split("AUTHOR", 1)[0])
    for attribute, fields in fragment_attributes().items():
        assert f"{attribute}:" in section, f"ansible-doc {name}: attribute {attribute} is not rendered"
        assert flat(fields["description"]) in section, \
            f"ansible-doc {name}: {attribute} lacks the fragment's description"
    assert re.search(r"support: (full|partial|none)", section), section


def test_without_the_fragment_folder_ansible_doc_refuses(tmp_path):
    """The failure the checks above guard: a module naming the fragment cannot render without it."""
    cfg = tmp_path / "ansible.cfg"
    text = (ROOT / "ansible.cfg").read_text()
    text = re.sub(r"(?m)^doc_fragment_plugins.*\n", "", text)
    text = text.replace("= library", "= %s" % LIBRARY).replace("= module_utils", "= %s" % (ROOT / "module_utils"))
    cfg.write_text(text)
    result = ansible_doc(MODULES[0], config=cfg)
    assert "unknown doc_fragment(s)" in result.stderr and FRAGMENT_NAME in result.stderr, result.stderr
