#!/usr/bin/env bash
# The test command: on Debian 12, run as root from anywhere in the checkout.
# Installs missing build packages, configures build/ (release), builds, and
# runs the whole test suite. Safe to run again (build/ is reconfigured).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. tools/setup-build.sh
meson test -C build --print-errorlogs
