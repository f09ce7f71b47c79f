#!/usr/bin/env bash
# check_train_nonfinite.sh TAPEGRAD - `tapegrad train digits` with a
# learning rate that diverges stops at the first non-finite loss with a
# message naming it, exits 1, and saves nothing.
set -euo pipefail
tapegrad=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
set +e
err=$("$tapegrad" train digits --lr 1e30 --epochs 2 --quiet --save "$dir/m.safetensors" 2>&1 >/dev/null)
rc=$?
set -e
echo "$err"
if [[ $rc != 1 ]]; then
    echo "exited $rc, expected 1" >&2
    exit 1
fi
grep -Eq "the loss is (NaN|infinite) at epoch 1, step [0-9]+" <<<"$err" || {
    echo "no message naming the non-finite loss" >&2
    exit 1
}
if compgen -G "$dir/*" >/dev/null; then
    echo "files were written: $(ls "$dir")" >&2
    exit 1
fi
echo "tapegrad train --lr 1e30: stopped with exit 1, nothing saved"
