"""A head and an RPC worker in two network namespaces joined by a veth pair, the link throttled with tc.

Used by tests/unit/test_rpc_cache_seed.py (a cache the server writes itself), tests/integration/
test_rpc_cache.py (cold / warm / seeded loads) and by hand to measure load time::

    sudo .venv/bin/python tests/support/rpc_cache_lab.py --bin /opt/minimax-spark/llama.cpp/current/bin \\
        --rate 40mbit --expert-ff 2688

    # the head's per-load hash (project patch rpc-hash-sidecar): one process vs seeded, with and without it
    sudo .venv/bin/python tests/support/rpc_cache_lab.py --hash-file --bin <patched bin> \\
        --unpatched-bin <bin of build_llamacpp_project_patches: []> --expert-ff 13440 --reps 5

    # the worker's cache hit (project patch rpc-cache-hit-mmap): seeded loads with the hash file, the worker
    # with and without the patch
    sudo .venv/bin/python tests/support/rpc_cache_lab.py --cache-hit --bin <build with both patches> \
        --unpatched-bin <bin of build_llamacpp_project_patches: []: a stock worker> --expert-ff 13440 --reps 5

    # the head's read of the worker's weights (project patch rpc-load-mapped): seeded loads with the hash file, the
    # head with and without the patch; each load also records what the head read (rchar of /proc/PID/io)
    sudo .venv/bin/python tests/support/rpc_cache_lab.py --head-read --bin <build with the project patches> \
        --unpatched-bin <build without rpc-load-mapped> --expert-ff 26880 --layers 4 --reps 5

The head (llama-server without mmap, as head_server runs it, every layer offloaded to the RPC device)
runs in namespace ``<tag>-h`` at 10.77.0.1, the worker (ggml-rpc-server -c) in ``<tag>-w`` at 10.77.0.2.
tc tbf on the head's end limits what the head sends. Needs root, ``ip`` and ``tc``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

HEAD_IP, WORKER_IP, PORT, HTTP_PORT = "10.77.0.1", "10.77.0.2", 50052, 8080
PROMPT = [{"role": "user", "content": "Hello"}]


def _run(*argv, check=True):
    return subprocess.run([str(a) for a in argv], check=check, capture_output=True, text=True)


def can_run():
    """None when a lab can be built here, else the reason it cannot."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth, tc)"
    for tool in ("ip", "tc"):
        if not shutil.which(tool):
            return "needs %s (iproute2)" % tool
    return None


class Lab:
    def __init__(self, bin_dir, tag=None, rate=None):
        self.bin = Path(bin_dir)
        self.worker_bin = None  # the worker's build, when it is not the head's (a stock worker, say)
        self.tag = tag or "rpcc%d" % os.getpid()
        self.head_ns, self.worker_ns = self.tag + "-h", self.tag + "-w"
        self.veth_h, self.veth_w = self.tag[:10] + "h", self.tag[:10] + "w"
        self.rate = rate
        self.procs = []

    # -- network -------------------------------------------------------------------------------------
    def up(self):
        for ns in (self.head_ns, self.worker_ns):
            _run("ip", "netns", "add", ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        _run("ip", "link", "add", self.veth_h, "netns", self.head_ns, "type", "veth", "peer", "name", self.veth_w,
             "netns", self.worker_ns)
        _run("ip", "-n", self.head_ns, "addr", "add", HEAD_IP + "/24", "dev", self.veth_h)
        _run("ip", "-n", self.worker_ns, "addr", "add", WORKER_IP + "/24", "dev", self.veth_w)
        _run("ip", "-n", self.head_ns, "link", "set", self.veth_h, "up")
        _run("ip", "-n", self.worker_ns, "link", "set", self.veth_w, "up")
        if self.rate:
            _run("ip", "netns", "exec", self.head_ns, "tc", "qdisc", "add", "dev", self.veth_h, "root", "tbf",
                 "rate", self.rate, "burst", "64kb", "latency", "400ms")
        return self

    def down(self):
        for p in self.procs:
            self._stop(p)
        self.procs = []
        for ns in (self.head_ns, self.worker_ns):
            _run("ip", "netns", "del", ns, check=False)

    def tx_bytes(self):
        """Bytes the head has sent to the worker over the veth."""
        out = _run("ip", "-n", self.head_ns, "-j", "-s", "link", "show", self.veth_h).stdout
        return int(json.loads(out)[0]["stats64"]["tx"]["bytes"])

    # -- processes -----------------------------------------------------------------------------------
    def _spawn(self, ns, argv, log, env=None):
        full_env = dict(os.environ, GGML_NO_BACKTRACE="1", LD_LIBRARY_PATH=str(self.bin))
        full_env.update(env or {})
        handle = open(log, "ab")
        p = subprocess.Popen(["ip", "netns", "exec", ns] + [str(a) for a in argv], stdout=handle,
                             stderr=subprocess.STDOUT, env=full_env, start_new_session=True)
        p.log = log
        self.procs.append(p)
        return p

    def _stop(self, p):
        if p.poll() is None:
            os.killpg(p.pid, 15)
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait()
        if p in self.procs:
            self.procs.remove(p)

    def rpc_server_path(self):
        where = Path(self.worker_bin or self.bin)
        for name in ("ggml-rpc-server", "rpc-server"):
            if (where / name).exists():
                return where / name
        raise FileNotFoundError("no ggml-rpc-server or rpc-server in %s" % where)

    def start_worker(self, cache_dir, log):
        p = self._spawn(self.worker_ns, [self.rpc_server_path(), "-H", WORKER_IP, "-p", PORT, "-c"], log,
                        env={"LLAMA_CACHE": str(cache_dir), "LD_LIBRARY_PATH": str(self.worker_bin or self.bin)})
        self._wait(lambda: ":%d " % PORT in _run("ip", "netns", "exec", self.worker_ns, "ss", "-Hltn").stdout + " ",
                   p, 30, "the RPC server to listen")
        return p

    def in_head(self, code, timeout=120):
        """Run Python ``code`` in the head's namespace; its stdout."""
        return subprocess.run(["ip", "netns", "exec", self.head_ns, sys.executable, "-c", code], check=True,
                              capture_output=True, text=True, timeout=timeout).stdout

    def load(self, model, log, timeout=300, env=None, rpc=True):
        """Start llama-server on the head with every layer on the worker (``rpc=False``: in the head's own
        process); seconds until /health is 200. ``env``: more environment (e.g. GGML_RPC_HASH_FILE)."""
        t0 = time.monotonic()
        placement = ["--rpc", "%s:%d" % (WORKER_IP, PORT), "-ngl", "99"] if rpc else ["-ngl", "0"]
        p = self._spawn(self.head_ns, [self.bin / "llama-server", "-m", model] + placement
                        + ["--host", "127.0.0.1", "--port", HTTP_PORT, "-c", "2048",
                           "-np", "1", "--no-warmup", "--jinja", "--load-mode", "none",
                           # ggml's INFO lines (the patch's "ggml_rpc: weight hashes") print from verbosity 4
                           "-lv", "4"], log, env=env)
        probe = ("import urllib.request,sys\ntry:\n print(urllib.request.urlopen('http://127.0.0.1:%d/health',"
                 " timeout=2).status)\nexcept Exception: print(0)" % HTTP_PORT)
        self._wait(lambda: self.in_head(probe).strip() == "200", p, timeout, "llama-server to load")
        return p, time.monotonic() - t0

    def complete(self, n=24):
        code = ("import json,urllib.request\nreq=urllib.request.Request('http://127.0.0.1:%d/v1/chat/completions',"
                "data=json.dumps({'messages':%r,'temperature':0,'max_tokens':%d}).encode(),"
                "headers={'Content-Type':'application/json'})\n"
                "print(json.dumps(json.load(urllib.request.urlopen(req,timeout=60))['choices'][0]['message']))"
                % (HTTP_PORT, PROMPT, n))
        return json.loads(self.in_head(code))

    def _wait(self, ready, p, timeout, what):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if p.poll() is not None:
                raise RuntimeError("%s exited (%s) waiting for %s:\n%s" % (p.args, p.returncode, what, _tail(p.log)))
            if ready():
                return
            time.sleep(0.2)
        raise RuntimeError("timed out waiting for %s:\n%s" % (what, _tail(p.log)))

    def stop(self, p):
        self._stop(p)


def _tail(path, n=30):
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


@contextmanager
def lab(bin_dir, rate=None, tag=None):
    reason = can_run()
    if reason:
        raise RuntimeError(reason)
    the_lab = Lab(bin_dir, tag=tag, rate=rate)
    try:
        yield the_lab.up()
    finally:
        the_lab.down()


def saved_entries(log):
    """Cache entries the server wrote during a load (its 'saved to' lines)."""
    return re.findall(r"saved to '([^']+)'", Path(log).read_text(errors="replace"))


WEIGHT_HASHES_RE = re.compile(r"ggml_rpc: weight hashes: (.*)$", re.M)


def weight_hashes(log):
    """The last "ggml_rpc: weight hashes:" line of a head's log (project patch rpc-hash-sidecar) as a dict,
    or None (a build without the patch)."""
    found = WEIGHT_HASHES_RE.findall(Path(log).read_text(errors="replace"))
    # the counters, then "; hash files: <each file, used or ignored and why>"
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", found[-1].split("; hash files:")[0])} if found else None


def head_read_bytes(pid):
    """Bytes llama-server has read through read(2) so far (``rchar`` of /proc/PID/io): a weight set from a mapping
    of the file is not counted, a weight read into a scratch buffer is."""
    for line in Path("/proc/%d/io" % pid).read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise RuntimeError("no rchar in /proc/%d/io" % pid)


RPC_MAPPED_RE = re.compile(r"rpc-load-mapped: (\d+) RPC weights \((\d+) bytes\)")


def rpc_mapped(log):
    """(tensors, bytes) of the head's "rpc-load-mapped:" line (project patch rpc-load-mapped), or None."""
    found = RPC_MAPPED_RE.findall(Path(log).read_text(errors="replace"))
    return tuple(int(x) for x in found[-1]) if found else None


def one_load(the_lab, model, cache_dir, logdir, label, env=None, rpc=True):
    """Start the worker on ``cache_dir`` (none with ``rpc=False``), load, complete, stop both; the load's figures."""
    logdir = Path(logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    wlog, hlog = logdir / ("%s-worker.log" % label), logdir / ("%s-head.log" % label)
    worker = the_lab.start_worker(cache_dir, wlog) if rpc else None
    tx0 = the_lab.tx_bytes()
    head, seconds = the_lab.load(model, hlog, env=env, rpc=rpc)
    sent = the_lab.tx_bytes() - tx0
    read = head_read_bytes(head.pid)
    reply = the_lab.complete()
    the_lab.stop(head)
    if worker is not None:
        the_lab.stop(worker)
    return {"label": label, "load_s": round(seconds, 2), "sent_bytes": sent,
            "saved": len(saved_entries(wlog)) if rpc else 0, "reply": reply, "weight_hashes": weight_hashes(hlog),
            "head_read_bytes": read, "rpc_mapped": rpc_mapped(hlog),
            "worker_log": str(wlog), "head_log": str(hlog)}


def load_through_rpc(bin_dir, model, cache_dir, logdir, rate=None):
    """One load through an unthrottled (or ``rate``) link, so the server fills ``cache_dir`` itself."""
    with lab(bin_dir, rate=rate) as the_lab:
        return one_load(the_lab, model, cache_dir, logdir, "server-fill")


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2.0


def _interleaved_loads(the_lab, builds, configs, model, cache_dir, hash_env, logdir, reps):
    """``reps`` rounds of ``configs`` (name, head build, worker build, with the hash file, through RPC), interleaved;
    {name: [one_load results]}. The lab is left on the patched build for both ends."""
    out = {name: [] for name, _, _, _, _ in configs}
    for rep in range(reps):
        for name, head, worker, hashed, rpc in configs:
            the_lab.bin, the_lab.worker_bin = Path(builds[head]), Path(builds[worker])
            out[name].append(one_load(the_lab, model, cache_dir, logdir, "%s-%d" % (name, rep),
                                      env={"GGML_RPC_HASH_FILE": hash_env} if hashed else None, rpc=rpc))
    the_lab.bin, the_lab.worker_bin = Path(builds["patched"]), None
    return out


def hash_file_loads(the_lab, builds, model, cache_dir, hash_env, logdir, reps=3):
    """Load figures for the hash file (project patch rpc-hash-sidecar), ``reps`` rounds, configurations interleaved.

    ``builds``: {"patched": bin dir, "unpatched": bin dir}. ``cache_dir``: the worker's seeded cache. Returns
    {config: [one_load results]} for: one-process (the patched build, no RPC), seeded-unpatched (the head hashes
    every large weight), seeded-patched (GGML_RPC_HASH_FILE=hash_env: the head hashes nothing).
    """
    configs = [("one-process", "patched", "patched", False, False),
               ("seeded-unpatched", "unpatched", "unpatched", False, True),
               ("seeded-patched", "patched", "patched", True, True)]
    return _interleaved_loads(the_lab, builds, configs, model, cache_dir, hash_env, logdir, reps)


def cache_hit_loads(the_lab, builds, model, cache_dir, hash_env, logdir, reps=3):
    """Load figures for the worker's cache hit (project patch rpc-cache-hit-mmap), ``reps`` rounds, interleaved.

    ``builds``: {"patched": bin dir with rpc-cache-hit-mmap, "unpatched": bin dir of a worker without it (stock
    ggml-rpc-server)}. The head is always the patched build and both seeded loads use the hash file (the head
    hashes nothing), so they differ only in how the worker sets a cache hit. Returns {config: [one_load results]}
    for one-process (patched, no RPC), seeded-unpatched, seeded-patched.
    """
    configs = [("one-process", "patched", "patched", False, False),
               ("seeded-unpatched", "patched", "unpatched", True, True),
               ("seeded-patched", "patched", "patched", True, True)]
    return _interleaved_loads(the_lab, builds, configs, model, cache_dir, hash_env, logdir, reps)


def head_read_loads(the_lab, builds, model, cache_dir, hash_env, logdir, reps=3):
    """Load figures for the head's read of the worker's weights (project patch rpc-load-mapped), interleaved.

    ``builds``: {"patched": the head with rpc-load-mapped, "unpatched": a head without it (it reads every weight
    into a scratch buffer before the RPC client sends only its hash)}. The worker is the patched build and both
    seeded loads use the hash file, so they differ only in how the head hands the worker's weights to the RPC
    client. Returns {config: [one_load results]} for one-process, seeded-unpatched, seeded-patched.
    """
    configs = [("one-process", "patched", "patched", False, False),
               ("seeded-unpatched", "unpatched", "patched", True, True),
               ("seeded-patched", "patched", "patched", True, True)]
    return _interleaved_loads(the_lab, builds, configs, model, cache_dir, hash_env, logdir, reps)


def figures(results):
    """Median and spread of the load times, per configuration, as lines of text."""
    base = median([r["load_s"] for r in results["one-process"]])
    lines = ["%-18s %8s %8s %8s %8s %10s  %s" % ("load", "median_s", "min_s", "max_s", "ratio", "head_read",
                                                 "head hashed")]
    for name, runs in results.items():
        times = [r["load_s"] for r in runs]
        wh = runs[-1]["weight_hashes"]
        hashed = ("%d tensors, %.0f MiB (file: %d)"
                  % (wh["hashed_tensors"], wh["hashed_bytes"] / 2 ** 20, wh["file_tensors"])
                  if wh else ("n/a (no RPC)" if name == "one-process" else "all (no counter: unpatched)"))
        read = "%.0f MiB" % (median([r["head_read_bytes"] for r in runs]) / 2 ** 20)
        lines.append("%-18s %8.2f %8.2f %8.2f %8.2f %10s  %s" % (name, median(times), min(times), max(times),
                                                                 median(times) / base, read, hashed))
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True, help="llama.cpp bin dir (llama-server, ggml-rpc-server)")
    ap.add_argument("--rate", default="40mbit", help="tc tbf rate of the head->worker link ('none': unthrottled)")
    ap.add_argument("--expert-ff", type=int, default=2688)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--fnv1a-library", help="libminimax_fnv1a.so (default: <bin>/libminimax_fnv1a.so)")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--hash-file", action="store_true",
                    help="measure the hash file instead: one process vs seeded loads with and without the patch "
                         "(needs --unpatched-bin; --bin is the patched build; no throttle)")
    ap.add_argument("--cache-hit", action="store_true",
                    help="measure the worker's cache hit instead: one process vs seeded loads with the hash file, the "
                         "worker from --unpatched-bin (stock) and from --bin (with rpc-cache-hit-mmap)")
    ap.add_argument("--head-read", action="store_true",
                    help="measure the head's read of the worker's weights instead: one process vs seeded loads with "
                         "the hash file, the head from --unpatched-bin (without rpc-load-mapped) and from --bin")
    ap.add_argument("--unpatched-bin",
                    help="bin dir of a build without the project patches (build_llamacpp_project_patches: [])")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "tools"))
    sys.path.insert(0, str(root / "library"))
    import ansible.module_utils

    ansible.module_utils.__path__.append(str(root / "module_utils"))
    from ansible.module_utils.minimax_spark_rpccache import Seeder

    import make_tiny_m3

    work = Path(args.workdir or tempfile.mkdtemp(prefix="rpc-cache-lab-"))
    model = work / "tiny.gguf"
    if not model.exists():
        make_tiny_m3.write_tiny_m3(model, template_text=(root / ".cache/demo/MiniMax-M3.jinja").read_text()
                                   if (root / ".cache/demo/MiniMax-M3.jinja").exists() else "{{ messages }}",
                                   layers=args.layers, expert_ff=args.expert_ff)
    lib = args.fnv1a_library or str(Path(args.bin) / "libminimax_fnv1a.so")
    if args.hash_file or args.cache_hit or args.head_read:
        from ansible.module_utils.minimax_spark_rpchashes import HashFiles

        seeded = work / "seeded"
        Seeder(str(model), str(seeded), library=lib).run()
        env = HashFiles([str(model)], library=lib).run()["env"]
        with lab(args.bin) as the_lab:
            loads = cache_hit_loads if args.cache_hit else head_read_loads if args.head_read else hash_file_loads
            res = loads(the_lab, {"patched": args.bin, "unpatched": args.unpatched_bin}, model, seeded, env,
                        work / "logs", reps=args.reps)
        print("\n".join(figures(res)))
        return 0
    results = []
    with lab(args.bin, rate=None if args.rate == "none" else args.rate) as the_lab:
        cold = work / "cold"
        shutil.rmtree(cold, ignore_errors=True)
        results.append(one_load(the_lab, model, cold, work / "logs", "cold"))
        results.append(one_load(the_lab, model, cold, work / "logs", "warm"))
        seeded = work / "seeded"
        shutil.rmtree(seeded, ignore_errors=True)
        t0 = time.monotonic()
        rep = Seeder(str(model), str(seeded), library=lib if os.path.exists(lib) else None).run()
        seed_s = time.monotonic() - t0
        res = one_load(the_lab, model, seeded, work / "logs", "seeded")
        res["seed_s"] = round(seed_s, 2)
        res["seeded_entries"] = len(rep["seeded"])
        results.append(res)
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
