"""Every module in library/ has the face of a core module: `ansible-doc` renders its DOCUMENTATION,
EXAMPLES and RETURN; it declares its check mode, diff mode and platform support; and the options it
documents are the options its argument spec accepts (names, types, defaults, choices, required,
elements, aliases, suboptions).

The documentation side is what `ansible-doc --json` reads (documentation fragments merged, as a user
sees it); the argument spec side is what the module hands to AnsibleModule when it runs.
"""
from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.basic import FILE_COMMON_ARGUMENTS

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "library"
MODULES = sorted(p.stem for p in LIBRARY.glob("*.py"))
ANSIBLE_DOC = str(Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin" / "ansible-doc")
if not os.path.exists(ANSIBLE_DOC):
    ANSIBLE_DOC = shutil.which("ansible-doc") or "ansible-doc"


def ansible_doc(names, library=LIBRARY, as_json=True):
    """Run ansible-doc with the project's ansible.cfg (its `library` and `module_utils`)."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_LIBRARY=str(library),
               ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    argv = [ANSIBLE_DOC, "-t", "module"] + (["--json"] if as_json else []) + list(names)
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def docs():
    result = ansible_doc(MODULES)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


class _SpecCaptured(Exception):
    pass


def argument_spec_of(name):
    """The keyword arguments the module's main() hands to AnsibleModule (it stops right there)."""
    module = importlib.import_module(name)
    captured = {}

    class Capture:
        def __init__(self, *args, **kwargs):
            assert not args, "%s passes AnsibleModule positional arguments" % name
            captured.update(kwargs)
            raise _SpecCaptured()

    original = module.AnsibleModule
    module.AnsibleModule = Capture
    try:
        module.main()
    except _SpecCaptured:
        pass
    finally:
        module.AnsibleModule = original
    assert captured, "%s.main() did not create an AnsibleModule" % name
    spec = dict(captured["argument_spec"])
    if captured.get("add_file_common_args"):
        for key, value in FILE_COMMON_ARGUMENTS.items():
            spec.setdefault(key, value)
    return spec, captured


#: The fields an option's or a return value's documentation may have (ansible-doc adds the version_added_* ones).
OPTION_FIELDS = {"description", "type", "default", "choices", "required", "elements", "aliases", "no_log",
                 "suboptions", "version_added", "version_added_collection"}
RETURN_FIELDS = {"description", "type", "returned", "sample", "contains", "elements", "version_added",
                 "version_added_collection"}


def unknown_fields(entries, allowed, prefix=""):
    """Fields no documentation has: a ', ' inside a YAML flow mapping {description: a, b} makes `b` a key."""
    found = []
    for name, entry in sorted((entries or {}).items()):
        extra = sorted(set(entry) - allowed)
        if extra:
            found.append("%s%s: unknown fields %s" % (prefix, name, extra))
        nested = entry.get("suboptions") or entry.get("contains")
        if isinstance(nested, dict):
            found += unknown_fields(nested, allowed, prefix="%s%s." % (prefix, name))
    return found


def differences(doc_options, spec, prefix=""):
    """What the documentation says differently from the argument spec, one sentence per option field."""
    found = []
    doc_options = doc_options or {}
    for name in sorted(set(spec) - set(doc_options)):
        found.append("%s%s: in the argument spec, not documented" % (prefix, name))
    for name in sorted(set(doc_options) - set(spec)):
        found.append("%s%s: documented, not in the argument spec" % (prefix, name))
    for name in sorted(set(doc_options) & set(spec)):
        doc, arg = doc_options[name], spec[name]
        fields = {
            "type": (doc.get("type", "str"), arg.get("type", "str")),
            "default": (doc.get("default"), arg.get("default")),
            "choices": (doc.get("choices"), arg.get("choices")),
            "required": (bool(doc.get("required", False)), bool(arg.get("required", False))),
            "elements": (doc.get("elements"), arg.get("elements")),
            "aliases": (sorted(doc.get("aliases") or []), sorted(arg.get("aliases") or [])),
        }
        for field, (documented, accepted) in fields.items():
            if documented != accepted:
                found.append("%s%s: %s %r in the documentation, %r in the argument spec"
                             % (prefix, name, field, documented, accepted))
        if doc.get("suboptions") or arg.get("options"):
            found += differences(doc.get("suboptions"), arg.get("options") or {}, prefix="%s%s." % (prefix, name))
    return found


@pytest.mark.parametrize("name", MODULES)
def test_ansible_doc_renders_the_module(name, docs):
    assert name in docs, "ansible-doc could not read %s" % name
    entry = docs[name]
    doc = entry["doc"]
    assert doc["module"] == name
    assert doc["short_description"] and doc["description"] and doc["options"]
    examples = yaml.safe_load(entry["examples"])
    assert isinstance(examples, list) and any(name in task for task in examples), \
        "the EXAMPLES of %s are tasks that call it" % name
    assert isinstance(entry["return"], dict) and entry["return"], "%s documents its RETURN values" % name
    assert unknown_fields(doc["options"], OPTION_FIELDS) + unknown_fields(entry["return"], RETURN_FIELDS) == []
    for key, value in entry["return"].items():
        assert {"description", "type", "returned"} <= set(value), "RETURN %s of %s: description, type, returned" % (
            key, name)


@pytest.mark.parametrize("name", MODULES)
def test_examples_use_documented_options_only(name, docs):
    options = docs[name]["doc"]["options"]
    known = set(options) | {alias for o in options.values() for alias in o.get("aliases") or []}
    for task in yaml.safe_load(docs[name]["examples"]):
        args = task.get(name)
        if isinstance(args, dict):
            assert set(args) <= known, "EXAMPLES task %r of %s: unknown options %s" % (
                task.get("name"), name, sorted(set(args) - known))


def test_ansible_doc_text_renders_every_module():
    result = ansible_doc(MODULES, as_json=False)
    assert result.returncode == 0, result.stderr
    for name in MODULES:
        assert "> MODULE %s " % name in result.stdout, "ansible-doc did not render %s:\n%s" % (name, result.stderr)


def test_ansible_doc_refuses_a_module_whose_documentation_is_not_yaml(tmp_path):
    # The failure these tests guard against (three modules had it): a ': ' inside a plain YAML scalar.
    source = (LIBRARY / "bench_run.py").read_text()
    broken = source.replace("Offline by construction, no Hub; the tokenizer",
                            "Offline by construction, no Hub: the tokenizer")
    assert broken != source
    (tmp_path / "bench_run.py").write_text(broken)
    result = ansible_doc(["bench_run"], library=tmp_path, as_json=False)
    assert result.returncode != 0
    assert "module bench_run Missing documentation (or could not parse documentation)" in result.stderr


@pytest.mark.parametrize("name", MODULES)
def test_documented_options_are_the_argument_spec(name, docs):
    spec, _ = argument_spec_of(name)
    assert differences(docs[name]["doc"]["options"], spec) == []


def test_a_default_that_drifts_from_the_documentation_is_named(docs):
    spec, _ = argument_spec_of("bench_run")
    spec = dict(spec, runs=dict(spec["runs"], default=5), extra=dict(type="bool"))
    spec["latency_mode"] = dict(spec["latency_mode"], choices=["api", "none"])
    assert differences(docs["bench_run"]["doc"]["options"], spec) == [
        "extra: in the argument spec, not documented",
        "latency_mode: choices ['api', 'generation', 'none'] in the documentation, ['api', 'none'] in the argument "
        "spec",
        "runs: default 3 in the documentation, 5 in the argument spec",
    ]


def test_a_comma_inside_a_flow_mapping_is_named():
    # What ten options and return values had: the description cut at its first comma, the rest keys.
    options = yaml.safe_load("watch_ports: {description: Remote ports whose connections, once closed, restart it., "
                             "type: list, elements: int}")
    assert unknown_fields(options, OPTION_FIELDS) == [
        "watch_ports: unknown fields ['once closed', 'restart it.']"]


@pytest.mark.parametrize("name", MODULES)
def test_attributes_declare_check_mode_diff_mode_and_platform(name, docs):
    attributes = docs[name]["doc"].get("attributes") or {}
    assert {"check_mode", "diff_mode", "platform"} <= set(attributes), "%s declares its attributes" % name
    _, kwargs = argument_spec_of(name)
    check = attributes["check_mode"]["support"]
    assert (check != "none") == bool(kwargs.get("supports_check_mode")), \
        "%s: check_mode support %s, supports_check_mode=%s" % (name, check, kwargs.get("supports_check_mode"))
    returns_diff = "_diff" in (LIBRARY / ("%s.py" % name)).read_text()
    diff = attributes["diff_mode"]["support"]
    assert (diff != "none") == returns_diff, "%s: diff_mode support %s, returns a diff: %s" % (name, diff, returns_diff)
    assert attributes["platform"]["platforms"] in ("posix", "linux")


@pytest.mark.parametrize("name", MODULES)
def test_module_file_holds_no_engine(name):
    # Engines live in module_utils/ (imported and tested directly); a module file stays a face.
    lines = len((LIBRARY / ("%s.py" % name)).read_text().splitlines())
    assert lines <= 300, "library/%s.py has %d lines; move its engine to module_utils/" % (name, lines)


# Private names of the standard library and Ansible that files may use (their owners document them).
FOREIGN_PRIVATE_OK = {"_diff", "_exit", "_asdict", "_replace", "_fields", "_getframe", "_current_frames"}


def private_names_used_across_files(paths):
    """`from x import _name` and `obj._name` (obj not self/cls) in the given Python files."""
    import ast

    found = []
    for path in paths:
        tree = ast.parse(path.read_text(), filename=str(path))
        rel = path.relative_to(ROOT) if ROOT in path.parents else path.name
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                found += ["%s:%d imports %s from %s" % (rel, node.lineno, alias.name, node.module)
                          for alias in node.names if alias.name.startswith("_") and not alias.name.startswith("__")]
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                owner = node.value.id if isinstance(node.value, ast.Name) else None
                if owner not in ("self", "cls") and node.attr not in FOREIGN_PRIVATE_OK:
                    found.append("%s:%d uses %s.%s" % (rel, node.lineno, ast.unparse(node.value), node.attr))
    return found


def test_no_file_uses_another_files_private_names():
    paths = [p for folder in ("library", "module_utils", "filter_plugins")
             for p in sorted((ROOT / folder).glob("*.py"))]
    assert private_names_used_across_files(paths) == []


def test_a_private_name_imported_across_files_is_named(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from ansible.module_utils.minimax_spark_gguf import _per_layer\n\nx = meta._reader\n")
    assert private_names_used_across_files([probe]) == [
        "probe.py:1 imports _per_layer from ansible.module_utils.minimax_spark_gguf",
        "probe.py:3 uses meta._reader",
    ]
