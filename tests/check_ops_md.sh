#!/usr/bin/env bash
# check_ops_md.sh TAPEGRAD OPS_MD - fails when the committed docs/ops.md is
# not what `tapegrad ops --markdown` prints from the registry now.
set -euo pipefail
tapegrad=$1
committed=$2
tmp=$(mktemp "${TMPDIR:-/tmp}/tapegrad-ops-md.XXXXXX")
trap 'rm -f "$tmp"' EXIT
"$tapegrad" ops --markdown >"$tmp"
if ! diff -u "$committed" "$tmp"; then
    echo >&2
    echo "docs/ops.md is out of date with the op registry (diff above: - committed, + generated)." >&2
    echo "Regenerate it from the source root with:" >&2
    echo "    ./build/tools/tapegrad ops --markdown > docs/ops.md" >&2
    exit 1
fi
echo "docs/ops.md matches \`tapegrad ops --markdown\`"
