#!/usr/bin/env python3
"""Wait until llama-server's /health answers 200; fail at once when llama-server exits while it loads.

    wait_healthy.py URL TIMEOUT INTERVAL (--log PATH --offset BYTES | --unit NAME --restarts N)

The supervisor writes "[minimax-supervise] ... exited with status N" to the log when llama-server exits; systemd
counts restarts (NRestarts). Either means the load crashed: the script prints the log tail and exits 1 instead
of waiting out the timeout. Exit 2: the timeout passed. Only the standard library is used.
"""
import argparse
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("timeout", type=float)
    ap.add_argument("interval", type=float)
    ap.add_argument("--log", default="")
    ap.add_argument("--offset", type=int, default=0)
    ap.add_argument("--unit", default="")
    ap.add_argument("--restarts", type=int, default=0)
    args = ap.parse_args()
    start = time.monotonic()
    status = -1
    while True:
        status = health(args.url)
        waited = time.monotonic() - start
        if status == 200:
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
