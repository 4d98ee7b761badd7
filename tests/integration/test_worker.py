"""worker_rpc deployed as a user deploys it: playbooks/services.yml --tags worker_rpc against inventory/local.

On the tests' node (tests/support/own-root.sh: its own network namespace), as root: the test changes the node's
iptables rules. What a user relies on is checked on the state left behind: the RPC port admits
the head's address only and follows a changed head address; switching the firewall off removes every rule; a
bad setting is refused before anything stops, and a server that fails to start gives way to the last verified
one; the minimax_rpc fact tells the head where the server listens.
"""
import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from helpers import changed_tasks, failed_tasks, kept_as_found, run_module, run_playbook


def iptables_usable():
    try:
        return os.geteuid() == 0 and subprocess.run(["iptables", "-w", "-S"], capture_output=True).returncode == 0
    except OSError:
        return False


pytestmark = pytest.mark.skipif(not iptables_usable(), reason="changes iptables rules: run as root (in a namespace)")

PORT = 50152
HEAD, OTHER = "127.0.0.2", "127.0.0.3"
FACTS = Path("/etc/ansible/facts.d")
RUN_DIR = Path("/opt/minimax-spark/services")
SERVICE = "minimax-rpc-server"
RULES = {"iptables": Path("/etc/minimax-spark/worker-rpc-firewall.ipv4.rules"),
         "ip6tables": Path("/etc/minimax-spark/worker-rpc-firewall.ipv6.rules")}
JUMP = "-A INPUT -p tcp -m tcp --dport %d -j MINIMAX-RPC" % PORT
IPERF_PORT = 5201  # worker_rpc_iperf_port: the link probe's iperf3, admitted from the head only while it measures
IPERF_JUMP = "-A INPUT -p tcp -m tcp --dport %d -j MINIMAX-RPC" % IPERF_PORT


def deploy(check=False, **settings):
    extravars = {"worker_rpc_port": PORT, "worker_rpc_firewall": True, "worker_rpc_allowed_sources": [HEAD]}
    extravars.update(settings)
    # The worker alone: a tag run of worker_rpc also replans, which needs the model; these tests need none.
    return run_playbook("playbooks/services.yml", tags=["worker_rpc"], skip_tags=["plan"], extravars=extravars,
                        check=check)


def rules(tool="iptables"):
    """Our part of the filter table (the chain and the jumps to it), as `iptables -S` prints it."""
    out = subprocess.run([tool, "-w", "-S"], check=True, capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "MINIMAX-RPC" in line]


def reachable(source, port=PORT):
    """Whether a TCP connection from `source` to the RPC port gets through (a DROP times out)."""
    with socket.socket() as sock:
        sock.bind((source, 0))
        sock.settimeout(1.5)
        try:
            sock.connect(("127.0.0.1", port))
        except (socket.timeout, ConnectionRefusedError):
            return False
        return True


def dropped(source, port):
    """Whether the firewall drops `source`'s SYN to `port` (it times out) rather than letting it reach the closed
    port (refused at once: nothing listens there between measurements)."""
    with socket.socket() as sock:
        sock.bind((source, 0))
        sock.settimeout(1.5)
        try:
            sock.connect(("127.0.0.1", port))
        except socket.timeout:
            return True
        except ConnectionRefusedError:
            return False
        return False


def server_pid():
    return int((RUN_DIR / (SERVICE + ".pid")).read_text())


def listening():
    return ":%d " % PORT in subprocess.run(["ss", "-Hltn"], capture_output=True, text=True).stdout + " "


def rpc_fact():
    return json.loads((FACTS / "minimax_rpc.fact").read_text())


@pytest.fixture(scope="module")
def deployed(llamacpp_bin):
    """The first deployment: firewall on, the head at 127.0.0.2."""
    fact = FACTS / "minimax_llamacpp.fact"
    if not fact.exists():  # MINIMAX_SPARK_LLAMACPP_BIN: a build made elsewhere, not recorded here
        server = next(p for p in (llamacpp_bin / n for n in ("ggml-rpc-server", "rpc-server")) if p.exists())
        FACTS.mkdir(parents=True, exist_ok=True)
        fact.write_text(json.dumps({"rpc_server_path": str(server), "bin_dir": str(llamacpp_bin),
                                    "build_id": "test-" + llamacpp_bin.parent.name}))
    # The head reads the endpoint the worker recorded: the demo's worker is put back on record afterwards.
    with kept_as_found(FACTS / "minimax_rpc.fact", RUN_DIR / (SERVICE + ".verified.json")):
        runner = deploy()
        assert runner.status == "successful", failed_tasks(runner) or runner.stdout_text[-4000:]
        import minimax_service

        # A worker is verified by verify's commit once the head it serves passed the canary (no head here): record
        # the running server the way the commit does, so a failed start below has this server to go back to.
        run_module(minimax_service.main, {"name": SERVICE, "state": "verified",
                                          "note": {"endpoint": rpc_fact()["endpoint"], "rpc": rpc_fact()}})
        yield runner
        run_module(minimax_service.main, {"name": SERVICE, "state": "stopped"})
    for tool in RULES:  # leave no rule behind when a test failed half-way
        subprocess.run([tool, "-w", "-D"] + IPERF_JUMP[len("-A "):].split(), capture_output=True)
        subprocess.run([tool + "-restore", "-w", "--noflush"], capture_output=True,
                       input="*filter\n-D INPUT %s\n-F MINIMAX-RPC\n-X MINIMAX-RPC\nCOMMIT\n" % JUMP[len("-A INPUT "):],
                       text=True)


def test_the_port_admits_the_head_only_and_a_rerun_changes_nothing(deployed):
    assert rules("iptables") == ["-N MINIMAX-RPC", JUMP, "-A MINIMAX-RPC -s %s/32 -j ACCEPT" % HEAD,
                                 "-A MINIMAX-RPC -j DROP"]
    # No IPv6 source: IPv6 to the port is dropped altogether.
    assert rules("ip6tables") == ["-N MINIMAX-RPC", JUMP, "-A MINIMAX-RPC -j DROP"]
    assert reachable(HEAD) and not reachable(OTHER)
    # The link probe's port has no permanent rule (the link role opens it to the head only while it measures;
    # loopback measures nothing): a connection reaches the closed port and is refused, from anyone.
    assert not dropped(HEAD, IPERF_PORT) and not dropped(OTHER, IPERF_PORT)
    build = json.loads((FACTS / "minimax_llamacpp.fact").read_text())
    fact = rpc_fact()
    log = fact.pop("log")  # where the link role reads the transport each connection negotiated
    assert log.endswith(SERVICE + ".log") or log == "journalctl -u " + SERVICE, log
    # the command that runs: the head restarts when a worker's command changes, verify's commit records it
    assert fact == {"endpoint": "127.0.0.1:%d" % PORT, "build_id": build.get("build_id", ""),
                    "cache_dir": "/var/lib/minimax-spark/rpc-cache", "service": SERVICE,
                    "command": "%s -H 127.0.0.1 -p %d -c" % (build["rpc_server_path"], PORT)}
    rerun = deploy()
    assert rerun.status == "successful" and changed_tasks(rerun) == []


def test_a_changed_head_address_replaces_the_old_accept(deployed):
    pid = server_pid()
    before = rules("iptables")
    checked = deploy(check=True, worker_rpc_allowed_sources=[OTHER])
    assert checked.status == "successful", failed_tasks(checked)
    assert ("localhost", "Report the firewall changes a real run would make") in changed_tasks(checked)
    assert rules("iptables") == before, "check mode changed the firewall"

    runner = deploy(worker_rpc_allowed_sources=[OTHER])
    assert runner.status == "successful", failed_tasks(runner)
    assert rules("iptables") == ["-N MINIMAX-RPC", JUMP, "-A MINIMAX-RPC -s %s/32 -j ACCEPT" % OTHER,
                                 "-A MINIMAX-RPC -j DROP"]
    assert reachable(OTHER) and not reachable(HEAD)
    assert server_pid() == pid, "a firewall change must not restart the RPC server"


KEEPS = ". Nothing was changed: the running RPC server (if any) keeps serving."


@pytest.mark.parametrize("settings,task,message", [
    ({"worker_rpc_extra_args": "--no-such-flag"}, "Check the settings",
     'worker_rpc_extra_args must be a list of strings (one word each), not '
     '"--no-such-flag": write a YAML list in the inventory; with -e give JSON, e.g. '
     '-e \'{"worker_rpc_extra_args": ["--flag", "value"]}\'' + KEEPS),
    ({"worker_rpc_port": 70000, "worker_rpc_threads": -1}, "Check the settings",
     "worker_rpc_port=70000 is not a TCP port: give a number from 1 to 65535; "
     "worker_rpc_threads=-1 is not 0 (the server's default) or a number of threads" + KEEPS),
    ({"worker_rpc_allowed_sources": ["head.local"]}, "Check the settings",
     "worker_rpc_allowed_sources: 'head.local' is not an IP address or network: list the head's fast-link IP" + KEEPS),
    ({"worker_rpc_iperf_port": PORT}, "Check the settings",
     "worker_rpc_iperf_port=50152 is not a TCP port other than worker_rpc_port: give a number from 1 to 65535 "
     "(or 0: no link measurement)" + KEEPS),
    ({"link_min_gbit": -1}, "Check the link settings",
     "link_min_gbit=-1 and link_probe_seconds=3: give a threshold of 0 or more Gbit/s (0 checks no speed) and a "
     "measurement of at least 1 second"),
], ids=["extra-args-string", "port-and-threads", "source-hostname", "iperf-port-is-rpc-port", "link-threshold"])
def test_a_bad_setting_is_refused_before_anything_stops(deployed, settings, task, message):
    pid, rules_before = server_pid(), rules("iptables")
    runner = deploy(**dict({"worker_rpc_allowed_sources": [OTHER]}, **settings))
    assert runner.status == "failed"
    [(host, failed, msg)] = failed_tasks(runner)
    assert failed == task
    assert msg == message
    assert server_pid() == pid and rules("iptables") == rules_before


def test_a_server_that_fails_to_start_gives_way_to_the_last_verified_one(deployed):
    fact = rpc_fact()
    runner = deploy(worker_rpc_allowed_sources=[OTHER], worker_rpc_extra_args=["--no-such-flag"])
    assert runner.status == "failed"
    # The start fails (rescued), then the run fails with what failed and what serves now.
    [(_, started, _), (_, task, msg)] = failed_tasks(runner)
    assert (started, task) == ("Start the RPC server", "Report the failed start")
    head, _, what = msg.partition(" What failed: ")
    assert head.startswith(
        "minimax-rpc-server failed to start with the new settings on localhost, so the last verified RPC server "
        "(verified 20")
    assert head.endswith(", 127.0.0.1:%d) runs again." % PORT)
    assert what.startswith("minimax-rpc-server exited within 3 s of its start and is stopped now; see "
                           "/var/log/minimax-spark/minimax-rpc-server.log:")
    assert "--no-such-flag" in what
    assert listening() and reachable(OTHER)
    spec = json.loads((RUN_DIR / (SERVICE + ".json")).read_text())
    assert "--no-such-flag" not in spec["argv"]
    assert rpc_fact() == fact


def test_firewall_off_removes_chain_and_jump(deployed):
    pid = server_pid()
    runner = deploy(worker_rpc_allowed_sources=[OTHER], worker_rpc_firewall=False)
    assert runner.status == "successful", failed_tasks(runner)
    assert rules("iptables") == [] and rules("ip6tables") == []
    assert not any(path.exists() for path in RULES.values())
    assert reachable(HEAD) and reachable(OTHER)
    assert server_pid() == pid


def test_without_a_verified_server_a_failed_start_leaves_the_worker_stopped(deployed):
    """No verified record (no head ever passed the canary with this worker): a server that only listens is not
    verified, so a failed start stops the service and says so, rather than keep a server nothing proved."""
    fact = rpc_fact()
    (RUN_DIR / (SERVICE + ".verified.json")).unlink()
    runner = deploy(worker_rpc_allowed_sources=[OTHER], worker_rpc_extra_args=["--no-such-flag"])
    assert runner.status == "failed"
    msg = failed_tasks(runner)[-1][2]
    assert msg.startswith("minimax-rpc-server failed to start with the new settings on localhost, so nothing "
                          "serves: no RPC server was ever verified here, so the service is stopped. What failed: "
                          "minimax-rpc-server exited within 3 s of its start"), msg
    assert not listening() and not (RUN_DIR / (SERVICE + ".pid")).exists()
    assert rpc_fact() == fact
