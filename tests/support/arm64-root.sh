#!/usr/bin/env bash
# Build (once) an arm64 Debian root file system that runs under qemu, for the arm64 tests: the
# DGX Sparks are aarch64, and this is where the project's Python, its C library and
# tools/bootstrap.sh meet an aarch64 machine without one. Prints the root's path.
#
#   tests/support/arm64-root.sh          -> ~/.cache/minimax-spark/arm64-root/bookworm-<hash>
#
# The root holds python3 and every package `tools/bootstrap.sh demo` installs (read from that
# script, so the two never drift), and /opt/minimax-spark-test/site: the controller's Python
# requirements plus pytest as aarch64 wheels (`pip install --platform ... --only-binary=:all:`
# run by this host's pip, nothing compiled or installed under emulation).
#
# Cached twice under ~/.cache/minimax-spark/arm64-root/: the root by a hash of its suite, packages and this
# recipe (debootstrap under emulation: several minutes, once), the Python site by a hash of the
# requirements (seconds from the local wheel index). Older roots are removed.
#
# Exit status 77 with the reason on stderr: this host cannot run arm64 programs at all (not
# root, no binfmt_misc in the kernel, qemu-user-static not installable). Any other failure is a
# failure. Environment: MINIMAX_SPARK_DEBIAN_MIRROR (default: the mirror apt uses here),
# MINIMAX_SPARK_ARM64_CACHE (default ~/.cache/minimax-spark/arm64-root: one root for every clone on the machine, like the llama.cpp build cache).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
project="$(cd "$here/../.." && pwd)"
cache="${MINIMAX_SPARK_ARM64_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/minimax-spark/arm64-root}"
suite=bookworm
site=/opt/minimax-spark-test/site

say() { echo "arm64-root: $*" >&2; }
cannot() { say "this host cannot run arm64 programs: $*"; exit 77; }

# One home for the package list: what tools/bootstrap.sh installs for the demo, plus Python.
eval "$(grep -m1 '^packages=(' "$project/tools/bootstrap.sh")"
packages=(python3 "${packages[@]}")

# --- can this host run aarch64 binaries? ----------------------------------------------------
[ "$(id -u)" -eq 0 ] || cannot "debootstrap and chroot need root"
binfmt=/proc/sys/fs/binfmt_misc
if [ ! -e "$binfmt/status" ]; then
  mount -t binfmt_misc binfmt_misc "$binfmt" 2>/dev/null || cannot "binfmt_misc cannot be mounted on $binfmt"
fi
if [ ! -e "$binfmt/qemu-aarch64" ] && [ "$(uname -m)" != aarch64 ]; then
  if ! command -v update-binfmts >/dev/null || ! [ -e /usr/libexec/qemu-binfmt/aarch64-binfmt-P ]; then
    say "installing qemu-user-static binfmt-support"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends qemu-user-static binfmt-support; } >&2 \
      || cannot "qemu-user-static and binfmt-support could not be installed"
  fi
  update-binfmts --enable qemu-aarch64 >&2 2>/dev/null || true
  [ -e "$binfmt/qemu-aarch64" ] || cannot "aarch64 is not registered in $binfmt (update-binfmts --enable qemu-aarch64 failed)"
fi
grep -qx enabled "$binfmt/qemu-aarch64" 2>/dev/null || [ "$(uname -m)" = aarch64 ] \
  || cannot "the qemu-aarch64 entry in $binfmt is disabled"
command -v debootstrap >/dev/null || {
  say "installing debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >&2
}

# The mirror apt uses here (deb822 `URIs:` or one-line `deb URL suite`), unless told otherwise.
mirror="${MINIMAX_SPARK_DEBIAN_MIRROR:-}"
if [ -z "$mirror" ]; then
  mirror="$(
    { grep -hE '^\s*URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}'
      grep -hE '^\s*deb\s' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
        | sed -E 's/\[[^]]*\]//' | awk '{print $2}'
    } | grep -E '/debian/?$' | head -n 1 || true
  )"
  mirror="${mirror:-http://deb.debian.org/debian}"
fi

# --- the root file system --------------------------------------------------------------------
key="$({ echo "suite=$suite arch=arm64 variant=minbase"; printf 'pkg=%s\n' "${packages[@]}"; } | sha256sum | cut -c1-12)"
root="$cache/$suite-$key"
if [ ! -e "$root/.minimax-spark-complete" ]; then
  mkdir -p "$cache"
  work="$(mktemp -d "$cache/.build.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  say "debootstrap --arch=arm64 $suite from $mirror under qemu (several minutes, once)"
  start=$SECONDS
  include="$(IFS=,; echo "${packages[*]}")"
  if ! nice -n 10 debootstrap --arch=arm64 --variant=minbase --include="$include" "$suite" "$work/root" "$mirror" \
        >"$work/debootstrap.log" 2>&1; then
    tail -n 40 "$work/debootstrap.log" >&2
    tail -n 40 "$work/root/debootstrap/debootstrap.log" >&2 2>/dev/null || true
    exit 1
  fi
  machine="$(chroot "$work/root" /usr/bin/python3 -c 'import platform; print(platform.machine())')"
  [ "$machine" = aarch64 ] || { say "the new root's python3 reports $machine, not aarch64"; exit 1; }
  rm -rf "$work/root/var/cache/apt/archives/"*.deb "$work/root/var/lib/apt/lists/"*
  echo "built in $((SECONDS - start)) s" > "$work/root/.minimax-spark-complete"
  rm -rf "$root"
  mv "$work/root" "$root"
  say "root built in $((SECONDS - start)) s: $root"
  find "$cache" -mindepth 1 -maxdepth 1 -name "$suite-*" ! -name "$suite-$key" -exec rm -rf {} +
fi

# --- the Python site: aarch64 wheels, downloaded and installed by this host's pip -------------
# A requirement without an aarch64 wheel (or a pure-Python one) fails here, naming it: on a Spark,
# pip would try to compile it from source or fail the same way.
req="$here/arm64-requirements.txt"
pyver="$(chroot "$root" /usr/bin/python3 -c 'import sys; print("%d%d" % sys.version_info[:2])')"
site_key="$(cat "$req" "$project/requirements.txt" | { cat; echo "py=$pyver"; } | sha256sum | cut -c1-12)"
wheels="$cache/wheels-$site_key"
pip=(python3 -m pip)
[ -x "$project/.venv/bin/python" ] && pip=("$project/.venv/bin/python" -m pip)
# manylinux2014 is glibc 2.17; newer wheels say manylinux_2_28 (bookworm has glibc 2.36).
platform=(--only-binary=:all: --implementation cp --python-version "$pyver" --abi "cp$pyver" --abi abi3 --abi none
          --platform manylinux2014_aarch64 --platform manylinux_2_28_aarch64 --platform linux_aarch64)
if [ ! -e "$wheels/.complete" ]; then
  say "downloading $req as aarch64 wheels for cp$pyver into $wheels"
  rm -rf "$wheels"
  if ! "${pip[@]}" download --quiet --dest "$wheels" "${platform[@]}" -r "$req" >"$cache/wheels.log" 2>&1; then
    grep -E "^ERROR" "$cache/wheels.log" >&2 || tail -n 20 "$cache/wheels.log" >&2
    say "a requirement has no aarch64 (or pure-Python) wheel for cp$pyver: see above"
    exit 1
  fi
  touch "$wheels/.complete"
  find "$cache" -mindepth 1 -maxdepth 1 -name 'wheels-*' ! -name "wheels-$site_key" -exec rm -rf {} +
fi
if [ ! -e "$root$site.$site_key" ]; then
  say "installing the aarch64 wheels into $site"
  rm -rf "$root$site" "$root$site".*
  "${pip[@]}" install --quiet --no-index --find-links "$wheels" --target "$root$site" --no-warn-conflicts \
    "${platform[@]}" -r "$req" >"$cache/site.log" 2>&1 || { tail -n 20 "$cache/site.log" >&2; exit 1; }
  touch "$root$site.$site_key"
fi
echo "$root"
