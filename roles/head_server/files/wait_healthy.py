#!/usr/bin/env python3
"""Wait until llama-server's /health answers 200; fail at once when llama-server exits while it loads.

    wait_healthy.py URL TIMEOUT INTERVAL (--log PATH --offset BYTES | --unit NAME --restarts N) [--started EPOCH]
                    [--spec-type TYPE --spec-failure TEXT... [--api-key-file PATH]]

The supervisor writes "[minimax-supervise] ... exited with status N" to the log when llama-server exits; systemd
counts restarts (NRestarts). Either means the load crashed: the script prints the log tail and exits 1 instead
of waiting out the timeout. Exit 2: the timeout passed. Only the standard library is used.

The last line printed is always `LOAD {json}`: what llama.cpp's log says of this start's load so far (the part
of the log after the supervisor's last "starting:" line, or the systemd unit's current invocation). A build with
the project patch rpc-hash-sidecar logs, for the weights set on RPC workers, "ggml_rpc: load progress: ..." every
2 s, "ggml_rpc: hash file F: N tensors" (or "... ignored, WHY: ...") and, once loaded, one "ggml_rpc: weight
hashes: ..." line; `message` says it in words for the role's output.

With --spec-type, a healthy llama-server must also have the speculative decoding it was asked for: llama-server
logs why it could not set it up (--spec-failure: its own lines, e.g. "failed to initialize speculative decoding
context") and then serves without it, its /slots saying "speculative": false. Either makes the start a failure:
the script prints the line and exits 3.
"""
import argparse
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request


def health(url):
    try:
        with urllib.request.urlopen(url + "/health", timeout=10) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return -1


def supervised_exit(log, offset):
    try:
        with open(log, "rb") as handle:
            handle.seek(offset)
            fresh = handle.read().decode(errors="replace")
    except OSError:
        return None
    if "[minimax-supervise]" in fresh and " exited with status " in fresh:
        return "\n".join(fresh.splitlines()[-40:])
    return None


def systemd_restarts(unit):
    out = subprocess.run(["systemctl", "show", "-p", "NRestarts", "--value", unit],
                         capture_output=True, text=True).stdout.strip()
    return int(out) if out.isdigit() else 0


def journal_tail(unit):
    return subprocess.run(["journalctl", "-u", unit, "-n", "40", "--no-pager"], capture_output=True, text=True).stdout


PROGRESS_RE = re.compile(r"ggml_rpc: load progress: weights=(\d+) bytes=(\d+) hashed_bytes=(\d+) sent_bytes=(\d+)")
SUMMARY_RE = re.compile(
    r"ggml_rpc: weight hashes: file_tensors=(?P<file_tensors>\d+) file_bytes=(?P<file_bytes>\d+)"
    r" hashed_tensors=(?P<hashed_tensors>\d+) hashed_bytes=(?P<hashed_bytes>\d+)"
    r" sent_tensors=(?P<sent_tensors>\d+) sent_bytes=(?P<sent_bytes>\d+)"
    r" weights=(?P<weights>\d+) bytes=(?P<bytes>\d+)")
HASH_FILE_RE = re.compile(r"ggml_rpc: hash file (.+?)(?:: (\d+) tensors| ignored, (.*): its tensors are hashed)$")
#: project patch rpc-load-mapped: the worker's weights were set from a mapping of the GGUF, not read by the head
MAPPED_RE = re.compile(r"rpc-load-mapped: (\d+) RPC weights \((\d+) bytes\) set from a mapping of the file")
BUFFER_RE = re.compile(r"load_tensors:\s+(RPC\S*) model buffer size =\s*([\d.]+) MiB")
TAIL_BYTES = 16 << 20


def run_log(log, unit):
    """llama.cpp's log of the current start, as text ('' when it cannot be read)."""
    if unit:
        inv = subprocess.run(["systemctl", "show", "-p", "InvocationID", "--value", unit],
                             capture_output=True, text=True).stdout.strip()
        if not inv:
            return ""
        return subprocess.run(["journalctl", "_SYSTEMD_INVOCATION_ID=" + inv, "-o", "cat", "--no-pager"],
                              capture_output=True, text=True).stdout
    try:
        with open(log, "rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(0, handle.tell() - TAIL_BYTES))
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    start = text.rfind("[minimax-supervise]", 0, max(0, text.rfind(" starting: ")) + 1)
    return text[start:] if start >= 0 else text


def gib(n):
    return "%.2f GiB" % (n / 2.0 ** 30) if n >= 2 ** 30 else "%.1f MiB" % (n / 2.0 ** 20)


def load_state(text, waited):
    """What the log says of the load: the hash files, the progress, the summary; and a message."""
    state = {"waited_s": int(waited), "hash_files": [], "rpc_buffer_bytes": 0, "progress": None, "summary": None,
             "mapped": None}
    for line in text.splitlines():
        line = line.rstrip()
        m = HASH_FILE_RE.search(line)
        if m:
            state["hash_files"].append({"path": m.group(1), "used": m.group(2) is not None,
                                        "tensors": int(m.group(2) or 0), "reason": m.group(3) or ""})
        m = BUFFER_RE.search(line)
        if m:
            state["rpc_buffer_bytes"] += int(float(m.group(2)) * 2 ** 20)
        m = PROGRESS_RE.search(line)
        if m:
            state["progress"] = dict(zip(("weights", "bytes", "hashed_bytes", "sent_bytes"), map(int, m.groups())))
        m = MAPPED_RE.search(line)
        if m:
            mapped = state["mapped"] or {"tensors": 0, "bytes": 0}  # one line per buffer context
            state["mapped"] = {"tensors": mapped["tensors"] + int(m.group(1)),
                               "bytes": mapped["bytes"] + int(m.group(2))}
        m = SUMMARY_RE.search(line)
        if m:
            state["summary"] = {k: int(v) for k, v in m.groupdict().items()}
    s, p = state["summary"], state["progress"]
    if s:
        state["message"] = ("RPC weights: %d tensors (%s) took their hash from the hash file, %d (%s) were hashed; "
                            "%d (%s) were sent to the workers" % (
                                s["file_tensors"], gib(s["file_bytes"]), s["hashed_tensors"], gib(s["hashed_bytes"]),
                                s["sent_tensors"], gib(s["sent_bytes"])))
        if state["mapped"]:
            state["message"] += "; %d (%s) were set from a mapping of the GGUF: the head read only what it sent" % (
                state["mapped"]["tensors"], gib(state["mapped"]["bytes"]))
    elif p:
        total = state["rpc_buffer_bytes"]
        state["message"] = "loading for %d s: %s%s of the workers' weights set (%d tensors; %s hashed, %s sent)" % (
            waited, gib(p["bytes"]), (" of %s" % gib(total)) if total else "", p["weights"],
            gib(p["hashed_bytes"]), gib(p["sent_bytes"]))
    elif state["rpc_buffer_bytes"]:
        state["message"] = "loading for %d s: %s of weights to set on the workers, none set yet" % (
            waited, gib(state["rpc_buffer_bytes"]))
    else:
        state["message"] = "loading for %d s" % waited
    ignored = [f for f in state["hash_files"] if not f["used"]]
    if ignored:
        state["message"] += "; hash files ignored: " + "; ".join("%s (%s)" % (f["path"], f["reason"]) for f in ignored)
    return state


def slots_speculative(url, key_file):
    """True/False: does any slot speculate (llama-server's /slots); None when /slots does not answer."""
    headers = {}
    if key_file:
        try:
            with open(key_file) as handle:
                headers["Authorization"] = "Bearer " + handle.read().strip()
        except OSError:
            pass
    try:
        with urllib.request.urlopen(urllib.request.Request(url + "/slots", headers=headers), timeout=10) as reply:
            slots = json.load(reply)
    except (urllib.error.URLError, OSError, ValueError):
        return None
    if not isinstance(slots, list) or not slots:
        return None
    return any(isinstance(s, dict) and s.get("speculative") for s in slots)


def speculation_failure(args):
    """The reason llama-server serves without the speculation asked for, or None when it speculates."""
    reason = None
    for _ in range(10):  # llama-server's log is written by a thread of its own: give it a moment
        text = run_log(args.log, args.unit)
        found = [line.strip() for line in text.splitlines() if any(f in line for f in args.spec_failure)]
        if found:
            return found[0]
        speculative = slots_speculative(args.url, args.api_key_file)
        if speculative is not False:
            return None
        reason = "its /slots report \"speculative\": false"
        time.sleep(0.5)
    return reason


def report(args, waited, code):
    state = load_state(run_log(args.log, args.unit), waited)
    print("LOAD " + json.dumps(state, sort_keys=True))
    return code


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("timeout", type=float)
    ap.add_argument("interval", type=float)
    ap.add_argument("--log", default="")
    ap.add_argument("--offset", type=int, default=0)
    ap.add_argument("--unit", default="")
    ap.add_argument("--restarts", type=int, default=0)
    ap.add_argument("--started", type=float, default=0.0, help="epoch seconds the wait began (earlier attempts)")
    ap.add_argument("--spec-type", default="")
    ap.add_argument("--spec-failure", action="append", default=[])
    ap.add_argument("--api-key-file", default="")
    args = ap.parse_args()
    start = time.monotonic()
    before = max(0.0, time.time() - args.started) if args.started else 0.0
    status = -1
    while True:
        status = health(args.url)
        attempt = time.monotonic() - start
        waited = attempt + before
        if status == 200:
            failure = speculation_failure(args) if args.spec_type not in ("", "none") else None
            if failure:
                print("llama-server started without the speculative decoding it was asked for "
                      "(head_server_spec_type=%s) and would serve every request without it: %s"
                      % (args.spec_type, failure))
                return 3
            print("llama-server is healthy after %d s" % waited)
            return report(args, waited, 0)
        crash = supervised_exit(args.log, args.offset) if args.log else None
        if args.unit and systemd_restarts(args.unit) > args.restarts:
            crash = journal_tail(args.unit)
        if crash is not None:
            print("llama-server exited while loading, after %d s (/health: %s); it is restarted and would crash "
                  "again. Last log lines:\n%s" % (waited, status, crash))
            return report(args, waited, 1)
        if attempt >= args.timeout:
            print("llama-server did not become healthy within head_server_health_timeout=%d s (/health: %s)"
                  % (args.timeout, status))
            return report(args, waited, 2)
        time.sleep(min(args.interval, 1.0 if attempt < 10 else args.interval))


if __name__ == "__main__":
    sys.exit(main())
