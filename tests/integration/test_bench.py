"""playbooks/bench.yml against the deployed demo, offline (inside a network namespace without internet):
llama-benchy at the depths that fit, the JSON, the summary and the PNG, a two-setting sweep on a temporary
llama-server, the deployed one back afterwards, the winner written where the inventory reads it."""
import json
import time
from pathlib import Path

import pytest
import requests
import yaml

from helpers import ROOT, changed_tasks, failed_tasks, run_playbook

MODEL = ROOT / ".cache" / "demo" / "MiniMax-M3-tiny.gguf"
SERVICES = Path("/opt/minimax-spark/services")


@pytest.fixture(scope="module")
def deployed(demo_model, llamacpp_archive):
    """The demo as tools/demo deploys it (the build comes from the cache)."""
    started = time.time()
    runner = run_playbook("site.yml", tags=["common", "build_llamacpp", "model_download", "hybrid_template",
                                            "worker_rpc", "head_server"])
    assert runner.status == "successful", failed_tasks(runner) or runner.stdout_text[-5000:]
    print("deploy took %.0f s" % (time.time() - started))


def deployed_argv():
    for name in ("minimax-llama-server.json",):
        path = SERVICES / name
        if path.exists():
            return json.loads(path.read_text())["argv"]
    return None


def test_bench_measures_sweeps_and_puts_the_deployed_head_back(deployed, tmp_path):
    before = deployed_argv()
    started = time.time()
    out = tmp_path / "results"
    winner = tmp_path / "group_vars" / "head" / "bench.yml"
    runner = run_playbook("playbooks/bench.yml", extravars={
        "bench_output_dir": str(out), "bench_workdir": str(tmp_path / "work"),
        # The demo serves 65536 tokens: 65536 cannot fit with a prompt, and is left out with a message.
        "bench_depths": [0, 1024, 65536], "bench_prompt_tokens": 1536, "bench_generate_tokens": 32, "bench_runs": 2,
        "bench_memory_bandwidth_gbs": 20,
        # The tiny model's byte-sized tokens make M3's template ~500 tokens: llama-benchy takes them out of the
        # prompt, so the prompt must be well above that. Its prefill takes about as long as the API's round trip:
        # keep the round trip in. Two runs of 32 tokens: a client starved on 2 busy cores reads a short reply in one
        # piece (no decode time) and llama-benchy leaves that run out; every row still needs a decode figure.
        "bench_latency_mode": "none",
        "bench_sweep": True, "bench_sweep_ubatch": [256], "bench_apply_winner": True,
        "bench_winner_file": str(winner),
        # The tiny model loads in a second: poll /health every second, watch the start for 2 s.
        "head_server_health_interval": 1, "head_server_settle": 2})
    assert runner.status == "successful", failed_tasks(runner) or runner.stdout_text[-5000:]
    print("bench.yml took %.0f s" % (time.time() - started))
    assert ("depths [65536] do not fit the served context (n_ctx 65536, each run needs depth + 1536 prompt + 32 "
            "generated tokens): measured [0, 1024] only") in runner.stdout_text

    # The report: one JSON per run (llama-benchy's own), results.json, summary.md, bench.png.
    names = sorted(p.name for p in out.iterdir())
    assert names == ["bench.png", "deployed.json", "results.json", "summary.md", "ubatch-256.json"]
    data = json.loads((out / "results.json").read_text())
    assert [s["name"] for s in data["setups"]] == ["deployed", "ubatch 256"]
    for setup in data["setups"]:
        assert [r["depth"] for r in setup["rows"]] == [0, 1024]
        for row in setup["rows"]:
            assert 20 < row["pp"] < 1e6 and 0.5 < row["tg"] < 1e5, row
            assert row["roofline_fraction"] == round(row["tg"] / data["decode_roofline"], 3)
    assert data["active_bytes_per_token"] and int(data["active_bytes_per_token"]) > 1e6  # the tiny M3: ~2.4 MB
    assert 0 < data["decode_roofline"] < 20e9 / 1e6
    summary = (out / "summary.md").read_text()
    print(summary)
    assert "| deployed | 0 |" in summary and "| ubatch 256 | 1024 |" in summary and "%" in summary
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # The winner went to the file the inventory reads; the deployed llama-server is back, unchanged.
    applied = yaml.safe_load(winner.read_text())
    assert applied == {"head_server_ubatch_size": 256, "head_server_batch_size": 2048, "head_server_spec_type": "none"}
    assert data["winner"] == "ubatch 256"
    assert deployed_argv() == before
    assert requests.get("http://127.0.0.1:8891/health", timeout=10).status_code == 200
    temp_file = SERVICES / "minimax-llama-bench.json"
    temp = json.loads(temp_file.read_text()) if temp_file.exists() else None
    assert temp is None or "18891" in temp["argv"]
    with pytest.raises(requests.ConnectionError):
        requests.get("http://127.0.0.1:18891/health", timeout=5)


def test_check_mode_sends_and_writes_nothing(deployed, tmp_path):
    out = tmp_path / "results"
    runner = run_playbook("playbooks/bench.yml", check=True,
                          extravars={"bench_output_dir": str(out), "bench_sweep": True})
    assert runner.status == "successful", failed_tasks(runner)
    assert changed_tasks(runner) == []
    assert ("Check mode: bench would measure the head at depths [0, 4096, 16384, 65536] and sweep ubatch "
            "[512, 1024, 2048]") in runner.stdout_text
    assert not out.exists()


def test_no_depth_that_fits_fails_with_the_message_and_writes_no_report(deployed, tmp_path):
    out = tmp_path / "results"
    runner = run_playbook("playbooks/bench.yml", extravars={
        "bench_output_dir": str(out), "bench_workdir": str(tmp_path / "work"), "bench_depths": [65536]})
    assert runner.status == "failed"
    assert failed_tasks(runner)[0][2] == (
        "depths [65536] do not fit the served context (n_ctx 65536, each run needs depth + 2048 prompt + 128 "
        "generated tokens): measured [] only; raise head_server_ctx_size to measure them")
    assert not (out / "results.json").exists()


def test_a_failed_sweep_puts_the_deployed_head_back(deployed, tmp_path):
    """The sweep's setting cannot be measured (no such port): the play fails, the deployed llama-server runs again."""
    before = deployed_argv()
    winner = tmp_path / "bench.yml"
    runner = run_playbook("playbooks/bench.yml", extravars={
        "bench_output_dir": str(tmp_path / "results"), "bench_workdir": str(tmp_path / "work"),
        # The deployed head is measured first: 2 runs of 32 tokens, so that a client starved on 2 busy cores, which
        # reads a short reply in one piece (no decode time), still leaves one run measured.
        "bench_depths": [0], "bench_prompt_tokens": 1536, "bench_generate_tokens": 32, "bench_runs": 2,
        "bench_latency_mode": "none", "bench_sweep": True, "bench_sweep_ubatch": [256], "bench_sweep_port": 99999,
        "bench_apply_winner": True, "bench_winner_file": str(winner),
        "head_server_health_interval": 1, "head_server_settle": 2})
    assert runner.status == "failed"
    assert "99999" in str(failed_tasks(runner)[0]), failed_tasks(runner)
    assert deployed_argv() == before
    assert requests.get("http://127.0.0.1:8891/health", timeout=10).status_code == 200
    assert not winner.exists()


def test_sweep_measures_an_ngram_type_on_and_off_with_its_acceptance(deployed, tmp_path):
    """An n-gram type (no draft model) on and off: llama-benchy's figures with their spread, the drafts made and
    accepted and the decode of each (llama-server's timings), and the rule that picked the winner."""
    before = deployed_argv()
    out = tmp_path / "results"
    runner = run_playbook("playbooks/bench.yml", extravars={
        "bench_output_dir": str(out), "bench_workdir": str(tmp_path / "work"),
        "bench_depths": [0], "bench_prompt_tokens": 1536, "bench_generate_tokens": 64, "bench_runs": 3,
        "bench_latency_mode": "none", "bench_sweep": True, "bench_sweep_ubatch": [256],
        "bench_sweep_spec_type": "ngram-mod", "head_server_health_interval": 1, "head_server_settle": 2})
    assert runner.status == "successful", failed_tasks(runner) or runner.stdout_text[-5000:]
    data = json.loads((out / "results.json").read_text())
    assert [s["name"] for s in data["setups"]] == ["deployed", "ubatch 256, spec ngram-mod", "ubatch 256"]
    on, off = data["setups"][1], data["setups"][2]
    assert on["settings"]["head_server_spec_type"] == "ngram-mod" and off["settings"]["head_server_spec_type"] == "none"
    assert on["spec"]["type"] == "ngram-mod" and on["spec"]["drafted"] > 0, on["spec"]
    assert 0 <= on["spec"]["accepted"] <= on["spec"]["drafted"] and on["spec"]["decode"] > 0
    assert off["spec"]["type"] == "none" and off["spec"]["drafted"] == 0 and off["spec"]["decode"] > 0
    # Three runs a depth: each figure has its spread. llama-benchy leaves out a run whose reply it read in one piece
    # (no decode time to divide by: a client starved for a moment on 2 busy cores), so at least two count.
    for setup in data["setups"]:
        assert 2 <= setup["rows"][0]["runs"] <= 3 and setup["rows"][0]["tg_std"] is not None, setup["rows"][0]
    summary = (out / "summary.md").read_text()
    print(summary)
    assert ("ubatch 256, spec ngram-mod: speculative decoding accepted %d of %d drafted tokens"
            % (on["spec"]["accepted"], on["spec"]["drafted"])) in summary
    assert "ubatch 256: speculative decoding off, decode " in summary
    assert "\nRule: " in summary and data["winner_rule"]
    assert deployed_argv() == before
    assert requests.get("http://127.0.0.1:8891/health", timeout=10).status_code == 200
