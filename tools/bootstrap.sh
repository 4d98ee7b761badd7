#!/usr/bin/env bash
# Install what the project needs on a Debian/Ubuntu controller: system packages and the venv.
#
#   tools/bootstrap.sh demo    # packages to build llama.cpp and run the demo; .venv from requirements.txt
#   tools/bootstrap.sh test    # plus Docker and debootstrap for molecule, qemu for the arm64 tests, the nodes'
#                              # tools (the integration tests' nodes are offline); .venv from requirements-test.txt
#
# Safe to run again: packages already present and an up-to-date venv are left alone.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
what="${1:-demo}"

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"

packages=(python3 python3-venv python3-pip cmake ninja-build g++ ccache git patch pkg-config iproute2 procps curl ca-certificates libgomp1)
if [ "$what" = test ]; then
  # qemu-user-static and binfmt-support: the arm64 tests run an arm64 root under emulation.
  # tini: PID 1 of the node the integration tests deploy into (tests/support/own-root.sh).
  packages+=(docker.io debootstrap iptables qemu-user-static binfmt-support tini)
  # The integration tests' nodes reach no network, so the tools every node gets (common_packages: iperf3, ethtool,
  # ...) are installed here, where the nodes see them; read from the role, so the two lists never drift.
  nodes="$(sed -n 's/^common_packages: *\[\(.*\)\]$/\1/p' "$root/roles/common/defaults/main.yml" | tr -d ' ' | tr ',' ' ')"
  [ -n "$nodes" ] || { echo "bootstrap: no common_packages list in roles/common/defaults/main.yml" >&2; exit 1; }
  read -r -a node_packages <<< "$nodes"
  packages+=("${node_packages[@]}")
  # npm: tests/integration/test_agents.py installs the real coding agents (pinned there) into .cache/npm.
  command -v npm >/dev/null || packages+=(nodejs npm)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "==> installing ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

# The venv: rebuilt when the requirements change (a stamp holds their hash).
python="${PYTHON:-python3}"
req="$root/requirements.txt"
[ "$what" = test ] && req="$root/requirements-test.txt"
stamp="$root/.venv/.requirements-$(cat "$root/requirements.txt" "$req" | sha256sum | cut -c1-16)"
if [ ! -e "$stamp" ]; then
  echo "==> preparing .venv ($req)" >&2
  [ -x "$root/.venv/bin/python" ] || "$python" -m venv "$root/.venv"
  "$root/.venv/bin/python" -m pip install --quiet --upgrade pip >&2
  "$root/.venv/bin/python" -m pip install --quiet -r "$req" >&2
  rm -f "$root"/.venv/.requirements-*
  touch "$stamp"
fi
