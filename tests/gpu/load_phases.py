"""gpu-check load: time from llama-server's start to /health, per build and placement.

    python3 tests/gpu/load_phases.py --model M --template T --build stock=DIR --build patched=DIR \\
        --out OUT --state DIR [--cuda 1] [--reps 3] [--cold-reps 1] [--deadline EPOCH] [--tensor-split 5,4]

For each build (a llama.cpp bin folder: llama-server, ggml-rpc-server) and each placement:

- ``single``: one process, every layer on the head's device (CUDA0; on a CPU rehearsal, the CPU);
- ``cold``: split over a loopback RPC worker (``ggml-rpc-server -c``) whose cache is empty;
- ``seeded``: the same split, the worker's cache seeded with its layers by the project's seeder
  (``module_utils/minimax_spark_rpccache.Seeder``, what ``rpc_cache_seed`` runs), before the worker starts;
- ``seeded-mmap``: ``seeded`` with the head memory-mapping the GGUF (``--load-mode mmap``, what
  ``head_server_mmap: true`` gives): the head reads only what it sends, not the worker's share.

``--modes`` picks the placements (default: single, seeded, cold).

The head's command line is the project's (``llama_server_argv``, head_server's defaults: ctx 65536, one
slot, flash attention, q8_0 KV, no mmap) with the placement's ``--rpc``/``--tensor-split``/``-ngl``. Each
load's record (seconds to /health, the head's hash counts from its log, the entries the worker saved)
is appended to ``STATE/loads.jsonl``, so a second call on the same machine adds repetitions; OUT gets
``summary.json`` and ``loads.txt`` over all of them. Loads are interleaved (rep 1 of everything, then
rep 2, ...) and none is started past ``--deadline``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HTTP_PORT, RPC_PORT = 18931, 50173
MODES = ("single", "seeded", "seeded-mmap", "cold")
#: The patched RPC client's line (roles/build_llamacpp/files/patches/rpc-hash-sidecar.patch), once the
#: weights are set: how many tensors took their hash from the hash file, how many were hashed, how many
#: large ones were sent.
HASH_LINE = re.compile(r"ggml_rpc: weight hashes: (.*)")
HASH_FILE_LINE = re.compile(r"ggml_rpc: hash file (.*)")
#: The patched head's line (rpc-load-mapped.patch) once the worker's share is set from a mapping of the GGUF
#: instead of being read into scratch buffers, and its line when the file could not be mapped.
MAPPED_LINE = re.compile(r"rpc-load-mapped: (\d+) RPC weights \((\d+) bytes\) set from a mapping of the file")
MAP_FAILED_LINE = re.compile(r"rpc-load-mapped: (cannot map model file .*)")


def _import_project():
    sys.path.insert(0, str(ROOT / "filter_plugins"))
    import ansible.module_utils

    ansible.module_utils.__path__.append(str(ROOT / "module_utils"))
    from ansible.module_utils import minimax_spark_rpccache

    import minimax_plan
    import minimax_spark

    return minimax_spark, minimax_plan, minimax_spark_rpccache


def block_count(model):
    import gguf

    r = gguf.GGUFReader(model)
    for f in r.fields.values():
        if f.name.endswith(".block_count"):
            return int(f.parts[f.data[0]][0])
    raise SystemExit("load_phases: %s has no block_count" % model)


def worker_layers(plan_mod, n_layer, cuda, split):
    """(-ngl, --tensor-split or None, the worker's layer indices, output on the worker)."""
    n_items = n_layer + 1
    if cuda:
        devices = plan_mod.llamacpp_layer_devices(split, n_items)
        ngl, ts = 999, [("%g" % x) for x in split]
        mine = [i for i, d in enumerate(devices) if d == 0]   # RPC0 comes first in llama.cpp's device order
    else:
        # A CPU head is no device: -ngl gives the worker the last layers (head_server's auto rule, one worker).
        ngl, ts = math.ceil(n_items / 2), None
        mine = list(range(n_items - ngl, n_items))
    return ngl, ts, [i for i in mine if i < n_layer], n_layer in mine


def server_options(bin_dir):
    out = subprocess.run([str(Path(bin_dir) / "llama-server"), "--help"], capture_output=True, text=True,
                         env=_env(bin_dir), timeout=60)
    return re.findall(r"(--[a-z0-9-]+)", out.stdout + out.stderr)


def _env(bin_dir, extra=None):
    env = dict(os.environ, GGML_NO_BACKTRACE="1", OMP_WAIT_POLICY="PASSIVE")
    env["LD_LIBRARY_PATH"] = str(bin_dir) + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    env.update(extra or {})
    return env


def _healthy():
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/health" % HTTP_PORT, timeout=2) as resp:
            return resp.status == 200
    except Exception:
        return False


def _listening(port):
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _stop(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _spawn(argv, log, env):
    handle = open(log, "wb")
    return subprocess.Popen([str(a) for a in argv], stdout=handle, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)


def _tail(path, n=25):
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def hash_counts(log):
    """The head's counts from the patched client's log lines ({} from a stock build): the hash line's counts,
    the hash file, and rpc-load-mapped's ``mapped_tensors``/``mapped_bytes`` (or ``map_error``)."""
    found = {}
    for line in Path(log).read_text(errors="replace").splitlines():
        m = HASH_LINE.search(line)
        if m:
            for key, value in re.findall(r"(\w+)=(\d+)", m.group(1)):
                found[key] = int(value)
        m = HASH_FILE_LINE.search(line)
        if m:
            found["hash_file"] = m.group(1).strip()[:300]
        m = MAPPED_LINE.search(line)
        if m:
            found["mapped_tensors"], found["mapped_bytes"] = int(m.group(1)), int(m.group(2))
        m = MAP_FAILED_LINE.search(line)
        if m:
            found["map_error"] = m.group(1).strip()[:300]
    return found


def write_hash_file(args, meta):
    """The model's hash file through the project's engine (rpc_hash_file's); its path, or None."""
    if args.no_hash_file:
        return None
    try:
        from ansible.module_utils.minimax_spark_rpchashes import HashFiles, hash_file_for
    except ImportError:
        meta["hash_file"] = "none: this branch has no module_utils/minimax_spark_rpchashes.py"
        return None
    path = hash_file_for(args.model)
    fresh = not os.path.exists(path)
    t = time.monotonic()
    lib = args.fnv1a_library if args.fnv1a_library and os.path.exists(args.fnv1a_library) else None
    report = HashFiles([args.model], library=lib, jobs=args.seed_jobs).run()
    seconds = round(time.monotonic() - t, 1)
    if fresh:
        meta["hash_file_s"] = seconds
        meta["hash_file_jobs"] = args.seed_jobs
    print("load_phases: hash file %s %s in %.1f s (%s)" % (path, "written" if fresh else "checked", seconds,
                                                          json.dumps(report, default=str)[:300]), flush=True)
    meta["hash_file"] = path
    return path


def one_load(build, bin_dir, mode, head_argv, cache_dir, logdir, label, timeout, head_env=None):
    """Start a worker (split modes) and the head; seconds until /health answers 200."""
    rec = {"build": build, "mode": mode, "label": label}
    wlog, hlog = logdir / ("%s-worker.log" % label), logdir / ("%s-head.log" % label)
    worker = None
    try:
        if mode != "single":
            rpc = Path(bin_dir) / "ggml-rpc-server"
            if not rpc.exists():
                rpc = Path(bin_dir) / "rpc-server"
            worker = _spawn([rpc, "-H", "127.0.0.1", "-p", RPC_PORT, "-c"], wlog,
                            _env(bin_dir, {"LLAMA_CACHE": str(cache_dir)}))
            end = time.time() + 60
            while not _listening(RPC_PORT):
                if worker.poll() is not None or time.time() > end:
                    raise RuntimeError("the RPC server did not listen:\n" + _tail(wlog))
                time.sleep(0.1)
        t0 = time.monotonic()
        head = _spawn(head_argv, hlog, _env(bin_dir, head_env))
        try:
            end = t0 + timeout
            while not _healthy():
                if head.poll() is not None:
                    raise RuntimeError("llama-server exited (%s):\n%s" % (head.returncode, _tail(hlog)))
                if time.monotonic() > end:
                    raise RuntimeError("no /health within %d s:\n%s" % (timeout, _tail(hlog)))
                time.sleep(0.05)
            rec["load_s"] = round(time.monotonic() - t0, 2)
        finally:
            _stop(head)
        rec.update(hash_counts(hlog))
    except RuntimeError as exc:
        rec["error"] = str(exc)[-2000:]
    finally:
        if worker is not None:
            _stop(worker)
    if worker is not None:
        rec["worker_saved"] = len(re.findall(r"saved to '", Path(wlog).read_text(errors="replace")))
    return rec


def summarise(records, meta):
    rows = {}
    for r in records:
        rows.setdefault((r["build"], r["mode"]), []).append(r)
    table = []
    for (build, mode), recs in sorted(rows.items(), key=lambda kv: (kv[0][0], MODES.index(kv[0][1]))):
        times = [r["load_s"] for r in recs if "load_s" in r]
        row = {"build": build, "mode": mode, "n": len(times), "errors": sum(1 for r in recs if "error" in r),
               "times_s": times}
        if times:
            row.update(median_s=round(statistics.median(times), 2), min_s=min(times), max_s=max(times))
        for key in ("file_tensors", "hashed_tensors", "hashed_bytes", "sent_tensors", "mapped_tensors", "mapped_bytes",
                    "map_error", "worker_saved"):
            vals = sorted({r[key] for r in recs if key in r})
            if vals:
                row[key] = vals
        table.append(row)
    by = {(r["build"], r["mode"]): r for r in table}
    ratios = {}
    for build in sorted({r["build"] for r in table}):
        single = by.get((build, "single"), {}).get("median_s")
        for mode in ("seeded", "seeded-mmap", "cold"):
            m = by.get((build, mode), {}).get("median_s")
            if single and m:
                ratios["%s %s/single" % (build, mode)] = round(m / single, 2)
    return {"meta": meta, "table": table, "ratios": ratios}


def summary_text(summary):
    lines = ["load phases: seconds from llama-server's start to /health (median [min-max] of n)"]
    for k, v in sorted(summary["meta"].items()):
        lines.append("  %s: %s" % (k, v))
    lines.append("%-8s %-11s %3s %22s  %s" % ("build", "mode", "n", "median [min-max] s", "head hashes / worker saved"))
    for r in summary["table"]:
        span = "%.1f [%.1f-%.1f]" % (r["median_s"], r["min_s"], r["max_s"]) if r["n"] else "-"
        extra = []
        def fmt(key, r=r):
            return "/".join(str(v) for v in r[key]) if key in r else "?"

        if "file_tensors" in r or "hashed_tensors" in r:
            extra.append("head: %s from the hash file, %s hashed (%s bytes), %s sent" % (
                fmt("file_tensors"), fmt("hashed_tensors"), fmt("hashed_bytes"), fmt("sent_tensors")))
        elif r["mode"] != "single" and r["n"]:
            extra.append("head: no hash line (stock client: every weight > 10 MiB hashed)")
        if "mapped_tensors" in r:
            extra.append("rpc-load-mapped: %s weights (%s bytes) from a mapping of the file" % (
                fmt("mapped_tensors"), fmt("mapped_bytes")))
        elif r["mode"] != "single" and r["n"] and "file_tensors" in r:
            extra.append("no rpc-load-mapped line (the worker's share read into buffers)")
        if "map_error" in r:
            extra.append("rpc-load-mapped failed: %s" % fmt("map_error"))
        if "worker_saved" in r:
            extra.append("worker saved %s" % fmt("worker_saved"))
        if r["errors"]:
            extra.append("%d failed" % r["errors"])
        lines.append("%-8s %-11s %3d %22s  %s" % (r["build"], r["mode"], r["n"], span, "; ".join(extra)))
    for k, v in sorted(summary["ratios"].items()):
        lines.append("ratio %s: %.2f" % (k, v))
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--template", required=True)
    ap.add_argument("--build", action="append", required=True, help="LABEL=BIN_DIR (repeatable)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--state", required=True, help="folder kept between calls: caches, logs, loads.jsonl")
    ap.add_argument("--cuda", type=int, default=1)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cold-reps", type=int, default=2)
    ap.add_argument("--tensor-split", default="5,4", help="RPC0,CUDA0 layer shares (default 5,4)")
    ap.add_argument("--deadline", type=float, default=0, help="epoch seconds: no load starts past it")
    ap.add_argument("--timeout", type=int, default=400, help="seconds a load may take")
    ap.add_argument("--fnv1a-library", default="")
    ap.add_argument("--seed-jobs", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)))
    ap.add_argument("--no-hash-file", action="store_true", help="do not write the hash file beside the GGUF")
    ap.add_argument("--modes", default="single,seeded,cold",
                    help="placements, comma-separated, of: %s" % ", ".join(MODES))
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error("--modes: unknown %s (known: %s)" % (", ".join(unknown), ", ".join(MODES)))
    spark, plan_mod, rpccache = _import_project()
    builds = dict(b.split("=", 1) for b in args.build)
    out, state = Path(args.out), Path(args.state)
    out.mkdir(parents=True, exist_ok=True)
    logdir = state / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    deadline = args.deadline or time.time() + 3600
    n_layer = block_count(args.model)
    split = [float(x) for x in args.tensor_split.split(",")]
    ngl, ts, mine, output_on_worker = worker_layers(plan_mod, n_layer, args.cuda, split)
    meta = {"model": args.model, "model_gb": round(os.path.getsize(args.model) / 1e9, 2), "cuda": args.cuda,
            "worker layers": "blk.%d-%d%s" % (mine[0], mine[-1], " + output" if output_on_worker else "") if mine
            else "output" if output_on_worker else "none",
            "tensor_split": args.tensor_split if args.cuda else None, "ngl_split": ngl}
    print("load_phases: %s" % json.dumps(meta), flush=True)

    # The worker's share, seeded once by the project's seeder (seeded loads never write to it).
    seeded = state / "cache-seeded"
    include = [r"^blk\.(%s)\." % "|".join(str(i) for i in mine)] if mine else []
    if output_on_worker:
        include.append(r"^output\.")
    if not (seeded / "rpc" / "manifest.json").exists() and not any((seeded / "rpc").glob("*")):
        t = time.monotonic()
        lib = args.fnv1a_library if args.fnv1a_library and os.path.exists(args.fnv1a_library) else None
        rep = rpccache.Seeder(args.model, str(seeded), include=include, library=lib, jobs=args.seed_jobs).run()
        meta["seed_s"] = round(time.monotonic() - t, 1)
        meta["seeded_entries"] = len(rep["seeded"])
        meta["seeded_gb"] = round(sum(os.path.getsize(p) for p in (seeded / "rpc").iterdir()
                                      if p.is_file() and not p.name.endswith(".json")) / 1e9, 2)
        (state / "seed.json").write_text(json.dumps({k: meta[k] for k in ("seed_s", "seeded_entries", "seeded_gb")}))
        print("load_phases: seeded %d entries (%.2f GB) in %.1f s with %d jobs (%s)" % (
            meta["seeded_entries"], meta["seeded_gb"], meta["seed_s"], args.seed_jobs,
            "C library" if lib else "pure Python"), flush=True)
    elif (state / "seed.json").exists():
        meta.update(json.loads((state / "seed.json").read_text()))
    head_env = {}
    hash_path = write_hash_file(args, meta)
    if hash_path:
        head_env["GGML_RPC_HASH_FILE"] = hash_path

    argvs = {}
    for build, bin_dir in builds.items():
        opts = server_options(bin_dir)
        cfg = dict(server=str(Path(bin_dir) / "llama-server"), model=args.model, host="127.0.0.1", port=HTTP_PORT,
                   alias="minimax-m3", ctx_size=65536, parallel=1, flash_attn="on", cache_type_k="q8_0",
                   cache_type_v="q8_0", batch_size=2048, ubatch_size=2048, mmap=False, jinja=True,
                   chat_template_file=args.template, server_options=opts, verbosity=4)
        single = dict(cfg, ngl=999 if args.cuda else 0)
        split_cfg = dict(cfg, rpc=["127.0.0.1:%d" % RPC_PORT], ngl=ngl, tensor_split=ts)
        argvs[build] = {"single": spark.llama_server_argv(single), "seeded": spark.llama_server_argv(split_cfg),
                        "cold": spark.llama_server_argv(split_cfg),
                        # explicit: "auto" maps only when every device supports it (an iGPU does not)
                        "seeded-mmap": spark.llama_server_argv(dict(split_cfg, mmap=True)) + (
                            ["--load-mode", "mmap"] if "--load-mode" in opts else [])}
    meta["head argv (split)"] = " ".join(argvs[next(iter(builds))]["seeded"][1:])

    records_path = state / "loads.jsonl"
    records = [json.loads(x) for x in records_path.read_text().splitlines()] if records_path.exists() else []
    done = {}
    for r in records:
        done[(r["build"], r["mode"])] = done.get((r["build"], r["mode"]), 0) + 1
    last = {}
    first_guess = {"single": 15, "seeded": 60, "seeded-mmap": 60, "cold": 120}
    for rep in range(args.reps):
        for mode in modes:
            for build, bin_dir in builds.items():
                want = args.cold_reps if mode == "cold" else args.reps
                if done.get((build, mode), 0) >= min(want, rep + 1):
                    continue
                guess = last.get((build, mode), first_guess[mode])
                if time.time() + guess + 5 > deadline:
                    print("load_phases: %s %s skipped (deadline)" % (build, mode), flush=True)
                    continue
                cache = seeded
                if mode == "cold":
                    cache = state / "cache-cold"
                    shutil.rmtree(cache, ignore_errors=True)
                    cache.mkdir(parents=True)
                label = "%s-%s-%d" % (build, mode, done.get((build, mode), 0) + 1)
                argv = argvs[build][mode]
                timeout = int(min(args.timeout, max(30, deadline - time.time() + 20)))
                rec = one_load(build, bin_dir, mode, argv, cache, logdir, label, timeout, head_env)
                rec["at"] = time.strftime("%H:%M:%S")
                if mode == "cold":
                    shutil.rmtree(cache, ignore_errors=True)  # the disk holds the proxy and one seeded share
                records.append(rec)
                with records_path.open("a") as fh:
                    fh.write(json.dumps(rec) + "\n")
                done[(build, mode)] = done.get((build, mode), 0) + 1
                last[(build, mode)] = rec.get("load_s", 60)
                print("load_phases: %s: %s" % (label, json.dumps({k: v for k, v in rec.items()
                                                                   if k not in ("label", "error")})), flush=True)
                if "error" in rec:
                    print("load_phases: %s failed: %s" % (label, rec["error"][-1500:]), flush=True)
                summary = summarise(records, meta)
                (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
                (out / "loads.txt").write_text(summary_text(summary))
    summary = summarise(records, meta)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "loads.txt").write_text(summary_text(summary))
    sys.stdout.write(summary_text(summary))
    return 0 if records and all("error" not in r for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
