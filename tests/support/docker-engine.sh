#!/usr/bin/env bash
# Make sure a Docker engine answers, and print the DOCKER_HOST to use on stdout.
#
#   tests/support/docker-engine.sh            -> unix:///var/run/docker.sock
#   export DOCKER_HOST="$(tests/support/docker-engine.sh)"
#
# An engine that already answers (at $DOCKER_HOST, or the default socket) is used as it is.
# Otherwise Debian's docker.io (and iptables) is installed when missing and `dockerd` is started
# in the background with iptables ON: without its NAT/forward rules, TCP between containers on
# a user-defined network times out. Safe to call twice (and from two shells at once: a lock
# serialises the start). Needs root to start an engine.
#
# Environment: MINIMAX_SPARK_DOCKER_ROOT (data root, default /var/lib/docker),
#              MINIMAX_SPARK_DOCKER_SOCK (default /var/run/docker.sock),
#              MINIMAX_SPARK_DOCKER_LOG  (default /var/log/minimax-spark-dockerd.log).
set -euo pipefail

data_root="${MINIMAX_SPARK_DOCKER_ROOT:-/var/lib/docker}"
sock="${MINIMAX_SPARK_DOCKER_SOCK:-/var/run/docker.sock}"
log="${MINIMAX_SPARK_DOCKER_LOG:-/var/log/minimax-spark-dockerd.log}"
pidfile="${sock%.sock}.pid"
[ "$pidfile" = "$sock" ] && pidfile="$sock.pid"
host="unix://$sock"

say() { echo "docker-engine: $*" >&2; }

answers() { DOCKER_HOST="$1" timeout 20 docker info >/dev/null 2>&1; }

# 1. An engine the caller already points at, or the one on our socket.
if command -v docker >/dev/null 2>&1; then
  if [ -n "${DOCKER_HOST:-}" ] && answers "$DOCKER_HOST"; then echo "$DOCKER_HOST"; exit 0; fi
  if answers "$host"; then echo "$host"; exit 0; fi
fi

if [ "$(id -u)" -ne 0 ]; then
  say "no Docker engine answers at $host and starting one needs root"
  exit 1
fi

# 2. Packages (a fresh machine has none of them).
need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v docker >/dev/null 2>&1 || need+=(docker.io)
command -v iptables >/dev/null 2>&1 || need+=(iptables)
if [ "${#need[@]}" -gt 0 ]; then
  say "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
fi

# 3. Start dockerd once (the lock keeps two concurrent callers from starting two daemons).
mkdir -p "$(dirname "$log")" "$(dirname "$sock")" "$data_root"
exec 9>"$sock.minimax-spark.lock"
flock 9
if ! answers "$host"; then
  # iptables-nft needs nf_tables in the kernel; fall back to the legacy backend when it fails.
  if ! iptables -w -L -n >/dev/null 2>&1 && command -v iptables-legacy >/dev/null 2>&1 \
     && iptables-legacy -w -L -n >/dev/null 2>&1; then
    say "iptables-nft does not work here: switching the iptables alternative to legacy"
    update-alternatives --set iptables /usr/sbin/iptables-legacy >&2
    update-alternatives --set ip6tables /usr/sbin/ip6tables-legacy >&2 || true
  fi
  # A daemon that died leaves its pid file behind, and dockerd refuses to start over it.
  if [ -s "$pidfile" ] && ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    rm -f "$pidfile"
  fi
  if [ -s "$pidfile" ]; then
    say "dockerd (pid $(cat "$pidfile")) runs but does not answer yet; waiting for it"
  else
    say "starting dockerd (data root $data_root, log $log)"
    # setsid + nohup: the daemon outlives this script and the shell that called it. It must not inherit any
    # descriptor beyond 0-2: a caller's lock (`flock FILE tools/molecule-test`, fd 3) or this script's (fd 9)
    # would stay held for the daemon's whole life and block every later caller.
    (
      for fd in /proc/self/fd/*; do
        fd="${fd##*/}"
        [ "$fd" -gt 2 ] 2>/dev/null && eval "exec $fd>&-" 2>/dev/null
      done
      exec setsid nohup dockerd --data-root "$data_root" -H "$host" --pidfile "$pidfile" \
        --iptables=true --ip-forward=true >>"$log" 2>&1 </dev/null
    ) &
  fi
  for _ in $(seq 1 120); do
    answers "$host" && break
    sleep 0.5
  done
  if ! answers "$host"; then
    say "dockerd did not answer within 60 s; last lines of $log:"
    tail -n 30 "$log" >&2 || true
    exit 1
  fi
fi
flock -u 9
echo "$host"
