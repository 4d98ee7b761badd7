"""verify_url's default: where llama-server answers, as head_server derives it once (head_server_url), in a play
that imports head_server's settings entry point first as playbooks/verify.yml does, with or without the
inventory setting head_server's variables (the molecule scenario and a Spark inventory set none)."""
import json

import pytest

from helpers import ROOT, failed_tasks, run_playbook


def url_play(tmp_path):
    play = tmp_path / "play.yml"
    play.write_text(json.dumps([{
        "hosts": "localhost", "gather_facts": False,
        "pre_tasks": [{"ansible.builtin.import_role": {"name": "head_server", "tasks_from": "settings"}}],
        "tasks": [{"ansible.builtin.include_vars": str(ROOT / "roles/verify/defaults/main.yml")},
                  {"ansible.builtin.copy": {"content": "{{ verify_url }}", "dest": str(tmp_path / "url")}}],
    }]))
    inventory = tmp_path / "hosts.yml"  # a head with no head_server variables, as a Spark inventory may be
    inventory.write_text(json.dumps({"all": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}"}},
        "children": {"head": {"hosts": {"localhost": None}}}}}))
    return play, inventory


@pytest.mark.parametrize("extravars, url", [
    ({}, "http://127.0.0.1:8891"),
    ({"head_server_host": "0.0.0.0"}, "http://127.0.0.1:8891"),
    ({"head_server_host": "10.20.20.1"}, "http://10.20.20.1:8891"),
    ({"head_server_host": "::"}, "http://127.0.0.1:8891"),
    ({"head_server_host": "fd00::1", "head_server_port": 9000}, "http://[fd00::1]:9000"),
], ids=["unset", "all-v4", "fabric", "all-v6", "v6-port"])
def test_verify_url_default(tmp_path, extravars, url):
    play, inventory = url_play(tmp_path)
    runner = run_playbook(str(play), inventory=str(inventory), extravars=extravars)
    assert runner.status == "successful", failed_tasks(runner) or runner.stdout_text
    assert (tmp_path / "url").read_text() == url


def test_a_bad_head_setting_fails_in_its_home_before_verify_reads_it(tmp_path):
    play, inventory = url_play(tmp_path)
    runner = run_playbook(str(play), inventory=str(inventory), extravars={"head_server_port": 70000})
    assert runner.status == "failed"
    assert [task for _, task, _ in failed_tasks(runner)] == ["Check the head's settings"]
    assert failed_tasks(runner)[0][2] == (
        "head_server_port=70000 is not a port (1-65535). Nothing was changed: the running llama-server (if any) "
        "keeps serving.")
    assert not (tmp_path / "url").exists()
