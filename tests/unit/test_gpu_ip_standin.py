"""tests/gpu/ip.py, the stand-in tools/gpu-check puts on PATH where the GPU image has no iproute2: what the link
role reads from it (through module_utils/minimax_spark_link's parsers) is what it reads from iproute2's ip on
this host, and an invocation it does not know is refused rather than guessed."""
import shutil
import subprocess
import sys

import pytest

from helpers import ROOT

sys.path.insert(0, str(ROOT / "module_utils"))
import minimax_spark_link as link  # noqa: E402

STANDIN = [sys.executable, str(ROOT / "tests" / "gpu" / "ip.py")]
needs_ip = pytest.mark.skipif(shutil.which("ip") is None, reason="iproute2's ip is not installed here")


def both(*args):
    real = subprocess.run(["ip", *args], capture_output=True, text=True)
    mine = subprocess.run(STANDIN + list(args), capture_output=True, text=True)
    assert mine.returncode == real.returncode, (mine.stderr, real.stderr)
    return real.stdout, mine.stdout


@needs_ip
def test_the_addresses_and_the_owner_of_each_address_match_iproute2():
    real, mine = both("-j", "addr", "show")
    assert link.parse_addresses(mine) == link.parse_addresses(real)
    for addresses in link.parse_addresses(real).values():
        for address in addresses + ["127.0.0.1"]:
            assert link.parse_addr_owner(mine, address) == link.parse_addr_owner(real, address)


@needs_ip
def test_routes_to_loopback_to_this_hosts_address_and_away_match_iproute2():
    own = [a for addresses in link.parse_addresses(both("-j", "addr", "show")[0]).values() for a in addresses]
    for peer in ["127.0.0.1", "::1", "192.0.2.77", "203.0.113.9"] + own:
        real, mine = both("-j", "route", "get", peer)
        if real:
            assert link.parse_route_get(mine) == link.parse_route_get(real), peer
    real, mine = both("-j", "route", "show", "default")
    assert link.parse_default_devs(mine) == link.parse_default_devs(real)


def test_a_loopback_route_is_local_over_lo_without_iproute2():
    out = subprocess.run(STANDIN + ["-j", "route", "get", "127.0.0.1"], capture_output=True, text=True, check=True)
    assert link.parse_route_get(out.stdout) == {"dev": "lo", "src": "127.0.0.1", "gateway": "", "local": True}


def test_what_the_standin_does_not_know_is_refused_with_what_it_knows():
    out = subprocess.run(STANDIN + ["link", "set", "eth0", "down"], capture_output=True, text=True)
    assert out.returncode == 2 and out.stdout == ""
    assert "'ip link set eth0 down' is not supported; it answers '-j addr show'" in out.stderr
