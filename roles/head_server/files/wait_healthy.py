#!/usr/bin/env python3
"""Wait until llama-server's /health answers 200; fail at once when llama-server exits while it loads.

    wait_healthy.py URL TIMEOUT INTERVAL (--log PATH --offset BYTES | --unit NAME --restarts N)
                    [--spec-type TYPE --spec-failure TEXT... [--api-key-file PATH]]

The supervisor writes "[minimax-supervise] ... exited with status N" to the log when llama-server exits; systemd
counts restarts (NRestarts). Either means the load crashed: the script prints the log tail and exits 1 instead
of waiting out the timeout. Exit 2: the timeout passed.

With --spec-type, a healthy llama-server must also have the speculative decoding it was asked for: llama-server
logs why it could not set it up (--spec-failure: its own lines, e.g. "failed to initialize speculative decoding
context") and then serves without it, its /slots saying "speculative": false. Either makes the start a failure:
the script prints the line and exits 3. Only the standard library is used.
"""
import argparse
import json
import os
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


#: The supervisor's line before each start of the command: the log of this start follows the last one.
START_MARK = "[minimax-supervise] "
START_WORD = " starting: "
LOG_TAIL_BYTES = 8 << 20


def this_start_log(log, unit):
    """What llama-server printed since its current start (supervised log, or the unit's current invocation)."""
    if unit:
        invocation = subprocess.run(["systemctl", "show", "-p", "InvocationID", "--value", unit],
                                    capture_output=True, text=True).stdout.strip()
        argv = ["journalctl", "--no-pager", "-o", "cat"] + (
            ["_SYSTEMD_INVOCATION_ID=" + invocation] if invocation else ["-u", unit, "-n", "2000"])
        return subprocess.run(argv, capture_output=True, text=True).stdout
    try:
        with open(log, "rb") as handle:
            handle.seek(max(0, os.path.getsize(log) - LOG_TAIL_BYTES))
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith(START_MARK) and START_WORD in line]
    return "\n".join(lines[starts[-1] + 1:] if starts else lines)


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
        text = this_start_log(args.log, args.unit)
        found = [line.strip() for line in text.splitlines() if any(f in line for f in args.spec_failure)]
        if found:
            return found[0]
        speculative = slots_speculative(args.url, args.api_key_file)
        if speculative is not False:
            return None
        reason = "its /slots report \"speculative\": false"
        time.sleep(0.5)
    return reason


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("timeout", type=float)
    ap.add_argument("interval", type=float)
    ap.add_argument("--log", default="")
    ap.add_argument("--offset", type=int, default=0)
    ap.add_argument("--unit", default="")
    ap.add_argument("--restarts", type=int, default=0)
    ap.add_argument("--spec-type", default="")
    ap.add_argument("--spec-failure", action="append", default=[])
    ap.add_argument("--api-key-file", default="")
    args = ap.parse_args()
    start = time.monotonic()
    status = -1
    while True:
        status = health(args.url)
        waited = time.monotonic() - start
        if status == 200:
            failure = speculation_failure(args) if args.spec_type not in ("", "none") else None
            if failure:
                print("llama-server started without the speculative decoding it was asked for "
                      "(head_server_spec_type=%s) and would serve every request without it: %s"
                      % (args.spec_type, failure))
                return 3
            print("llama-server is healthy after %d s" % waited)
            return 0
        crash = supervised_exit(args.log, args.offset) if args.log else None
        if args.unit and systemd_restarts(args.unit) > args.restarts:
            crash = journal_tail(args.unit)
        if crash is not None:
            print("llama-server exited while loading, after %d s (/health: %s); it is restarted and would crash "
                  "again. Last log lines:\n%s" % (waited, status, crash))
            return 1
        if waited >= args.timeout:
            print("llama-server did not become healthy within head_server_health_timeout=%d s (/health: %s)"
                  % (args.timeout, status))
            return 2
        time.sleep(min(args.interval, 1.0 if waited < 10 else args.interval))


if __name__ == "__main__":
    sys.exit(main())
