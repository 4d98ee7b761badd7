#!/usr/bin/env python3
"""Benchmark hf_download against the fake Hub (not a test).

1. capped:   each CDN connection limited to --cap-mbps; 1 connection vs --connections connections.
             Shows what parallel ranges buy against a CDN that throttles each connection.
2. uncapped: the same module over loopback with --connections connections, no cap.
             Compared with a dd-style write (+fsync) of the same size and a sha256 pass, and with the
             process CPU time of the downloader and of the fake Hub, to say whether it was disk- or CPU-bound:
             disk-bound when the download reaches DISK_RATIO of the dd figure (or the disk was busy most of
             the time, or the downloader used well under one core while the cores were not saturated);
             CPU-bound when the downloader used about a core or more, or the cores were saturated.

The download and the dd reference write into memory in the same state: right before each, a scratch file
of the same size is written and deleted (--no-warm-up turns this off). In a VM whose memory the host backs
lazily (a balloon's free page reporting), writing into pages the guest freed seconds ago costs several
times the CPU of writing into pages it just freed, and the two measurements would not compare like with like.
--settle 5 waits after each warm-up instead, so that both write into memory the host took back (cold).

Bounded: the defaults move about 64 MB (capped, twice) + 256 MB (uncapped), write 256 MB three times more
(dd twice, warm-ups) and take well under a minute.

    .venv/bin/python tests/support/bench_download.py [--workdir /var/tmp] [--uncapped-mb 256]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MB = 1_000_000
DISK_RATIO = 0.85  # a download at this share of the dd write+fsync rate is as fast as the disk path allows
LIGHT_CPU = 0.6  # cores: a downloader using fewer is not what limits the rate
BUSY_CPU = 0.9  # cores: a downloader using this many (Python threads, one hashing) is CPU-bound
SATURATED = 0.85  # share of all cores kept busy (downloader + fake Hub) that means the machine is CPU-bound
RUNNER = """
import json, sys
import ansible.module_utils
ansible.module_utils.__path__.append(%(module_utils)r)
sys.path.insert(0, %(library)r)
from ansible.module_utils.testing import patch_module_args
import hf_download
with patch_module_args(json.load(open(sys.argv[1]))):
    hf_download.main()
"""


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", default=None, help="where the test files go (the disk being measured)")
    parser.add_argument("--capped-mb", type=int, default=32, help="file size of the capped runs (MB)")
    parser.add_argument("--cap-mbps", type=float, default=2.0, help="per-connection cap of the capped runs (MB/s)")
    parser.add_argument("--uncapped-mb", type=int, default=256, help="file size of the uncapped run (MB)")
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--part-mb", type=float, default=None, help="part_size in MB (default: size/connections/4)")
    parser.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                        help="do not write and delete a scratch file before the uncapped download and each dd")
    parser.add_argument("--settle", type=float, default=0.0,
                        help="seconds to wait after each warm-up (5 or more: both steps write into cold VM memory)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    return parser.parse_args()


class Hub:
    """The fake Hub CLI in its own process, so its CPU time is not counted as the downloader's."""

    def __init__(self, root, extra=()):
        port_file = Path(root) / ".port"
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "support" / "fakehub.py"), "--root", str(root),
             "--repo", "bench/model", "--port-file", str(port_file), *extra],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while not port_file.exists() or not port_file.read_text().strip():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise SystemExit("fake Hub did not start")
            time.sleep(0.05)
        self.url = "http://127.0.0.1:%s" % port_file.read_text().strip()
        self.pid = self.proc.pid
        # The fake Hub hashes a file the first time it lists it (the real Hub has its sha256 ready): list the
        # repo once now, so neither the download's wall time nor the Hub's CPU time counts that hashing.
        tree = self.url + "/api/models/bench/model/tree/main?recursive=true"
        with urllib.request.urlopen(tree, timeout=300) as answer:
            answer.read()

    def cpu_seconds(self):
        with open("/proc/%d/stat" % self.pid) as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)


def make_repo(root, size_mb):
    (root / "Q").mkdir(parents=True)
    path = root / "Q" / "bench.gguf"
    block = os.urandom(4 * MB)
    with open(path, "wb") as handle:
        for _ in range(size_mb // 4):
            handle.write(block[:-1] + bytes([_ % 256]))  # not one repeated block: defeats dedup
        handle.write(os.urandom((size_mb % 4) * MB))
        handle.flush()
        os.fsync(handle.fileno())  # its write-back must not compete with the download being measured
    return path


def disk_ticks(path):
    """Milliseconds the block device holding path has spent doing I/O (None when not a plain block device)."""
    st = os.stat(path)
    stat = Path("/sys/dev/block/%d:%d/stat" % (os.major(st.st_dev), os.minor(st.st_dev)))
    try:
        return int(stat.read_text().split()[9])
    except (OSError, IndexError, ValueError):
        return None


def run_download(hub, dest, connections, part_size, workdir, warm_mb=0, settle=0.0):
    """Run the module in a child process; (result, wall seconds, child CPU seconds)."""
    args = {
        "repo": "bench/model",
        "include": ["Q/*.gguf"],
        "dest": str(dest),
        "endpoint": hub.url,
        "connections": connections,
        "part_size": part_size,
        "verify_cache": False,
    }
    args_file = Path(workdir) / "args.json"
    args_file.write_text(json.dumps(args))
    runner = Path(workdir) / "runner.py"
    runner.write_text(RUNNER % {"module_utils": str(ROOT / "module_utils"), "library": str(ROOT / "library")})
    if warm_mb:
        warm_up(Path(workdir) / "warm-up.bin", warm_mb, settle)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    out = subprocess.run([sys.executable, str(runner), str(args_file)], capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = json.loads(out.stdout)
    if result.get("failed"):
        raise SystemExit("download failed: %s" % result["msg"])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return result, wall, cpu


def warm_up(path, size_mb, settle=0.0):
    """Write (no fsync) and delete size_mb of data: the next step writes into memory the guest just freed."""
    block = bytes(8 * MB)
    with open(path, "wb", buffering=0) as handle:
        for _ in range(-(-size_mb // 8)):
            handle.write(block)
    os.unlink(path)
    time.sleep(settle)


def dd_write(path, size_mb, warm=True, settle=0.0):
    """Write size_mb of data in 8 MB blocks and fsync (what the download has to put on disk)."""
    block = os.urandom(8 * MB)
    if warm:
        warm_up(path, size_mb, settle)
    started = time.monotonic()
    with open(path, "wb", buffering=0) as handle:
        left = size_mb * MB
        while left:
            left -= handle.write(block[: min(len(block), left)])
        os.fsync(handle.fileno())
    seconds = time.monotonic() - started
    os.unlink(path)
    return size_mb * MB / seconds


def sha256_rate(path):
    digest = hashlib.sha256()
    started = time.process_time()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(8 << 20), b""):
            digest.update(block)
    return path.stat().st_size / max(time.process_time() - started, 1e-9)


def capped_runs(args, workdir):
    root = workdir / "capped-repo"
    make_repo(root, args.capped_mb)
    hub = Hub(root, ["--rate-cap", str(args.cap_mbps * MB)])
    try:
        figures = {}
        for conns in (1, args.connections):
            dest = workdir / ("capped-%d" % conns)
            part = int(args.part_mb * MB) if args.part_mb else max(1 << 20, args.capped_mb * MB // conns // 2)
            result, wall, cpu = run_download(hub, dest, conns, part, workdir)
            figures[conns] = result["throughput"] / MB
            shutil.rmtree(dest)
    finally:
        hub.stop()
    return figures


def uncapped_run(args, workdir):
    root = workdir / "uncapped-repo"
    source = make_repo(root, args.uncapped_mb)
    hub = Hub(root)
    try:
        dest = workdir / "uncapped"
        hub_cpu0 = hub.cpu_seconds()
        ticks0 = disk_ticks(workdir)
        part = int(args.part_mb * MB) if args.part_mb else max(1 << 20, args.uncapped_mb * MB // args.connections // 4)
        warm_mb = args.uncapped_mb if args.warm_up else 0
        result, wall, cpu = run_download(hub, dest, args.connections, part, workdir, warm_mb, args.settle)
        hub_cpu = hub.cpu_seconds() - hub_cpu0
        ticks1 = disk_ticks(workdir)
        shutil.rmtree(dest)
    finally:
        hub.stop()
    dd_runs = [dd_write(workdir / "dd.bin", args.uncapped_mb, args.warm_up, args.settle) / MB for _ in range(2)]
    figures = {
        "mb_per_s": result["throughput"] / MB,
        "wall_s": wall,
        "client_cpu_s": cpu,
        "disk_busy": (ticks1 - ticks0) / 1000.0 / wall if ticks0 is not None and ticks1 is not None else None,
        "hub_cpu_s": hub_cpu,
        "dd_mb_per_s": max(dd_runs),  # the better of two: the bar the download is held to
        "dd_runs_mb_per_s": dd_runs,
        "sha256_mb_per_s": sha256_rate(source) / MB,
        "cores": os.cpu_count(),
        "warm_up": args.warm_up,
        "settle_s": args.settle,
    }
    figures["dd_ratio"] = figures["mb_per_s"] / figures["dd_mb_per_s"]
    figures["client_cores"] = cpu / wall
    figures["busy_cores"] = (cpu + hub_cpu) / wall
    return figures


def verdict(u):
    """DISK-bound, CPU-bound or neither, with the figures that decided it.

    Disk-bound: the download reached DISK_RATIO of the dd write+fsync rate, or the disk was busy most of the
    time, or the downloader used well under one core while the cores were not saturated. CPU-bound: the
    downloader used about a core or more, or downloader + fake Hub saturated the cores.
    """
    ratio, client, busy, cores = u["dd_ratio"], u["client_cores"], u["busy_cores"], u["cores"]
    disk = "?" if u["disk_busy"] is None else "%.0f%%" % (100 * u["disk_busy"])
    figures = ("download at %.0f%% of dd write+fsync (%.0f of %.0f MB/s), downloader %.2f cores, "
               "downloader + fake Hub %.2f of %d cores, disk busy %s") % (
        100 * ratio, u["mb_per_s"], u["dd_mb_per_s"], client, busy, cores, disk)
    if ratio >= DISK_RATIO:
        return "DISK-bound: " + figures + "."
    if (u["disk_busy"] or 0) >= 0.8:
        return "DISK-bound (the device was busy most of the time): " + figures + "."
    if client >= BUSY_CPU or busy >= SATURATED * cores:
        return (
            "CPU-bound: %s; the cores, not the disk, set the rate (sha256 alone: %.0f MB/s on one core)."
            % (figures, u["sha256_mb_per_s"])
        )
    if client <= LIGHT_CPU:
        return (
            "DISK-bound (neither the downloader, at well under one core, nor the machine was CPU-saturated; on "
            "uncapped loopback what is left is the disk): " + figures + "."
        )
    return (
        "Neither disk nor CPU saturated: %s. The run is short enough that fixed costs (process start, listing, "
        "resolve, probe, the final fdatasync and hash tail) dominate." % figures
    )


def main():
    args = parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-hf-", dir=args.workdir))
    try:
        capped = capped_runs(args, workdir)
        uncapped = uncapped_run(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    one, many = capped[1], capped[args.connections]
    print("hf_download benchmark (fake Hub on loopback, %d cores)" % os.cpu_count())
    print("  capped at %.1f MB/s per connection, %d MB file:" % (args.cap_mbps, args.capped_mb))
    print("    1 connection:   %7.1f MB/s" % one)
    print("    %2d connections: %7.1f MB/s  (x%.1f)" % (args.connections, many, many / one if one else 0))
    memory = ""
    if args.warm_up:
        settle = ", then %.0f s" % args.settle if args.settle else ""
        memory = " (download and dd each after the same warm-up write%s)" % settle
    print("  uncapped loopback, %d connections, %d MB file%s:" % (args.connections, args.uncapped_mb, memory))
    print("    download:       %7.1f MB/s  (wall %.2f s)" % (uncapped["mb_per_s"], uncapped["wall_s"]))
    print("    downloader CPU: %7.2f s  (%.2f cores), fake Hub CPU %.2f s" % (
        uncapped["client_cpu_s"], uncapped["client_cpu_s"] / uncapped["wall_s"], uncapped["hub_cpu_s"]))
    if uncapped["disk_busy"] is not None:
        print("    disk busy:      %7.0f %% of the wall time" % (100 * uncapped["disk_busy"]))
    print("    dd write+fsync: %7.1f MB/s  (best of %s; download at %.0f%% of it)" % (
        uncapped["dd_mb_per_s"], " / ".join("%.1f" % r for r in uncapped["dd_runs_mb_per_s"]),
        100 * uncapped["dd_ratio"]))
    print("    sha256 alone:   %7.1f MB/s (one core)" % uncapped["sha256_mb_per_s"])
    print("  verdict: " + verdict(uncapped))
    if args.json:
        print(json.dumps({"capped": capped, "uncapped": uncapped}))


if __name__ == "__main__":
    main()
