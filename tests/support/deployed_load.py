"""Load time of the head that site.yml deployed, against the same model in one process.

Reads the command line and environment head_server runs (``<run_dir>/minimax-llama-server.json``), stops
the service (the minimax_service module, through ``ansible`` on the inventory's head), then starts, in
interleaved rounds, the deployed command line as it is (its ``--rpc`` workers hold their layers, from their
seeded caches), the same without the hash file in its environment (the head hashes every weight it places on
a worker, as a build without the project patch rpc-hash-sidecar does) and the same command line without
``--rpc``/``--tensor-split`` (one process holds the whole model), each on a spare port,
timed from start to ``/health``; each answers one greedy completion and stops.
The service is put back afterwards (``state=restored``: the last verified deployment), so a rerun of
``site.yml`` changes nothing. Run on the head, as root, from the repository root::

    sudo .venv/bin/python tools/make_tiny_m3.py --template <MiniMax-M3.jinja> --expert-ff 26880 --layers 4 \
        /var/tmp/tiny-wide.gguf
    sudo .venv/bin/ansible-playbook -i inventory/local site.yml -e model_download_local_file=/var/tmp/tiny-wide.gguf
    sudo .venv/bin/python tests/support/deployed_load.py --reps 7

Each load also records what the head read with read(2) (``rchar`` of /proc/PID/io) and its
``rpc-load-mapped`` / ``weight hashes`` lines (project patches). llama-server on its RPC worker only: the
worker must accept the new head, so the deployed head is stopped for the whole measurement.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rpc_cache_lab  # noqa: E402  (head_read_bytes, rpc_mapped, weight_hashes, median)

ROOT = Path(__file__).resolve().parents[2]
SERVICE = "minimax-llama-server"
PROBE = "]~b]user\nWhat is the weather in Paris?[e~[\n]~b]ai\n"


def option_value(argv, name):
    """The value after ``name`` in ``argv``, or None."""
    return argv[argv.index(name) + 1] if name in argv else None


def without(argv, *names):
    """``argv`` without each option in ``names`` and its value."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in names:
            skip = True
        else:
            out.append(arg)
    return out


def with_port(argv, port):
    """``argv`` listening on 127.0.0.1:``port`` instead of the deployed address."""
    return without(argv, "--host", "--port") + ["--host", "127.0.0.1", "--port", str(port)]


def commands(definition, port, env):
    """{name: (argv, environment)} from the service definition head_server wrote and the environment ``env`` it
    runs in: "one-process" (no --rpc, no --tensor-split), "deployed" (as it is) and "no-hash-file" (as deployed,
    without GGML_RPC_HASH_FILE: the head hashes every weight it places on a worker)."""
    argv = definition["argv"]
    if option_value(argv, "--rpc") is None:
        raise SystemExit("The deployed llama-server has no --rpc worker (%s): there is no split load to compare."
                         % " ".join(argv))
    deployed = dict(env, **definition.get("env", {}))
    return {"one-process": (with_port(without(argv, "--rpc", "--tensor-split"), port), deployed),
            "deployed": (with_port(argv, port), deployed),
            "no-hash-file": (with_port(argv, port),
                             {k: v for k, v in deployed.items() if k != "GGML_RPC_HASH_FILE"})}


def ansible_service(inventory, state):
    """Run minimax_service with ``state`` on the inventory's head (the module head_server uses)."""
    cmd = [str(Path(sys.executable).parent / "ansible"), "head", "-i", inventory, "-m", "minimax_service",
           "-a", "name=%s state=%s" % (SERVICE, state)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit("%s failed:\n%s%s" % (" ".join(cmd), proc.stdout, proc.stderr))


def one_load(argv, env, port, log, timeout):
    """Start ``argv``, wait for /health, complete greedily, stop; the load's figures."""
    url = "http://127.0.0.1:%d" % port
    with open(log, "w") as out:
        start = time.monotonic()
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit("llama-server exited with %s before /health answered: %s"
                                 % (proc.returncode, Path(log).read_text(errors="replace")[-3000:]))
            try:
                if requests.get(url + "/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() - start > timeout:
                raise SystemExit("no /health from %s after %d s (log: %s)" % (argv[0], timeout, log))
            time.sleep(0.05)
        seconds = time.monotonic() - start
        read = rpc_cache_lab.head_read_bytes(proc.pid)
        reply = requests.post(url + "/completion", timeout=300, json={
            "prompt": PROBE, "n_predict": 32, "temperature": 0, "cache_prompt": False}).json()["content"]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return {"load_s": round(seconds, 2), "head_read_bytes": read, "reply": reply, "log": str(log),
            "rpc_mapped": rpc_cache_lab.rpc_mapped(log), "weight_hashes": rpc_cache_lab.weight_hashes(log)}


def figures(results, model_bytes):
    """The lab's table of load times and reads, and what the rpc-load-mapped line of each split load said."""
    lines = ["model: %.2f GB; %d rounds, interleaved" % (model_bytes / 1e9, len(results["one-process"]))]
    lines += rpc_cache_lab.figures(results)
    for name, runs in results.items():
        mapped = runs[-1]["rpc_mapped"]
        if name != "one-process":
            lines.append("%s: %s" % (name, "%d RPC weights (%.0f MiB) set from a mapping of the GGUF"
                                     % (mapped[0], mapped[1] / 2 ** 20) if mapped else "no rpc-load-mapped line"))
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--port", type=int, default=8899, help="spare port for the measured heads")
    ap.add_argument("--inventory", default="inventory/local")
    ap.add_argument("--run-dir", default="/opt/minimax-spark/services")
    ap.add_argument("--logdir", default="/var/tmp/minimax-deployed-load")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds to wait for /health")
    ap.add_argument("--json", help="write every load's figures here")
    args = ap.parse_args(argv)

    definition = json.loads((Path(args.run_dir) / (SERVICE + ".json")).read_text())
    cmds = commands(definition, args.port, os.environ)
    model = Path(option_value(definition["argv"], "--model"))
    logdir = Path(args.logdir)
    logdir.mkdir(parents=True, exist_ok=True)

    results = {name: [] for name in cmds}
    ansible_service(args.inventory, "stopped")
    try:
        for rep in range(args.reps):
            for name, (cmd, env) in cmds.items():
                results[name].append(one_load(cmd, env, args.port, logdir / ("%s-%d.log" % (name, rep)),
                                              args.timeout))
    finally:
        ansible_service(args.inventory, "restored")

    for line in figures(results, model.stat().st_size):
        print(line)
    replies = {r["reply"] for runs in results.values() for r in runs}
    if "GGML_RPC_HASH_FILE" not in definition.get("env", {}):
        print("the deployment sets no GGML_RPC_HASH_FILE (a build without rpc-hash-sidecar): no-hash-file is deployed")
    print("greedy replies: %s" % ("identical in every load" if len(replies) == 1 else "DIFFER: %r" % replies))
    print("deployed: %s" % " ".join(cmds["deployed"][0]))
    print("reproduce: sudo .venv/bin/python tests/support/deployed_load.py --reps %d" % args.reps)
    if args.json:
        Path(args.json).write_text(json.dumps({"model": str(model), "commands": {k: v[0] for k, v in cmds.items()},
                                               "results": results},
                                              indent=2))
    return 0 if len(replies) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
