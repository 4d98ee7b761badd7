"""The bench role's filters (roofline, depths, winner) and head_server's speculative decoding argv."""
import pytest
from ansible.errors import AnsibleFilterError
from test_filters import seed_cfg

import minimax_bench as mb
import minimax_spark as ms
from helpers import ROOT


def test_roofline_is_bandwidth_over_active_bytes():
    # H200 (4800 GB/s) and the M3-shaped proxy's ~0.982 GB per token: the 4886 tok/s in docs/benchmarks.md.
    assert mb.decode_roofline(982_400_000, 4800) == pytest.approx(4886.0, abs=1)
    # Strings from facts and inventories work the same.
    assert mb.decode_roofline("1000000000", "273") == 273.0


@pytest.mark.parametrize("active, bandwidth", [(0, 273), (1e9, 0), (-1, 273)])
def test_roofline_refuses_what_is_not_positive(active, bandwidth):
    with pytest.raises(AnsibleFilterError, match="positive"):
        mb.decode_roofline(active, bandwidth)


def test_roofline_refuses_text():
    with pytest.raises(AnsibleFilterError, match="numbers"):
        mb.decode_roofline("lots", 273)


def test_fraction():
    assert mb.roofline_fraction(434, 4886) == 0.089
    assert mb.roofline_fraction(10.7, 0) is None
    assert mb.roofline_fraction(None, 100) is None


def test_depths_are_capped_by_the_served_context_with_a_message():
    result = mb.bench_depths([0, 4096, 16384, 65536], 4096, 256, 32)
    assert result["keep"] == [0]
    assert result["dropped"] == [4096, 16384, 65536]
    assert result["message"] == (
        "depths [4096, 16384, 65536] do not fit the served context (n_ctx 4096, each run needs depth + 256 prompt "
        "+ 32 generated tokens): measured [0] only; raise head_server_ctx_size to measure them")


def test_all_depths_fit_a_large_context():
    result = mb.bench_depths(["65536", 0, 4096], 131072, 2048, 128)
    assert result == {"keep": [0, 4096, 65536], "dropped": [], "message": ""}


def setups():
    return [
        {"name": "ubatch 512", "rows": [{"depth": 0, "pp": 4645, "tg": 451}, {"depth": 4096, "pp": 5813, "tg": 386}]},
        {"name": "ubatch 2048", "rows": [{"depth": 0, "pp": 3645, "tg": 434}, {"depth": 4096, "pp": 4316, "tg": 411}]},
        {"name": "failed", "rows": []},
    ]


def test_winner_by_decode_and_by_prefill():
    # decode: 512 leads at depth 0, 2048 at 4096 - a tie; prefill decides for 512 (ahead at both depths by > 5 %)
    decode = mb.bench_winner(setups(), "decode", 5)
    assert decode["name"] == "ubatch 512" and decode["decided_by"] == "prefill"
    prefill = mb.bench_winner(setups(), "prefill", 5)
    assert prefill["name"] == "ubatch 512" and prefill["decided_by"] == "prefill"
    assert prefill["rule"] == ("ubatch 512 leads every other setting on prefill at every depth by more than the spread "
                               "of the repeated runs and the 5% margin")
    assert mb.bench_winner([], "decode") == {}


def role_default(name):
    import yaml

    return yaml.safe_load((ROOT / "roles" / "bench" / "defaults" / "main.yml").read_text())[name]


def h200_sweep():
    """The issue's H200 sweep (tiny model, tools/gpu-check with bench.yml): decode is noise, prefill is not."""
    def setup(ub, tg0, tg4k, pp4k):
        return {"name": "ubatch %d" % ub, "apply": {"head_server_ubatch_size": ub},
                "rows": [{"depth": 0, "pp": None, "tg": tg0}, {"depth": 4096, "pp": pp4k, "tg": tg4k}]}
    return [setup(512, 1017, 895, 30434), setup(1024, 1055, 934, 27882), setup(2048, 951, 939, 18044)]


def test_h200_sweep_picks_ubatch_512_by_prefill_with_decode_tied():
    winner = mb.bench_winner(h200_sweep(), "decode", role_default("bench_winner_margin"))
    assert winner["name"] == "ubatch 512" and winner["apply"] == {"head_server_ubatch_size": 512}
    assert winner["decided_by"] == "prefill"
    assert winner["rule"] == (
        "decode tied within the spread of the repeated runs and the 5% margin (ubatch 1024, ubatch 512, ubatch 2048); "
        "prefill decides: ubatch 512 leads them at every depth by more than the spread of the repeated runs and the 5% "
        "margin")


def test_a_lead_inside_the_spread_of_repeated_runs_is_a_tie():
    """No margin: the std of the repeated runs alone decides what a lead is."""
    def setup(name, tg, tg_std, pp):
        return {"name": name, "rows": [{"depth": 0, "tg": tg, "tg_std": tg_std, "pp": pp, "pp_std": 10.0}]}
    noisy = [setup("a", 100.0, 4.0, 1000.0), setup("b", 95.0, 4.0, 1200.0)]
    tie = mb.bench_winner(noisy, "decode", 0)
    assert tie["name"] == "b" and tie["decided_by"] == "prefill"
    assert tie["rule"].startswith("decode tied within the spread of the repeated runs (a, b); prefill decides: b")
    steady = [setup("a", 100.0, 1.0, 1000.0), setup("b", 95.0, 1.0, 1200.0)]
    assert mb.bench_winner(steady, "decode", 0)["name"] == "a"
    # a user margin above the lead makes it a tie again
    assert mb.bench_winner(steady, "decode", 10)["name"] == "b"


def test_nothing_wins_when_both_metrics_tie():
    flat = [{"name": n, "apply": {}, "rows": [{"depth": 0, "tg": 100.0 + i, "pp": 1000.0 - i}]}
            for i, n in enumerate(["a", "b"])]
    result = mb.bench_winner(flat, "decode", 5)
    assert "apply" not in result and "name" not in result and result["decided_by"] == ""
    assert result["rule"] == ("decode tied within the spread of the repeated runs and the 5% margin (b, a); "
                              "prefill tied too (a, b): no setting wins, nothing is applied")


@pytest.mark.parametrize("margin", [-1, "much"])
def test_winner_margin_is_checked(margin):
    with pytest.raises(AnsibleFilterError, match="bench_winner_margin"):
        mb.bench_winner(setups(), "decode", margin)


def test_winner_metric_is_checked():
    with pytest.raises(AnsibleFilterError, match="decode or prefill"):
        mb.bench_winner(setups(), "latency")


# --- speculative decoding in llama-server's argv ---------------------------------------------------
def test_speculative_decoding_is_off_by_default():
    argv = ms.llama_server_argv(seed_cfg())
    assert not [a for a in argv if a.startswith("--spec")]
    argv = ms.llama_server_argv(seed_cfg(spec_type="none", draft_model="/m/draft.gguf", spec_draft_n_max=16))
    assert not [a for a in argv if a.startswith("--spec")]


def test_ngram_needs_no_draft_model():
    argv = ms.llama_server_argv(seed_cfg(spec_type="ngram-mod", spec_draft_n_max=""))
    assert argv[argv.index("--spec-type") + 1] == "ngram-mod"
    assert "--spec-draft-model" not in argv and "--spec-draft-n-max" not in argv


def test_draft_type_passes_the_draft_model_and_n_max_before_extra_args():
    argv = ms.llama_server_argv(seed_cfg(spec_type="draft-eagle3", draft_model="/m/eagle3.gguf",
                                         spec_draft_n_max=8, extra_args=["--seed", "1"]))
    tail = argv[argv.index("--spec-type"):]
    assert tail == ["--spec-type", "draft-eagle3", "--spec-draft-model", "/m/eagle3.gguf",
                    "--spec-draft-n-max", "8", "--seed", "1"]


def test_draft_type_without_a_draft_model_fails_naming_the_variable():
    with pytest.raises(AnsibleFilterError, match="head_server_spec_type=draft-dflash needs a draft model: "
                                                 "set head_server_draft_model"):
        ms.llama_server_argv(seed_cfg(spec_type="draft-dflash"))


def test_a_build_without_spec_type_fails_with_a_message():
    with pytest.raises(AnsibleFilterError, match="this llama.cpp build's llama-server has no --spec-type"):
        ms.llama_server_argv(seed_cfg(spec_type="ngram-simple", server_options=["--model", "--no-mmap"]))
    argv = ms.llama_server_argv(seed_cfg(spec_type="ngram-simple", server_options=["--spec-type", "--no-mmap"]))
    assert "--spec-type" in argv
