"""tests/gpu/load_phases.py (tools/gpu-check load): which layers the worker gets (what is seeded), the head's
hash counts read from the patched client's log line, and the summary's medians and ratios."""
import sys

from helpers import ROOT

sys.path.insert(0, str(ROOT / "tests" / "gpu"))
import load_phases  # noqa: E402

_, minimax_plan, _ = load_phases._import_project()


def test_the_worker_of_a_5_4_split_holds_the_first_five_layers_and_not_the_output():
    ngl, ts, mine, output = load_phases.worker_layers(minimax_plan, 8, True, [5.0, 4.0])
    assert (ngl, ts, mine, output) == (999, ["5", "4"], [0, 1, 2, 3, 4], False)


def test_a_cpu_head_gives_the_worker_the_last_layers_and_the_output():
    ngl, ts, mine, output = load_phases.worker_layers(minimax_plan, 4, False, [5.0, 4.0])
    assert (ngl, ts, mine, output) == (3, None, [2, 3], True)


def test_the_patched_clients_counts_are_read_from_its_log(tmp_path):
    log = tmp_path / "head.log"
    log.write_text(
        "ggml_rpc: hash file /m/p.gguf.rpc-hashes: 57 tensors\n"
        "ggml_rpc: load progress: weights=10 bytes=5 hashed_bytes=0 sent_bytes=0\n"
        "ggml_rpc: weight hashes: file_tensors=21 file_bytes=9130000000 hashed_tensors=0 hashed_bytes=0 "
        "sent_tensors=0 sent_bytes=0 weights=44 bytes=9140000000\n")
    got = load_phases.hash_counts(log)
    assert got["file_tensors"] == 21 and got["hashed_tensors"] == 0 and got["hashed_bytes"] == 0
    assert got["sent_tensors"] == 0 and got["hash_file"] == "/m/p.gguf.rpc-hashes: 57 tensors"
    log.write_text("load_tensors: offloaded 9/9 layers to GPU\n")
    assert load_phases.hash_counts(log) == {}


def test_the_mapping_line_of_rpc_load_mapped_is_kept_in_the_record_and_the_table(tmp_path):
    # the H200 head's own line (2026-12-03), and the line it logs when the GGUF cannot be mapped
    log = tmp_path / "head.log"
    log.write_text(
        "ggml_rpc: weight hashes: file_tensors=31 file_bytes=9080000000 hashed_tensors=0 hashed_bytes=0 "
        "sent_tensors=0 sent_bytes=0 weights=73 bytes=9126109184\n"
        "load_tensors: rpc-load-mapped: 73 RPC weights (9126109184 bytes) set from a mapping of the file\n")
    got = load_phases.hash_counts(log)
    assert (got["mapped_tensors"], got["mapped_bytes"]) == (73, 9126109184) and "map_error" not in got
    recs = [dict(got, build="patched", mode="seeded", load_s=s) for s in (4.8, 4.9, 5.1)]
    summary = load_phases.summarise(recs, {})
    row = summary["table"][0]
    assert (row["mapped_tensors"], row["mapped_bytes"]) == ([73], [9126109184])
    assert "rpc-load-mapped: 73 weights (9126109184 bytes) from a mapping of the file" in (
        load_phases.summary_text(summary))

    log.write_text("ggml_rpc: weight hashes: file_tensors=31 hashed_tensors=0 hashed_bytes=0 sent_tensors=0\n"
                   "load_tensors: rpc-load-mapped: cannot map model file 0, reading its RPC weights: "
                   "Cannot allocate memory\n")
    got = load_phases.hash_counts(log)
    assert "mapped_tensors" not in got
    assert got["map_error"] == "cannot map model file 0, reading its RPC weights: Cannot allocate memory"
    text = load_phases.summary_text(load_phases.summarise([dict(got, build="patched", mode="seeded", load_s=9.0)], {}))
    assert "no rpc-load-mapped line (the worker's share read into buffers)" in text
    assert "rpc-load-mapped failed: cannot map model file 0, reading its RPC weights: Cannot allocate memory" in text


def test_the_summary_gives_median_spread_and_the_ratio_to_one_process():
    recs = [{"build": "patched", "mode": "single", "load_s": s} for s in (3.0, 4.0, 3.5)]
    recs += [{"build": "patched", "mode": "seeded", "load_s": s, "file_tensors": 21, "hashed_tensors": 0}
             for s in (6.0, 7.0, 8.0)]
    recs += [{"build": "patched", "mode": "cold", "error": "llama-server exited (1)"}]
    summary = load_phases.summarise(recs, {"model": "p.gguf"})
    rows = {(r["build"], r["mode"]): r for r in summary["table"]}
    assert rows[("patched", "single")]["median_s"] == 3.5
    assert (rows[("patched", "seeded")]["min_s"], rows[("patched", "seeded")]["max_s"]) == (6.0, 8.0)
    assert rows[("patched", "seeded")]["hashed_tensors"] == [0]
    assert rows[("patched", "cold")]["n"] == 0 and rows[("patched", "cold")]["errors"] == 1
    assert summary["ratios"] == {"patched seeded/single": 2.0}
    text = load_phases.summary_text(summary)
    assert "patched  seeded        3          7.0 [6.0-8.0]  head: 21 from the hash file, 0 hashed" in text
    assert "ratio patched seeded/single: 2.00" in text


def test_gpu_check_dry_run_shows_the_proxy_load_would_make_and_both_builds():
    import subprocess

    out = subprocess.run([str(ROOT / "tools/gpu-check"), "dry-run"], capture_output=True, text=True, cwd=ROOT,
                         env={**__import__("os").environ, "GPU_CHECK_PROXY_ARGS": "--layers 6"})
    assert out.returncode == 0, out.stderr
    assert "load would make this proxy (tools/make_m3_proxy.py --layers 6):" in out.stdout
    assert "  96 tensors, 14.86 GB; 41 over 10 MiB (14.80 GB)" in out.stdout
    assert "build_llamacpp_project_patches\": []}', then with the defaults" in out.stdout


def test_an_unknown_placement_is_refused_before_anything_runs(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit):
        load_phases.main(["--model", "m.gguf", "--template", "t.jinja", "--build", "patched=/nowhere",
                          "--out", str(tmp_path / "out"), "--state", str(tmp_path / "state"),
                          "--modes", "single,warm"])
    assert "--modes: unknown warm (known: single, seeded, seeded-mmap, cold)" in capsys.readouterr().err
    assert not (tmp_path / "state").exists()
