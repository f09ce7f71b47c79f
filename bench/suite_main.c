/* bench_suite: the benchmark suite as its own executable (the same report
 * as `tapegrad bench`; see bench/cli.c and docs/benchmarks.md). */
#include "bench.h"

int main(int argc, char **argv)
{
    return bench_cli("bench_suite", argc, argv);
}
