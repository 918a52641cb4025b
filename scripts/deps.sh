#!/usr/bin/env bash
# Install the Debian packages braid builds and tests with, when missing.
# usage: scripts/deps.sh [build|test]
set -eu
want=(meson ninja-build pkg-config gcc libssl-dev check libsubunit-dev libibverbs-dev rdma-core)
if [ "${1:-build}" = test ]; then
  want+=(iproute2 gnuplot-nox python3 python3-numpy python3-torch valgrind gdb python3-venv python3-setuptools
         python3-wheel)
fi
missing=()
for p in "${want[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing: ${missing[*]}"
sudo_cmd=""
[ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
$sudo_cmd apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
