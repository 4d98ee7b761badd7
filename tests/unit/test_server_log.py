"""A head never serves alone (module llama_server_log, engine module_utils/minimax_spark_serverlog.py).

The log lines below were captured from the vendored llama.cpp (b11312) built by the project: llama-server started
against the demo's real ggml-rpc-server, and against tests/support/fake_rpc_server.py in each of its modes (a
listener that writes garbage, one that accepts and closes, an RPC server of protocol 8.0.0, one of the right
protocol that offers no device). The ``Failed to connect`` / version-mismatch-and-go-on lines are those of newer
builds (FACTS.md "Seen this month", upstream #26392): the vendored tree aborts on both instead.
"""
import json

import pytest
from ansible.module_utils.minimax_spark_serverlog import (
    GIB,
    argv_from_definition,
    command_settings,
    current_start,
    message,
    parse_log,
    planned_shares,
    probe_rpc,
    slot_context,
    to_check,
    verdict,
)

import llama_server_log
from fake_rpc_server import FakeRpcServer
from helpers import run_module

EP = "127.0.0.1:50052"
WORKERS = [{"name": "localhost", "endpoint": EP, "service": "minimax-rpc-server"}]
ARGV = ["/opt/minimax-spark/llama.cpp/3bf8557a8c637922/bin/llama-server", "--model", "/m/tiny.gguf", "--rpc", EP,
        "--split-mode", "layer", "--n-gpu-layers", "3", "--tensor-split", "3", "--ctx-size", "4096",
        "--parallel", "1"]

# tools/demo, verbosity 5: a dry pass sizes the buffers (0.00 MiB), then the load
GOOD = (
    "[minimax-supervise] 2026-12-04T15:41:45 pre-start: /work/main/.venv/bin/python "
    "/opt/minimax-spark/services/minimax-supervise wait-tcp 127.0.0.1:50052 --timeout 600\n"
    "[minimax-supervise] 2026-12-04T15:41:45 127.0.0.1:50052 answers\n"
    "[minimax-supervise] 2026-12-04T15:41:45 starting: /opt/minimax-spark/llama.cpp/3bf8557a8c637922/bin/llama-server "
    "--model /m/tiny.gguf --rpc 127.0.0.1:50052\n") + """\
0.00.014.494 I load_tensors:          CPU model buffer size =     0.00 MiB
0.00.014.495 I load_tensors: RPC0[127.0.0.1:50052] model buffer size =     0.00 MiB
0.00.043.582 I load_tensors:          CPU model buffer size =     1.79 MiB
0.00.043.587 I load_tensors: RPC0[127.0.0.1:50052] model buffer size =     2.31 MiB
0.00.050.022 I llama_kv_cache: RPC0[127.0.0.1:50052] KV buffer size =     1.06 MiB
0.00.099.622 I srv    load_model: initializing, n_slots = 1, n_ctx_slot = 4096, kv_unified = 'false'
"""
# a plain TCP listener that writes garbage on the worker's port (the same line for one that accepts and closes)
GARBAGE = "../../../src/d51de6bc6cbcc9ce/ggml/src/ggml-rpc/ggml-rpc.cpp:362: Remote RPC server crashed or returned " \
          "malformed response\n"
CLOSED = "0.00.006.283 E send failed (bytes_sent=0, size_to_send=8)\n" + GARBAGE
# an RPC server of protocol 8.0.0: the abort is written before llama.cpp's log thread writes the mismatch
VERSION = ("../../../src/d51de6bc6cbcc9ce/ggml/src/ggml-rpc/ggml-rpc.cpp:558: RPC handshake failed for "
           "127.0.0.1:50052\n0.00.010.190 E RPC server version mismatch: 8.0.0\n")
# an RPC server of the right protocol offering no device: healthy, the whole model on the head, nothing said
ALONE = """\
0.00.030.975 I load_tensors: loading model tensors, this can take a while... (load_mode = none)
0.00.031.311 I load_tensors: offloaded 3/5 layers to GPU
0.00.031.311 I load_tensors:          CPU model buffer size =     4.10 MiB
0.00.802.021 I srv    load_model: initializing, n_slots = 1, n_ctx_slot = 4096, kv_unified = 'false'
"""
# newer builds: a worker that cannot be reached, or speaks another protocol, is left out and the load goes on
TWO = ["10.20.20.2:50052", "10.20.20.3:50052"]
TWO_WORKERS = [{"name": "spark-2", "endpoint": TWO[0], "service": "minimax-rpc-server"},
               {"name": "spark-3", "endpoint": TWO[1], "service": "minimax-rpc-server"}]
UPSTREAM_CONNECT = """\
E Failed to connect to 10.20.20.3:50052
I load_tensors:          CPU model buffer size =   512.00 MiB
I load_tensors: RPC0[10.20.20.2:50052] model buffer size = 40960.00 MiB
"""
UPSTREAM_MISMATCH = """\
E RPC server version mismatch: 8.0.0
I load_tensors:          CPU model buffer size =   512.00 MiB
I load_tensors: RPC0[10.20.20.2:50052] model buffer size = 40960.00 MiB
"""
# ctx 65536 over 2 slots on a model trained for 8192 (the tiny model), default verbosity
CAPPED = """\
0.00.149.588 W srv    load_model: the slot context (32768) exceeds the training context of the model (8192) - capping
0.00.189.757 I srv    load_model: initializing, n_slots = 2, n_ctx_slot = 8192, kv_unified = 'false'
"""
# llama-server's default verbosity (3): libllama's load lines are not written
QUIET = "0.00.269.950 I srv    load_model: initializing, n_slots = 1, n_ctx_slot = 4096, kv_unified = 'false'\n"


def judge(text, argv=ARGV, workers=WORKERS, loaded=True, answers=None, **kw):
    settings = command_settings(argv)
    result = verdict(parse_log(text, settings["model"]), settings, workers=workers, answers=answers or {},
                     loaded=loaded, **kw)
    return result, message(result, loaded)


def test_a_speculative_drafts_buffers_are_not_the_models_share():
    loader = ("0.00.011.457 I llama_model_loader: loaded meta data with 42 key-value pairs and 74 tensors from %s "
              "(version GGUF V3 (latest))\n")
    text = (loader % "/m/tiny.gguf" + GOOD.split("starting: ")[1]
            + loader % "/m/draft.gguf"
            + "0.00.090.001 I load_tensors: RPC0[127.0.0.1:50052] model buffer size =     0.50 MiB\n")
    assert parse_log(text, "/m/tiny.gguf")["buffers"] == {EP: 2.31}
    assert parse_log(text)["buffers"] == {EP: 2.31}  # without the model: the largest buffer of each device


def test_a_good_load_holds_every_share_and_is_ok():
    parsed = parse_log(GOOD)
    assert parsed["buffers"] == {EP: 2.31}  # the dry pass's 0.00 is not a second buffer
    assert parsed["failures"] == [] and parsed["n_ctx_slot"] == 4096
    result, msg = judge(GOOD, served_ctx=4096)
    assert result["ok"] and msg == ""
    assert result["context"]["expected"] == 4096


def test_a_port_answered_by_garbage_names_the_worker_its_address_the_line_and_the_fix():
    with FakeRpcServer("garbage") as fake:
        argv = ARGV[:4] + [fake.endpoint] + ARGV[5:]
        workers = [{"name": "spark-2", "endpoint": fake.endpoint, "service": "minimax-rpc-server"}]
        parsed = parse_log(GARBAGE)
        assert to_check(parsed, [fake.endpoint], loaded=False) == [fake.endpoint]
        answer = probe_rpc(fake.endpoint, 2)
        result, msg = judge(GARBAGE, argv=argv, workers=workers, loaded=False, answers={fake.endpoint: answer})
    assert answer["kind"] == "garbage" and answer["sample"].startswith("HTTP/1.0 200 OK")
    (problem,) = result["problems"]
    assert (problem["worker"], problem["endpoint"], problem["kind"]) == ("spark-2", fake.endpoint, "malformed")
    assert msg.startswith("llama-server could not load onto its workers: worker spark-2 (%s): llama-server aborted: "
                          "the worker's port answered something that is not a working RPC server. llama.cpp logged: "
                          "`../../../src/d51de6bc6cbcc9ce/ggml/src/ggml-rpc/ggml-rpc.cpp:362: Remote RPC server "
                          "crashed or returned malformed response`. %s answers the RPC hello with bytes that are not "
                          "RPC: 'HTTP/1.0 200 OK" % (fake.endpoint, fake.endpoint)), msg
    assert ("Fix: another program than ggml-rpc-server listens on spark-2's port %d: stop it (`ss -ltnp 'sport = :%d'` "
            "on spark-2 names it), then run site.yml (or --tags worker_rpc,head_server) again."
            % (fake.port, fake.port)) in msg


def test_a_listener_that_accepts_and_closes_is_named_as_such():
    with FakeRpcServer("close") as fake:
        answer = probe_rpc(fake.endpoint, 2)
    result, msg = judge(CLOSED, argv=ARGV[:4] + [fake.endpoint] + ARGV[5:],
                        workers=[{"name": "spark-2", "endpoint": fake.endpoint}], loaded=False,
                        answers={fake.endpoint: answer})
    assert answer["kind"] == "closed"
    assert [p["kind"] for p in result["problems"]] == ["malformed"]
    assert "accepts the connection and closes it without answering the RPC hello" in msg


def test_an_rpc_server_of_another_protocol_is_one_failure_with_both_lines():
    parsed = parse_log(VERSION)
    (failure,) = parsed["failures"]
    assert failure["kind"] == "version" and failure["endpoint"] == EP and failure["version"] == "8.0.0"
    with FakeRpcServer("version", version=(8, 0, 0)) as fake:
        answer = probe_rpc(fake.endpoint, 2)
    assert (answer["kind"], answer["version"]) == ("rpc", "8.0.0")
    result, msg = judge(VERSION, loaded=False, answers={EP: answer})
    (problem,) = result["problems"]
    assert problem["worker"] == "localhost" and problem["line"] == (
        "../../../src/d51de6bc6cbcc9ce/ggml/src/ggml-rpc/ggml-rpc.cpp:558: RPC handshake failed for 127.0.0.1:50052"
        " / 0.00.010.190 E RPC server version mismatch: 8.0.0")
    assert "worker localhost (127.0.0.1:50052): its RPC server speaks another RPC protocol" in msg
    assert "127.0.0.1:50052 is an RPC server of protocol 8.0.0" in msg
    assert ("Fix: localhost's RPC server is of another llama.cpp than the head's llama-server: build one "
            "llama.cpp") in msg


def test_a_handshake_failure_whose_mismatch_line_was_lost_is_named_by_the_workers_answer():
    """Seen through site.yml: llama-server aborted before its log thread wrote the mismatch line."""
    only = VERSION.splitlines()[0] + "\n"
    with FakeRpcServer("version", version=(8, 0, 0)) as fake:
        answer = probe_rpc(fake.endpoint, 2)
    assert answer["devices"] == 1
    result, msg = judge(only, loaded=False, answers={EP: answer})
    assert [(p["kind"], p["worker"]) for p in result["problems"]] == [("version", "localhost")]
    assert "its RPC server speaks another RPC protocol than this llama-server" in msg
    assert "127.0.0.1:50052 is an RPC server of protocol 8.0.0 with 1 device." in msg


def test_a_worker_offering_no_device_leaves_the_head_alone_and_is_caught():
    parsed = parse_log(ALONE)
    assert parsed["load_logged"] and parsed["buffers"] == {} and parsed["failures"] == []
    assert to_check(parsed, [EP]) == [EP]
    with FakeRpcServer("nodevices", version=(7, 0, 0)) as fake:
        answer = probe_rpc(fake.endpoint, 2)
    assert (answer["kind"], answer["version"], answer["devices"]) == ("rpc", "7.0.0", 0)
    result, msg = judge(ALONE, answers={EP: answer}, served_ctx=4096)
    assert not result["ok"]
    (problem,) = result["problems"]
    assert problem["kind"] == "missing"
    assert msg == (
        "llama-server answered /health but does not serve on every worker in --rpc: worker localhost "
        "(127.0.0.1:50052) holds no part of the model: llama-server logged no model buffer on it, so the layers "
        "planned there were loaded on the head alone; 127.0.0.1:50052 is an RPC server of protocol 7.0.0 with 0 "
        "devices. Fix: localhost's RPC server offers no device (started without a backend, or another program "
        "speaking RPC): restart it with site.yml --tags worker_rpc, then --tags head_server.")


def test_newer_builds_that_go_on_without_a_worker_are_caught_by_name():
    result, msg = judge(UPSTREAM_CONNECT, argv=["llama-server", "--rpc", ",".join(TWO)], workers=TWO_WORKERS)
    assert [(p["worker"], p["kind"]) for p in result["problems"]] == [("spark-3", "connect")]
    assert "worker spark-3 (10.20.20.3:50052): llama-server could not connect to it. llama.cpp logged: " \
           "`E Failed to connect to 10.20.20.3:50052`" in msg
    assert "Fix: start the worker's RPC server (site.yml --tags worker_rpc)" in msg
    # the mismatch line names no address: the worker without a model buffer is the one
    result, msg = judge(UPSTREAM_MISMATCH, argv=["llama-server", "--rpc", ",".join(TWO)], workers=TWO_WORKERS)
    assert [(p["worker"], p["endpoint"], p["kind"]) for p in result["problems"]] == [
        ("spark-3", "10.20.20.3:50052", "version")]
    assert "`E RPC server version mismatch: 8.0.0`" in msg


def test_a_log_without_load_lines_proves_nothing():
    result, msg = judge(QUIET)
    assert [p["kind"] for p in result["problems"]] == ["unlogged"]
    assert "llama-server logged nothing of its load (no load_tensors line: its verbosity is below 4)" in msg
    # a head without workers has nothing to prove
    assert judge(QUIET, argv=["llama-server", "--ctx-size", "4096"], workers=[])[0]["ok"]


PLAN = {"model_path": "/m/big.gguf", "tensor_split": [30, 33],
        "nodes": [{"name": "spark-1", "role": "head", "weights_gib": 50.0},
                  {"name": "spark-2", "role": "worker", "weights_gib": 40.0},
                  {"name": "spark-3", "role": "worker", "weights_gib": 45.0}]}
BIG = ["llama-server", "--model", "/m/big.gguf", "--rpc", ",".join(TWO), "--tensor-split", "30,33"]


def test_each_worker_must_hold_near_the_plans_share():
    settings = command_settings(BIG)
    shares = planned_shares(PLAN, settings)
    assert shares == {TWO[0]: 40 * GIB, TWO[1]: 45 * GIB}
    near = "I load_tensors: RPC0[%s] model buffer size = 41000.00 MiB\nI load_tensors: RPC0[%s] model buffer size " \
           "= 46080.00 MiB\n" % tuple(TWO)
    assert judge(near, argv=BIG, workers=TWO_WORKERS, shares=shares)[0]["ok"]
    short = near.replace("46080.00", "2048.00")
    result, msg = judge(short, argv=BIG, workers=TWO_WORKERS, shares=shares)
    assert [(p["worker"], p["kind"]) for p in result["problems"]] == [("spark-3", "share")]
    assert "worker spark-3 (10.20.20.3:50052) holds 2048.0 MiB of the model; the plan gives it 46080.0 MiB " \
           "(tolerance 10%)" in msg
    # a plan for another model or split (a restored deployment) is not compared
    assert planned_shares(dict(PLAN, model_path="/m/other.gguf"), settings) is None
    assert planned_shares(dict(PLAN, tensor_split=[20, 43]), settings) is None
    assert judge(short, argv=BIG, workers=TWO_WORKERS, shares=None)[0]["ok"]


def test_the_served_context_must_be_the_command_lines_per_slot():
    argv = ["llama-server", "--ctx-size", "65536", "--parallel", "2"]
    result, msg = judge(CAPPED, argv=argv, workers=[], served_ctx=8192)
    assert result["context"]["expected"] == 32768
    assert msg == (
        "llama-server does not serve the context it was started with: llama-server serves 8192 tokens of context "
        "per slot, and its command line asks for 32768 (--ctx-size 65536 / --parallel 2); llama-server logged: "
        "`0.00.149.588 W srv    load_model: the slot context (32768) exceeds the training context of the model "
        "(8192) - capping`. Fix: give a context the model was trained for: head_server_ctx_size at most 8192 per "
        "slot (x head_server_parallel), or lift the model's window on purpose.")
    assert judge(CAPPED, argv=argv, workers=[], served_ctx=32768)[0]["ok"]
    # llama.cpp pads the context and each slot's share to 256
    assert slot_context(command_settings(["s", "-c", "5000"])) == 5120
    assert slot_context(command_settings(["s", "-c", "65536", "-np", "3"])) == 22016
    assert slot_context(command_settings(["s", "-c", "65536", "-np", "3", "--kv-unified"])) == 65536
    assert slot_context(command_settings(["s", "-c", "0"])) is None


def test_the_command_line_comes_from_either_service_definition():
    assert argv_from_definition(json.dumps({"argv": ARGV})) == ARGV
    unit = ("[Service]\nExecStartPre=/usr/bin/python3 /opt/x wait-tcp 127.0.0.1:50052\n"
            'ExecStart=/bin/llama-server --rpc 127.0.0.1:50052 --alias "a b" --extra "100%%" --x "$$HOME"\n')
    assert argv_from_definition(unit) == ["/bin/llama-server", "--rpc", EP, "--alias", "a b", "--extra", "100%",
                                          "--x", "$HOME"]


def test_only_the_last_start_of_a_supervised_log_is_judged():
    old = GOOD
    new = ("[minimax-supervise] 2026-12-04T16:00:00 exited with status 134\n"
           "[minimax-supervise] 2026-12-04T16:00:05 starting: llama-server --rpc 127.0.0.1:50052\n" + ALONE)
    assert parse_log(current_start(old + new))["buffers"] == {}
    assert parse_log(current_start(old))["buffers"] == {EP: 2.31}


def test_probe_says_when_nothing_listens():
    with FakeRpcServer("garbage") as fake:
        endpoint = fake.endpoint
    assert probe_rpc(endpoint, 1)["kind"] == "refused"


def test_module_reads_the_services_log_and_definition_and_returns_the_verdict(tmp_path):
    log = tmp_path / "minimax-llama-server.log"
    log.write_text(GOOD)
    (tmp_path / "minimax-llama-server.json").write_text(json.dumps({"argv": ARGV}))
    service = {"service": "minimax-llama-server", "manager": "supervisor", "run_dir": str(tmp_path),
               "log_dir": str(tmp_path)}
    workers = {"localhost": {"endpoint": EP, "service": "minimax-rpc-server", "build_id": "3bf8557a8c637922"}}
    good = run_module(llama_server_log.main, dict(service, workers=workers))
    assert good["ok"] is True and good["message"] == "" and good["buffers"] == {EP: 2.31}
    assert good["changed"] is False and good["endpoints"] == [EP]
    # a failed start: the supervisor's last start is read
    with log.open("a") as handle:
        handle.write("[minimax-supervise] 2026-12-04T16:00:00 starting: llama-server\n" + GARBAGE
                     + "[minimax-supervise] 2026-12-04T16:00:01 exited with status 134\n")
    failed = run_module(llama_server_log.main, dict(service, workers=workers, loaded=False, probe=False))
    assert failed["ok"] is False
    assert [(p["worker"], p["endpoint"], p["kind"]) for p in failed["problems"]] == [("localhost", EP, "malformed")]
    assert failed["message"].startswith("llama-server could not load onto its workers: worker localhost "
                                        "(127.0.0.1:50052): llama-server aborted")
    # and every start after an offset, when one is given
    offset = log.stat().st_size
    with log.open("a") as handle:
        handle.write("[minimax-supervise] 2026-12-04T16:00:06 starting: llama-server\n" + VERSION
                     + "[minimax-supervise] 2026-12-04T16:00:07 starting: llama-server\n")
    since = run_module(llama_server_log.main, dict(service, workers=workers, loaded=False, probe=False,
                                                   offset=offset))
    assert [p["kind"] for p in since["problems"]] == ["version"]
    missing = run_module(llama_server_log.main, {"log": str(tmp_path / "nope.log"), "argv": ARGV})
    assert missing["failed"] and missing["msg"].startswith("cannot read llama-server's log")
    nodef = run_module(llama_server_log.main, dict(service, run_dir=str(tmp_path / "none")))
    assert nodef["failed"] and nodef["msg"].startswith("cannot read llama-server's command line")


@pytest.mark.parametrize("argv", [["llama-server", "--ctx-size", "many"], []])
def test_a_command_line_the_check_cannot_read_is_refused(argv, tmp_path):
    log = tmp_path / "log"
    log.write_text(GOOD)
    res = run_module(llama_server_log.main, {"log": str(log), "argv": argv})
    assert res["failed"] and res["msg"].startswith("cannot read llama-server's command line"), res


def test_a_long_running_servers_log_is_read_from_its_last_start(tmp_path):
    from ansible.module_utils.minimax_spark_serverlog import read_log_file

    log = tmp_path / "big.log"
    requests = "0.01.037.076 I slot   operator(): id  0 | task 0 | new prompt, n_ctx_slot = 4096\n" * 40000
    log.write_text(GOOD + requests)
    text = read_log_file(str(log), limit=1 << 16)  # the start's first lines, however much came after
    assert text.startswith("[minimax-supervise] 2026-12-04T15:41:45 starting: ")
    assert parse_log(text)["buffers"] == {EP: 2.31}
    assert read_log_file(str(log), offset=len(GOOD), limit=100).startswith("0.01.037.076 I slot")
    log.write_text("no supervisor here\n" + GARBAGE)
    assert read_log_file(str(log)).startswith("no supervisor here")


def test_a_systemd_units_log_is_its_current_run_even_where_journald_does_not_tag_it(tmp_path, monkeypatch):
    """systemd: a loaded server's log is its invocation's; where journald does not tag lines with the invocation
    (containers), the lines since its main process started; a failed start's, every line since it began."""
    from ansible.module_utils.minimax_spark_serverlog import read_journal

    calls = tmp_path / "calls"
    (tmp_path / "systemctl").write_text(
        "#!/bin/sh\ncase \"$3\" in InvocationID) echo 0123abcd;; ExecMainStartTimestamp) "
        "echo 'Fri 2026-12-04 15:41:45 UTC';; esac\n")
    # a journald without invocation tags: the invocation's journal is empty
    (tmp_path / "journalctl").write_text(
        "#!/bin/sh\necho \"$*\" >> %s\ncase \"$1\" in _SYSTEMD_INVOCATION_ID=*) exit 0;; esac\ncat %s\n"
        % (calls, tmp_path / "journal"))
    (tmp_path / "journal").write_text(GOOD)
    for tool in ("systemctl", "journalctl"):
        (tmp_path / tool).chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (tmp_path, __import__("os").environ["PATH"]))
    assert parse_log(read_journal("minimax-llama-server", since=1764863000))["buffers"] == {EP: 2.31}
    assert calls.read_text().splitlines() == [
        "_SYSTEMD_INVOCATION_ID=0123abcd -o cat --no-pager",
        "-u minimax-llama-server --since Fri 2026-12-04 15:41:45 UTC -o cat --no-pager"]
    calls.unlink()
    read_journal("minimax-llama-server", since=1764863000, loaded=False)
    assert calls.read_text().splitlines() == ["-u minimax-llama-server --since @1764863000 -o cat --no-pager"]
