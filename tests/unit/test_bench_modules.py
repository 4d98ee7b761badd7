"""The bench engine: bytes per token from a GGUF, the offline tokenizer, llama-benchy's report, the
report writer (JSON, summary, PNG), and the bench_model / bench_run / bench_report modules."""
import json
import os
import sys

import gguf
import numpy as np
import pytest
from ansible.module_utils.minimax_spark_bench import (
    CORPUS_URL,
    benchy_argv,
    build_tokenizer,
    gguf_vocab,
    model_stats,
    parse_benchy,
    run_benchy,
)
from ansible.module_utils.minimax_spark_bench_report import summary_markdown, write_report
from ansible.module_utils.minimax_spark_gguf import GGUFError

import bench_model
import bench_report
import bench_run
from helpers import run_module

ARCH = "minimax-m3"


def byte_level():
    """GPT-2's byte -> printable character map (what byte-level BPE vocabularies store)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def write_model(path, split_max_tensors=0, tokenizer="gpt2"):
    """4 float32 tensors: a 10x4 embedding (16 B a row), a 4x4 dense weight (64 B), 8 experts of 4x4 (512 B)."""
    writer = gguf.GGUFWriter(str(path), ARCH, split_max_tensors=split_max_tensors)
    writer.add_uint32(ARCH + ".block_count", 1)
    writer.add_uint32(ARCH + ".context_length", 8192)
    writer.add_uint32(ARCH + ".embedding_length", 4)
    writer.add_uint32(ARCH + ".expert_count", 8)
    writer.add_uint32(ARCH + ".expert_used_count", 2)
    tokens = byte_level() + ["Ġt", "he", "Ġthe", "<think>"]
    writer.add_string("tokenizer.ggml.model", tokenizer)
    writer.add_string("tokenizer.ggml.pre", "minimax-m2")
    writer.add_array("tokenizer.ggml.tokens", tokens)
    writer.add_array("tokenizer.ggml.token_type", [1] * (len(tokens) - 1) + [4])
    writer.add_array("tokenizer.ggml.merges", ["Ġ t", "h e", "Ġt he"])
    writer.add_tensor("token_embd.weight", np.zeros((10, 4), dtype=np.float32))
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((4, 4), dtype=np.float32))
    writer.add_tensor("blk.0.ffn_up_exps.weight", np.zeros((8, 4, 4), dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.zeros((4,), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def test_active_bytes_count_the_used_share_of_experts_and_one_embedding_row(tmp_path):
    stats = model_stats(write_model(tmp_path / "m.gguf"))
    assert stats["expert_bytes"] == 512 and stats["dense_bytes"] == 64 + 16 and stats["embedding_row_bytes"] == 16
    # 80 dense + 16 (one embedding row) + 512 * 2/8
    assert stats["active_bytes_per_token"] == 80 + 16 + 128
    assert stats["total_bytes"] == 160 + 64 + 512 + 16
    assert (stats["expert_count"], stats["expert_used_count"], stats["context_length"]) == (8, 2, 8192)


def test_active_bytes_sum_every_shard_of_a_split_model(tmp_path):
    write_model(tmp_path / "m.gguf", split_max_tensors=1)
    first = sorted(p for p in os.listdir(tmp_path) if p.endswith(".gguf"))[0]
    stats = model_stats(str(tmp_path / first))
    assert stats["shards"] == 4
    assert stats["active_bytes_per_token"] == 224


def test_tokenizer_from_the_gguf_encodes_and_decodes_offline(tmp_path):
    vocab = gguf_vocab(write_model(tmp_path / "m.gguf"))
    dest = build_tokenizer(json.loads(json.dumps(vocab)), str(tmp_path / "tokenizer.json"))
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(dest)
    ids = tok.encode(" the cat, café").ids
    assert ids[0] == vocab["tokens"].index("Ġthe")  # the merges apply
    assert tok.decode(ids) == " the cat, café"       # byte-level round trip, UTF-8 included
    assert tok.encode("<think>").ids == [vocab["tokens"].index("<think>")]  # user-defined tokens stay whole
    # llama-benchy's own loader takes the file as it is.
    from llama_benchy.corpus import LightweightTokenizer

    assert LightweightTokenizer.from_pretrained(dest).encode(" the") == [vocab["tokens"].index("Ġthe")]


def test_tokenizer_of_another_kind_says_what_to_set(tmp_path):
    with pytest.raises(GGUFError, match="set bench_tokenizer to an HF tokenizer folder"):
        gguf_vocab(write_model(tmp_path / "m.gguf", tokenizer="llama"))


def benchy_report():
    def metric(mean):
        return {"mean": mean, "std": 1.0, "values": [mean - 1.0, mean + 1.0]}

    return {"version": "0.4.0", "benchmarks": [
        {"context_size": 4096, "prompt_size": 2048, "response_size": 128, "is_context_prefill_phase": False,
         "pp_throughput": metric(4316.0), "tg_throughput": metric(411.0), "ttfr": metric(500.0)},
        {"context_size": 4096, "prompt_size": 2048, "response_size": 128, "is_context_prefill_phase": True,
         "pp_throughput": metric(1.0)},
        {"context_size": 0, "prompt_size": 2048, "response_size": 128, "is_context_prefill_phase": False,
         "pp_throughput": metric(3645.0), "tg_throughput": metric(434.0), "ttfr": None},
    ]}


def test_parse_benchy_keeps_the_measured_phase_by_depth():
    rows = parse_benchy(benchy_report())
    assert [(r["depth"], r["pp"], r["tg"]) for r in rows] == [(0, 3645.0, 434.0), (4096, 4316.0, 411.0)]
    # llama-benchy's spread over the repeated runs travels with each figure (the sweep's winner rule reads it)
    assert [(r["pp_std"], r["tg_std"], r["runs"]) for r in rows] == [(1.0, 1.0, 2), (1.0, 1.0, 2)]
    assert rows[0]["ttfr_ms"] is None and rows[1]["ttfr_ms"] == 500.0


def test_benchy_argv_is_offline_and_carries_no_key():
    argv = benchy_argv("http://h:8891/v1", "minimax-m3", "/t/tokenizer.json", [0, 4096], 2048, 128, 3, "/o/x.json")
    assert argv[argv.index("--book-url") + 1] == CORPUS_URL
    assert argv[argv.index("--tokenizer") + 1] == "/t/tokenizer.json"
    assert argv[argv.index("--depth") + 1:argv.index("--depth") + 3] == ["0", "4096"]
    assert "--api-key" not in argv and "--no-cache" in argv and "--exact-tg" in argv


def test_run_benchy_hands_the_arguments_on_stdin_and_writes_the_corpus(tmp_path):
    """The child's command line holds no argument; HOME is the work folder holding the corpus llama-benchy reads."""
    fake = tmp_path / "py"
    fake.write_text("#!/bin/sh\nprintf '%s|' \"$@\"; echo; echo HOME=$HOME; cat\n")
    fake.chmod(0o755)
    rc, out = run_benchy(str(fake), str(tmp_path), ["--base-url", "u"], api_key="s3cret")
    first = out.splitlines()[0]
    assert rc == 0 and "s3cret" not in first and first.startswith("-c|")
    assert "HOME=%s" % tmp_path in out and '"--api-key", "s3cret"' in out
    book = [p for p in (tmp_path / ".cache" / "llama-benchy").iterdir()]
    assert len(book) == 1 and len(book[0].read_text().split()) > 100000


def test_report_writes_json_summary_and_png(tmp_path):
    setups = [{"name": "deployed", "settings": {"ubatch_size": 2048}, "rows": parse_benchy(benchy_report())},
              {"name": "ubatch 512", "settings": {}, "rows": [{"depth": 0, "pp": 4645.0, "tg": 451.0}]}]
    paths = write_report(str(tmp_path / "out"), setups, roofline=4886.0, meta={"endpoint": "http://h:8891/v1"})
    data = json.loads(open(paths["json"]).read())
    assert data["decode_roofline"] == 4886.0
    assert data["setups"][0]["rows"][0]["roofline_fraction"] == 0.089
    summary = open(paths["summary"]).read()
    assert "| deployed | 0 | 3645.0 ± 1.0 | 434.0 ± 1.0 | 8.9% |" in summary
    assert "| ubatch 512 | 0 | 4645.0 | 451.0 | 9.2% |" in summary
    assert "decode roofline: 4886.0 tok/s" in summary
    png = open(paths["plot"], "rb").read()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10000
    assert sorted(os.listdir(tmp_path / "out")) == ["bench.png", "results.json", "summary.md"]


def test_summary_without_roofline_or_figures_shows_dashes():
    text = summary_markdown([{"name": "x", "rows": [{"depth": 0, "pp": None, "tg": None}]}])
    assert "| x | 0 | - | - | - |" in text


def test_bench_model_module_writes_the_vocabulary_once(tmp_path):
    model = write_model(tmp_path / "m.gguf")
    dest = str(tmp_path / "vocab.json")
    result = run_module(bench_model.main, {"path": model, "vocab_dest": dest})
    assert result["changed"] and result["active_bytes_per_token"] == 224
    assert json.loads(open(dest).read())["merges"] == ["Ġ t", "h e", "Ġt he"]
    assert run_module(bench_model.main, {"path": model, "vocab_dest": dest})["changed"] is False


def test_bench_model_module_check_mode_writes_nothing(tmp_path):
    dest = tmp_path / "vocab.json"
    result = run_module(bench_model.main, {"path": write_model(tmp_path / "m.gguf"), "vocab_dest": str(dest)},
                        check_mode=True)
    assert result["changed"] and not dest.exists()


def test_bench_model_module_fails_on_a_missing_model(tmp_path):
    result = run_module(bench_model.main, {"path": str(tmp_path / "none.gguf")})
    assert result["failed"] and "none.gguf" in result["msg"]


def test_bench_run_fails_with_llama_benchys_output_when_the_endpoint_is_down(tmp_path):
    vocab = tmp_path / "vocab.json"
    vocab.write_text(json.dumps(gguf_vocab(write_model(tmp_path / "m.gguf"))))
    result = run_module(bench_run.main, {
        "url": "http://127.0.0.1:9/v1", "model": "m", "name": "deployed", "dest": str(tmp_path / "out"),
        "workdir": str(tmp_path / "work"), "vocab": str(vocab), "depths": [0], "prompt_tokens": 64,
        "generate_tokens": 8, "runs": 1, "api_key": "s3cret", "python": sys.executable, "timeout": 120})
    assert result["failed"]
    assert result["msg"].startswith("llama-benchy failed against http://127.0.0.1:9/v1 (rc ")
    assert "s3cret" not in json.dumps(result)
    assert (tmp_path / "work" / "tokenizer.json").is_file()


def test_bench_run_says_what_to_raise_when_every_reply_came_in_one_piece(tmp_path):
    """llama-benchy wrote its report, with the prompt's speed but no decode speed (each reply read in one piece, as a
    client starved on busy cores reads a short one): the failure names the cause and the settings to raise."""
    vocab = tmp_path / "vocab.json"
    vocab.write_text(json.dumps(gguf_vocab(write_model(tmp_path / "m.gguf"))))
    fake = tmp_path / "benchy"
    fake.write_text("#!%s\nimport json, sys\nargv = json.load(sys.stdin)\n"
                    "row = {'context_size': 0, 'prompt_size': 64, 'response_size': 8,"
                    " 'is_context_prefill_phase': False,"
                    " 'pp_throughput': {'mean': 900.0, 'std': 0.0, 'values': [900.0]}, 'tg_throughput': None}\n"
                    "open(argv[argv.index('--save-result') + 1], 'w').write(json.dumps({'benchmarks': [row]}))\n"
                    "print('llama-benchy (0.4.0)')\n" % sys.executable)
    fake.chmod(0o755)
    result = run_module(bench_run.main, {
        "url": "http://127.0.0.1:9/v1", "model": "m", "name": "deployed", "dest": str(tmp_path / "out"),
        "workdir": str(tmp_path / "work"), "vocab": str(vocab), "depths": [0], "prompt_tokens": 64,
        "generate_tokens": 8, "runs": 1, "python": str(fake), "timeout": 120})
    assert result["failed"]
    assert result["msg"] == (
        "llama-benchy measured no decode speed against http://127.0.0.1:9/v1 at depths [0]: each of its 1 runs read "
        "the 8 generated tokens in one piece, leaving no time to divide by; raise bench_generate_tokens or bench_runs;"
        " its output ends:\nllama-benchy (0.4.0)\n")
    assert result["report"] == str(tmp_path / "out" / "deployed.json")


def test_bench_report_module_check_mode_writes_nothing(tmp_path):
    result = run_module(bench_report.main, {"dest": str(tmp_path / "out"), "roofline": 100.0,
                                            "setups": [{"name": "x", "rows": [{"depth": 0, "pp": 1.0, "tg": 2.0}]}]},
                        check_mode=True)
    assert "| x | 0 | 1.0 | 2.0 | 2.0% |" in result["summary_text"]
    assert not (tmp_path / "out").exists()


def test_summary_reports_the_draft_acceptance():
    text = summary_markdown([{"name": "ubatch 512, spec ngram-mod", "rows": [{"depth": 0, "pp": 1.0, "tg": 2.0}],
                              "spec": {"drafted": 40, "accepted": 30, "decode": 12.5}},
                             {"name": "ubatch 512", "rows": [], "spec": {}},
                             {"name": "ubatch 256, spec ngram-mod", "rows": [],
                              "spec": {"type": "ngram-mod", "drafted": 0, "accepted": 0, "decode": 9.0}},
                             {"name": "ubatch 256", "rows": [], "spec": {"type": "none", "decode": 8.0}}])
    assert ("ubatch 512, spec ngram-mod: speculative decoding accepted 30 of 40 drafted tokens (75%), decode 12.5 "
            "tok/s (llama-server's timings)") in text
    assert "ubatch 256, spec ngram-mod: speculative decoding drafted nothing, decode 9.0 tok/s" in text
    assert "ubatch 256: speculative decoding off, decode 8.0 tok/s" in text
    assert text.count("speculative decoding") == 3


def test_decode_plot_keeps_the_measured_lines_readable_under_a_far_roofline():
    """A roofline 1000x above the measured decode: the decode axis spans the measured points, the roofline is
    the right-hand scale (percent) and the title, not a line that squashes the points onto the axis."""
    from ansible.module_utils.minimax_spark_bench_report import figure

    setups = [{"name": "ubatch 512", "rows": [{"depth": 0, "pp": 900.0, "tg": 30.0, "tg_std": 1.5},
                                              {"depth": 4096, "pp": 800.0, "tg": 24.0, "tg_std": 1.0}]},
              {"name": "ubatch 2048", "rows": [{"depth": 0, "pp": 1100.0, "tg": 29.0},
                                               {"depth": 4096, "pp": 950.0, "tg": 25.0}]}]
    fig = figure(setups, roofline=30000.0)
    ax_tg = fig.axes[1]
    low, high = ax_tg.get_ylim()
    assert low <= 24.0 and 30.0 + 1.5 <= high <= 2 * 31.5, (low, high)  # the data fill the axis
    assert ax_tg.get_title() == "decode (roofline 30000 tok/s)"
    right = [c for c in ax_tg.get_children() if type(c).__name__ == "SecondaryAxis"]
    assert len(right) == 1 and right[0].get_ylabel() == "% of the roofline"
    # a near roofline stays a line on the same axis
    near = figure(setups, roofline=40.0).axes[1]
    assert near.get_ylim()[1] >= 40.0
    assert any(line.get_label() == "roofline 40 tok/s" for line in near.get_lines())
