"""CONTRIBUTING.md's tables of facts and entry points are the code's, and fail the suite when they fall behind.

Facts: every ``common_fact_name`` a role hands to common's ``local_fact`` (a templated name counts as each choice
its variable's spec allows) has a row in the facts table naming its writer, and every role whose files read
``ansible_local.minimax_<fact>`` is named in that row's "read by" cell. Entry points: every entry point a role
declares in ``meta/argument_specs.yml`` and every ``tasks_from`` in use has a row in the entry points table, and
every caller (role, or playbook file) is named in its "called by" cell. A row for something the code no longer has
fails too.
"""
from __future__ import annotations

import re
from pathlib import Path

from test_role_interfaces import ROLES, _tasks_from_uses, specs

ROOT = Path(__file__).resolve().parents[2]
CONTRIBUTING = ROOT / "CONTRIBUTING.md"
READER = re.compile(r"""ansible_local(?:\.|\[\s*['"])minimax_([a-z_]+)""")
WRITER = re.compile(r"""^\s*common_fact_name:\s*['"]?([^'"\n]+?)['"]?\s*$""", re.M)


def table_rows(text: str, header: str) -> list[list[str]]:
    """The cells of each row of the Markdown table whose header line starts with `header`."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith(header)), None)
    assert start is not None, f"CONTRIBUTING.md: no table starting {header!r}"
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def names(cell: str) -> set[str]:
    """Role names and playbook file names (`stop.yml`, also as `playbooks/stop.yml`) a cell mentions."""
    return set(re.findall(r"[A-Za-z0-9_]+(?:\.yml)?", cell))


def written_facts() -> dict[str, set[str]]:
    """{fact: writer roles} from every `common_fact_name:` in the roles' task files."""
    out: dict[str, set[str]] = {}
    for path in sorted((ROOT / "roles").glob("*/tasks/*.yml")):
        role = path.parts[-3]
        for value in WRITER.findall(path.read_text()):
            templated = re.fullmatch(r"\{\{\s*([a-z_]+)\s*\}\}", value.strip())
            if templated:
                variable = templated.group(1)
                choices = {c for entry in specs(role).values()
                           for n, spec in (entry.get("options") or {}).items() if n == variable
                           for c in (spec.get("choices") or [])}
                assert choices, f"{path.relative_to(ROOT)}: common_fact_name {value} has no choices in its spec"
            else:
                choices = {value.strip()}
            for fact in choices:
                out.setdefault("minimax_" + fact, set()).add(role)
    return out


def read_facts() -> dict[str, set[str]]:
    """{fact: roles whose tasks, defaults, vars or specs read ansible_local.minimax_<fact>}."""
    out: dict[str, set[str]] = {}
    for path in sorted((ROOT / "roles").glob("*/*/*.yml")):
        if path.parent.name not in ("tasks", "defaults", "vars", "meta", "handlers"):
            continue
        for fact in READER.findall(path.read_text()):
            out.setdefault("minimax_" + fact, set()).add(path.parts[-3])
    return out


def fact_problems(text: str, written: dict[str, set[str]], read: dict[str, set[str]]) -> list[str]:
    rows = {}
    for cells in table_rows(text, "| fact | written by | read by |"):
        fact = re.findall(r"`(minimax_[a-z_]+)`", cells[0])
        assert len(fact) == 1, f"CONTRIBUTING.md facts table: one fact per row, not {cells[0]!r}"
        rows[fact[0]] = cells
    problems = []
    for fact, writers in sorted(written.items()):
        if fact not in rows:
            problems.append(f"{fact} (written by {sorted(writers)}) has no row in the facts table")
            continue
        missing = sorted(writers - names(rows[fact][1]))
        if missing:
            problems.append(f"{fact}: 'written by' does not name {missing}")
    for fact, readers in sorted(read.items()):
        if fact in rows:
            missing = sorted(readers - written.get(fact, set()) - names(rows[fact][2]))
            if missing:
                problems.append(f"{fact}: 'read by' does not name {missing}, which read it")
        elif fact in written:
            continue
        else:
            problems.append(f"{fact} is read by {sorted(readers)} but no role writes it")
    problems += [f"{fact} has a row but no role writes it" for fact in sorted(set(rows) - set(written))]
    return problems


def entry_point_problems(text: str, declared: set[tuple[str, str]], uses: list[tuple[str, str, str]]) -> list[str]:
    rows = {}
    for cells in table_rows(text, "| role | entry point | what it does | called by |"):
        entry = re.findall(r"`([a-z_]+)`", cells[1])
        assert len(entry) == 1, f"CONTRIBUTING.md entry points table: one entry point per row, not {cells[1]!r}"
        rows[(cells[0], entry[0])] = cells
    problems = [f"{role}: `{entry}` has no row in the entry points table"
                for role, entry in sorted(declared - set(rows))]
    problems += [f"{role}: `{entry}` has a row but is not an entry point of the role"
                 for role, entry in sorted(set(rows) - declared)]
    for where, role, entry in sorted(uses):
        key = (role, Path(entry).stem)
        caller = where.split("/")[1] if where.startswith("roles/") else Path(where).name
        if key in rows and caller not in names(rows[key][3]):
            problems.append(f"{role}: `{key[1]}` is called from {where}; 'called by' does not name {caller}")
        elif key not in rows and key not in declared:
            problems.append(f"{where} calls {role} tasks_from {entry}, which the table does not list")
    return problems


def declared_entry_points() -> set[tuple[str, str]]:
    return {(role, entry) for role in ROLES for entry in specs(role) if entry != "main"}


def test_every_fact_has_its_writer_and_readers_in_contributing():
    problems = fact_problems(CONTRIBUTING.read_text(), written_facts(), read_facts())
    assert not problems, "CONTRIBUTING.md is behind the code: " + "; ".join(problems)


def test_every_entry_point_and_tasks_from_is_in_contributing():
    uses = [use for use in _tasks_from_uses() if use[1] in ROLES]
    problems = entry_point_problems(CONTRIBUTING.read_text(), declared_entry_points(), uses)
    assert not problems, "CONTRIBUTING.md is behind the code: " + "; ".join(problems)


def test_the_code_scan_finds_what_the_house_is_built_on():
    """The scans above see the facts and entry points the deployment cannot work without."""
    written, read = written_facts(), read_facts()
    assert {"minimax_llamacpp", "minimax_model", "minimax_draft", "minimax_template", "minimax_plan",
            "minimax_rpc", "minimax_deployment"} <= set(written)
    assert written["minimax_rpc"] == {"worker_rpc"} and "head_server" in read["minimax_rpc"]
    assert {("common", "local_fact"), ("head_server", "settings"), ("worker_rpc", "stop")} <= declared_entry_points()


def test_a_new_fact_entry_point_or_reader_without_its_row_fails():
    text = CONTRIBUTING.read_text()
    written, read = written_facts(), read_facts()
    assert fact_problems(text, {**written, "minimax_new": {"plan"}}, read) == [
        "minimax_new (written by ['plan']) has no row in the facts table"]
    assert fact_problems(text, written, {**read, "minimax_rpc": read["minimax_rpc"] | {"bench"}}) == [
        "minimax_rpc: 'read by' does not name ['bench'], which read it"]
    declared = declared_entry_points()
    assert entry_point_problems(text, declared | {("plan", "replan")}, []) == [
        "plan: `replan` has no row in the entry points table"]
    assert entry_point_problems(text, declared, [("roles/verify/tasks/main.yml", "plan", "memory_check")]) == [
        "plan: `memory_check` is called from roles/verify/tasks/main.yml; 'called by' does not name verify"]
