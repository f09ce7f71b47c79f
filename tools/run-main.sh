#!/usr/bin/env bash
# The main job: on Debian 12, run as root from anywhere in the checkout.
# Installs missing build packages, configures build/ (release), builds, then
# trains the digits MLP (tapegrad train digits: accuracy, save, reload check),
# runs the gradient-check sweep over every registered op (one-screen summary),
# and a quick backward benchmark. Safe to run again (build/ is reconfigured).
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
./build/tools/tapegrad train digits
./build/tools/tapegrad gradcheck --summary
./build/tools/tapegrad bench --quick
