"""The link, seen from outside: the worker deployed on the fast network's address passed the check and was
measured; pointed at the slow network's address (shaped to 100 Mbit/s) it is refused with the table, the measured
rate and the fix naming the fast address, and nothing it runs changes; two ends with different MTUs are refused
the same way; once the slow link is fixed at the same address (the shaping removed) the next run measures it
again and passes; each run checks the link once per worker. The iperf3 port is open to the head only while the
probe measures (the rest of the time no rule names it and nothing listens there), also when the probe fails. The
converge playbook is rerun as a user reruns site.yml, with the inventory's address overridden.
"""
from __future__ import annotations

import json
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "support"))
import molecule_nodes  # noqa: E402  (the scenario's nodes and converge)
from molecule_nodes import PROJECT, node  # noqa: E402

CONVERGE = Path(__file__).resolve().parents[1] / "converge.yml"
HEAD, WORKER = "link-head", "link-worker"
FAST, SLOW = "172.31.71.3", "172.31.72.3"
HEAD_FAST = "172.31.71.2"
IPERF_PORT = 5201  # worker_rpc_iperf_port
SLOW_RATE, SHAPED_GBIT = "100mbit", 0.1  # molecule.yml: scenario_slow_rate 100mbit


def converge(*extra):
    """converge.yml rerun as a user reruns site.yml, with extra arguments."""
    return molecule_nodes.converge(CONVERGE, *extra)


def link_fact():
    return json.loads(node(WORKER).file("/etc/ansible/facts.d/minimax_link.fact").content_string)


def listening():
    return node(WORKER).check_output("ss -Hltn 'sport = :50052'")


def last_row(out, address):
    """The worker's row in the last link table printed (worker_rpc's, with the measurement)."""
    rows = [line.strip().strip('",') for line in out.splitlines() if f"link-worker  {address}" in line]
    assert rows, out[-3000:]
    return rows[-1]


def task_hosts(out, task):
    """For each time ``task`` ran in the output: the hosts it reported ok on (the default callback's lines)."""
    runs = []
    for block in out.split("TASK [")[1:]:
        if block.startswith(task + "]"):
            runs.append(sorted(set(re.findall(r"^ok: \[([^\]\s]+)", block, re.MULTILINE))))
    return runs


def iperf_rules():
    """The worker's rules naming the iperf3 port, as iptables-save prints them (IPv4 and IPv6)."""
    saved = node(WORKER).check_output("iptables-save -t filter; ip6tables-save -t filter")
    return [line for line in saved.splitlines() if f"--dport {IPERF_PORT} " in line + " "]


# A TCP connection to the worker's iperf3 port from an address the firewall does not admit: the worker's own
# address on the fast network (a local connection crosses INPUT too). "dropped": the SYN was dropped (timeout);
# "refused": it reached the port and nothing listens there.
OUTSIDER = f"""python3 -c '
import socket
s = socket.socket()
s.bind(("{FAST}", 0))
s.settimeout(2)
try:
    s.connect(("{FAST}", {IPERF_PORT}))
    print("outsider: connected")
except socket.timeout:
    print("outsider: dropped")
except ConnectionRefusedError:
    print("outsider: refused")
'"""

# Run on the worker during a converge: waits until iperf3 listens on the port and a rule names it, then prints
# the rules and what the outsider gets while the head measures.
WATCH = f"""for i in $(seq 1800); do
  if ss -Hltn 'sport = :{IPERF_PORT}' | grep -q . && iptables-save -t filter | grep -q -- '--dport {IPERF_PORT} '; then
    iptables-save -t filter | grep -- '--dport {IPERF_PORT} '
    {OUTSIDER}
    exit 0
  fi
  sleep 0.1
done
echo "no rule for port {IPERF_PORT} while iperf3 listened"; exit 1"""


def shape(rate):
    """Shape (or, with None, unshape) the slow network on both nodes, as prepare.yml does."""
    for host, address in ((HEAD, "172.31.72.2"), (WORKER, SLOW)):
        dev = interface_of(host, address)
        if rate:
            node(host).check_output(f"tc qdisc replace dev {dev} root tbf rate {rate} burst 64kb latency 50ms")
        else:
            node(host).run(f"tc qdisc del dev {dev} root")


def interface_of(host, address):
    for link in json.loads(node(host).check_output("ip -j -4 addr show")):
        if any(a.get("local") == address for a in link.get("addr_info", [])):
            return link["ifname"]
    raise AssertionError(f"no interface of {host} holds {address}")


def test_converge_measured_the_fast_network_and_left_no_iperf3():
    fact = link_fact()
    figures = PROJECT / ".cache" / "molecule" / "link-fast.json"
    figures.parent.mkdir(parents=True, exist_ok=True)
    figures.write_text(json.dumps(fact, indent=2))
    assert (fact["address"], fact["head"]) == (FAST, HEAD_FAST)
    assert fact["gbit_s"] >= 1, fact
    assert f"{FAST}:50052" in listening()
    # iperf3 ran for the measurement only, and its port's opening went with it: the permanent rules admit the
    # RPC port alone from the head; nothing names the iperf3 port, and the outsider cannot reach it.
    assert node(WORKER).run("pgrep -x iperf3").rc == 1
    rules = node(WORKER).check_output("iptables -S")
    assert "-A INPUT -p tcp -m tcp --dport 50052 -j MINIMAX-RPC" in rules
    assert f"-A MINIMAX-RPC -s {HEAD_FAST}/32 -j ACCEPT" in rules
    assert iperf_rules() == [], rules
    assert node(WORKER).check_output(OUTSIDER) == "outsider: refused"


def test_the_slow_address_is_refused_with_the_fix_and_the_shaped_rate():
    before = node(WORKER).check_output("systemctl show -p MainPID --value minimax-rpc-server")
    rc, out = converge("-e", f"worker_rpc_bind_address={SLOW}")
    assert rc != 0, out
    slow_if = interface_of(WORKER, SLOW)
    fast_if = interface_of(WORKER, FAST)
    assert "RPC would ride a slow or mismatched link, so nothing is started. link-worker: iperf3 measured " in out
    assert "head -> worker, under 1.0 Gbit/s" in out
    assert f"Fix: put fast_link_address: {FAST} for link-worker (its address on {fast_if}" in out
    row = last_row(out, SLOW)
    assert row.endswith("REFUSED") and f"{slow_if} " in row and " Gbit/s, rtt " in row, row
    # The measurement is recorded for that address: the shaped rate within 20 %.
    fact = link_fact()
    assert fact["address"] == SLOW and fact["passed"] is False and fact["verdict"] == "REFUSED", fact
    assert abs(fact["gbit_s"] - SHAPED_GBIT) <= 0.2 * SHAPED_GBIT, fact
    figures = PROJECT / ".cache" / "molecule" / "link.json"  # the figures, for the record (not a timed test)
    figures.parent.mkdir(parents=True, exist_ok=True)
    figures.write_text(json.dumps({"shaped_gbit_s": SHAPED_GBIT, "slow": fact}, indent=2))
    # Nothing it runs changed: the same RPC server, still on the fast address only; no iperf3 left.
    assert node(WORKER).check_output("systemctl show -p MainPID --value minimax-rpc-server") == before
    assert f"{FAST}:50052" in listening() and SLOW not in listening()
    assert node(WORKER).run("pgrep -x iperf3").rc == 1


def test_the_slow_link_fixed_at_the_same_address_is_measured_again_and_passes():
    """The refused figure is not reused: with the cable fixed (the shaping removed), the next run at the same
    address measures again, passes and shows the new figure."""
    shape(None)
    try:
        rc, out = converge("-e", f"worker_rpc_bind_address={SLOW}")
        assert rc == 0, out[-5000:]
        row = last_row(out, SLOW)
        assert row.endswith("ok") and " Gbit/s, rtt " in row, row
        fact = link_fact()
        assert fact["address"] == SLOW and fact["passed"] is True and fact["gbit_s"] >= 1, fact
        assert "%.3g Gbit/s" % fact["gbit_s"] in row, (row, fact)
        figures = PROJECT / ".cache" / "molecule" / "link-fixed.json"
        figures.write_text(json.dumps(fact, indent=2))
    finally:
        shape(SLOW_RATE)


def test_the_fast_address_passes_again_and_the_table_shows_it():
    rc, out = converge()
    assert rc == 0, out
    row = last_row(out, FAST)
    assert row.endswith("ok") and " Gbit/s, rtt " in row, row
    assert link_fact()["address"] == FAST
    # A rerun with the same addresses measures nothing and changes nothing, and checks the link once per worker:
    # the plan's pass reads both ends and judges; worker_rpc's pass reuses it.
    rc, out = converge()
    recap = out.split("PLAY RECAP")[-1]
    assert rc == 0 and recap.count("changed=0") == 2, out
    assert task_hosts(out, "link : Describe the worker's end of the link") == [[WORKER], []], out
    assert task_hosts(out, "link : Describe the head's route to the worker") == [[WORKER], []], out
    assert [bool(hosts) for hosts in task_hosts(out, "link : Show the links")] == [True, False], out
    assert "TASK [link : Measure from the head]" not in out
    # On request it measures again whatever was recorded (once, in worker_rpc's pass).
    rc, out = converge("-e", "link_remeasure=true")
    assert rc == 0, out
    assert task_hosts(out, "link : Measure from the head") == [[WORKER]], out


def test_the_iperf3_port_admits_the_head_only_while_the_probe_runs():
    """During a measurement (link_remeasure, 10 s) the port is sent to the head-only chain: the head measures, the
    outsider's SYN is dropped. After it the rule is gone and the outsider is refused (nothing listens), and the run
    reports no change for the rule it added and removed."""
    assert iperf_rules() == []
    with ThreadPoolExecutor(1) as pool:
        watch = pool.submit(node(WORKER).run, WATCH)
        rc, out = converge("-e", "link_remeasure=true", "-e", "link_probe_seconds=10")
        seen = watch.result(timeout=300)
    assert rc == 0, out[-5000:]
    assert task_hosts(out, "link : Measure from the head") == [[WORKER]], out
    assert seen.rc == 0, seen.stdout + seen.stderr
    assert seen.stdout.splitlines() == [f"-A INPUT -p tcp -m tcp --dport {IPERF_PORT} -j MINIMAX-RPC",
                                        "outsider: dropped"], seen.stdout
    fact = link_fact()
    assert fact["address"] == FAST and fact["passed"] is True and fact["seconds"] >= 9, fact
    assert iperf_rules() == [] and node(WORKER).run("pgrep -x iperf3").rc == 1
    assert node(WORKER).check_output(OUTSIDER) == "outsider: refused"
    # The opening is no change of its own: the worker's only change is the new measurement's fact.
    changed = [block.split("]")[0] for block in out.split("TASK [")[1:] if f"changed: [{WORKER}]" in block]
    assert changed == ["common : Record the fact minimax_link"], changed


def test_a_failed_probe_closes_the_port_and_stops_iperf3():
    """The head is not among the admitted sources: its iperf3 client is dropped and the probe fails; the opening
    and the iperf3 server are gone all the same, and the rerun with the right sources measures nothing new."""
    rc, out = converge("-e", '{"worker_rpc_allowed_sources": ["172.31.71.9"], "link_remeasure": true}')
    try:
        assert rc != 0, out[-5000:]
        assert f"iperf3 to {FAST}:{IPERF_PORT} failed: " in out, out[-5000:]
        assert "TASK [link : Close iperf3's port again, port 5201]" in out, out[-5000:]
        assert iperf_rules() == [], node(WORKER).check_output("iptables-save -t filter")
        assert node(WORKER).run("pgrep -x iperf3").rc == 1
        assert node(WORKER).check_output(OUTSIDER) == "outsider: refused"
    finally:
        rc, out = converge()
    assert rc == 0, out[-5000:]
    assert f"-A MINIMAX-RPC -s {HEAD_FAST}/32 -j ACCEPT" in node(WORKER).check_output("iptables -S")


def test_different_mtus_at_the_two_ends_are_refused():
    fast_if = interface_of(WORKER, FAST)
    head_if = interface_of(HEAD, HEAD_FAST)
    before = node(WORKER).check_output("systemctl show -p MainPID --value minimax-rpc-server")
    node(WORKER).check_output(f"ip link set dev {fast_if} mtu 1400")
    try:
        rc, out = converge()
    finally:
        node(WORKER).check_output(f"ip link set dev {fast_if} mtu 1500")
    assert rc != 0, out
    assert f"MTU 1500 on the head's {head_if} but 1400 on the worker's {fast_if}" in out
    assert "set MTU 1500 on both ends" in out
    assert node(WORKER).check_output("systemctl show -p MainPID --value minimax-rpc-server") == before
