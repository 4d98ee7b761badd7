"""playbooks/plan.yml at the real scale without the disk: metadata-only sparse M3 shards, what-if memory.

The shards carry M3's real tensor table in unsloth's quant sizes (UD-IQ4_XS ~208 GB in 6 shards,
UD-Q4_K_XL ~265 GB) and take a few KB on disk. Two to four 128 GB Sparks are inventory hosts
with ``plan_memory_gib: 119`` (ansible_connection local) on the tests' node (the record test writes
/etc/ansible/facts.d there).
"""
import json
from pathlib import Path

import pytest
import yaml

import gguf_info
import sparse_m3
from helpers import ROOT, changed_tasks, failed_tasks, kept_as_found, run_playbook

FACT = Path("/etc/ansible/facts.d/minimax_plan.fact")


@pytest.fixture(scope="module", autouse=True)
def recorded_plan():
    """The plan the demo recorded is put back afterwards: these tests record plans for other models."""
    with kept_as_found(FACT):
        yield


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("m3")
    return {q: sparse_m3.write_sparse_model(root, q) for q in ("UD-IQ4_XS", "UD-Q4_K_XL")}


def inventory(tmp_path, nodes, **extra):
    workers = {"spark-%d" % i: None for i in range(2, nodes + 1)}
    data = {"all": {
        "vars": dict(ansible_connection="local", ansible_python_interpreter="{{ ansible_playbook_python }}",
                     plan_memory_gib=119, **extra),
        "children": {"head": {"hosts": {"spark-1": None}}, "workers": {"hosts": workers}},
    }}
    path = tmp_path / ("inventory-%d.yml" % nodes)
    path.write_text(yaml.safe_dump(data))
    return str(path)


def plan_lines(runner):
    """The table the play printed."""
    for event in runner.event_list:
        res = event.get("event_data", {}).get("res", {})
        if event.get("event") == "runner_on_ok" and event["event_data"].get("task") == "Show the plan":
            return res["msg"]
    raise AssertionError("no plan printed:\n" + runner.stdout_text[-3000:])


def test_seed_setup_fits_on_two_sparks(shards, tmp_path):
    FACT.unlink(missing_ok=True)
    runner = run_playbook("playbooks/plan.yml", inventory(tmp_path, 2),
                          extravars={"model_download_local_file": str(shards["UD-IQ4_XS"])})
    assert runner.rc == 0, failed_tasks(runner)
    lines = plan_lines(runner)
    head, worker = lines[1].split(), lines[2].split()
    assert head[:6] == ["spark-1", "head", "GPU", "29", "31-59", "+"]
    assert worker[:5] == ["spark-2", "worker", "RPC0", "31", "0-30"]
    assert lines[3].startswith("--tensor-split 31,30  -ngl 999  ctx 65536, parallel 1, ubatch 2048, "
                               "KV 80784 bytes/token")
    assert lines[4] == "context: 65,536 tokens (--ctx-size 65536); the model's training context 1,048,576"
    assert lines[5] == (
        "UD-IQ4_XS needs 193.7 GiB + 4.9 GiB KV (65536 tokens, q8_0/q8_0) + 10.1 GiB compute buffers "
        "(ubatch 2048); 2 nodes offer 230.0 GiB: fits, least headroom 10.3 GiB on spark-1")
    assert changed_tasks(runner) == [] and not FACT.exists()  # the plan changes nothing


def test_q4_k_xl_is_refused_on_two(shards, tmp_path):
    runner = run_playbook("playbooks/plan.yml", inventory(tmp_path, 2),
                          extravars={"model_download_local_file": str(shards["UD-Q4_K_XL"])})
    assert runner.rc != 0
    assert failed_tasks(runner) == [("spark-1", "Refuse a model that does not fit",
        "UD-Q4_K_XL needs 246.9 GiB + 4.9 GiB KV (65536 tokens, q8_0/q8_0) + 10.1 GiB compute buffers "
        "(ubatch 2048); 2 nodes offer 230.0 GiB: add a node or choose UD-IQ4_XS")]


def record_playbook(tmp_path, plan=True):
    """What services.yml does before the services start: plan for the head's model, then record the plan on every
    node (the plan role's `record` entry point); without the plan play when `plan` is false."""
    plays = [{"ansible.builtin.import_playbook": str(ROOT / "playbooks" / "plan.yml"),
              "vars": {"plan_model_path": "{{ head_server_model_path }}"}}] if plan else []
    plays.append({"name": "Record the plan", "hosts": "head:workers", "gather_facts": not plan,
                  "gather_subset": ["min"], "tasks": [{"name": "Record the plan on every node",
                                                       "ansible.builtin.import_role": {"name": "plan",
                                                                                       "tasks_from": "record"}}]})
    path = tmp_path / "record.yml"
    path.write_text(yaml.safe_dump(plays, sort_keys=False))
    return str(path)


def test_q4_k_xl_fits_on_three_and_the_plan_is_recorded(shards, tmp_path):
    FACT.unlink(missing_ok=True)
    runner = run_playbook(record_playbook(tmp_path), inventory(tmp_path, 3),
                          extravars={"head_server_model_path": str(shards["UD-Q4_K_XL"]),
                                     # a plan the head starts with is made for the head's model, not this file
                                     "model_download_local_file": str(shards["UD-IQ4_XS"])})
    assert runner.rc == 0, failed_tasks(runner)
    lines = plan_lines(runner)
    assert [line.split()[3] for line in lines[1:4]] == ["19", "22", "19"]
    assert lines[-1].endswith("3 nodes offer 345.0 GiB: fits, least headroom 24.3 GiB on spark-2")
    fact = json.loads(FACT.read_text())
    assert fact["tensor_split"] == [22, 19, 20] and fact["n_gpu_layers"] == 999 and fact["fits"] is True
    assert [n["name"] for n in fact["nodes"]] == ["spark-1", "spark-2", "spark-3"]
    assert fact["model_path"] == str(shards["UD-Q4_K_XL"])


def test_a_run_that_skipped_the_plan_records_nothing(shards, tmp_path):
    """The record entry point writes only a plan computed in the run (a skipped plan play leaves the recorded one for
    head_server's check of its settings)."""
    FACT.write_text(json.dumps({"tensor_split": [31, 30], "ctx_size": 8192}))
    before = FACT.read_text()
    runner = run_playbook(record_playbook(tmp_path, plan=False), inventory(tmp_path, 2),
                          extravars={"head_server_model_path": str(shards["UD-IQ4_XS"])})
    assert runner.rc == 0, failed_tasks(runner)
    assert changed_tasks(runner) == [] and FACT.read_text() == before


def test_memory_check_refuses_a_start_without_the_planned_memory(tmp_path):
    """The preflights' entry point: MemAvailable read fresh against the recorded plan's need."""
    FACT.parent.mkdir(parents=True, exist_ok=True)
    FACT.write_text(json.dumps({"tensor_split": [31, 30], "nodes": [
        {"name": "localhost", "need_gib": 100000.0, "layer_range": "0-30", "weights_gib": 99990.0,
         "kv_gib": 5.0, "compute_gib": 5.0}]}))
    playbook = tmp_path / "check.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "Check", "hosts": "localhost", "gather_facts": True, "gather_subset": ["min"],
        "tasks": [{"name": "Check the planned memory", "ansible.builtin.include_role":
                   {"name": "plan", "tasks_from": "memory_check"},
                   "vars": {"plan_server_processes": ["no-such-server-xyz"]}}],
    }]))
    runner = run_playbook(str(playbook))
    failed = failed_tasks(runner)
    assert len(failed) == 1 and failed[0][1] == "Refuse to start without the planned memory"
    assert failed[0][2].startswith("localhost has ")
    assert failed[0][2].endswith(
        " GiB available now; the plan needs 100000.0 GiB there (0-30: 99990.0 GiB weights, 5.0 GiB KV, "
        "5.0 GiB compute): stop what uses the memory (another model, a stale server) and run again")
    FACT.unlink()


def planned_context(runner):
    """The context line the play printed beside the table, and the number in it."""
    line = next(line for line in plan_lines(runner) if line.startswith("context: "))
    return line, int(line.split("--ctx-size ")[1].split(")")[0].split()[0])


def test_max_context_grows_with_the_sparks_inside_the_window(shards, tmp_path):
    """head_server_ctx_size: max on two, three and four Sparks: the largest context that fits every node."""
    window = gguf_info.gguf_facts(str(shards["UD-IQ4_XS"]))["context_length"]
    assert window == 1048576  # M3's
    contexts = []
    for nodes in (2, 3, 4):
        runner = run_playbook("playbooks/plan.yml", inventory(tmp_path, nodes, head_server_ctx_size="max"),
                              extravars={"model_download_local_file": str(shards["UD-IQ4_XS"])})
        assert runner.rc == 0, failed_tasks(runner)
        line, ctx = planned_context(runner)
        assert line == (f"context: {ctx:,} tokens (--ctx-size {ctx}), the most that fits (head_server_ctx_size: max; "
                        "256 tokens more per slot would not); the model's training context 1,048,576")
        table = plan_lines(runner)
        assert "ctx %d, parallel 1" % ctx in table[nodes + 1]
        assert table[-1].startswith("UD-IQ4_XS needs 193.7 GiB + ") and ": fits, least headroom" in table[-1]
        headroom = [float(row.split()[-2]) for row in table[1:nodes + 1]]
        assert min(headroom) >= 0 and min(headroom) < 1  # spent: one step more would not fit
        contexts.append(ctx)
    assert contexts[0] > 2 * 65536 and contexts[0] < contexts[1] < contexts[2] <= window
    assert all(ctx % 256 == 0 for ctx in contexts)


def test_max_is_capped_and_says_the_context_per_slot(shards, tmp_path):
    runner = run_playbook("playbooks/plan.yml", inventory(tmp_path, 3),
                          extravars={"model_download_local_file": str(shards["UD-IQ4_XS"]),
                                     "head_server_ctx_size": "max", "head_server_parallel": 2,
                                     "head_server_ctx_size_max": 200000})
    assert runner.rc == 0, failed_tasks(runner)
    assert planned_context(runner) == (
        "context: 2 slots of 99,840 tokens each (--ctx-size 199680 in all), head_server_ctx_size: max, capped by "
        "head_server_ctx_size_max; the model's training context 1,048,576", 199680)


def test_a_bad_context_is_refused_before_the_plan(shards, tmp_path):
    runner = run_playbook("playbooks/plan.yml", inventory(tmp_path, 2),
                          extravars={"model_download_local_file": str(shards["UD-IQ4_XS"]),
                                     "head_server_ctx_size": "maximum"})
    assert runner.rc != 0
    assert failed_tasks(runner)[0][1:] == ("Check the head's settings",
        "head_server_ctx_size='maximum' is not a whole number or max: give a context in tokens (e.g. 65536), "
        "0 (the model's own context) or max (the most that fits every node). Nothing was changed: the running "
        "llama-server (if any) keeps serving.")


@pytest.fixture
def no_recorded_model():
    """A head where model_download has not run: the model fact moved aside for the test, put back after."""
    fact = Path("/etc/ansible/facts.d/minimax_model.fact")
    with kept_as_found(fact):
        fact.unlink(missing_ok=True)
        yield


def test_a_workers_only_run_with_no_model_recorded_says_how_to_name_one(shards, tmp_path, no_recorded_model):
    """A tag run that skips model_download does not read model_download_local_file: the plan says to run that step
    (which takes the file) or to name the head's model, changes nothing, and the head's model named is planned for."""
    playbook, hosts = "playbooks/services.yml", inventory(tmp_path, 2)
    runner = run_playbook(playbook, hosts, tags=["worker_rpc"],
                          extravars={"model_download_local_file": str(shards["UD-IQ4_XS"])})
    assert runner.status == "failed"
    assert failed_tasks(runner) == [(
        "spark-1", "Check the model is known",
        "plan_model_path is empty: no model is recorded on the head and none is named. Run the model_download step "
        "first (site.yml, or --tags model_download; model_download_local_file takes a GGUF already on the head), or "
        "set head_server_model_path to shard 1 of a GGUF")]
    assert changed_tasks(runner) == []
    runner = run_playbook("playbooks/plan.yml", hosts, extravars={"head_server_model_path": str(shards["UD-IQ4_XS"])})
    assert runner.rc == 0, failed_tasks(runner)
    assert plan_lines(runner)[5].endswith("2 nodes offer 230.0 GiB: fits, least headroom 10.3 GiB on spark-1")
