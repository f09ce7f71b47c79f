#!/usr/bin/env bash
# Runs a test executable once under each OpenBLAS kernel family this CPU can
# run (OPENBLAS_CORETYPE, which a DYNAMIC_ARCH OpenBLAS such as Debian's
# honours): what a test asserts about bits must not hang on one family's
# tiling. The replicas' deferred weight gradients are the case in point: at
# cuts of 16 rows they chained exactly on the SkylakeX kernels and not on
# the Haswell ones (tests/test_replicas.c, src/train/replicas.c).
#   tests/blas_kernels.sh TEST_EXE [ARGS...]
# Exit 77 (skipped) where the BLAS is not a DYNAMIC_ARCH OpenBLAS; 1 if the
# test fails under any family, naming it. TG_TEST_NO_REFUSALS=1 tells the
# replicas' tests that every family must chain their shapes exactly.
set -uo pipefail
exe=$1
shift
flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
has() {
    local f
    for f in "$@"; do
        [[ $flags == *" $f "* ]] || return 1
    done
}
# Each family with the CPU flags its kernels need.
families=()
has pni && families+=(Prescott) # pni: SSE3
has sse4_2 && families+=(Nehalem)
has avx && families+=(Sandybridge)
has avx2 fma && families+=(Haswell Zen)
has avx512f avx512vl avx512bw avx512dq avx512cd && families+=(SkylakeX)
has avx512f avx512vl avx512bw avx512dq avx512cd avx512_bf16 && families+=(Cooperlake)

ran=0
for fam in "${families[@]}"; do
    # A DYNAMIC_ARCH OpenBLAS says which kernels it chose (OPENBLAS_VERBOSE=2).
    chosen=$(OPENBLAS_CORETYPE=$fam OPENBLAS_VERBOSE=2 "$exe" --help 2>&1 |
             sed -n 's/^Core: //p' | head -n1)
    if [ "$chosen" != "$fam" ]; then
        echo "blas_kernels: $fam: OpenBLAS chose '${chosen:-nothing}', not tested"
        continue
    fi
    echo "blas_kernels: $exe under the $fam kernels"
    if ! OPENBLAS_CORETYPE=$fam TG_TEST_NO_REFUSALS=1 "$exe" "$@"; then
        echo "blas_kernels: $exe failed under the $fam kernels (OPENBLAS_CORETYPE=$fam)" >&2
        exit 1
    fi
    ran=$((ran + 1))
done
if [ "$ran" -eq 0 ]; then
    echo "blas_kernels: no OpenBLAS kernel family could be chosen (not a DYNAMIC_ARCH OpenBLAS?)"
    exit 77
fi
echo "blas_kernels: passed under $ran kernel families"
