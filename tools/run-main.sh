#!/usr/bin/env bash
# The main job: on Debian 12, run as root from anywhere in the checkout.
# Installs missing build packages, configures build/ (release), builds, then
# trains the digits MLP (tapegrad train digits: accuracy, save, reload check),
# runs the gradient-check sweep over every registered op (one-screen summary),
# and a quick backward benchmark. Safe to run again (build/ is reconfigured).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. tools/setup-build.sh
./build/tools/tapegrad train digits
./build/tools/tapegrad gradcheck --summary
./build/tools/tapegrad bench --quick
