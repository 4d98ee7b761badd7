"""head_server's wait for /health reports the load from llama.cpp's log (files/wait_healthy.py).

A load takes up to half an hour; the role prints, every head_server_health_interval, what the log of the
current start says: the workers' weights set out of their buffer size, bytes hashed and sent, and a hash file
the patched RPC client ignored (and why); after the load, the "ggml_rpc: weight hashes" counts the role records.
"""
import json
import subprocess
import sys

from helpers import ROOT

WAIT = ROOT / "roles" / "head_server" / "files" / "wait_healthy.py"

OLD_RUN = (
    "[minimax-supervise] 2026-12-03T10:00:00 starting: llama-server --old\n"
    "ggml_rpc: weight hashes: file_tensors=0 file_bytes=0 hashed_tensors=9 hashed_bytes=9 sent_tensors=0"
    " sent_bytes=0 weights=20 bytes=30\n"
    "[minimax-supervise] 2026-12-03T10:00:09 exited with status 0\n"
)
THIS_RUN = (
    "[minimax-supervise] 2026-12-03T10:01:00 pre-start: wait-tcp 127.0.0.1:50052\n"
    "[minimax-supervise] 2026-12-03T10:01:00 starting: llama-server --new\n"
    "load_tensors:   RPC0[127.0.0.1:50052] model buffer size =  2048.00 MiB\n"
    "ggml_rpc: hash file /m/a.gguf.rpc-hashes: 9 tensors\n"
    "ggml_rpc: hash file /m/d.gguf.rpc-hashes ignored, stale: /m/d.gguf changed since it was written"
    " (size or mtime differ): its tensors are hashed\n"
    "ggml_rpc: load progress: weights=5 bytes=1073741824 hashed_bytes=0 sent_bytes=0\n"
)


def _wait(log, *extra):
    # --offset: where the log ended when this start began (the previous start exited before it)
    done = subprocess.run([sys.executable, str(WAIT), "http://127.0.0.1:9", "0", "1", "--log", str(log),
                           "--offset", str(len(OLD_RUN)), *extra],
                          capture_output=True, text=True)
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("LOAD "), done.stdout
    return done.returncode, json.loads(last[5:])


def test_progress_is_read_from_this_start_only(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(OLD_RUN + THIS_RUN)
    rc, load = _wait(log)
    assert rc == 2
    assert load["summary"] is None, "the previous start's counts were taken for this one"
    assert load["message"] == (
        "loading for 0 s: 1.00 GiB of 2.00 GiB of the workers' weights set (5 tensors; 0.0 MiB hashed, 0.0 MiB sent); "
        "hash files ignored: /m/d.gguf.rpc-hashes "
        "(stale: /m/d.gguf changed since it was written (size or mtime differ))")
    assert [f["used"] for f in load["hash_files"]] == [True, False]


def test_the_counts_after_the_load(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(OLD_RUN + THIS_RUN + "ggml_rpc: weight hashes: file_tensors=9 file_bytes=1610612736 hashed_tensors=0"
                   " hashed_bytes=0 sent_tensors=1 sent_bytes=11534336 weights=40 bytes=2147483648\n")
    _, load = _wait(log, "--started", "0")
    assert load["summary"] == {"file_tensors": 9, "file_bytes": 1610612736, "hashed_tensors": 0, "hashed_bytes": 0,
                               "sent_tensors": 1, "sent_bytes": 11534336, "weights": 40, "bytes": 2147483648}
    assert load["message"].startswith("RPC weights: 9 tensors (1.50 GiB) took their hash from the hash file, "
                                      "0 (0.0 MiB) were hashed; 1 (11.0 MiB) were sent to the workers")


def test_a_build_without_the_patch_still_reports_the_wait(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("[minimax-supervise] 2026-12-03T10:01:00 starting: llama-server\n")
    _, load = _wait(log)
    assert load["message"] == "loading for 0 s" and load["progress"] is None and load["summary"] is None


def test_the_weights_the_head_mapped_are_reported(tmp_path):
    """Project patch rpc-load-mapped logs one line per buffer context; the report adds them up."""
    log = tmp_path / "server.log"
    log.write_text(OLD_RUN + THIS_RUN
                   + "load_all_data: rpc-load-mapped: 6 RPC weights (1073741824 bytes) set from a mapping of the file\n"
                   + "load_all_data: rpc-load-mapped: 3 RPC weights (536870912 bytes) set from a mapping of the file\n"
                   + "ggml_rpc: weight hashes: file_tensors=9 file_bytes=1610612736 hashed_tensors=0"
                   " hashed_bytes=0 sent_tensors=0 sent_bytes=0 weights=40 bytes=2147483648\n")
    _, load = _wait(log, "--started", "0")
    assert load["mapped"] == {"tensors": 9, "bytes": 1610612736}
    assert ("were sent to the workers; 9 (1.50 GiB) were set from a mapping of the GGUF: the head read only what it "
            "sent; hash files ignored") in load["message"], load["message"]


def test_without_the_mapping_patch_nothing_is_said_of_it(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(OLD_RUN + THIS_RUN + "ggml_rpc: weight hashes: file_tensors=9 file_bytes=1610612736 hashed_tensors=0"
                   " hashed_bytes=0 sent_tensors=0 sent_bytes=0 weights=40 bytes=2147483648\n")
    _, load = _wait(log, "--started", "0")
    assert load["mapped"] is None and "mapping" not in load["message"]
