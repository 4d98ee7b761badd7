"""local_fact: one module run writes a role's fact and hands back ansible_local as setup would read it, so the
next task sees the fact without a reload; a file holding the content is left alone; check mode writes nothing."""
import json
import os
import stat

import local_fact
from helpers import run_module


def args(folder, name="minimax_plan", content=None):
    return {"name": name, "content": {"ctx_size": 65536, "split": [3, 2]} if content is None else content,
            "fact_path": str(folder)}


def test_writes_the_fact_creates_the_folder_and_returns_every_local_fact_read_back(tmp_path):
    folder = tmp_path / "facts.d"
    result = run_module(local_fact.main, args(folder))
    assert result["changed"] is True
    path = folder / "minimax_plan.fact"
    assert result["path"] == str(path)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o755
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert json.loads(path.read_text()) == {"ctx_size": 65536, "split": [3, 2]}
    assert result["ansible_facts"]["ansible_local"] == {"minimax_plan": {"ctx_size": 65536, "split": [3, 2]}}
    # Another tool's facts (an INI file) come back beside it, as setup reads them: ansible_local is replaced whole.
    (folder / "site.fact").write_text("[rack]\nrow = 4\n")
    again = run_module(local_fact.main, args(folder, name="minimax_link", content={"mtu": 9000}))
    assert again["ansible_facts"]["ansible_local"] == {
        "minimax_plan": {"ctx_size": 65536, "split": [3, 2]},
        "minimax_link": {"mtu": 9000},
        "site": {"rack": {"row": "4"}},
    }


def test_the_same_content_is_not_written_again_and_other_content_replaces_it(tmp_path):
    first = run_module(local_fact.main, args(tmp_path))
    path = tmp_path / "minimax_plan.fact"
    inode, text = os.stat(path).st_ino, path.read_text()
    # Compared as JSON: the keys in another order, another indent, are the same fact.
    path.write_text(json.dumps({"split": [3, 2], "ctx_size": 65536}))
    inode = os.stat(path).st_ino
    second = run_module(local_fact.main, args(tmp_path))
    assert (first["changed"], second["changed"]) == (True, False)
    assert os.stat(path).st_ino == inode, "an unchanged fact was rewritten"
    third = run_module(local_fact.main, args(tmp_path, content={"ctx_size": 8192, "split": [3, 2]}))
    assert third["changed"] is True
    assert path.read_text() == text.replace("65536", "8192")
    assert third["ansible_facts"]["ansible_local"]["minimax_plan"]["ctx_size"] == 8192
    # No temporary file is left beside it.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["minimax_plan.fact"]


def test_a_file_that_is_not_json_is_replaced(tmp_path):
    path = tmp_path / "minimax_plan.fact"
    path.write_text('{"ctx_size": 65536, "spl')  # cut short
    result = run_module(local_fact.main, args(tmp_path))
    assert result["changed"] is True
    assert json.loads(path.read_text())["ctx_size"] == 65536


def test_check_mode_writes_nothing_and_returns_the_facts_on_disk_with_the_diff(tmp_path):
    path = tmp_path / "minimax_plan.fact"
    path.write_text(json.dumps({"ctx_size": 4096, "split": [3, 2]}))
    result = run_module(local_fact.main, args(tmp_path), check_mode=True, diff=True)
    assert result["changed"] is True
    assert json.loads(path.read_text())["ctx_size"] == 4096
    assert result["ansible_facts"]["ansible_local"]["minimax_plan"]["ctx_size"] == 4096
    assert '"ctx_size": 65536' in result["diff"]["after"] and "4096" in result["diff"]["before"]
    missing = run_module(local_fact.main, args(tmp_path / "none"), check_mode=True)
    assert missing["changed"] is True and not (tmp_path / "none").exists()
    assert missing["ansible_facts"]["ansible_local"] == {}


def test_a_name_that_is_no_fact_name_is_refused_before_anything_is_written(tmp_path):
    result = run_module(local_fact.main, args(tmp_path, name="../plan"))
    assert result["failed"] is True
    assert result["msg"] == ("name '../plan' is not a fact name: use letters, digits and _ (it becomes "
                             "ansible_local.NAME and the file NAME.fact)")
    assert list(tmp_path.iterdir()) == []


def test_a_fact_path_that_is_a_file_is_refused_and_left_as_it_is(tmp_path):
    plain = tmp_path / "facts.d"
    plain.write_text("not a folder\n")
    result = run_module(local_fact.main, args(plain))
    assert result["failed"] is True
    assert result["msg"] == ("fact_path %s is not a folder: give the local facts folder (setup's fact_path, default "
                             "/etc/ansible/facts.d)" % plain)
    assert plain.read_text() == "not a folder\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["facts.d"]
