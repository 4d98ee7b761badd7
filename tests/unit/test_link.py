"""The link check: parsing what a node says about its link (captured outputs and sysfs trees) and the verdict
the play refuses with. Each case is one a Spark owner meets: the 200 GbE port, a bond, a RoCE device present
and absent, a veth that reports no speed, the management port carrying the default route, MTU 1500 vs 9000."""
from __future__ import annotations

import json
import os

import pytest
from ansible.module_utils import minimax_spark_link as ml

import link_info
import link_probe
import minimax_link as mlf
import minimax_spark as ms
from helpers import run_module

# `ip -j route get` captured: a directly connected address, one through a gateway, and an address of this host.
ROUTE_DIRECT = ('[{"dst":"192.168.100.11","dev":"enp1s0f0np0","prefsrc":"192.168.100.10","flags":[],"uid":0,'
                '"cache":[]}]')
ROUTE_GATEWAY = ('[{"dst":"10.1.2.3","gateway":"192.168.1.1","dev":"enP7s7","prefsrc":"192.168.1.20","flags":[],'
                 '"uid":0,"cache":[]}]')
ROUTE_LOCAL = ('[{"type":"local","dst":"127.0.0.1","dev":"lo","prefsrc":"127.0.0.1","flags":[],"uid":0,'
               '"cache":["local"]}]')
# `ip -j route show default` with one route, and with a multipath one.
DEFAULTS = '[{"dst":"default","gateway":"192.168.1.1","dev":"enP7s7","protocol":"dhcp","metric":100,"flags":[]}]'
DEFAULTS_MULTIPATH = ('[{"dst":"default","flags":[],"nexthops":[{"gateway":"10.0.0.1","dev":"eth0","weight":1,'
                      '"flags":[]},{"gateway":"10.0.1.1","dev":"eth1","weight":1,"flags":[]}]}]')
# `ip -j addr show` (trimmed): loopback, the management port, the QSFP port with IPv4 and IPv6.
ADDRS = json.dumps([
    {"ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1", "scope": "host"}]},
    {"ifname": "enP7s7", "addr_info": [{"family": "inet", "local": "192.168.1.21", "scope": "global"}]},
    {"ifname": "enp1s0f0np0", "addr_info": [
        {"family": "inet6", "local": "fe80::1", "scope": "link"},
        {"family": "inet6", "local": "fd00::11", "scope": "global"},
        {"family": "inet", "local": "192.168.100.11", "scope": "global"}]},
])
ETHTOOL_200G = "Settings for enp1s0f0np0:\n\tSpeed: 200000Mb/s\n\tDuplex: Full\n\tLink detected: yes\n"
# What ethtool said on this machine's virtual NIC.
ETHTOOL_UNKNOWN = "Settings for eth0:\n\tSpeed: Unknown!\n\tDuplex: Unknown! (255)\n\tLink detected: yes\n"
RDMA_LINK = ("link rocep1s0f0/1 state ACTIVE physical_state LINK_UP netdev enp1s0f0np0 \n"
             "link rocep1s0f1/1 state DOWN physical_state DISABLED netdev enp1s0f1np1 \n")
# An iperf3 3.12 client's -J report, captured here on loopback (trimmed to what is read).
IPERF3 = json.dumps({"start": {"version": "iperf 3.12"}, "intervals": [], "end": {
    "streams": [{"sender": {"socket": 5, "seconds": 1.00084, "bytes": 1300234240,
                            "bits_per_second": 10393143679.309381, "retransmits": 4, "max_rtt": 255,
                            "min_rtt": 255, "mean_rtt": 255, "sender": True}}],
    "sum_sent": {"seconds": 1.00084, "bytes": 1300234240, "bits_per_second": 10393143679.309381, "retransmits": 4,
                 "sender": True},
    "sum_received": {"seconds": 1.00093, "bytes": 1299972096, "bits_per_second": 10390040576.0, "sender": True}}})
IPERF3_REFUSED = json.dumps({"start": {}, "intervals": [], "end": {},
                             "error": "unable to connect to server: Connection refused"})


def netdev(root, name, speed=None, mtu=1500, operstate="up", device=True, kind_type=1, slaves=None):
    """One /sys/class/net/NAME: ``speed`` None leaves the file unreadable (EINVAL stands in: a folder)."""
    base = root / "class" / "net" / name
    base.mkdir(parents=True)
    if speed is None:
        (base / "speed").mkdir()  # reading it fails with an OSError, as EINVAL does on a veth
    else:
        (base / "speed").write_text("%s\n" % speed)
    (base / "mtu").write_text("%d\n" % mtu)
    (base / "operstate").write_text(operstate + "\n")
    (base / "type").write_text("%d\n" % kind_type)
    if device:
        (base / "device").mkdir()
    if slaves is not None:
        (base / "bonding").mkdir()
        (base / "bonding" / "slaves").write_text(" ".join(slaves) + "\n")
    return base


def roce(root, device, netdev_name, gids):
    """/sys/class/infiniband/DEVICE/ports/1 with GIDs [(index, gid, type)] on ``netdev_name``."""
    port = root / "class" / "infiniband" / device / "ports" / "1"
    for sub in ("gids", "gid_attrs/ndevs", "gid_attrs/types"):
        (port / sub).mkdir(parents=True, exist_ok=True)
    for index, gid, kind in gids:
        (port / "gids" / str(index)).write_text(gid + "\n")
        (port / "gid_attrs" / "ndevs" / str(index)).write_text(netdev_name + "\n")
        (port / "gid_attrs" / "types" / str(index)).write_text(kind + "\n")


# -- parsing ----------------------------------------------------------------------------------------------------

def test_route_get_names_the_interface_and_knows_a_local_address():
    assert ml.parse_route_get(ROUTE_DIRECT) == {
        "dev": "enp1s0f0np0", "src": "192.168.100.10", "gateway": "", "local": False}
    assert ml.parse_route_get(ROUTE_GATEWAY)["gateway"] == "192.168.1.1"
    assert ml.parse_route_get(ROUTE_LOCAL) == {"dev": "lo", "src": "127.0.0.1", "gateway": "", "local": True}
    with pytest.raises(ValueError, match="no route"):
        ml.parse_route_get("[]")


def test_default_route_interfaces_single_and_multipath():
    assert ml.parse_default_devs(DEFAULTS) == ["enP7s7"]
    assert ml.parse_default_devs(DEFAULTS_MULTIPATH) == ["eth0", "eth1"]
    assert ml.parse_default_devs("[]") == []


def test_addresses_and_their_owner():
    assert ml.parse_addr_owner(ADDRS, "192.168.100.11") == "enp1s0f0np0"
    assert ml.parse_addr_owner(ADDRS, "fd00:0::11") == "enp1s0f0np0"
    assert ml.parse_addr_owner(ADDRS, "10.9.9.9") is None
    # Global addresses only, IPv4 first: the one a fix proposes.
    assert ml.parse_addresses(ADDRS)["enp1s0f0np0"] == ["192.168.100.11", "fd00::11"]
    assert ml.parse_addresses(ADDRS)["lo"] == []


def test_ethtool_speed_known_and_unknown():
    assert ml.parse_ethtool_speed(ETHTOOL_200G) == 200000
    assert ml.parse_ethtool_speed(ETHTOOL_UNKNOWN) is None
    assert ml.parse_ethtool_speed("") is None


def test_rdma_link_lists_each_port_with_its_netdev():
    assert ml.parse_rdma_link(RDMA_LINK) == [
        {"device": "rocep1s0f0", "port": 1, "state": "ACTIVE", "netdev": "enp1s0f0np0"},
        {"device": "rocep1s0f1", "port": 1, "state": "DOWN", "netdev": "enp1s0f1np1"}]


def test_ethernet_port_from_sysfs(tmp_path):
    netdev(tmp_path, "enp1s0f0np0", speed=200000, mtu=9000)
    facts = ml.interface_facts(str(tmp_path / "class" / "net"), "enp1s0f0np0")
    assert facts == {"name": "enp1s0f0np0", "kind": "physical", "speed_mbps": 200000, "speed_source": "sysfs",
                     "mtu": 9000, "operstate": "up", "slaves": []}


def test_physical_port_without_sysfs_speed_asks_ethtool(tmp_path):
    netdev(tmp_path, "enp1s0f0np0", speed=-1, mtu=9000)
    asked = []
    facts = ml.interface_facts(str(tmp_path / "class" / "net"), "enp1s0f0np0",
                               lambda name: asked.append(name) or ETHTOOL_200G)
    assert asked == ["enp1s0f0np0"]
    assert (facts["speed_mbps"], facts["speed_source"]) == (200000, "ethtool")


def test_veth_reports_no_speed_and_is_not_guessed(tmp_path):
    netdev(tmp_path, "veth0", speed=None, device=False)
    netdev(tmp_path, "veth1", speed=-1, device=False)
    for name in ("veth0", "veth1"):
        facts = ml.interface_facts(str(tmp_path / "class" / "net"), name, lambda n: pytest.fail("ethtool asked"))
        assert (facts["kind"], facts["speed_mbps"], facts["speed_source"]) == ("virtual", None, "none")


def test_bond_adds_up_its_slaves_that_are_up(tmp_path):
    netdev(tmp_path, "bond0", speed=None, mtu=9000, device=False, slaves=["enp1s0f0np0", "enp1s0f1np1", "eth9"])
    netdev(tmp_path, "enp1s0f0np0", speed=200000, mtu=9000)
    netdev(tmp_path, "enp1s0f1np1", speed=200000, mtu=9000)
    netdev(tmp_path, "eth9", speed=-1, mtu=9000, operstate="down")
    facts = ml.interface_facts(str(tmp_path / "class" / "net"), "bond0")
    assert (facts["kind"], facts["speed_mbps"], facts["speed_source"]) == ("bond", 400000, "slaves")
    assert [(s["name"], s["speed_mbps"], s["operstate"]) for s in facts["slaves"]] == [
        ("enp1s0f0np0", 200000, "up"), ("enp1s0f1np1", 200000, "up"), ("eth9", None, "down")]


def test_loopback_is_recognised(tmp_path):
    netdev(tmp_path, "lo", speed=None, mtu=65536, operstate="unknown", device=False, kind_type=772)
    facts = ml.interface_facts(str(tmp_path / "class" / "net"), "lo")
    assert (facts["kind"], facts["speed_mbps"], facts["mtu"]) == ("loopback", None, 65536)


def test_roce_device_on_the_port_gives_the_address_v2_gid_first(tmp_path):
    roce(tmp_path, "rocep1s0f0", "enp1s0f0np0", [
        (0, "fe80:0000:0000:0000:0000:0000:0000:0001", "IB/RoCE v1"),
        (1, "fe80:0000:0000:0000:0000:0000:0000:0001", "RoCE v2"),
        (2, "0000:0000:0000:0000:0000:ffff:c0a8:640b", "IB/RoCE v1"),
        (3, "0000:0000:0000:0000:0000:ffff:c0a8:640b", "RoCE v2")])
    roce(tmp_path, "rocep1s0f1", "enp1s0f1np1", [(3, "0000:0000:0000:0000:0000:ffff:0a00:0001", "RoCE v2")])
    found = ml.rdma_on(str(tmp_path / "class" / "infiniband"), "enp1s0f0np0", "192.168.100.11")
    assert found == [{"device": "rocep1s0f0", "port": 1, "gid_index": 3,
                      "gid": "0000:0000:0000:0000:0000:ffff:c0a8:640b", "type": "RoCE v2", "matches_address": True}]


def test_no_roce_device_on_the_port(tmp_path):
    roce(tmp_path, "rocep1s0f1", "enp1s0f1np1", [(3, "0000:0000:0000:0000:0000:ffff:0a00:0001", "RoCE v2")])
    assert ml.rdma_on(str(tmp_path / "class" / "infiniband"), "enp1s0f0np0", "192.168.100.11") == []
    assert ml.rdma_on(str(tmp_path / "absent"), "enp1s0f0np0", "192.168.100.11") == []


def test_iperf3_report_and_its_error():
    assert ml.parse_iperf3(IPERF3) == {"gbit_s": 10.39, "mean_rtt_ms": 0.255, "retransmits": 4, "seconds": 1.0}
    with pytest.raises(ValueError, match="Connection refused"):
        ml.parse_iperf3(IPERF3_REFUSED)


def spark_sysfs(root, qsfp_mtu=9000, rdma=True):
    netdev(root, "lo", speed=None, mtu=65536, operstate="unknown", device=False, kind_type=772)
    netdev(root, "enP7s7", speed=1000, mtu=1500)
    netdev(root, "enp1s0f0np0", speed=200000, mtu=qsfp_mtu)
    netdev(root, "wlP9s9", speed=None, mtu=1500, operstate="down")
    if rdma:
        roce(root, "rocep1s0f0", "enp1s0f0np0", [(3, "0000:0000:0000:0000:0000:ffff:c0a8:640b", "RoCE v2")])


def fake_run(outputs):
    def run(argv):
        key = " ".join(argv)
        return outputs[key] if key in outputs else (1, "", "unexpected %s" % key)
    return run


def test_gather_on_a_worker_finds_the_port_holding_its_address(tmp_path):
    spark_sysfs(tmp_path)
    found = ml.gather(fake_run({"ip -j addr show": (0, ADDRS, ""), "ip -j route show default": (0, DEFAULTS, ""),
                                "ethtool enP7s7": (0, "", "")}),
                      local_address="192.168.100.11", sysfs_net=str(tmp_path / "class/net"),
                      sysfs_ib=str(tmp_path / "class/infiniband"))
    assert found["interface"]["name"] == "enp1s0f0np0"
    assert found["interface"]["addresses"] == ["192.168.100.11", "fd00::11"]
    assert found["default_devs"] == ["enP7s7"]
    assert [i["name"] for i in found["interfaces"]] == ["enP7s7", "enp1s0f0np0"]  # up, loopback aside
    assert found["rdma"][0]["device"] == "rocep1s0f0"


def test_gather_without_sysfs_rdma_asks_rdma_link(tmp_path):
    spark_sysfs(tmp_path, rdma=False)
    found = ml.gather(fake_run({"ip -j addr show": (0, ADDRS, ""), "ip -j route show default": (0, DEFAULTS, ""),
                                "rdma link": (0, RDMA_LINK, "")}),
                      local_address="192.168.100.11", sysfs_net=str(tmp_path / "class/net"),
                      sysfs_ib=str(tmp_path / "class/infiniband"))
    assert [r["device"] for r in found["rdma"]] == ["rocep1s0f0"]
    assert found["rdma_source"] == "rdma link"


def test_gather_reports_an_address_no_interface_holds(tmp_path):
    spark_sysfs(tmp_path)
    with pytest.raises(ValueError, match="no interface of this host holds 10.9.9.9"):
        ml.gather(fake_run({"ip -j addr show": (0, ADDRS, "")}), local_address="10.9.9.9",
                  sysfs_net=str(tmp_path / "class/net"))


# /proc/net on a Spark without iproute2 (the shapes captured on this machine, with a Spark's addresses): the
# management port carries the default route, the QSFP port its /24, IPv6 on the QSFP port.
PROC_ROUTE = ("Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
              "enP7s7\t00000000\t0101A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
              "enP7s7\t0001A8C0\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0\n"
              "enp1s0f0np0\t0064A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n")
PROC_IPV6_ROUTE = (
    "fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 "
    "00000100 00000001 00000000 00000001  enp1s0f0np0\n"
    "00000000000000000000000000000001 80 00000000000000000000000000000000 00 00000000000000000000000000000000 "
    "00000000 00000002 00000000 80200001       lo\n"
    "00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 "
    "ffffffff 00000001 00000000 00200200       lo\n")
PROC_IF_INET6 = ("00000000000000000000000000000001 01 80 10 80       lo\n"
                 "fe800000000000000000000000000001 03 40 20 80 enp1s0f0np0\n"
                 "fd000000000000000000000000000011 03 40 00 80 enp1s0f0np0\n")
IPV4 = {"lo": "127.0.0.1", "enP7s7": "192.168.1.21", "enp1s0f0np0": "192.168.100.11"}


def proc_net(root):
    base = root / "proc-net"
    base.mkdir()
    (base / "route").write_text(PROC_ROUTE)
    (base / "ipv6_route").write_text(PROC_IPV6_ROUTE)
    (base / "if_inet6").write_text(PROC_IF_INET6)
    return str(base)


def no_ip(outputs):
    """A node without iproute2: ``ip`` (and ``rdma``) are not found, as link_info's run says (rc 127)."""
    inner = fake_run(outputs)

    def run(argv):
        return (127, "", "%s not found" % argv[0]) if argv[0] in ("ip", "rdma") else inner(argv)
    return run


def test_proc_net_routes_defaults_and_ipv6_addresses():
    routes = ml.parse_proc_route(PROC_ROUTE)
    assert [(r["dev"], str(r["dst"]), r["gateway"]) for r in routes] == [
        ("enP7s7", "0.0.0.0/0", "192.168.1.1"), ("enP7s7", "192.168.1.0/24", ""),
        ("enp1s0f0np0", "192.168.100.0/24", "")]
    assert [(r["dev"], str(r["dst"])) for r in ml.parse_proc_ipv6_route(PROC_IPV6_ROUTE)] == [
        ("enp1s0f0np0", "fd00::/64")]  # lo's entries (local, unreachable) are not routes to a peer
    assert ml.parse_if_inet6(PROC_IF_INET6) == [
        ("lo", "::1", "host"), ("enp1s0f0np0", "fe80::1", "link"), ("enp1s0f0np0", "fd00::11", "global")]


def test_without_ip_a_worker_finds_its_port_from_proc_and_sysfs(tmp_path):
    spark_sysfs(tmp_path)
    sysfs_net = str(tmp_path / "class/net")
    proc = ml.ProcReader(sysfs_net, proc_net(tmp_path), ipv4=IPV4.get, source=lambda peer: "192.168.100.10")
    found = ml.gather(no_ip({"ethtool enP7s7": (0, "", "")}), local_address="192.168.100.11", sysfs_net=sysfs_net,
                      sysfs_ib=str(tmp_path / "class/infiniband"), proc=proc)
    assert found["source"] == "read from /proc/net and sysfs: no ip command on this node"
    assert (found["interface"]["name"], found["interface"]["speed_mbps"], found["interface"]["mtu"]) == (
        "enp1s0f0np0", 200000, 9000)
    assert found["interface"]["addresses"] == ["192.168.100.11", "fd00::11"]
    assert found["default_devs"] == ["enP7s7"]
    assert found["rdma"][0]["device"] == "rocep1s0f0"
    # With ip the same node reads the same (the captured `ip -j` outputs).
    with_ip = ml.gather(fake_run({"ip -j addr show": (0, ADDRS, ""), "ip -j route show default": (0, DEFAULTS, ""),
                                  "ethtool enP7s7": (0, "", "")}), local_address="192.168.100.11",
                        sysfs_net=sysfs_net, sysfs_ib=str(tmp_path / "class/infiniband"))
    assert {k: v for k, v in found.items() if k != "source"} == {k: v for k, v in with_ip.items() if k != "source"}


def test_without_ip_the_head_routes_by_the_longest_prefix_and_knows_its_own_address(tmp_path):
    spark_sysfs(tmp_path)
    sysfs_net = str(tmp_path / "class/net")
    proc = ml.ProcReader(sysfs_net, proc_net(tmp_path), ipv4=IPV4.get, source=lambda peer: "192.168.100.10")
    run = no_ip({"ethtool enP7s7": (0, "", "")})
    fast = ml.gather(run, peer="192.168.100.12", sysfs_net=sysfs_net, proc=proc)
    assert fast["route"] == {"dev": "enp1s0f0np0", "src": "192.168.100.10", "gateway": "", "local": False}
    far = ml.gather(run, peer="10.1.2.3", sysfs_net=sysfs_net, proc=proc)
    assert far["route"]["dev"] == "enP7s7" and far["route"]["gateway"] == "192.168.1.1"
    assert far["interface"]["speed_mbps"] == 1000
    # The head and the worker on one host (the demo): loopback, as `ip route get` says.
    for own in ("127.0.0.1", "192.168.100.11", "fd00::11"):
        assert ml.gather(run, peer=own, sysfs_net=sysfs_net, proc=proc)["route"]["local"] is True, own
    with pytest.raises(ValueError, match=r"no interface of this host holds 10.9.9.9 \(read from /proc/net and "
                                         r"sysfs: no ip command on this node: only each interface's first IPv4"):
        ml.gather(run, local_address="10.9.9.9", sysfs_net=sysfs_net, proc=proc)


def test_module_without_the_ip_command_reads_proc_on_this_machine(monkeypatch):
    """link_info on a node without iproute2 (ip hidden from the module's lookup, which also searches sbin):
    this machine's real /proc/net, sysfs and kernel answer; loopback and this host's own address are local."""
    import ansible.module_utils.basic as basic
    real = basic.get_bin_path

    def hide_ip(arg, *args, **kwargs):
        if arg == "ip":
            raise ValueError("Failed to find required executable 'ip'")
        return real(arg, *args, **kwargs)

    monkeypatch.setattr(basic, "get_bin_path", hide_ip)
    result = run_module(link_info.main, {"peer": "127.0.0.1"}, check_mode=True)
    assert result.get("failed") is not True, result
    assert result["source"] == "read from /proc/net and sysfs: no ip command on this node"
    assert result["route"]["local"] is True and result["interface"]["kind"] == "loopback"
    worker = run_module(link_info.main, {"local_address": "127.0.0.1"})
    assert worker["held"] is True and worker["interface"]["name"] == "lo"
    absent = run_module(link_info.main, {"local_address": "192.0.2.254"})
    assert absent["failed"] is True and absent["msg"].startswith("no interface of this host holds 192.0.2.254 (read")


def test_module_reports_an_address_this_node_lacks_only_for_a_what_if():
    """missing_ok (a what-if plan): reported as not held; without it (a deploying run) refused."""
    what_if = run_module(link_info.main, {"local_address": "192.0.2.254", "missing_ok": True})
    assert what_if.get("failed") is not True and what_if["held"] is False
    assert what_if["msg"] == "no interface of this host holds 192.0.2.254"
    deploy = run_module(link_info.main, {"local_address": "192.0.2.254"})
    assert deploy["failed"] is True and deploy["msg"] == "no interface of this host holds 192.0.2.254"


def test_module_routes_a_real_address_over_a_captured_sysfs(tmp_path):
    """link_info through AnsibleModule: the kernel's real route to 127.0.0.1 (lo), described from a sysfs tree."""
    netdev(tmp_path, "lo", speed=None, mtu=65536, operstate="unknown", device=False, kind_type=772)
    result = run_module(link_info.main, {"peer": "127.0.0.1", "sysfs_root": str(tmp_path)}, check_mode=True)
    assert result["changed"] is False
    assert result["route"]["local"] is True
    assert (result["interface"]["name"], result["interface"]["kind"]) == ("lo", "loopback")


def test_module_refuses_a_name_that_does_not_resolve():
    result = run_module(link_info.main, {"peer": "no-such-host.invalid"})
    assert result["failed"] is True
    assert result["msg"].startswith("cannot resolve no-such-host.invalid")
    assert result["msg"].endswith("give the fast-link IP address")


def test_probe_module_measures_nothing_in_check_mode():
    assert run_module(link_probe.main, {"host": "127.0.0.1"}, check_mode=True)["skipped"] is True


# -- the verdict ------------------------------------------------------------------------------------------------

def end(name, speed, mtu, default=False, others=(), rdma=None, local=False, src="192.168.100.10"):
    """A link_info result: the link's interface plus the node's other up interfaces (name, speed, address)."""
    iface = {"name": name, "kind": "loopback" if local else "physical", "speed_mbps": speed, "mtu": mtu,
             "operstate": "up", "slaves": [], "addresses": []}
    interfaces = [dict(iface)] + [{"name": n, "kind": "physical", "speed_mbps": s, "mtu": 9000, "operstate": "up",
                                   "slaves": [], "addresses": [a]} for n, s, a in others]
    return {"route": {"dev": name, "src": src, "gateway": "", "local": local}, "interface": iface,
            "default_devs": [name] if default else ["enP7s7"], "interfaces": interfaces, "rdma": rdma or []}


ROCE = [{"device": "rocep1s0f0", "port": 1, "gid_index": 3, "gid": "::ffff:192.168.100.11", "type": "RoCE v2",
         "matches_address": True}]


def test_the_200g_port_at_mtu_9000_passes_and_rdma_is_chosen():
    pair = {"worker": "spark-2", "address": "192.168.100.11", "head": end("enp1s0f0np0", 200000, 9000),
            "end": end("enp1s0f0np0", 200000, 9000, rdma=ROCE), "probe": {"gbit_s": 94.2, "mean_rtt_ms": 0.05}}
    result = mlf.link_verdict([pair], 10, True, True)
    assert result["ok"] and result["message"] == ""
    assert result["pairs"][0]["rdma"]["device"] == "rocep1s0f0"
    assert result["table"].splitlines()[3].split() == [
        "spark-2", "192.168.100.11", "enp1s0f0np0", "200G", "mtu", "9000", "enp1s0f0np0", "200G", "mtu", "9000",
        "no", "94.2", "Gbit/s,", "rtt", "0.05", "ms", "rocep1s0f0", "gid", "3", "(RoCE", "v2)", "ok"]
    # A build without RDMA: off, with one line saying so, and no device for the server.
    off = mlf.link_verdict([pair], 10, True, False)
    assert off["pairs"][0]["rdma"] is None and "off (build without RDMA)" in off["table"]
    absent = dict(pair, end=end("enp1s0f0np0", 200000, 9000))
    assert "off (no RDMA device on enp1s0f0np0)" in mlf.link_verdict([absent], 10, True, True)["table"]


def test_the_management_port_is_refused_with_the_worker_fast_address():
    pair = {"worker": "spark-2", "address": "192.168.1.21",
            "head": end("enP7s7", 1000, 1500, default=True, others=[("enp1s0f0np0", 200000, "192.168.100.10")]),
            "end": end("enP7s7", 1000, 1500, default=True, others=[("enp1s0f0np0", 200000, "192.168.100.11")])}
    result = mlf.link_verdict([pair], 10, True)
    assert not result["ok"]
    assert result["message"] == (
        "RPC would ride a slow or mismatched link, so nothing is started. spark-2: the head's enP7s7 reports 1G, "
        "under 10 Gbit/s; the worker's enP7s7 reports 1G, under 10 Gbit/s; the head reaches 192.168.1.21 over "
        "enP7s7, its default route, while enp1s0f0np0 200G mtu 9000 is faster. Fix: put fast_link_address: "
        "192.168.100.11 for spark-2 (its address on enp1s0f0np0, 200G); for a lab link, lower link_min_gbit "
        "(now 10) or set link_enforce: false.")
    assert "REFUSED" in result["table"]


def test_a_slow_probe_is_refused_even_when_the_speed_is_unknown():
    pair = {"worker": "w", "address": "172.30.1.3", "head": end("eth1", None, 1500), "end": end("eth1", None, 1500),
            "probe": {"gbit_s": 0.0953, "mean_rtt_ms": 2.1}}
    result = mlf.link_verdict([pair], 10, True)
    assert "iperf3 measured 0.0953 Gbit/s head -> worker, under 10 Gbit/s" in result["message"]
    assert "0.0953 Gbit/s, rtt 2.1 ms" in result["table"]
    # Two veths report no speed: the fix still names the worker's address on its other interface.
    veths = dict(pair, end=end("eth1", None, 1500, others=[("eth0", None, "172.30.0.3")]))
    assert ("Fix: put fast_link_address: 172.30.0.3 for w (its address on eth0, ?)"
            in mlf.link_verdict([veths])["message"])
    # The user lowers the threshold for a lab: it passes.
    assert mlf.link_verdict([pair], 0.05, True)["ok"]


def test_an_mtu_mismatch_is_refused_with_the_mtu_to_set():
    pair = {"worker": "spark-2", "address": "192.168.100.11", "head": end("enp1s0f0np0", 200000, 9000),
            "end": end("enp1s0f0np0", 200000, 1500)}
    result = mlf.link_verdict([pair], 10, True)
    assert "MTU 9000 on the head's enp1s0f0np0 but 1500 on the worker's enp1s0f0np0" in result["message"]
    assert "set MTU 9000 on both ends" in result["message"]


def test_loopback_passes_and_enforce_off_only_warns():
    local = {"worker": "localhost", "address": "127.0.0.1", "head": end("lo", None, 65536, local=True, src="127.0.0.1"),
             "end": end("lo", None, 65536, local=True)}
    result = mlf.link_verdict([local], 10, True, True)
    assert result["ok"] and "ok (loopback: same host)" in result["table"]
    assert result["pairs"][0]["rdma"] is None
    slow = {"worker": "w", "address": "10.0.0.2", "head": end("eth0", 1000, 1500), "end": end("eth0", 1000, 1500)}
    lab = mlf.link_verdict([slow], 10, False)
    assert lab["ok"] and lab["message"] == "" and lab["warnings"] == [
        "w: the head's eth0 reports 1G, under 10 Gbit/s; the worker's eth0 reports 1G, under 10 Gbit/s"]
    assert "slow (link_enforce off)" in lab["table"]


def test_a_pair_not_read_in_a_what_if_is_shown_as_not_checked_and_passes():
    why = ("no interface of this host holds 10.20.20.2 (a what-if: memory given per host, so the link is not needed "
           "for the plan; a deploying run refuses it)")
    absent = {"worker": "spark-2", "address": "10.20.20.2", "checked": False, "why": why}
    local = {"worker": "localhost", "address": "127.0.0.1", "head": end("lo", None, 65536, local=True, src="127.0.0.1"),
             "end": end("lo", None, 65536, local=True)}
    result = mlf.link_verdict([absent, local], 10, True, True)
    assert result["ok"] and result["message"] == "" and result["warnings"] == []
    assert result["unchecked"] == ["link not checked for spark-2 (10.20.20.2): " + why]
    row = result["table"].splitlines()[3].split()
    assert row[:2] == ["spark-2", "10.20.20.2"] and row[-2:] == ["not", "checked"]
    assert result["pairs"][0]["rdma"] is None and result["pairs"][1]["checked"] is True


# -- the firewall admits the probe's port from the head only ---------------------------------------------------

def test_firewall_jumps_for_the_rpc_and_the_probe_port():
    plan = ms.rpc_firewall_plan("-P INPUT ACCEPT\n", [50052, 5201], ["10.20.20.1"])
    assert plan == (
        "*filter\n:MINIMAX-RPC - [0:0]\n-A MINIMAX-RPC -s 10.20.20.1/32 -j ACCEPT\n-A MINIMAX-RPC -j DROP\n"
        "-I INPUT 1 -p tcp -m tcp --dport 50052 -j MINIMAX-RPC\n-I INPUT 1 -p tcp -m tcp --dport 5201 -j MINIMAX-RPC\n"
        "COMMIT\n")
    in_place = ("-P INPUT ACCEPT\n-N MINIMAX-RPC\n-A INPUT -p tcp -m tcp --dport 5201 -j MINIMAX-RPC\n"
                "-A INPUT -p tcp -m tcp --dport 50052 -j MINIMAX-RPC\n-A MINIMAX-RPC -s 10.20.20.1/32 -j ACCEPT\n"
                "-A MINIMAX-RPC -j DROP\n")
    assert ms.rpc_firewall_plan(in_place, [50052, 5201], ["10.20.20.1"]) == ""
    # The probe port switched off (0 is left out by worker_rpc): its jump goes.
    assert ms.rpc_firewall_plan(in_place, [50052], ["10.20.20.1"]) == (
        "*filter\n-D INPUT -p tcp -m tcp --dport 5201 -j MINIMAX-RPC\nCOMMIT\n")
    start = ms.rpc_firewall_start_commands([50052, 5201], {"ipv4": "/etc/x.rules"})[0][2]
    assert "--dport 50052 -j MINIMAX-RPC" in start and "--dport 5201 -j MINIMAX-RPC" in start


# -- bench.yml reports the link beside decode -------------------------------------------------------------------

def test_bench_report_shows_each_link_in_summary_json_and_plot(tmp_path):
    from ansible.module_utils.minimax_spark_bench_report import write_report
    links = [{"worker": "spark-2", "address": "192.168.100.11", "interface": "enp1s0f0np0", "gbit_s": 94.214,
              "mean_rtt_ms": 0.052, "retransmits": 0, "seconds": 10.0}]
    setups = [{"name": "deployed", "settings": {}, "rows": [{"depth": 0, "pp": 500.0, "tg": 10.5}]}]
    plain = write_report(str(tmp_path / "plain"), [dict(s) for s in setups], roofline=20.0, meta={})
    paths = write_report(str(tmp_path / "out"), setups, roofline=20.0, meta={"links": links})
    summary = open(paths["summary"]).read()
    assert "- link head -> spark-2 (192.168.100.11): 94.21 Gbit/s, rtt 0.052 ms over 10 s (iperf3)" in summary
    assert json.loads(open(paths["json"]).read())["links"] == links
    assert "link head" not in open(plain["summary"]).read()
    assert open(paths["plot"], "rb").read() != open(plain["plot"], "rb").read()  # the text beside decode


# -- the transport each connection negotiated, from ggml-rpc-server's own log -------------------------------------

RPC_LOG = """Starting RPC server v7.0.0
  endpoint       : 10.0.0.2:50052
  transport      : TCP
Accepted client connection
Client connection closed
Starting RPC server v7.0.0
  endpoint       : 10.0.0.2:50052
  local cache    : /var/lib/minimax-spark/rpc-cache
  transport      : TCP (RDMA auto-negotiate enabled)
Accepted client connection
RDMA probed: dev=rocep1s0f0 gid=3 (RoCEv2) qpn=1234 inline=220
RDMA activated: qpn=1234->99 mtu=4096 rx_depth=32
Client connection closed
Accepted client connection
RDMA activate failed, staying on TCP
"""


def test_rpc_transports_read_from_the_server_log_since_its_last_start():
    env = {"GGML_RDMA_DEV": "rocep1s0f0", "GGML_RDMA_GID": "3"}
    found = mlf.rpc_transports(RPC_LOG, "spark-2", True, env)
    assert found["connections"] == ["RDMA", "TCP"] and found["rdma_enabled"] is True
    assert found["line"] == "spark-2: llama.cpp negotiated RDMA on 1 of 2 connection(s) (rocep1s0f0 gid 3)"
    first_start = RPC_LOG.split("Starting RPC server")[1]
    assert mlf.rpc_transports(first_start, "spark-2", True, env)["line"] == (
        "spark-2: TCP on 1 connection(s); RDMA off: build without RDMA")
    assert mlf.rpc_transports(first_start, "w", True, {})["line"] == (
        "w: TCP on 1 connection(s); RDMA off: build without RDMA")
    assert mlf.rpc_transports("Starting RPC server\n  transport      : TCP (RDMA auto-negotiate enabled)\n"
                              "Accepted client connection\n", "w", True, {})["line"] == (
        "w: TCP on 1 connection(s); RDMA off: no RDMA device on the link")
    assert mlf.rpc_transports("", "w")["line"] == "w: no connection yet in the RPC server's log"


def test_probe_module_names_iperf3s_exit_and_output_when_it_gives_no_result(tmp_path, monkeypatch):
    """iperf3 3.12 can exit 0 with -J and a report without its sums: the failure shows what it printed."""
    stand_in_iperf3(tmp_path, monkeypatch, ('{"start": {"version": "iperf 3.12"}, "intervals": [], "end": {}}\n', ""),
                    ("", ""))
    result = run_module(link_probe.main, {"host": "192.0.2.7", "seconds": 1})
    assert result["failed"] is True
    assert result["msg"] == ('iperf3 to 192.0.2.7:5201 failed: iperf3 gave no result (exit 0; its output ends: '
                             '{"start": {"version": "iperf 3.12"}, "intervals": [], "end": {}})')
    empty = run_module(link_probe.main, {"host": "192.0.2.7", "seconds": 1})
    assert empty["msg"] == "iperf3 to 192.0.2.7:5201 failed: iperf3 gave no result (exit 0; its output is empty)"


def stand_in_iperf3(tmp_path, monkeypatch, *replies):
    """An iperf3 on PATH that answers its Nth run with replies[N-1] (stdout, stderr) and counts its runs."""
    for n, (out, err) in enumerate(replies, 1):
        (tmp_path / ("out%d" % n)).write_text(out)
        (tmp_path / ("err%d" % n)).write_text(err)
    fake = tmp_path / "iperf3"
    fake.write_text('#!/bin/sh\nd=%s\necho x >> "$d/runs"\nn=$(wc -l < "$d/runs")\n'
                    'cat "$d/out$n"; cat "$d/err$n" >&2\nexit 0\n' % tmp_path)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (tmp_path, os.environ["PATH"]))
    return lambda: len((tmp_path / "runs").read_text().splitlines())


def test_a_client_run_that_reports_nothing_is_measured_again_with_a_warning_naming_it(tmp_path, monkeypatch,
                                                                                      capsys):
    """Seen twice under a loaded machine: iperf3 3.12's client exited 0 having printed nothing. With attempts 2 the
    second run measures; the first run's exit, stdout and stderr are returned and in a warning."""
    runs = stand_in_iperf3(tmp_path, monkeypatch, ("", "iperf3: some words\n"), (IPERF3, ""))
    result = run_module(link_probe.main, {"host": "192.0.2.7", "seconds": 1, "attempts": 2})
    assert runs() == 2
    assert not result.get("failed") and result["gbit_s"] == 10.39 and result["attempts"] == 2, result
    first = "iperf3 gave no result (exit 0; its output is empty; on stderr: iperf3: some words)"
    assert result["retried"] == [first]
    # The warning: in the result as on a node (ansible-core 2.19: a summary whose event holds the message), or
    # shown at once where this test process has loaded Ansible's controller (other tests import its plugins).
    warning = "iperf3 to 192.0.2.7:5201, run 1 of 2: %s; measuring again" % first
    returned = [w["event"]["msg"] if isinstance(w, dict) else w for w in result.get("warnings", [])]
    assert returned == [warning] or (returned == [] and warning in " ".join(capsys.readouterr().err.split()))


def test_without_attempts_left_a_run_that_reports_nothing_fails_saying_so(tmp_path, monkeypatch):
    runs = stand_in_iperf3(tmp_path, monkeypatch, ("", ""), ("", "late words"), (IPERF3, ""))
    result = run_module(link_probe.main, {"host": "192.0.2.7", "seconds": 1, "attempts": 2})
    assert runs() == 2 and result["failed"] is True and result["attempts"] == 2
    assert result["retried"] == ["iperf3 gave no result (exit 0; its output is empty)"]
    assert result["msg"] == ("iperf3 to 192.0.2.7:5201 failed: iperf3 gave no result (exit 0; its output is empty; "
                             "on stderr: late words)")


def test_a_run_that_reports_an_error_is_not_run_again(tmp_path, monkeypatch):
    """Refused, timed out, busy: iperf3 said why, and another run would say it again after as long."""
    runs = stand_in_iperf3(tmp_path, monkeypatch, (IPERF3_REFUSED, ""), (IPERF3, ""))
    result = run_module(link_probe.main, {"host": "192.0.2.7", "seconds": 1, "attempts": 3})
    assert runs() == 1 and result["failed"] is True
    assert result["msg"].startswith("iperf3 to 192.0.2.7:5201 failed: unable to connect to server: Connection "
                                    "refused (exit 0; its output ends: ")
    bad = run_module(link_probe.main, {"host": "192.0.2.7", "attempts": 0})
    assert bad["msg"] == "port must be 1-65535, seconds and attempts at least 1 (got 5201, 3, 0)"
    assert runs() == 1
