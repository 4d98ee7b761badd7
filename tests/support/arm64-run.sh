#!/usr/bin/env bash
# Run a command inside the arm64 root (tests/support/arm64-root.sh) under qemu, with this project
# mounted read-only at its own path, a fresh /tmp, /proc and /dev; the mounts live in a private
# mount namespace and vanish with the command.
#
#   tests/support/arm64-run.sh ROOT [--offline] [--rw DIR]... -- COMMAND [ARG...]
#
# --offline: a network namespace of its own (no network at all, not even to the Debian mirror or PyPI).
# --rw DIR:  DIR (a host folder) is mounted read-write at the same path inside.
# The command runs as root in the root, in the project folder, with PATH of a Debian system, HOME=/root, LANG=C.UTF-8 and
# PYTHONPATH=/opt/minimax-spark-test/site (the aarch64 wheels); PYTHONDONTWRITEBYTECODE keeps the
# read-only project clean.
set -euo pipefail
project="$(cd "$(dirname "$0")/../.." && pwd)"
root="$1"; shift
offline=()
rw=()
while [ "$#" -gt 0 ]; do
  case "$1" in
    --offline) offline=(--net); shift ;;
    --rw) rw+=("$2"); shift 2 ;;
    --) shift; break ;;
    *) echo "arm64-run: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -e "$root/.minimax-spark-complete" ] || { echo "arm64-run: $root is not a finished arm64 root" >&2; exit 2; }

# Binds: the project and the real folder behind its .cache symlink (read-only), then --rw folders.
cache="$(readlink -f "$project/.cache" 2>/dev/null || true)"
binds=("$project:ro")
[ -n "$cache" ] && [ -d "$cache" ] && [ "${cache#"$project"/}" = "$cache" ] && binds+=("$cache:ro")
for dir in "${rw[@]}"; do binds+=("$dir:rw"); done

mounts='
set -e
mount -t proc proc "$R/proc"
mount --rbind /dev "$R/dev"
mount -t tmpfs -o mode=1777 tmpfs "$R/tmp"
for b in $BINDS; do
  dir="${b%:*}"; mode="${b##*:}"
  mkdir -p "$R$dir"
  mount --bind "$dir" "$R$dir"
  [ "$mode" = ro ] && mount -o remount,bind,ro "$R$dir"
done
exec chroot "$R" /usr/bin/env -i -C "$P" PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  HOME=/root LANG=C.UTF-8 PYTHONPATH=/opt/minimax-spark-test/site PYTHONDONTWRITEBYTECODE=1 "$@"
'
R="$root" P="$project" BINDS="${binds[*]}" exec unshare --mount --propagation private "${offline[@]}" -- sh -c "$mounts" sh "$@"
