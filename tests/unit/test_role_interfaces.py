"""Every role's interface is written down once and agrees with itself.

A role's public variables live in three places a user reads: ``defaults/main.yml`` (the value and one
comment), ``meta/argument_specs.yml`` (type and checks, per entry point) and the README's variable table
(generated from the specs by tools/gen-vars-docs; tests/unit/test_vars_docs.py keeps it current). They must
name the same variables, each prefixed with the role's name. Every entry point in the argument spec has its
tasks file, and every ``tasks_from`` another role or playbook uses is a declared entry point (so Ansible
validates its arguments). What crosses a role does so through declared variables, entry points and facts: no
role or playbook touches another role's `_<role>_` variables, no one but head_server defaults a `head_server_`
setting, and a service's name is written once.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "tasks" / "main.yml").exists())


def load(path: Path):
    return yaml.safe_load(path.read_text()) or {}


def defaults(role: str) -> dict:
    path = ROOT / "roles" / role / "defaults" / "main.yml"
    return load(path) if path.exists() else {}


def specs(role: str) -> dict:
    return load(ROOT / "roles" / role / "meta" / "argument_specs.yml").get("argument_specs") or {}


def options(role: str, entry_point: str = "main") -> dict:
    return specs(role).get(entry_point, {}).get("options") or {}


def all_options(role: str) -> set[str]:
    return {name for entry in specs(role).values() for name in (entry.get("options") or {})}


BEGIN, END = "<!-- BEGIN_ANSIBLE_DOCS -->", "<!-- END_ANSIBLE_DOCS -->"


def readme_variables(role: str) -> list[str]:
    """Names in the first column of the variables table: the region tools/gen-vars-docs generates between its
    markers, under the README's "## Variables" heading."""
    readme = ROOT / "roles" / role / "README.md"
    assert readme.exists(), f"roles/{role}: no README.md"
    text = readme.read_text()
    assert BEGIN in text and END in text, \
        f"roles/{role}/README.md: no generated variables table: run tools/gen-vars-docs"
    heading = text.find("\n## Variables")
    assert 0 <= heading < text.index(BEGIN), f"roles/{role}/README.md: the generated table is not under ## Variables"
    names = []
    for line in text[text.index(BEGIN):text.index(END)].splitlines():
        if line.startswith("|"):
            # One variable per row, or several sharing a row: `a` / `b`.
            first_cell = line.split("|")[1]
            names += re.findall(r"`([A-Za-z][A-Za-z0-9_]*)`", first_cell)
    return names


def test_every_role_is_found():
    assert {"common", "build_llamacpp", "head_server", "worker_rpc"} <= set(ROLES)


@pytest.mark.parametrize("role", ROLES)
def test_role_has_an_argument_spec_with_main(role):
    path = ROOT / "roles" / role / "meta" / "argument_specs.yml"
    assert path.exists(), f"roles/{role}: no meta/argument_specs.yml"
    assert "main" in specs(role), f"roles/{role}/meta/argument_specs.yml: no `main` entry point"


@pytest.mark.parametrize("role", ROLES)
def test_defaults_and_main_spec_name_the_same_variables(role):
    in_defaults, in_spec = set(defaults(role)), set(options(role))
    only_defaults, only_spec = sorted(in_defaults - in_spec), sorted(in_spec - in_defaults)
    assert not only_defaults, f"roles/{role}: in defaults/main.yml, not in argument_specs main: {only_defaults}"
    assert not only_spec, f"roles/{role}: in argument_specs main, not in defaults/main.yml: {only_spec}"


@pytest.mark.parametrize("role", ROLES)
def test_readme_table_names_every_variable_of_every_entry_point(role):
    in_readme = readme_variables(role)
    duplicates = sorted({name for name in in_readme if in_readme.count(name) > 1})
    assert not duplicates, f"roles/{role}/README.md: rows listed twice: {duplicates}"
    documented, declared = set(in_readme), all_options(role) | set(defaults(role))
    missing, unknown = sorted(declared - documented), sorted(documented - declared)
    assert not missing, f"roles/{role}/README.md: variables missing from the table: {missing}"
    assert not unknown, f"roles/{role}/README.md: rows for variables the role does not have: {unknown}"


@pytest.mark.parametrize("role", ROLES)
def test_public_variables_carry_the_role_prefix(role):
    names = set(defaults(role)) | all_options(role)
    unprefixed = sorted(name for name in names if not name.startswith(role + "_"))
    assert not unprefixed, f"roles/{role}: public variables without the `{role}_` prefix: {unprefixed}"


@pytest.mark.parametrize("role", ROLES)
def test_spec_defaults_match_defaults_main(role):
    """A default written in both files is the same value (one home; the spec must not drift)."""
    values = defaults(role)
    drift = {
        name: (spec["default"], values[name])
        for entry in specs(role).values()
        for name, spec in (entry.get("options") or {}).items()
        if "default" in spec and name in values and spec["default"] != values[name]
        and not (isinstance(values[name], str) and "{{" in values[name])
    }
    assert not drift, f"roles/{role}: argument_specs default vs defaults/main.yml: {drift}"


@pytest.mark.parametrize("role", ROLES)
def test_every_default_has_a_comment(role):
    """Each variable in defaults/main.yml sits in a block that opens with a comment."""
    path = ROOT / "roles" / role / "defaults" / "main.yml"
    if not path.exists():
        return
    uncommented, commented = [], False
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("---"):
            commented = False
        elif line.startswith("#"):
            commented = True
        elif re.match(r"[A-Za-z_]", line):
            name = line.split(":", 1)[0]
            if not commented:
                uncommented.append(name)
    assert not uncommented, f"roles/{role}/defaults/main.yml: variables without a comment above them: {uncommented}"


@pytest.mark.parametrize("role", ROLES)
def test_every_entry_point_has_its_tasks_file(role):
    missing = [entry for entry in specs(role) if not (ROOT / "roles" / role / "tasks" / f"{entry}.yml").exists()]
    assert not missing, f"roles/{role}: entry points without tasks/<entry>.yml: {missing}"


def _tasks_from_uses():
    """(file, role, tasks_from) for every include_role/import_role with tasks_from in roles and playbooks."""
    uses = []
    files = list((ROOT / "roles").glob("*/tasks/*.yml")) + list((ROOT / "playbooks").glob("*.yml"))
    files += [ROOT / "site.yml"]

    def walk(node, path):
        if isinstance(node, dict):
            for key in ("ansible.builtin.include_role", "ansible.builtin.import_role", "include_role", "import_role"):
                call = node.get(key)
                if isinstance(call, dict) and call.get("tasks_from"):
                    uses.append((str(path.relative_to(ROOT)), call.get("name"), call["tasks_from"]))
            for value in node.values():
                walk(value, path)
        elif isinstance(node, list):
            for value in node:
                walk(value, path)

    for path in files:
        if path.exists():
            walk(load(path), path)
    return uses


def test_tasks_from_calls_name_declared_entry_points():
    undeclared = [
        (where, role, entry)
        for where, role, entry in _tasks_from_uses()
        if role in ROLES and Path(entry).stem not in specs(role)
    ]
    assert not undeclared, f"tasks_from without an entry point in the role's meta/argument_specs.yml: {undeclared}"


def test_other_roles_use_entry_points_not_paths():
    """No role includes another role's task file by path (roles talk through entry points)."""
    offenders = []
    for path in (ROOT / "roles").glob("*/tasks/*.yml"):
        text = path.read_text()
        if re.search(r"role_path\s*}}/\.\./", text) or re.search(r"roles/[a-z_]+/tasks/", text):
            offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"task files that include another role's files by path: {offenders}"


def _code_files():
    """(owning role or None, path, text without comments) of every role's tasks/defaults/vars/handlers file and
    every playbook."""
    out = []
    for path in sorted((ROOT / "roles").glob("*/*/*.yml")):
        if path.parent.name in ("tasks", "defaults", "vars", "handlers"):
            out.append((path.parts[-3], path))
    out += [(None, p) for p in sorted((ROOT / "playbooks").glob("*.yml")) + [ROOT / "site.yml"]]
    return [(role, path, re.sub(r"(?m)(^|\s)#.*$", "", path.read_text())) for role, path in out]


def test_no_role_touches_another_roles_private_variables():
    """`_<role>_x` is that role's own: another role (or a playbook) sets or reads it only through a declared
    variable or an entry point."""
    private = re.compile(r"(?<![A-Za-z0-9_])_(%s)_[a-z0-9_]+" % "|".join(sorted(ROLES, key=len, reverse=True)))
    leaks = sorted({
        (str(path.relative_to(ROOT)), match.group(0))
        for role, path, text in _code_files()
        for match in private.finditer(text)
        if match.group(1) != role
    })
    assert not leaks, f"private variables of another role: {leaks}"


def test_head_server_settings_have_no_shadow_default_outside_head_server():
    """The head's settings have one home (head_server's `settings` entry point): nobody else defaults them."""
    shadow = re.compile(r"head_server_[a-z0-9_]+\s*\|\s*default\s*\(")
    found = sorted({
        (str(path.relative_to(ROOT)), match.group(0))
        for role, path, text in _code_files()
        if role != "head_server"
        for match in shadow.finditer(text)
    })
    assert not found, f"head_server_ variables defaulted outside head_server: {found}"


def test_service_names_are_written_once():
    """A service's name is its role's `<role>_service_name` default; everyone else reads it from there (or from
    the fact the role records), never as a literal."""
    literal = re.compile(r"minimax-(llama|rpc)-server[a-z.-]*")
    found = sorted({
        (str(path.relative_to(ROOT)), line.strip())
        for role, path, text in _code_files()
        for line in text.splitlines()
        if literal.search(line)
        and not (path.parent.name == "defaults" and line.startswith("%s_service_name:" % role))
    })
    assert not found, f"service names written as literals: {found}"
