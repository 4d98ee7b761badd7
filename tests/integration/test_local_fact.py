"""common's `local_fact` entry point through Ansible, as the roles call it: one module run writes the fact and the
next task reads it back from ansible_local, on the node written to when the include is delegated (verify's
rollback puts the plan back on every worker that way), and a rerun writes nothing."""
import json
import sys
from pathlib import Path

import pytest

from helpers import changed_tasks, failed_tasks, run_playbook

FACTS = Path("/etc/ansible/facts.d")

PLAYBOOK = """
- name: Hand facts on
  hosts: head
  gather_facts: true
  gather_subset: ["!all", "!min", "local"]
  tasks:
    - name: Record the head's fact
      ansible.builtin.include_role:
        name: common
        tasks_from: local_fact
      vars:
        common_fact_name: probe_head
        common_fact_content: {n: "{{ n }}"}
    - name: Record the worker's fact, delegated
      ansible.builtin.include_role:
        name: common
        tasks_from: local_fact
        apply:
          delegate_to: worker
      vars:
        common_fact_name: probe_worker
        common_fact_content: {n: "{{ n }}"}
        common_fact_held: "{{ hostvars['worker'].ansible_local | default({}) }}"
    - name: Say what each node's facts hold now
      ansible.builtin.debug:
        msg: "SEEN {{ {'head': ansible_local | default({}), 'worker': hostvars['worker'].ansible_local | default({})}
                      | to_json }}"
"""


@pytest.fixture
def play(tmp_path):
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(json.dumps({"all": {"hosts": {
        name: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
        for name in ("head", "worker")}, "children": {"head": {"hosts": {"head": {}}}}}}))
    playbook = tmp_path / "facts.yml"
    playbook.write_text(PLAYBOOK)
    for name in ("probe_head", "probe_worker"):
        (FACTS / ("minimax_%s.fact" % name)).unlink(missing_ok=True)
    yield lambda n: run_playbook(str(playbook), inventory=str(inventory), extravars={"n": n})
    for name in ("probe_head", "probe_worker"):
        (FACTS / ("minimax_%s.fact" % name)).unlink(missing_ok=True)


def seen(runner):
    for event in runner.event_list:
        msg = event.get("event_data", {}).get("res", {}).get("msg")
        if isinstance(msg, str) and msg.startswith("SEEN "):
            return json.loads(msg[5:])
    raise AssertionError("the play said nothing:\n" + runner.stdout_text[-3000:])


def test_the_next_task_reads_each_fact_on_its_node_and_a_rerun_writes_none(play):
    first = play(1)
    assert first.status == "successful", failed_tasks(first)
    facts = seen(first)
    # Both nodes share this node's facts.d: the head's facts were read back before the delegated write, the
    # worker's after it; without delegate_facts the worker's read-back would land on the head.
    assert facts["head"]["minimax_probe_head"] == {"n": 1}
    assert "minimax_probe_worker" not in facts["head"]
    assert facts["worker"]["minimax_probe_worker"] == {"n": 1}
    assert json.loads((FACTS / "minimax_probe_worker.fact").read_text()) == {"n": 1}
    assert sorted(task for _, task in changed_tasks(first)) == [
        "Record the fact minimax_probe_head", "Record the fact minimax_probe_worker"]

    again = play(1)
    assert again.status == "successful", failed_tasks(again)
    assert changed_tasks(again) == []

    other = play(2)
    assert other.status == "successful", failed_tasks(other)
    assert seen(other)["head"]["minimax_probe_head"] == {"n": 2}
    assert seen(other)["worker"]["minimax_probe_worker"] == {"n": 2}
