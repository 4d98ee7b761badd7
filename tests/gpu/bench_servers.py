"""gpu-check benchmark: decode and prefill tok/s from llama-server's own `timings`."""
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request

spec_path, fact_path, out_path, logdir, cuda, reps = sys.argv[1:7]
cuda, reps = cuda == "1", int(reps)
spec = json.load(open(spec_path))
fact = json.load(open(fact_path))
os.makedirs(logdir, exist_ok=True)
PORT, RPC_PORT = 18891, 50153


def opt_drop(argv, flag, nvals=1):
    out, i = [], 0
    while i < len(argv):
        if argv[i] == flag:
            i += 1 + nvals
            continue
        out.append(argv[i])
        i += 1
    return out


def opt_set(argv, flag, value):
    argv = opt_drop(argv, flag)
    return argv + [flag, str(value)]


base = opt_set(spec["argv"], "--verbosity", 4)  # 4: load_tensors placement, no per-token debug
base = opt_set(base, "--port", PORT)
has_rpc = "--rpc" in base
local = opt_drop(opt_drop(base, "--rpc"), "--split-mode")
configs = []
if has_rpc:
    split = opt_set(base, "--rpc", "127.0.0.1:%d" % RPC_PORT)
    configs.append(("split_rpc_ub2048", split, "head GPU + loopback RPC worker (same GPU), the deployed argv" if cuda
                    else "head CPU + loopback RPC worker, the deployed argv"))
    configs.append(("split_rpc_ub512", opt_set(split, "--ubatch-size", 512), "as above, --ubatch-size 512"))
if cuda:
    configs.append(("gpu_single", opt_set(local, "--n-gpu-layers", 999), "one process, every layer on CUDA0, no RPC"))
configs.append(("cpu_ngl0", opt_set(local, "--n-gpu-layers", 0),
                "-ngl 0, no RPC (a CUDA build may still offload big prompt batches)"))
configs.append(("cpu_only", opt_set(opt_set(local, "--n-gpu-layers", 0), "--device", "none"),
                "-ngl 0 --device none: CPU only"))

env = dict(os.environ)
env.update(spec.get("env", {}))


def post(path, body, timeout=600):
    req = urllib.request.Request("http://127.0.0.1:%d%s" % (PORT, path), data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.load(resp)


def healthy(proc, timeout=300):
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/health" % PORT, timeout=5) as resp:
                if resp.status == 200:
                    return True
        except Exception:
            pass
        time.sleep(0.3)
    return False


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


rpc = None
if has_rpc:
    rpc_log = open(os.path.join(logdir, "bench-rpc-server.log"), "wb")
    rpc = subprocess.Popen([fact["rpc_server_path"], "-H", "127.0.0.1", "-p", str(RPC_PORT)], stdout=rpc_log,
                           stderr=subprocess.STDOUT, env=env, start_new_session=True)
    time.sleep(2)

results = {"model": spec["argv"][spec["argv"].index("--model") + 1], "build_id": fact.get("build_id"),
           "version": fact.get("version"), "cuda": cuda, "reps": reps, "configs": {}}
prompt_long = None
SHORT = "Write a long story about the weather in Paris."
for name, argv, what in configs:
    log_path = os.path.join(logdir, "bench-%s.log" % name)
    t = time.time()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    entry = {"what": what, "argv": argv[1:]}
    results["configs"][name] = entry
    try:
        if not healthy(proc):
            entry["error"] = "not healthy (exit %s); see %s" % (proc.poll(), os.path.basename(log_path))
            print("bench: %s: %s" % (name, entry["error"]), flush=True)
            continue
        entry["load_s"] = round(time.time() - t, 2)
        if prompt_long is None:
            # About 2k prompt tokens: measure the tokenizer on a sample, then size the text.
            sample = "The quick brown fox jumps over the lazy dog near the river Seine in Paris. "
            n = len(post("/tokenize", {"content": sample * 20})["tokens"])
            prompt_long = sample * max(1, int(round(2040 * 20 / n)))
            ntok = len(post("/tokenize", {"content": prompt_long})["tokens"])
            while ntok > 2048:
                prompt_long = prompt_long[: int(len(prompt_long) * 2040 / ntok)]
                ntok = len(post("/tokenize", {"content": prompt_long})["tokens"])
            results["prompt_tokens_long"] = ntok
        post("/completion", {"prompt": SHORT, "n_predict": 16, "temperature": 0, "cache_prompt": False})
        post("/completion", {"prompt": prompt_long, "n_predict": 1, "temperature": 0, "cache_prompt": False})
        dec, pre = [], []
        for _ in range(reps):
            r = post("/completion", {"prompt": SHORT, "n_predict": 256, "ignore_eos": True, "temperature": 0,
                                     "cache_prompt": False})
            dec.append(r["timings"])
        for _ in range(reps):
            r = post("/completion", {"prompt": prompt_long, "n_predict": 1, "temperature": 0, "cache_prompt": False})
            pre.append(r["timings"])
        entry["decode_tok_s"] = [round(x["predicted_per_second"], 1) for x in dec]
        entry["decode_tokens"] = dec[-1]["predicted_n"]
        entry["decode_ms_per_token"] = round(statistics.median(x["predicted_ms"] / x["predicted_n"] for x in dec), 3)
        entry["prefill_tok_s"] = [round(x["prompt_per_second"], 1) for x in pre]
        entry["prefill_tokens"] = pre[-1]["prompt_n"]
        entry["decode_tok_s_median"] = statistics.median(entry["decode_tok_s"])
        entry["prefill_tok_s_median"] = statistics.median(entry["prefill_tok_s"])
        print("bench: %-17s decode %7.1f tok/s (%d tok)  prefill %8.1f tok/s (%d tok)  load %.1fs" % (
            name, entry["decode_tok_s_median"], entry["decode_tokens"], entry["prefill_tok_s_median"],
            entry["prefill_tokens"], entry["load_s"]), flush=True)
    except Exception as exc:  # keep going: the other configurations still count
        entry["error"] = "%s: %s" % (type(exc).__name__, exc)
        print("bench: %s: %s" % (name, entry["error"]), flush=True)
    finally:
        stop(proc)
        placement = [line for line in open(log_path, errors="replace").read().splitlines()
                     if any(k in line for k in ("using device", "offloaded", "model buffer size", "KV buffer size"))]
        entry["placement_log"] = placement[:20]
    json.dump(results, open(out_path, "w"), indent=2)
if rpc is not None:
    stop(rpc)
json.dump(results, open(out_path, "w"), indent=2)
