#!/usr/bin/env bash
# check_cli.sh TAPEGRAD DATA_CSV - the CLI as a new user meets it (issue 15):
# every subcommand has its own --help (stdout, exit 0); a bad value is one
# line naming the option; --opt=value works; an unknown data set is named;
# a --save that cannot be written fails before training; a save past
# `ulimit -f` fails with a message and leaves no temporary file.
set -uo pipefail
tapegrad=$1
data=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

# run ARGS...: sets rc, out, err
run() {
    "$tapegrad" "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    out=$(cat "$tmp/out")
    err=$(cat "$tmp/err")
}

for cmd in "train digits" "train" "gradcheck" "ops" "demo" "bench"; do
    # shellcheck disable=SC2086  # the words of cmd are separate arguments
    run $cmd --help
    word=${cmd%% *}
    [[ $rc == 0 ]] || fail "$cmd --help exited $rc"
    [[ $out == "usage: tapegrad $word"* ]] || fail "$cmd --help: stdout does not start with its own usage: ${out%%$'\n'*}"
    [[ $out != *"commands:"* ]] || fail "$cmd --help printed the global help"
    [[ -z $err ]] || fail "$cmd --help wrote to stderr: $err"
done

run train digits --epochs 0 --data "$data"
[[ $rc == 2 ]] || fail "--epochs 0 exited $rc, want 2"
[[ $err == "tapegrad train: --epochs needs an integer in [1, 100000], got '0'" ]] ||
    fail "--epochs 0: stderr is not the one line naming the range: $err"
run train digits --epochs=0 --data "$data"
[[ $rc == 2 && $err == *"--epochs needs an integer in [1, 100000], got '0'" ]] ||
    fail "--epochs=0 not parsed as --epochs 0 (rc $rc): $err"
run train digits --epochs
[[ $rc == 2 && $err == "tapegrad train: --epochs needs a value" ]] || fail "--epochs without value: $err"
run train digits --frobnicate
[[ $rc == 2 && $err == *"unknown option '--frobnicate'"* ]] || fail "unknown option: $err"
run train mnist
[[ $rc == 2 && $err == *"unknown data set 'mnist'"* ]] || fail "train mnist (rc $rc): $err"

run train digits --epochs=1 --quiet --data "$data" --save "$tmp/no/such/dir/m.safetensors"
[[ $rc == 1 && $err == *"cannot write '$tmp/no/such/dir/m.safetensors' (--save)"* ]] ||
    fail "unwritable --save (rc $rc): $err"
[[ $out != *"test accuracy"* ]] || fail "unwritable --save was found only after training"

mkdir "$tmp/lim"
( ulimit -f 4; "$tapegrad" train digits --epochs=1 --quiet --data "$data" \
      --save="$tmp/lim/m.safetensors" >"$tmp/out" 2>"$tmp/err" )
rc=$?
[[ $rc == 1 ]] || fail "save past ulimit -f exited $rc, want 1"
grep -q "saving the parameters" "$tmp/err" || fail "save past ulimit -f: $(cat "$tmp/err")"
left=$(ls -A "$tmp/lim")
[[ -z $left ]] || fail "save past ulimit -f left files behind: $left"

run train digits --epochs=1 --quiet --data "$data" --save="$tmp/m.safetensors"
[[ $rc == 0 && -f $tmp/m.safetensors ]] || fail "a good run failed (rc $rc): $err"

# Data-parallel worker threads (issue 16): same accuracy band as one thread;
# one worker is the plain loop's arithmetic, so the same accuracy exactly.
acc_of() { sed -n 's/^test accuracy \([0-9.]*\).*/\1/p' <<<"$out"; }
run train digits --epochs=5 --quiet --data "$data" --save="$tmp/m0.safetensors"
acc0=$(acc_of)
run train digits --epochs=5 --quiet --data "$data" --save="$tmp/m1.safetensors" --workers 1
acc1=$(acc_of)
[[ $rc == 0 && $acc1 == "$acc0" ]] || fail "--workers 1: accuracy $acc1, plain loop $acc0 (rc $rc): $err"
run train digits --epochs=5 --quiet --data "$data" --save="$tmp/m2.safetensors" --workers 3
acc3=$(acc_of)
[[ $rc == 0 && $out == *"data-parallel: 3 worker threads"* ]] || fail "--workers 3 (rc $rc): $err"
awk -v a="$acc3" -v b="$acc0" 'BEGIN { d = a - b; exit !(a >= 0.9 && d < 0.02 && d > -0.02) }' ||
    fail "--workers 3: test accuracy $acc3, plain loop $acc0 (want within 0.02, >= 0.9)"
run train digits --workers 65 --data "$data"
[[ $rc == 2 && $err == *"--workers needs an integer in [0, 64]"* ]] || fail "--workers 65 (rc $rc): $err"
# The tape-length table (bench scale): one row per length, 10^2..10^4.
run bench scale --quick
[[ $rc == 0 ]] || fail "bench scale --quick (rc $rc): $err"
rows=$(grep -cE '^ +(100|1000|10000) ' <<<"$out")
[[ $rows == 3 ]] || fail "bench scale --quick printed $rows rows: $out"
run bench scale mlp
[[ $rc == 2 && $err == *"scale runs alone"* ]] || fail "bench scale mlp (rc $rc): $err"
# Replay against recording: five workloads, each replay's gradients bitwise
# those of recording; elementwise's six calls run as one fused call; mse's
# mean (values that cannot be summed exactly on the way) leaves its run
# after the first replay.
run bench replay --quick
[[ $rc == 0 ]] || fail "bench replay --quick (rc $rc): $err"
same=$(grep -c 'gradients bitwise equal: yes' <<<"$out")
[[ $same == 5 ]] || fail "bench replay --quick: $same of 5 workloads bitwise equal: $out"
[[ $out == *"6 of 6 calls fused"* ]] || fail "bench replay --quick: elementwise not fused: $out"
[[ $out == *"4 of 4 calls fused at the first replay, 3 after"* ]] ||
    fail "bench replay --quick: mse's mean did not leave its run: $out"
run train digits --workers 2 --dist --data "$data"
[[ $rc == 2 && $err == *"--dist and --workers cannot be combined"* ]] || fail "--dist --workers (rc $rc): $err"
# The data-parallel table: per model (mlp, and the lstm cell and layer at two
# batch sizes), 2 workers and the ceiling they are
# held against, 2 independent trainers apart.
run bench dp --quick
[[ $rc == 0 ]] || fail "bench dp --quick (rc $rc): $err"
rows=$(grep -cE '^  2 workers, 1 thr' <<<"$out")
apart=$(grep -cE '^  2 apart, 1 thr .*samples/s' <<<"$out")
[[ $rows == 5 && $apart == 5 ]] || fail "bench dp --quick: $rows worker rows, $apart apart rows: $out"

if [[ $fails != 0 ]]; then
    echo "$fails CLI checks failed" >&2
    exit 1
fi
echo "CLI checks passed"
