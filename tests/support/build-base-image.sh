#!/usr/bin/env bash
# Build the Debian bookworm + systemd image the molecule scenario runs its nodes in, without a
# registry: `debootstrap` a root file system and `docker import` it. Prints the image tag.
#
#   tests/support/build-base-image.sh                -> minimax-spark/bookworm-systemd:<recipe hash>
#   tests/support/build-base-image.sh --arch arm64   -> minimax-spark/bookworm-systemd-arm64:<recipe hash>
#
# --arch arm64 (molecule/arm64's worker, run under qemu): no second debootstrap; the cached arm64
# root of tests/support/arm64-root.sh (which already holds python3 and the build toolchain) is
# copied, the node packages below are added with apt-get in a chroot under qemu, and the same
# customisation runs (a few minutes, once; then cached like the x86 image).
#
# Cached twice: the image is skipped when the tag for this recipe already exists (and carries the
# recipe label), and the root file system tarball is kept under $MINIMAX_SPARK_IMAGE_CACHE
# (/var/cache/minimax-spark/images) so that a fresh engine re-imports it in seconds. The recipe
# hash covers the suite, the package list, the image settings and the customisation step below:
# change any of them and a new image is built next to the old one.
#
# Environment: DOCKER_HOST (default: whatever tests/support/docker-engine.sh prints),
#              MINIMAX_SPARK_DEBIAN_MIRROR (default: the Debian mirror apt uses on this machine),
#              MINIMAX_SPARK_IMAGE_CACHE, MINIMAX_SPARK_IMAGE_REPO (default minimax-spark/bookworm-systemd).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

arch=""
case "${1:-}" in
  --arch) arch="${2:?--arch needs an architecture (arm64)}" ;;
  "") ;;
  *) echo "build-base-image: unknown argument $1 (usage: $0 [--arch arm64])" >&2; exit 2 ;;
esac
case "$arch" in
  ""|amd64|x86_64) arch="" ;;
  arm64|aarch64) arch=arm64 ;;
  *) echo "build-base-image: --arch $arch: only arm64 (or the host's own) is supported" >&2; exit 2 ;;
esac

suite=bookworm
repo="${MINIMAX_SPARK_IMAGE_REPO:-minimax-spark/bookworm-systemd${arch:+-$arch}}"
cache="${MINIMAX_SPARK_IMAGE_CACHE:-/var/cache/minimax-spark/images}"
# What a DGX Spark node already has and the roles rely on: Python for Ansible (python3-apt for
# the apt module), sudo (`become` uses it even as root), systemd as PID 1, iproute2/procps/curl
# for the checks, iptables for the RPC firewall, libgomp1 for llama.cpp's CPU backend (the
# binaries need nothing else beyond libc and libstdc++).
packages=(
  python3 python3-apt sudo systemd systemd-sysv dbus iproute2 procps curl ca-certificates iptables
  libgomp1
)
# Image settings (`docker import --change`; this engine refuses STOPSIGNAL there: molecule.yml
# sets stop_signal). systemd wants `container=` to know it runs in one.
changes=(
  'ENV container=docker'
  'ENV LANG=C.UTF-8'
  'CMD ["/lib/systemd/systemd"]'
)

say() { echo "build-base-image: $*" >&2; }

# --arch arm64: a copy of the cached arm64 root plus the node packages, installed under qemu.
from_arm64_root() {
  local src="$1" root="$2"
  cp -a "$src" "$root"
  rm -rf "$root/opt/minimax-spark-test" "$root"/opt/minimax-spark-test.* "$root/.minimax-spark-complete"
  printf 'deb %s %s main\ndeb %s %s-updates main\n' "$mirror" "$suite" "$mirror" "$suite" > "$root/etc/apt/sources.list"
  mount -t proc proc "$root/proc"
  mount --bind /dev "$root/dev"
  local rc=0
  { chroot "$root" apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get install -y -qq --no-install-recommends "${packages[@]}"
  } >"$root.apt.log" 2>&1 || rc=$?
  umount "$root/dev" "$root/proc"
  if [ "$rc" -ne 0 ]; then tail -n 40 "$root.apt.log" >&2; return "$rc"; fi
}

# Runs inside the new root: trims what does not belong in a container node.
customise() {
  local root="$1"
  # No consoles, no hardware, no first-boot wizard in a container.
  for unit in getty@tty1.service console-getty.service serial-getty@.service systemd-udevd.service \
              systemd-firstboot.service systemd-remount-fs.service dev-hugepages.mount \
              sys-fs-fuse-connections.mount systemd-modules-load.service; do
    ln -sf /dev/null "$root/etc/systemd/system/$unit"
  done
  # An empty machine-id: systemd writes a fresh one at first boot of each container.
  : > "$root/etc/machine-id"
  rm -f "$root/var/lib/dbus/machine-id"
  # Let apt in the container work with the same mirror, and keep images small.
  printf 'deb %s %s main\ndeb %s %s-updates main\n' "$mirror" "$suite" "$mirror" "$suite" \
    > "$root/etc/apt/sources.list"
  printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
    > "$root/etc/apt/apt.conf.d/90minimax-spark-norecommends"
  chroot "$root" apt-get clean
  rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/log/*.log \
         "$root"/tmp/* "$root"/var/tmp/*
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

# The root file system's hash (suite, packages, customisation) names the cached tarball; the
# recipe hash adds the image settings and names the image.
rootfs_hash="$(
  { echo "suite=$suite"; printf 'pkg=%s\n' "${packages[@]}"; declare -f customise; } \
    | sha256sum | cut -c1-12
)"
stem=bookworm-systemd
if [ "$arch" = arm64 ]; then
  # The arm64 root's own name carries its hash (suite, packages, recipe): a new root, a new image.
  arm64_root="$("$here/arm64-root.sh")"
  rootfs_hash="$(
    { echo "$rootfs_hash"; echo "arm64-root=$(basename "$arm64_root")"; declare -f from_arm64_root; } \
      | sha256sum | cut -c1-12
  )"
  stem=bookworm-systemd-arm64
fi
recipe_hash="$({ echo "$rootfs_hash"; printf 'change=%s\n' "${changes[@]}"; } | sha256sum | cut -c1-12)"
tag="$repo:$recipe_hash"

if [ -z "${DOCKER_HOST:-}" ]; then
  DOCKER_HOST="$("$here/docker-engine.sh")"
fi
export DOCKER_HOST

label="$(docker image inspect --format '{{ index .Config.Labels "minimax-spark.recipe" }}' "$tag" 2>/dev/null || true)"
if [ "$label" = "$recipe_hash" ]; then
  docker tag "$tag" "$repo:latest"
  say "image $tag is up to date"
  echo "$tag"
  exit 0
fi

mkdir -p "$cache"
tarball="$cache/$stem-$rootfs_hash.tar"
if [ ! -s "$tarball" ] && [ "$arch" = arm64 ]; then
  work="$(mktemp -d "$cache/.build.XXXXXX")"
  trap 'umount "$work/root/dev" "$work/root/proc" 2>/dev/null; rm -rf "$work"' EXIT
  say "arm64: the cached arm64 root plus ${packages[*]} (apt-get under qemu, a few minutes, once)"
  start=$SECONDS
  renice -n 10 -p $$ >/dev/null  # emulated dpkg: leave the cores to the others' work first
  from_arm64_root "$arm64_root" "$work/root"
  customise "$work/root"
  tar --numeric-owner --xattrs -C "$work/root" -cf "$work/rootfs.tar" .
  mv "$work/rootfs.tar" "$tarball"
  say "arm64 root file system built in $((SECONDS - start)) s: $tarball"
fi
if [ ! -s "$tarball" ]; then
  if [ "$(id -u)" -ne 0 ]; then say "debootstrap needs root"; exit 1; fi
  if ! command -v debootstrap >/dev/null 2>&1; then
    say "installing debootstrap"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends debootstrap >&2
  fi
  work="$(mktemp -d "$cache/.build.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  say "debootstrap $suite from $mirror (about 2 minutes)"
  start=$SECONDS
  include="$(IFS=,; echo "${packages[*]}")"
  if ! debootstrap --variant=minbase --include="$include" "$suite" "$work/root" "$mirror" \
        >"$work/debootstrap.log" 2>&1; then
    tail -n 40 "$work/debootstrap.log" >&2
    tail -n 40 "$work/root/debootstrap/debootstrap.log" >&2 2>/dev/null || true
    exit 1
  fi
  customise "$work/root"
  tar --numeric-owner --xattrs -C "$work/root" -cf "$work/rootfs.tar" .
  mv "$work/rootfs.tar" "$tarball"
  say "root file system built in $((SECONDS - start)) s: $tarball"
fi

import_args=()
[ "$arch" = arm64 ] && import_args+=(--platform linux/arm64)
for change in "${changes[@]}" "LABEL minimax-spark.recipe=$recipe_hash"; do
  import_args+=(--change "$change")
done
say "importing $tarball as $tag"
docker import "${import_args[@]}" "$tarball" "$tag" >/dev/null
docker tag "$tag" "$repo:latest"
# Older recipes' tarballs and images are of no further use (an image still in use stays).
find "$cache" -maxdepth 1 -name "$stem-*.tar" ! -name "$stem-$rootfs_hash.tar" ! -name "$stem-arm64-*" -delete
docker image ls --format '{{.Repository}}:{{.Tag}}' "$repo" \
  | grep -v -x -F -e "$tag" -e "$repo:latest" | xargs -r docker rmi >/dev/null 2>&1 || true
echo "$tag"
