#!/usr/bin/env bash
# The test command: on Debian 12, run as root from anywhere in the checkout.
# Installs missing build packages, configures build/ (release), builds, and
# runs the whole test suite. Safe to run again (build/ is reconfigured).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

packages=(meson ninja-build pkg-config gcc libc6-dev python3
          libcriterion-dev libopenblas-dev libjemalloc-dev zlib1g-dev libjansson-dev)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update
    apt-get install -y "${missing[@]}"
fi

if [ -f build/build.ninja ]; then
    meson setup --reconfigure build --buildtype=release
else
    meson setup build --buildtype=release
fi
ninja -C build
meson test -C build --print-errorlogs
