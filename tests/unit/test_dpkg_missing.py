"""A rerun skips apt only for packages dpkg reports installed (filter minimax_dpkg_missing): a package that is
removed, left as configuration files only, unknown to dpkg or installed for another architecture is installed."""
import sys

from helpers import ROOT

sys.path.insert(0, str(ROOT / "filter_plugins"))
from minimax_packages import dpkg_missing  # noqa: E402

WANTED = ["cmake", "g++", "iperf3", "libgomp1", "tzdata"]


def test_everything_installed_leaves_nothing_to_install():
    lines = ["cmake amd64 install ok installed", "g++ amd64 install ok installed", "iperf3 amd64 install ok installed",
             "libgomp1 amd64 install ok installed", "tzdata all install ok installed"]
    assert dpkg_missing(WANTED, lines, "x86_64") == []


def test_a_removed_unknown_or_foreign_package_is_still_installed():
    lines = ["cmake amd64 deinstall ok config-files",  # removed, its configuration kept
             "g++ amd64 install ok installed",
             "libgomp1 arm64 install ok installed",  # another architecture's copy only
             "tzdata all install ok half-configured"]
    # iperf3: dpkg-query knows nothing of it (no line)
    assert dpkg_missing(WANTED, lines, "x86_64") == ["cmake", "iperf3", "libgomp1", "tzdata"]
    assert dpkg_missing(WANTED, lines, "aarch64") == ["cmake", "g++", "iperf3", "tzdata"]


def test_no_dpkg_output_means_every_package_is_installed_by_apt():
    assert dpkg_missing(WANTED, [], "x86_64") == WANTED
    assert dpkg_missing(WANTED, None, "x86_64") == WANTED
