#!/usr/bin/env bash
# Run a command on a node of its own: this machine's root seen through an overlay whose writes go to a tmpfs, in its
# own mount, PID, network (loopback only), IPC and UTS namespaces. The integration tests deploy there: the services,
# ports, local facts, firewall rules and installs they make are the node's, and end with it; a deployment serving on
# this machine is never seen, signalled or replaced. The node starts as a fresh Spark would: no deployment (the
# project's folders, facts and settings are empty there), this machine's packages and tools.
#
#   tests/support/own-root.sh COMMAND [ARG...]     # as root; run from anywhere, the working directory is kept
#
# Shared with this machine, read-write: the project checkout (its .cache: the llama.cpp source, the demo model, the
# agents from npm) and the llama.cpp build cache (build_llamacpp_cache_dir, ccache): a build is never redone.
# Every process of the node ends when COMMAND ends; its tmpfs and its /tmp go with it. The exit status is COMMAND's.
set -euo pipefail

if [ "${MINIMAX_SPARK_OWN_ROOT:-}" = inside ]; then
  # PID 1 of the node's namespaces (under tini, which reaps the services' orphans): build the root, enter it. The
  # overlay's writes go to a tmpfs mounted in this mount namespace only (an upper layer on the root file system
  # would overlap its lower one); the node's /tmp is $base/tmp, on disk (the tests write models and caches there).
  base="$1" workdir="$2"
  shift 2
  mkdir -p "$base/layer" "$base/tmp"
  chmod 1777 "$base/tmp"
  mount -t tmpfs -o "size=${MINIMAX_SPARK_OWN_ROOT_SIZE:-60%},mode=0755" own-root "$base/layer"
  base="$base/layer"
  mkdir -p "$base/upper" "$base/work" "$base/root"
  # A fresh Spark: the project's own folders start empty (opaque over this machine's).
  python3 -c 'import os, sys
for d in sys.argv[2:]:
    os.makedirs(os.path.join(sys.argv[1], d))
    os.setxattr(os.path.join(sys.argv[1], d), "trusted.overlay.opaque", b"y")' "$base/upper" \
    etc/ansible/facts.d etc/minimax-spark etc/netns opt/minimax-spark var/lib/minimax-spark var/log/minimax-spark
  mount -t overlay overlay -o "lowerdir=/,upperdir=$base/upper,workdir=$base/work" "$base/root"
  r="$base/root"
  mount --rbind /dev "$r/dev"
  mount --rbind /sys "$r/sys"
  mount -t proc proc "$r/proc"
  mount -t tmpfs -o mode=0755 run "$r/run"
  mkdir -p "$r/run/lock"
  mount --bind "${base%/layer}/tmp" "$r/tmp"
  for shared in "$MINIMAX_SPARK_OWN_ROOT_PROJECT" /var/cache/minimax-spark; do
    mkdir -p "$shared" "$r$shared"
    mount --bind "$shared" "$r$shared"
  done
  [ -x "$r$MINIMAX_SPARK_OWN_ROOT_PROJECT/tests/support/own-root.sh" ] || {
    echo "own-root: the checkout $MINIMAX_SPARK_OWN_ROOT_PROJECT is not visible on the node" >&2; exit 2; }
  hostname "$(hostname)-test"
  export MINIMAX_SPARK_OWN_ROOT=node
  exec chroot "$r" /bin/sh -c 'ip link set lo up && cd "$1" && shift && exec "$@"' own-root "$workdir" "$@"
fi

[ "$(id -u)" -eq 0 ] || { echo "own-root: run as root (it mounts and makes namespaces)" >&2; exit 2; }
for tool in unshare tini chroot ip python3; do
  command -v "$tool" >/dev/null || { echo "own-root: $tool is missing (tools/bootstrap.sh test installs it)" >&2; exit 2; }
done
[ "$#" -gt 0 ] || { echo "usage: $0 COMMAND [ARG...]" >&2; exit 2; }
# The node's folder: its /tmp, and the mount point of its tmpfs (a folder of its own: a checkout under /tmp stays
# visible). Removed with the node.
base="$(mktemp -d /var/tmp/minimax-spark-node.XXXXXX)"
MINIMAX_SPARK_OWN_ROOT=inside MINIMAX_SPARK_OWN_ROOT_PROJECT="$(cd "$(dirname "$0")/../.." && pwd)" \
  unshare --mount --pid --net --ipc --uts --fork --kill-child --propagation private \
  tini -s -g -- "$0" "$base" "$PWD" "$@" &
node=$!
# unshare ignores SIGINT and SIGTERM: stopping this script ends the node (its PID 1, so every process in it).
trap 'pkill -KILL -P "$node"; rm -rf "$base"; exit 143' TERM
trap 'pkill -KILL -P "$node"; rm -rf "$base"; exit 130' INT
status=0
wait "$node" || status=$?
rm -rf "$base"
exit "$status"
