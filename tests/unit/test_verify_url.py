"""verify_url's default: the head where llama-server listens, also in a play that never ran head_server (its
variables are then unknown unless the inventory sets them, as in the molecule scenario and a Spark inventory)."""
import json

import pytest

from helpers import ROOT, failed_tasks, run_playbook


@pytest.mark.parametrize("extravars, url", [
    ({}, "http://127.0.0.1:8891"),
    ({"head_server_host": "0.0.0.0"}, "http://127.0.0.1:8891"),
    ({"head_server_host": "10.20.20.1"}, "http://10.20.20.1:8891"),
    ({"head_server_host": "::"}, "http://127.0.0.1:8891"),
    ({"head_server_host": "fd00::1", "head_server_port": 9000}, "http://[fd00::1]:9000"),
], ids=["unset", "all-v4", "fabric", "all-v6", "v6-port"])
def test_verify_url_default(tmp_path, extravars, url):
    play = tmp_path / "play.yml"
    play.write_text(json.dumps([{
        "hosts": "localhost", "gather_facts": False,
        "tasks": [{"ansible.builtin.include_vars": str(ROOT / "roles/verify/defaults/main.yml")},
                  {"ansible.builtin.copy": {"content": "{{ verify_url }}", "dest": str(tmp_path / "url")}}],
    }]))
    inventory = tmp_path / "hosts.yml"  # a head with no head_server variables, as a Spark inventory may be
    inventory.write_text(json.dumps({"all": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": "{{ ansible_playbook_python }}"}}}}))
    runner = run_playbook(str(play), inventory=str(inventory), extravars=extravars)
    assert runner.status == "successful", failed_tasks(runner) or runner.stdout_text
    assert (tmp_path / "url").read_text() == url
