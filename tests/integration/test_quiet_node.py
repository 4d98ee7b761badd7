"""common's quiet_node entry point (worker_rpc and head_server call it before a start): one process list, and a
start beside a competing inference server is refused naming it, its pid and its command line."""
import subprocess

import yaml

from helpers import failed_tasks, run_playbook


def test_a_competing_server_is_refused_naming_it(tmp_path):
    fake = subprocess.Popen(["bash", "-c", "exec -a 'ollama serve --r19-test' sleep 120"])
    try:
        playbook = tmp_path / "quiet.yml"
        playbook.write_text(yaml.safe_dump([{
            "name": "Check", "hosts": "localhost", "gather_facts": True, "gather_subset": ["min"],
            "tasks": [{"name": "Check nothing competes", "ansible.builtin.include_role":
                       {"name": "common", "tasks_from": "quiet_node"},
                       "vars": {"common_conflicting_processes": ["vllm", "ollama"], "common_stop_services": []}}],
        }]))
        runner = run_playbook(str(playbook))
        failed = failed_tasks(runner)
        assert len(failed) == 1 and failed[0][1] == "Refuse to start beside them", failed
        assert ("ollama runs on localhost and would compete for memory: %d ollama serve --r19-test 120. Stop it first."
                % fake.pid) in failed[0][2], failed
        assert "vllm runs" not in failed[0][2]
    finally:
        fake.kill()
        fake.wait()

    runner = run_playbook(str(playbook))
    assert runner.status == "successful", failed_tasks(runner)
