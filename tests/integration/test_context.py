"""The head's context through site.yml on the demo: `max` takes the plan's number, a context above the model's
training context is refused before anything stops, and starts when lifted on purpose.

The model's training context is read from the demo's GGUF (tools/make_tiny_m3.py sets it), never assumed.
"""
import json
from pathlib import Path

import pytest
import requests
from test_demo import serving_argv

import gguf_info
from helpers import ROOT, changed_tasks, failed_tasks, run_playbook

MODEL = ROOT / ".cache" / "demo" / "MiniMax-M3-tiny.gguf"
PLAN_FACT = Path("/etc/ansible/facts.d/minimax_plan.fact")
API = "http://127.0.0.1:8891"


@pytest.fixture(scope="module")
def window(demo_model, llamacpp_archive):
    """The demo model's training context (<arch>.context_length) and architecture."""
    facts = gguf_info.gguf_facts(str(demo_model))
    assert facts["context_length"], "the demo model states no training context"
    return int(facts["context_length"]), facts["architecture"]


def flag(argv, name):
    return argv[argv.index(name) + 1] if name in argv else None


def recorded_plan():
    return json.loads(PLAN_FACT.read_text())


def printed(runner, task):
    for event in runner.event_list:
        data = event.get("event_data", {})
        if event.get("event") == "runner_on_ok" and data.get("task") == task:
            return data["res"]["msg"]
    raise AssertionError("task %r printed nothing" % task)


@pytest.fixture(scope="module")
def back_to_the_inventory():
    """Every test here changes the head's context: the inventory's settings are put back after them."""
    yield
    runner = run_playbook("site.yml", tags=["head_server"])
    assert runner.status == "successful", failed_tasks(runner)


def test_max_deploys_with_the_plans_context(window, back_to_the_inventory):
    train, _ = window
    runner = run_playbook("site.yml", extravars={"head_server_ctx_size": "max"})
    assert runner.status == "successful", failed_tasks(runner) or runner.stdout_text[-3000:]
    plan = recorded_plan()
    assert plan["ctx_request"] == "max" and plan["ctx_train"] == train
    # the demo's memory holds the whole window: max is the training context, a whole number of 256-token steps
    assert plan["ctx_size"] == plan["ctx_per_slot"] == train // 256 * 256
    _, argv = serving_argv()
    assert flag(argv, "--ctx-size") == str(plan["ctx_size"]) and flag(argv, "--parallel") == "1"
    assert "--override-kv" not in argv
    line = next(x for x in printed(runner, "Show the plan") if x.startswith("context: "))
    assert line == ("context: {:,} tokens (--ctx-size {}), head_server_ctx_size: max, capped by the model's "
                    "training context; the model's training context {:,}".format(plan["ctx_size"], plan["ctx_size"],
                                                                                  train))
    # served as planned: llama-server's own slot context
    props = requests.get(API + "/props", timeout=10).json()
    assert props["default_generation_settings"]["n_ctx"] == plan["ctx_size"]
    # a second run with the same -e changes nothing (the plan fact records the same max)
    again = run_playbook("site.yml", tags=["head_server"], extravars={"head_server_ctx_size": "max"})
    assert again.status == "successful", failed_tasks(again)
    assert changed_tasks(again) == []


def test_a_context_above_the_window_is_refused_before_anything_stops(window, back_to_the_inventory):
    train, arch = window
    before = serving_argv()
    plan_before = PLAN_FACT.read_bytes()
    over = train + 4096
    runner = run_playbook("site.yml", tags=["head_server"], extravars={"head_server_ctx_size": over})
    assert runner.status == "failed"
    assert failed_tasks(runner) == [("localhost", "Refuse a context beyond the model's training context",
        "head_server_ctx_size=%d is above the training context of tiny (%d tokens, %s.context_length): "
        "llama-server would cap each slot at %d and serve less than planned. Set head_server_ctx_size to %d or less "
        "(max: the most that fits), or lift the model's limit on purpose with head_server_ctx_beyond_training: true "
        "(--override-kv %s.context_length=int:%d). Nothing was changed: the running llama-server (if any) keeps "
        "serving." % (over, train, arch, train, train, arch, over))]
    assert changed_tasks(runner) == []
    assert serving_argv() == before  # same PID, same command line
    assert PLAN_FACT.read_bytes() == plan_before
    assert requests.get(API + "/health", timeout=5).status_code == 200


def test_a_context_above_the_window_starts_when_lifted(window, back_to_the_inventory):
    train, arch = window
    over = train + 4096
    runner = run_playbook("site.yml", tags=["head_server"],
                          extravars={"head_server_ctx_size": over, "head_server_ctx_beyond_training": True})
    assert runner.status == "successful", failed_tasks(runner) or runner.stdout_text[-3000:]
    plan = recorded_plan()
    assert (plan["ctx_size"], plan["ctx_beyond_training"], plan["override_kv"]) == (
        over, True, "%s.context_length=int:%d" % (arch, over))
    _, argv = serving_argv()
    assert flag(argv, "--ctx-size") == str(over)
    assert flag(argv, "--override-kv") == "%s.context_length=int:%d" % (arch, over)
    # llama-server serves the whole slot instead of capping it at the training context
    props = requests.get(API + "/props", timeout=10).json()
    assert props["default_generation_settings"]["n_ctx"] == over
