"""filter_plugins/minimax_plan: the placement plan for 2-4 nodes, pinned splits, CPU heads, refusals."""
import pytest

import gguf_info
import minimax_plan as mp
import sparse_m3

GIB = 2 ** 30


@pytest.fixture(scope="module")
def m3(tmp_path_factory):
    """gguf_info's sizes of the real-scale sparse shards (q8_0 KV), per quant."""
    root = tmp_path_factory.mktemp("m3")
    out = {}
    for quant in ("UD-IQ4_XS", "UD-Q4_K_XL"):
        path = sparse_m3.write_sparse_model(root, quant)
        out[quant] = gguf_info.gguf_facts(str(path), True, "q8_0", "q8_0")
    return out


def sparks(n, memory=119, reserve=4.0):
    return [dict(name="spark-%d" % (i + 1), memory_gib=memory, reserve_gib=reserve) for i in range(n)]


def toy(layers=8, layer_gib=1.0, output_gib=0.5, embd_gib=0.25, kv=1024):
    """A uniform model: ``layers`` of ``layer_gib``, an output layer, token_embd, ``kv`` bytes/token/layer."""
    return dict(
        block_count=layers,
        layer_bytes=[int(layer_gib * GIB)] * layers,
        non_layer_bytes={"token_embd.weight": int(embd_gib * GIB), "output.weight": int(output_gib * GIB)},
        kv_bytes_per_token=dict(per_layer=[kv] * layers, total=kv * layers, indexer=0,
                                cache_type_k="f16", cache_type_v="f16"),
        n_vocab=1000, n_embd=256, n_ff_exp=256, n_expert_used=1,
    )


def placed(plan):
    """Layers per node in placement order, checked against llama.cpp's own assignment."""
    return {r["name"]: r["layers"] for r in plan["nodes"]}


def check_split_reproduces(plan, n_items):
    """The plan's --tensor-split gives back exactly its layer counts under llama.cpp's rule."""
    devs = mp.llamacpp_layer_devices(plan["tensor_split"], n_items,
                                     None if plan["n_gpu_layers"] == 999 else plan["n_gpu_layers"])
    counts = [devs.count(d) for d in range(len(plan["tensor_split"]))]
    assert counts == plan["tensor_split"]


# ------------------------------------------------------------------------------------------------
# the seed's setup and the two questions, at the real scale
# ------------------------------------------------------------------------------------------------

def test_seed_setup_fits_on_two_sparks(m3):
    plan = mp.minimax_plan(m3["UD-IQ4_XS"], sparks(2), 65536, 1, 2048, model_name="UD-IQ4_XS")
    assert plan["fits"], plan["message"]
    head, worker = plan["nodes"]
    assert head["layer_range"].endswith("+ output") and head["device"] == "GPU"
    assert worker["device"] == "RPC0" and worker["layer_range"].startswith("0-")
    assert head["layers"] + worker["layers"] == 60
    assert plan["tensor_split"] == [worker["layers"], head["layers"] + 1]
    assert all(r["headroom_gib"] > 5 for r in plan["nodes"])
    assert 95 < head["need_gib"] < 115 and 95 < worker["need_gib"] < 115
    assert plan["kv_bytes_per_token"] == 80784 and plan["totals"]["kv_gib"] == 4.9
    check_split_reproduces(plan, 61)
    assert plan["message"].startswith(
        "UD-IQ4_XS needs 193.7 GiB + 4.9 GiB KV (65536 tokens, q8_0/q8_0) + 10.1 GiB compute buffers (ubatch 2048); "
        "2 nodes offer 230.0 GiB: fits, least headroom")


def test_q4_k_xl_is_refused_on_two_with_the_numbers(m3):
    plan = mp.minimax_plan(m3["UD-Q4_K_XL"], sparks(2), 65536, 1, 2048, model_name="UD-Q4_K_XL")
    assert not plan["fits"]
    assert plan["message"] == (
        "UD-Q4_K_XL needs 246.9 GiB + 4.9 GiB KV (65536 tokens, q8_0/q8_0) + 10.1 GiB compute buffers "
        "(ubatch 2048); 2 nodes offer 230.0 GiB: add a node or choose UD-IQ4_XS")
    assert plan["table"][-1] == plan["message"]


def test_q4_k_xl_fits_on_three(m3):
    plan = mp.minimax_plan(m3["UD-Q4_K_XL"], sparks(3), 65536, 1, 2048, model_name="UD-Q4_K_XL")
    assert plan["fits"], plan["message"]
    assert [r["device"] for r in plan["nodes"]] == ["GPU", "RPC0", "RPC1"]
    assert sum(r["layers"] for r in plan["nodes"]) == 60 and all(r["layers"] > 15 for r in plan["nodes"])
    check_split_reproduces(plan, 61)


def test_four_nodes_share_evenly(m3):
    plan = mp.minimax_plan(m3["UD-IQ4_XS"], sparks(4), 65536, 1, 2048)
    assert plan["fits"] and len(plan["tensor_split"]) == 4
    layers = [r["layers"] for r in plan["nodes"]]
    assert sum(layers) == 60 and max(layers) - min(layers) <= 3
    check_split_reproduces(plan, 61)


def test_smaller_ubatch_shrinks_compute_buffers(m3):
    big = mp.minimax_plan(m3["UD-IQ4_XS"], sparks(2), 65536, 1, 2048)
    small = mp.minimax_plan(m3["UD-IQ4_XS"], sparks(2), 65536, 1, 512)
    assert small["totals"]["compute_gib"] < big["totals"]["compute_gib"] / 3


# ------------------------------------------------------------------------------------------------
# shapes of clusters (toy model: exact numbers)
# ------------------------------------------------------------------------------------------------

def test_two_equal_nodes_split_in_half():
    plan = mp.minimax_plan(toy(), sparks(2, memory=10, reserve=1), ctx_size=1024, ubatch_size=32)
    assert plan["fits"]
    assert placed(plan) == {"spark-1": 4, "spark-2": 4}
    assert plan["tensor_split"] == [4, 5] and plan["n_gpu_layers"] == 999
    check_split_reproduces(plan, 9)


def test_three_nodes():
    plan = mp.minimax_plan(toy(layers=12), sparks(3, memory=10, reserve=1), ctx_size=1024, ubatch_size=32)
    assert plan["fits"] and sum(placed(plan).values()) == 12
    assert plan["nodes"][1]["layer_range"] == "0-%d" % (plan["nodes"][1]["layers"] - 1)
    check_split_reproduces(plan, 13)


def test_unequal_memory_gives_the_bigger_node_more():
    nodes = [dict(name="big-head", memory_gib=20, reserve_gib=1), dict(name="small", memory_gib=6, reserve_gib=1)]
    plan = mp.minimax_plan(toy(layers=16), nodes, ctx_size=1024, ubatch_size=32)
    assert plan["fits"]
    assert plan["nodes"][0]["layers"] > 2 * plan["nodes"][1]["layers"]
    assert all(r["headroom_gib"] >= 0 for r in plan["nodes"])
    check_split_reproduces(plan, 17)


def test_cpu_head_gets_ngl_and_worker_only_split():
    nodes = sparks(3, memory=10, reserve=1)
    nodes[0]["gpu"] = False
    plan = mp.minimax_plan(toy(layers=12), nodes, ctx_size=1024, ubatch_size=32)
    assert plan["fits"]
    head = plan["nodes"][0]
    assert head["device"] == "CPU" and head["layer_range"].startswith("0-") and not head["output"]
    assert len(plan["tensor_split"]) == 2  # the workers only: a CPU head is not a device
    assert plan["n_gpu_layers"] == 13 - head["layers"]
    assert plan["nodes"][2]["output"]  # the last worker holds the output layer
    check_split_reproduces(plan, 13)


def test_pinned_split_is_honoured():
    plan = mp.minimax_plan(toy(), sparks(2, memory=10, reserve=1), ctx_size=1024, ubatch_size=32, tensor_split=[3, 6])
    assert plan["pinned"] and plan["fits"]
    assert placed(plan) == {"spark-2": 3, "spark-1": 5}  # 6 shares: 5 layers + output
    assert plan["tensor_split"] == [3, 6]


def test_pinned_split_that_overloads_a_node_is_refused():
    plan = mp.minimax_plan(toy(), sparks(2, memory=6, reserve=1), ctx_size=1024, ubatch_size=32, tensor_split=[1, 8])
    assert not plan["fits"]
    assert plan["message"].endswith(
        "but the pinned tensor split leaves spark-1 lacks %.1f GiB: change head_server_tensor_split or leave it "
        "empty for the plan's split" % -plan["nodes"][0]["headroom_gib"])


def test_pinned_split_with_the_wrong_length_says_the_devices():
    with pytest.raises(mp.PlanError, match=r"has 3 entries; this cluster has 2 devices \(spark-2, spark-1\)"):
        mp.minimax_plan(toy(), sparks(2), tensor_split=[1, 1, 1])


def test_does_not_fit_message_with_numbers():
    plan = mp.minimax_plan(toy(layers=20, layer_gib=1.0), sparks(2, memory=10, reserve=1), ctx_size=1024,
                           ubatch_size=32, model_name="toy",
                           alternatives=[{"name": "toy-big", "gb": 30}, {"name": "toy-small", "gb": 10}])
    assert not plan["fits"]
    assert plan["message"] == (
        "toy needs 20.8 GiB + 0.0 GiB KV (1024 tokens, f16/f16) + 0.0 GiB compute buffers (ubatch 32); "
        "2 nodes offer 18.0 GiB: add a node or choose toy-small")


def test_kv_cells_are_shared_by_the_slots():
    assert mp.kv_cells(65536, 1) == 65536
    assert mp.kv_cells(65536, 4) == 65536
    assert mp.kv_cells(1000, 3) == 3 * 512  # each slot padded to 256


def test_meminfo():
    text = "MemTotal:       124780544 kB\nMemFree:         1000 kB\nMemAvailable:   104857600 kB\n"
    assert mp.meminfo_gib(text) == {"total_gib": 119.0, "available_gib": 100.0}


def test_memory_check_right_before_start():
    plan = mp.minimax_plan(toy(), sparks(2, memory=10, reserve=1), ctx_size=1024, ubatch_size=32)
    need = plan["nodes"][1]["need_gib"]
    assert mp.plan_memory_check(plan, "spark-2", need + 1) == ""
    assert mp.plan_memory_check(plan, "spark-2", need - 1, running=True) == ""
    msg = mp.plan_memory_check(plan, "spark-2", 1.0)
    assert msg.startswith("spark-2 has 1.0 GiB available now; the plan needs %.1f GiB there (0-3:" % need)
    assert msg.endswith("stop what uses the memory (another model, a stale server) and run again")


@pytest.mark.parametrize("cells,ubatch,measured_mib", [(65536, 2048, 5122.41), (65536, 512, 1280.85),
                                                      (131072, 2048, 9986.66), (16384, 2048, 1474.22)])
def test_compute_estimate_matches_llama_server(cells, ubatch, measured_mib):
    """llama-server's `CPU compute buffer size` for an M3-width proxy (one device with MSA layers and the
    output; n_embd 6144, vocab 200064, q8_0 KV, -fa on, -np 1), this llama.cpp tree: within 5 %."""
    model = dict(n_embd=6144, n_vocab=200064)
    estimate = mp.compute_bytes(model, cells, ubatch, has_msa=True, has_output=True) / 2 ** 20
    assert measured_mib <= estimate * 1.05 and estimate <= measured_mib * 1.05


def test_cpu_head_pinned_split_over_the_workers():
    nodes = sparks(3, memory=10, reserve=1)
    nodes[0]["gpu"] = False
    plan = mp.minimax_plan(toy(layers=12), nodes, ctx_size=1024, ubatch_size=32, tensor_split=[1, 1], n_gpu_layers=9)
    assert plan["pinned"] and plan["fits"] and plan["n_gpu_layers"] == 9
    # head 0-3 on its CPU; 9 items: 4.5 rounds to 5 + (3 + output)
    assert [r["layers"] for r in plan["nodes"]] == [4, 5, 3]
    assert plan["nodes"][2]["layer_range"] == "9-11 + output"


def test_plan_nodes_from_hostvars():
    hostvars = {
        "h": {"_plan_memory": {"total_gib": 119.0, "available_gib": 110.0}},
        "w": {"_plan_memory": {"total_gib": 119.0, "available_gib": None},
              "plan_reserve_gib": 8, "plan_compute_gib": 3},
    }
    nodes = mp.plan_nodes(["h", "w"], hostvars, 4, head_gpu=False)
    assert nodes[0] == dict(name="h", memory_gib=119.0, available_gib=110.0, reserve_gib=4.0, compute_gib="", gpu=False)
    assert nodes[1]["reserve_gib"] == 8.0 and nodes[1]["compute_gib"] == 3 and nodes[1]["gpu"] is True
    with pytest.raises(mp.PlanError, match="no memory known for x: the plan runs on the head and every worker"):
        mp.plan_nodes(["x"], {"x": {}})


def test_recorded_fact_leaves_out_what_changes_between_runs():
    nodes = sparks(2, memory=10, reserve=1)
    nodes[0]["available_gib"] = 7.5
    first = mp.minimax_plan(toy(), nodes, ctx_size=1024, ubatch_size=32)
    nodes[0]["available_gib"] = 3.2
    second = mp.minimax_plan(toy(), nodes, ctx_size=1024, ubatch_size=32)
    assert first["fact"] == second["fact"] and first["fact"]["tensor_split"] == [4, 5]
    assert "available_gib" not in first["fact"]["nodes"][0] and "table" not in first["fact"]


# ------------------------------------------------------------------------------------------------
# what each worker's RPC cache is seeded with
# ------------------------------------------------------------------------------------------------

def test_seed_include_selects_exactly_the_workers_layers_at_real_scale(tmp_path, m3):
    from ansible.module_utils.minimax_spark_rpccache import model_tensors

    path = sparse_m3.write_sparse_model(tmp_path, "UD-Q4_K_XL")
    plan = mp.minimax_plan(m3["UD-Q4_K_XL"], sparks(3), 65536, 1, 2048, model_name="UD-Q4_K_XL")
    assert plan["fits"], plan["message"]
    _shards, every = model_tensors(str(path), min_size=0)
    seeded = set()
    for row in plan["fact"]["nodes"][1:]:
        include = mp.plan_seed_include(plan["fact"], row["name"])
        _shards, tensors = model_tensors(str(path), include=include, min_size=0)
        blocks = {int(t["name"].split(".")[1]) for t in tensors}
        assert all(t["name"].startswith("blk.") for t in tensors), include
        assert blocks == set(range(row["blocks"][0], row["blocks"][1] + 1))
        assert len(blocks) == row["layers"]
        # every tensor of those blocks, and the bytes the plan counts for the node
        assert len(tensors) == len([t for t in every if t["name"].startswith("blk.")
                                    and int(t["name"].split(".")[1]) in blocks])
        assert abs(sum(t["size"] for t in tensors) / GIB - row["weights_gib"]) < 0.02
        seeded |= {t["name"] for t in tensors}
    head_blocks = plan["fact"]["nodes"][0]["blocks"]
    assert not any(name.startswith("blk.%d." % head_blocks[0]) for name in seeded)  # the head's stay home


def test_seed_include_is_empty_without_a_plan_or_for_the_head():
    plan = mp.minimax_plan(toy(), sparks(2, memory=10, reserve=1), ctx_size=1024, ubatch_size=32)
    assert mp.plan_seed_include(plan["fact"], "spark-1") == []  # the head is no worker
    assert mp.plan_seed_include({}, "spark-2") == []
    assert mp.plan_seed_include(None, "spark-2") == []
    worker = plan["fact"]["nodes"][1]
    assert worker["name"] == "spark-2" and worker["blocks"] == [0, worker["layers"] - 1]
    assert mp.plan_seed_include(plan["fact"], "spark-2") == [
        r"^blk\.(%s)\." % "|".join(str(i) for i in range(worker["layers"]))]


def test_seed_include_adds_the_output_layer_where_a_cpu_head_leaves_it():
    nodes = sparks(3, memory=10, reserve=1)
    nodes[0]["gpu"] = False
    plan = mp.minimax_plan(toy(layers=12), nodes, ctx_size=1024, ubatch_size=32)
    last = plan["fact"]["nodes"][2]
    assert last["output"]
    assert mp.plan_seed_include(plan["fact"], last["name"])[-1] == r"^output\."
    assert r"^output\." not in mp.plan_seed_include(plan["fact"], plan["fact"]["nodes"][1]["name"])


# ------------------------------------------------------------------------------------------------
# head_server_ctx_size: max, the training context
# ------------------------------------------------------------------------------------------------

def windowed(window, **kw):
    """The toy model with a training context of ``window`` tokens."""
    return dict(toy(**kw), context_length=window, architecture="minimax-m3")


def test_max_is_the_largest_context_that_fits_every_node(m3):
    plan = mp.minimax_plan(m3["UD-IQ4_XS"], sparks(2), "max", 1, 2048, model_name="UD-IQ4_XS")
    ctx = plan["ctx_size"]
    assert plan["fits"] and plan["ctx_request"] == "max" and plan["ctx_limit"] == "memory"
    assert ctx % mp.CTX_STEP == 0 and ctx == plan["kv_cells"] == plan["ctx_per_slot"]
    # the figures: at 64k both Sparks keep ~10 GiB; max spends them, one step more does not fit
    at_64k = mp.minimax_plan(m3["UD-IQ4_XS"], sparks(2), 65536, 1, 2048)
    assert [round(r["headroom_gib"], 1) for r in at_64k["nodes"]] == [10.3, 10.9]
    assert ctx > 2 * 65536 and min(r["headroom_gib"] for r in plan["nodes"]) >= 0
    assert not mp.minimax_plan(m3["UD-IQ4_XS"], sparks(2), ctx + mp.CTX_STEP, 1, 2048)["fits"]
    assert plan["ctx_line"] == (
        f"context: {ctx:,} tokens (--ctx-size {ctx}), the most that fits (head_server_ctx_size: max; 256 tokens "
        "more per slot would not); the model's training context 1,048,576")
    assert plan["table"][-2] == plan["ctx_line"] and plan["table"][-1] == plan["message"]
    assert plan["fact"]["ctx_size"] == ctx and plan["fact"]["ctx_request"] == "max"


def test_max_grows_with_the_nodes_and_stays_in_the_window(m3):
    sizes = [mp.minimax_plan(m3["UD-IQ4_XS"], sparks(n), "max", 1, 2048)["ctx_size"] for n in (2, 3, 4)]
    assert sizes[0] < sizes[1] < sizes[2] <= 1048576
    # a node with a bigger reserve holds fewer tokens: the plan honours every node's reserve
    assert mp.minimax_plan(m3["UD-IQ4_XS"], sparks(2, reserve=8.0), "max", 1, 2048)["ctx_size"] < sizes[0]
    # min headroom is kept on top
    kept = mp.minimax_plan(m3["UD-IQ4_XS"], sparks(2), "max", 1, 2048, min_headroom_gib=2.0)
    assert kept["ctx_size"] < sizes[0] and min(r["headroom_gib"] for r in kept["nodes"]) >= 2.0


def test_max_is_capped_by_the_models_window():
    plan = mp.minimax_plan(windowed(8192), sparks(2, memory=100, reserve=1), "max", ubatch_size=32)
    assert plan["fits"] and plan["ctx_size"] == 8192 and plan["ctx_limit"] == "the model's training context"
    assert plan["ctx_line"] == ("context: 8,192 tokens (--ctx-size 8192), head_server_ctx_size: max, capped by the "
                                "model's training context; the model's training context 8,192")
    # a window not a multiple of 256: the slot stays inside it
    assert mp.minimax_plan(windowed(10000), sparks(2, memory=100, reserve=1), "max", ubatch_size=32)["ctx_size"] \
        == 9984


def test_max_is_capped_by_the_users_cap():
    plan = mp.minimax_plan(windowed(65536), sparks(2, memory=100, reserve=1), "max", ubatch_size=32,
                           ctx_size_max=20000)
    assert plan["ctx_size"] == 19968 and plan["ctx_limit"] == "head_server_ctx_size_max"
    assert plan["fact"]["ctx_size_max"] == 20000
    with pytest.raises(mp.PlanError, match="head_server_ctx_size_max=-1 is negative"):
        mp.minimax_plan(windowed(65536), sparks(2), "max", ctx_size_max=-1)


def test_max_per_slot_with_parallel():
    plan = mp.minimax_plan(windowed(8192), sparks(2, memory=100, reserve=1), "max", parallel=4, ubatch_size=32)
    # each slot gets the window (llama-server caps a slot, not the total)
    assert plan["ctx_per_slot"] == 8192 and plan["ctx_size"] == 4 * 8192 == plan["kv_cells"]
    assert plan["ctx_line"].startswith("context: 4 slots of 8,192 tokens each (--ctx-size 32768 in all)")
    # memory-bound: per slot a multiple of 256, the total four of them, and a step more per slot does not fit
    tight = sparks(2, memory=10, reserve=1)
    model = windowed(1 << 20, kv=1 << 16)
    plan = mp.minimax_plan(model, tight, "max", parallel=3, ubatch_size=32)
    assert plan["fits"] and plan["ctx_per_slot"] % 256 == 0 and plan["ctx_size"] == 3 * plan["ctx_per_slot"]
    assert not mp.minimax_plan(model, tight, plan["ctx_size"] + 3 * 256, parallel=3, ubatch_size=32)["fits"]
    one = mp.minimax_plan(model, tight, "max", parallel=1, ubatch_size=32)
    assert abs(one["ctx_size"] - plan["ctx_size"]) <= 3 * 256  # the same memory, shared by the slots


def test_max_when_nothing_fits_is_refused_with_the_plan(m3):
    plan = mp.minimax_plan(m3["UD-Q4_K_XL"], sparks(2), "max", 1, 2048, model_name="UD-Q4_K_XL")
    assert not plan["fits"] and plan["ctx_size"] == 256
    assert plan["message"].endswith("2 nodes offer 230.0 GiB: add a node or choose UD-IQ4_XS")
    assert "but not even 256 tokens per slot fit" in plan["ctx_line"]


def test_a_context_above_the_window_is_refused_naming_both_numbers():
    plan = mp.minimax_plan(windowed(8192), sparks(2, memory=100, reserve=1), 65536, ubatch_size=32, model_name="tiny")
    assert plan["ctx_problem"] == (
        "head_server_ctx_size=65536 is above the training context of tiny (8192 tokens, minimax-m3.context_length): "
        "llama-server would cap each slot at 8192 and serve less than planned. Set head_server_ctx_size to 8192 or "
        "less (max: the most that fits), or lift the model's limit on purpose with head_server_ctx_beyond_training: "
        "true (--override-kv minimax-m3.context_length=int:65536)")
    assert plan["override_kv"] == "" and plan["ctx_per_slot"] == 8192
    # per slot: two slots of 8192 are inside the window, two of 8448 are not
    assert mp.minimax_plan(windowed(8192), sparks(2, memory=100, reserve=1), 16384, parallel=2,
                           ubatch_size=32)["ctx_problem"] == ""
    over = mp.minimax_plan(windowed(8192), sparks(2, memory=100, reserve=1), 16896, parallel=2, ubatch_size=32)
    assert over["ctx_problem"].startswith("head_server_ctx_size=16896 with head_server_parallel=2 gives each slot "
                                          "8448 tokens, which is above the training context")
    # the window itself, and 0 (the model's own), are fine; 0 sizes the KV for the window
    assert mp.minimax_plan(windowed(8192), sparks(2, memory=100, reserve=1), 8192, ubatch_size=32)["ctx_problem"] == ""
    zero = mp.minimax_plan(windowed(8192), sparks(2, memory=100, reserve=1), 0, ubatch_size=32)
    assert zero["ctx_problem"] == "" and zero["kv_cells"] == 8192 and zero["ctx_per_slot"] == 8192


def test_a_context_beyond_the_window_lifted_on_purpose():
    plan = mp.minimax_plan(windowed(8192), sparks(2, memory=100, reserve=1), 65536, ubatch_size=32,
                           ctx_beyond_training="true")
    assert plan["ctx_problem"] == "" and plan["ctx_per_slot"] == 65536
    assert plan["override_kv"] == plan["fact"]["override_kv"] == "minimax-m3.context_length=int:65536"
    assert plan["ctx_line"].endswith("lifted on purpose (head_server_ctx_beyond_training: --override-kv "
                                     "minimax-m3.context_length=int:65536)")
    # max, lifted: memory and the user's cap decide
    lifted = mp.minimax_plan(windowed(8192), sparks(2, memory=100, reserve=1), "max", ubatch_size=32,
                             ctx_beyond_training=True, ctx_size_max=100000)
    assert lifted["ctx_size"] == 99840 and lifted["override_kv"] == "minimax-m3.context_length=int:99840"
    # lifted but inside the window: nothing to override
    assert mp.minimax_plan(windowed(8192), sparks(2, memory=100, reserve=1), 4096, ubatch_size=32,
                           ctx_beyond_training=True)["override_kv"] == ""


@pytest.mark.parametrize("bad", ["maximum", "64k", True, ""])
def test_a_context_neither_a_number_nor_max_is_refused(bad):
    with pytest.raises(mp.PlanError, match="is not a whole number or max"):
        mp.minimax_plan(windowed(8192), sparks(2), bad)
