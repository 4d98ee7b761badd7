"""The head's settings flow: one URL derivation, endpoints from the workers' facts, the plan's settings guard."""
import pytest

from minimax_head import head_url, worker_endpoints, workers_unrecorded
from minimax_plan import plan_settings_mismatch

PLAN = {"ctx_size": 4096, "parallel": 1, "ubatch_size": 2048, "cache_type_k": "q8_0", "cache_type_v": "q8_0",
        "tensor_split": [3, 2], "model_path": "/m/MiniMax-M3-tiny.gguf", "n_gpu_layers": 999}
HEAD = {"ctx_size": 4096, "parallel": 1, "ubatch_size": 2048, "cache_type_k": "q8_0", "cache_type_v": "q8_0",
        "tensor_split": ["3", "2"], "model_path": "/x/../m/MiniMax-M3-tiny.gguf"}


@pytest.mark.parametrize("host, port, node, url", [
    ("0.0.0.0", 8891, None, "http://127.0.0.1:8891"),
    ("", "8891", None, "http://127.0.0.1:8891"),
    ("::", 8891, "spark-1", "http://spark-1:8891"),
    ("10.0.0.5", 9000, "spark-1", "http://10.0.0.5:9000"),
    ("fe80::1", 8891, None, "http://[fe80::1]:8891"),
])
def test_head_url_is_where_the_head_answers(host, port, node, url):
    assert head_url(host, port, node) == url


def test_endpoints_are_what_the_workers_recorded_not_the_inventory():
    hostvars = {
        "w1": {"worker_rpc_port": 1, "ansible_local": {"minimax_rpc": {"endpoint": "10.0.0.2:50052"}}},
        "w2": {"ansible_local": {}},
        "w3": {"ansible_local": {"minimax_rpc": {"endpoint": "[fd00::3]:50060"}}},
    }
    assert worker_endpoints(["w1", "w2", "w3"], hostvars) == ["10.0.0.2:50052", "[fd00::3]:50060"]
    assert workers_unrecorded(["w1", "w2", "w3"], hostvars) == ["w2"]
    assert worker_endpoints([], hostvars) == [] == workers_unrecorded(None, hostvars)


def test_the_plan_for_these_settings_passes():
    assert plan_settings_mismatch(PLAN, HEAD) == []
    assert plan_settings_mismatch({}, HEAD) == []  # no plan recorded: the memory check has nothing to go on either


def test_a_plan_for_other_settings_names_each_setting():
    head = dict(HEAD, ctx_size="8192", cache_type_v="f16", tensor_split=[4, 1], model_path="/m/other.gguf")
    assert plan_settings_mismatch(PLAN, head) == [
        "head_server_ctx_size=8192 (the plan: 4096)",
        "head_server_cache_type_v=f16 (the plan: q8_0)",
        "head_server_tensor_split=4,1 (the plan: 3,2)",
        "head_server_model_path=/m/other.gguf (the plan: /m/MiniMax-M3-tiny.gguf)",
    ]


def test_a_plan_of_an_older_release_is_compared_on_what_it_records():
    old = {k: v for k, v in PLAN.items() if k not in ("cache_type_k", "cache_type_v", "model_path")}
    assert plan_settings_mismatch(old, dict(HEAD, cache_type_k="f16")) == []
    assert plan_settings_mismatch(old, dict(HEAD, parallel=2)) == ["head_server_parallel=2 (the plan: 1)"]


# -- the context: max, the plan's number, the lift ----------------------------------------------------------------
from minimax_plan import plan_head_ctx  # noqa: E402
from minimax_settings import head_settings  # noqa: E402

MAX_PLAN = dict(PLAN, ctx_request="max", ctx_size=160256, ctx_size_max=0, ctx_beyond_training=False, override_kv="")
# what the head's guard hands in: the context asked for (head_server_ctx_size), not a number planned
ASKED = {k: v for k, v in HEAD.items() if k != "ctx_size"}


def test_max_starts_with_the_plans_number():
    assert plan_head_ctx(MAX_PLAN, "max") == {"ctx_size": 160256, "args": [], "problem": ""}
    assert plan_head_ctx(MAX_PLAN, " MAX ")["ctx_size"] == 160256
    assert plan_head_ctx(PLAN, 4096) == {"ctx_size": 4096, "args": [], "problem": ""}
    assert plan_settings_mismatch(MAX_PLAN, dict(ASKED, ctx_request="max", ctx_size_max="0")) == []


def test_max_without_a_plan_for_max_is_refused():
    for fact in ({}, None, PLAN):
        out = plan_head_ctx(fact, "max")
        assert out["ctx_size"] is None and out["problem"] == (
            "head_server_ctx_size=max takes the context the plan chose, and the recorded plan "
            "(ansible_local.minimax_plan) was not made for max: run site.yml or playbooks/services.yml without "
            "skipping the plan play")


def test_a_lifted_context_adds_the_override():
    lifted = dict(PLAN, ctx_size=65536, ctx_request=65536, ctx_beyond_training=True,
                  override_kv="minimax-m3.context_length=int:65536")
    assert plan_head_ctx(lifted, 65536) == {
        "ctx_size": 65536, "args": ["--override-kv", "minimax-m3.context_length=int:65536"], "problem": ""}
    # the guard: the lift is a setting the plan was made for ("true" as -e gives it)
    assert plan_settings_mismatch(lifted, dict(ASKED, ctx_request="65536", ctx_beyond_training="true")) == []
    assert plan_settings_mismatch(lifted, dict(ASKED, ctx_request=65536, ctx_beyond_training=False)) == [
        "head_server_ctx_beyond_training=False (the plan: True)"]


def test_the_guard_compares_the_context_asked_for():
    assert plan_settings_mismatch(MAX_PLAN, dict(ASKED, ctx_request=160256)) == [
        "head_server_ctx_size=160256 (the plan: max)"]
    assert plan_settings_mismatch(PLAN, dict(ASKED, ctx_request="max")) == ["head_server_ctx_size=max (the plan: 4096)"]
    assert plan_settings_mismatch(MAX_PLAN, dict(ASKED, ctx_request="max", ctx_size_max=32768)) == [
        "head_server_ctx_size_max=32768 (the plan: 0)"]
    # a plan of an older release (ctx_size only) is compared on it
    assert plan_settings_mismatch(PLAN, dict(ASKED, ctx_request=4096)) == []
    # a worker's plan against the head's: the number chosen counts too (memory changed between two max plans)
    assert plan_settings_mismatch(MAX_PLAN, dict(MAX_PLAN, ctx_size=158720)) == [
        "head_server_ctx_size=158720 (the plan: 160256)"]


@pytest.mark.parametrize("value, problem", [
    ("maximum", "head_server_ctx_size='maximum' is not a whole number or max: give a context in tokens (e.g. 65536), "
                "0 (the model's own context) or max (the most that fits every node)"),
    (True, "head_server_ctx_size=True is not a whole number or max: give a context in tokens (e.g. 65536), "
           "0 (the model's own context) or max (the most that fits every node)"),
    (-5, "head_server_ctx_size=-5 is negative (0 takes the model's own context)"),
])
def test_a_context_neither_a_number_nor_max_is_named(value, problem):
    assert head_settings({"ctx_size": value}) == [problem]


def test_max_and_numbers_are_good_contexts():
    for value in ("max", "MAX", 65536, "65536", 0):
        assert head_settings({"ctx_size": value, "ctx_size_max": 0}) == []
    assert head_settings({"ctx_size": "max", "ctx_size_max": -1}) == [
        "head_server_ctx_size_max=-1 is not 0 (no cap) or a context in tokens"]


# -- worker_rpc's settings, checked in head_server's style ------------------------------------------------------
from minimax_settings import worker_settings  # noqa: E402

WORKER = {"bind_address": "10.20.20.2", "port": 50052, "threads": 0, "extra_args": [], "devices": ["CUDA0"],
          "firewall": True, "allowed_sources": ["10.20.20.1", "fd00::/64"]}


def test_good_worker_settings_have_no_problem():
    assert worker_settings(WORKER) == []
    assert worker_settings(dict(WORKER, port="50060", firewall=False, allowed_sources=[])) == []


def test_every_bad_worker_setting_is_named_in_one_list():
    bad = dict(WORKER, bind_address="0.0.0.0", port=70000, threads=-1, extra_args="--no-such-flag",
               devices=[1], allowed_sources=["head.local"])
    assert worker_settings(bad) == [
        "worker_rpc_bind_address=0.0.0.0 would expose the unauthenticated RPC port on every network: "
        "use the fast-link IP",
        "worker_rpc_port=70000 is not a TCP port: give a number from 1 to 65535",
        "worker_rpc_threads=-1 is not 0 (the server's default) or a number of threads",
        "worker_rpc_extra_args must be a list of strings (one word each), not \"--no-such-flag\": write a YAML list in "
        "the inventory; with -e give JSON, e.g. -e '{\"worker_rpc_extra_args\": [\"--flag\", \"value\"]}'",
        "worker_rpc_devices must be a list of strings (one word each), not [1]: write a YAML list in the inventory; "
        "with -e give JSON, e.g. -e '{\"worker_rpc_devices\": [\"--flag\", \"value\"]}'",
        "worker_rpc_allowed_sources: 'head.local' is not an IP address or network: list the head's fast-link IP",
    ]


@pytest.mark.parametrize("bind", ["", "::", "[::]", "0"])
def test_a_worker_bound_nowhere_or_everywhere_is_refused(bind):
    [problem] = worker_settings(dict(WORKER, bind_address=bind))
    assert problem.startswith("worker_rpc_bind_address")


def test_a_firewall_without_sources_is_refused():
    assert worker_settings(dict(WORKER, allowed_sources=[])) == [
        "worker_rpc_firewall is on but worker_rpc_allowed_sources is empty: set fast_link_address on the head or "
        "list the head's address"]
