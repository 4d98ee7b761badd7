"""The variables reference is generated from the roles' argument specs and cannot fall behind them.

tools/gen-vars-docs writes docs/variables.md and each role README's table (between <!-- BEGIN_ANSIBLE_DOCS -->
and <!-- END_ANSIBLE_DOCS -->) from every entry point of roles/<role>/meta/argument_specs.yml. The check here
regenerates into a temporary folder and fails, naming the files and the fix, when the committed ones differ:
a spec changed without regenerating, or a hand edit inside the generated region.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "gen-vars-docs"
_loader = SourceFileLoader("gen_vars_docs", str(TOOL))
gen = module_from_spec(spec_from_loader("gen_vars_docs", _loader))
_loader.exec_module(gen)


def spec_variables(root: Path) -> dict[str, set[str]]:
    """{role: every option of every entry point}, read from the specs without the generator."""
    out = {}
    for path in sorted((root / "roles").glob("*/meta/argument_specs.yml")):
        specs = (yaml.safe_load(path.read_text()) or {}).get("argument_specs") or {}
        out[path.parts[-3]] = {name for entry in specs.values() for name in (entry.get("options") or {})}
    return out


def test_the_committed_reference_is_what_the_specs_give(tmp_path):
    result = subprocess.run([sys.executable, str(TOOL), "--out", str(tmp_path)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    generated = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.md"))
    assert "docs/variables.md" in generated and len(generated) == 1 + len(spec_variables(ROOT)), generated
    differ = [rel for rel in generated if not (ROOT / rel).exists()
              or (ROOT / rel).read_text() != (tmp_path / rel).read_text()]
    assert not differ, f"{differ} differ from roles/*/meta/argument_specs.yml: run tools/gen-vars-docs"


def test_every_variable_of_every_spec_is_in_the_reference():
    reference = (ROOT / "docs" / "variables.md").read_text()
    missing = sorted(f"{role}: {name}" for role, names in spec_variables(ROOT).items() for name in names
                     if f"| `{name}` |" not in reference)
    assert not missing, f"docs/variables.md lacks {missing}: run tools/gen-vars-docs"


def test_a_second_run_changes_nothing(tmp_path):
    first = gen.generate(ROOT)
    for rel, text in first.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    shutil.copytree(ROOT / "roles", tmp_path / "roles", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("README.md"))
    assert gen.generate(tmp_path) == first
    assert gen.stale(tmp_path) == []


def test_a_spec_changed_without_regenerating_is_caught(tmp_path):
    """The failure the check exists for: a new option in a spec, the reference not regenerated."""
    shutil.copytree(ROOT / "roles", tmp_path / "roles")
    (tmp_path / "docs").mkdir()
    shutil.copy(ROOT / "docs" / "variables.md", tmp_path / "docs" / "variables.md")
    spec_path = tmp_path / "roles" / "verify" / "meta" / "argument_specs.yml"
    spec = yaml.safe_load(spec_path.read_text())
    spec["argument_specs"]["main"]["options"]["verify_new_setting"] = {
        "type": "int", "default": 7, "description": "A setting added without regenerating."}
    spec_path.write_text(yaml.safe_dump(spec))
    assert gen.stale(tmp_path) == ["docs/variables.md", "roles/verify/README.md"]
    regenerated = gen.generate(tmp_path)
    row = "| `verify_new_setting` | int | `7` | main | A setting added without regenerating. |"
    assert row in regenerated["docs/variables.md"] and row in regenerated["roles/verify/README.md"]


def test_a_hand_edit_inside_the_region_is_replaced():
    readme = (ROOT / "roles" / "common" / "README.md").read_text()
    edited = readme.replace(gen.END, "| `common_by_hand` | str | `x` | main | a row written by hand |\n" + gen.END)
    assert gen.with_region(edited, gen.role_region("common", ROOT), "common") == readme


def test_a_row_added_by_hand_below_the_region_joins_it():
    readme = (ROOT / "roles" / "common" / "README.md").read_text()
    edited = readme.replace(gen.END, gen.END + "\n| `common_by_hand` | `x` | a row written below the table |", 1)
    assert gen.with_region(edited, gen.role_region("common", ROOT), "common") == readme
