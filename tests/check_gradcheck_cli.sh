#!/usr/bin/env bash
# check_gradcheck_cli.sh TAPEGRAD - `tapegrad gradcheck --order 2 --summary`
# checks every differentiable op of the registry at second order and ends
# with its one-line count; that count is what `tapegrad ops` says has a
# backward, all passed; a bad --order is a usage error (exit 2).
set -euo pipefail
tapegrad=$1
out=$("$tapegrad" gradcheck --order 2 --summary)
echo "$out"
last=$(tail -n 1 <<<"$out")
want=$("$tapegrad" ops | tail -n 1 | sed -E 's/.*: ([0-9]+) with a backward.*/\1/')
if ! [[ $last =~ ^([0-9]+)\ ops\ checked,\ ([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
    echo "last line is not 'N ops checked, N passed, N failed': $last" >&2
    exit 1
fi
if [[ ${BASH_REMATCH[1]} != "$want" || ${BASH_REMATCH[2]} != "$want" || ${BASH_REMATCH[3]} != 0 ]]; then
    echo "expected $want ops checked and passed, 0 failed: $last" >&2
    exit 1
fi
head -n 1 <<<"$out" | grep -q "second derivatives" || { echo "header does not say second order" >&2; exit 1; }
set +e
"$tapegrad" gradcheck --order 3 >/dev/null 2>&1
rc=$?
set -e
if [[ $rc != 2 ]]; then
    echo "--order 3 exited $rc, expected 2 (usage)" >&2
    exit 1
fi
echo "tapegrad gradcheck --order 2: $last"
