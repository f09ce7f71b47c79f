/* tapegrad - command-line front end: list the op registry, gradient-check
 * every differentiable op, run a training demo, print the core benchmark.
 * Written against the public API only; this is where output is printed
 * (the library never prints). Exit status: 0 success, 1 a check or a
 * library call failed, 2 usage error. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tapegrad.h>

#include "bench.h"
#include "cli.h"

static const char usage_text[] =
    "usage: tapegrad <command> [options]\n"
    "\n"
    "commands:\n"
    "  ops                          list the op registry: name, arity, backward, cost class, doc\n"
    "  gradcheck [--backend ref|cpu|both] [--fast] [--summary] [OP...]\n"
    "                               gradient-check every differentiable op (or the OPs named)\n"
    "                               against central differences in f64; default: both backends;\n"
    "                               --summary prints only failures and totals\n"
    "  train digits [--epochs N] [--lr X] [--seed S] [--batch B] [--hidden H] [--save FILE]\n"
    "               [--data CSV] [--quiet]\n"
    "                               train an MLP 64-H-10 on the bundled digits (Adam), report\n"
    "                               test accuracy, save, reload and check the reload\n"
    "  demo [--steps N] [--seed S]  train a 2-32-32-3 MLP on three seeded spirals (f32, cpu)\n"
    "  bench [WORKLOAD...] [--threads N] [--policy none|balanced|budget:BYTES|segments]\n"
    "        [--json FILE] [--profile] [--quick] [--dot FILE]\n"
    "                               time forward, fwd+bwd and train step of the workloads\n"
    "                               tiny chain mlp elementwise rnn conv deep (default all),\n"
    "                               checked first; `tapegrad bench --help` for details\n"
    "  version                      print the library version\n"
    "  help                         print this text\n"
    "\n"
    "exit status: 0 success, 1 a check or library call failed, 2 usage error\n";

static int usage(FILE *f, int status)
{
    fputs(usage_text, f);
    return status;
}

bool cli_parse_int(const char *cmd, const char *opt, const char *val, int64_t lo, int64_t hi,
                   int64_t *out)
{
    char *end;
    errno = 0;
    long long v = val ? strtoll(val, &end, 10) : 0;
    if (!val || !*val || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "tapegrad %s: %s needs an integer in [%lld, %lld], got '%s'\n", cmd, opt,
                (long long)lo, (long long)hi, val ? val : "");
        return false;
    }
    *out = v;
    return true;
}

int cli_lib_error(const char *cmd, const char *what)
{
    fprintf(stderr, "tapegrad %s: %s: %s (%s)\n", cmd, what, tg_last_error_message(),
            tg_strerror(tg_last_error()));
    return CLI_FAIL;
}

/* True when any argument of a command asks for help. */
static bool wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) return true;
    return false;
}

static int unknown_option(const char *cmd, const char *arg)
{
    fprintf(stderr, "tapegrad %s: unknown option '%s'\n\n", cmd, arg);
    return usage(stderr, CLI_USAGE);
}

/* ---- ops */
static int cmd_ops(int argc, char **argv)
{
    if (wants_help(argc, argv)) return usage(stdout, CLI_OK);
    if (argc > 1) return unknown_option("ops", argv[1]);
    int n = tg_op_count();
    int width = 4, counts[3] = {0};
    for (int i = 0; i < n; i++) {
        const tg_op *op = tg_op_at(i);
        if (!op) return cli_lib_error("ops", "reading the registry");
        int len = (int)strlen(op->name);
        if (len > width) width = len;
    }
    printf("%-*s  %5s  %-18s  %-13s  %s\n", width, "name", "arity", "backward", "cost", "doc");
    for (int i = 0; i < n; i++) {
        const tg_op *op = tg_op_at(i);
        tg_ad_mark mark = tg_op_mark(op);
        counts[mark]++;
        printf("%-*s  %5d  %-18s  %-13s  %s\n", width, op->name, op->arity,
               tg_ad_mark_name(mark), tg_cost_name(op->cost), op->doc ? op->doc : "-");
    }
    printf("%d ops: %d with a backward, %d non-differentiable, %d unmarked\n", n,
           counts[TG_AD_BACKWARD], counts[TG_AD_NONDIFFERENTIABLE], counts[TG_AD_UNMARKED]);
    return CLI_OK;
}

/* ---- gradcheck */
static int cmd_gradcheck(int argc, char **argv)
{
    static const char *const cmd = "gradcheck";
    if (wants_help(argc, argv)) return usage(stdout, CLI_OK);
    bool use[TG_BACKEND_COUNT] = {true, true};
    bool summary = false; /* one screen: failures and totals only */
    double worst_abs = 0, worst_rel = 0;
    const char *worst_op = "-";
    tg_gradcheck_opts opts = {.seed = 1};
    const char **names = calloc((size_t)argc, sizeof *names);
    int nnames = 0, status = CLI_USAGE;
    if (!names) {
        fprintf(stderr, "tapegrad %s: out of memory\n", cmd);
        return CLI_FAIL;
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = NULL;
        if (strcmp(a, "--fast") == 0) {
            opts.fast = 1;
            continue;
        }
        if (strcmp(a, "--summary") == 0) {
            summary = true;
            continue;
        }
        if (strcmp(a, "--backend") == 0) {
            if (i + 1 == argc) {
                fprintf(stderr, "tapegrad %s: --backend needs ref, cpu or both\n", cmd);
                goto out;
            }
            val = argv[++i];
        } else if (strncmp(a, "--backend=", 10) == 0) {
            val = a + 10;
        } else if (a[0] == '-') {
            free(names);
            return unknown_option(cmd, a);
        } else {
            /* An op name: it must exist and have a backward to be checked. */
            const tg_op *op = tg_op_find(a);
            if (!op) {
                fprintf(stderr, "tapegrad %s: %s\n", cmd, tg_last_error_message());
                goto out;
            }
            if (tg_op_mark(op) != TG_AD_BACKWARD) {
                fprintf(stderr, "tapegrad %s: op '%s' has no backward (%s); nothing to check\n",
                        cmd, a, tg_ad_mark_name(tg_op_mark(op)));
                goto out;
            }
            names[nnames++] = a;
            continue;
        }
        bool ref = strcmp(val, "ref") == 0, cpu = strcmp(val, "cpu") == 0;
        if (!ref && !cpu && strcmp(val, "both") != 0) {
            fprintf(stderr, "tapegrad %s: --backend needs ref, cpu or both, got '%s'\n", cmd, val);
            goto out;
        }
        use[TG_BACKEND_REF] = !cpu;
        use[TG_BACKEND_CPU] = !ref;
    }

    printf("gradcheck: %s mode (%s), backends:%s%s\n",
           opts.fast ? "fast" : "full",
           opts.fast ? "random directional derivatives" : "every input element",
           use[TG_BACKEND_REF] ? " ref" : "", use[TG_BACKEND_CPU] ? " cpu" : "");
    printf("%s; the summary counts ops, and an op passes only if it passes on every backend "
           "checked\n", summary ? "failures only" : "one row per op and backend");
    int width = 2;
    for (int i = 0; i < tg_op_count(); i++) {
        int len = (int)strlen(tg_op_at(i)->name);
        if (len > width) width = len;
    }
    if (!summary)
        printf("%-*s  %-7s  %5s  %11s  %11s  %s\n", width, "op", "backend", "cases",
               "max abs err", "max rel err", "result");
    int checked = 0, passed = 0;
    for (int i = 0; i < tg_op_count(); i++) {
        const tg_op *op = tg_op_at(i);
        if (tg_op_mark(op) != TG_AD_BACKWARD) continue;
        bool listed = nnames == 0;
        for (int k = 0; k < nnames && !listed; k++) listed = strcmp(names[k], op->name) == 0;
        if (!listed) continue;
        bool ok = true;
        for (int b = 0; b < TG_BACKEND_COUNT; b++) {
            if (!use[b]) continue;
            tg_op_check rep;
            tg_error_clear();
            tg_status st = tg_gradcheck_op(op, (tg_backend)b, &opts, &rep);
            if (rep.max_abs_err > worst_abs) {
                worst_abs = rep.max_abs_err;
                worst_op = op->name;
            }
            if (rep.max_rel_err > worst_rel) worst_rel = rep.max_rel_err;
            if (summary && st == TG_OK) continue;
            printf("%-*s  %-7s  %5d  %11.3e  %11.3e  %s", width, op->name,
                   tg_backend_name((tg_backend)b), rep.cases, rep.max_abs_err, rep.max_rel_err,
                   st == TG_OK ? "PASS" : "FAIL");
            if (st != TG_OK) {
                printf("  %s (%s)", tg_last_error_message(), tg_strerror(st));
                ok = false;
            }
            printf("\n");
        }
        checked++;
        passed += ok;
    }
    printf("worst errors: abs %.3e (%s), rel %.3e\n", worst_abs, worst_op, worst_rel);
    printf("%d ops checked, %d passed, %d failed\n", checked, passed, checked - passed);
    status = passed == checked ? CLI_OK : CLI_FAIL;
out:
    free(names);
    return status;
}

/* ---- bench: the suite (bench/cli.c) behind the CLI's usage rules. */
static int cmd_bench(int argc, char **argv)
{
    return bench_cli("tapegrad bench", argc, argv);
}

int main(int argc, char **argv)
{
    if (argc < 2) return usage(stderr, CLI_USAGE);
    const char *c = argv[1];
    if (strcmp(c, "help") == 0 || strcmp(c, "--help") == 0 || strcmp(c, "-h") == 0)
        return usage(stdout, CLI_OK);
    if (strcmp(c, "version") == 0 || strcmp(c, "--version") == 0) {
        printf("tapegrad %s\n", tg_version());
        return CLI_OK;
    }
    if (strcmp(c, "ops") == 0) return cmd_ops(argc - 1, argv + 1);
    if (strcmp(c, "gradcheck") == 0) return cmd_gradcheck(argc - 1, argv + 1);
    if (strcmp(c, "demo") == 0) return cli_demo(argc - 1, argv + 1);
    if (strcmp(c, "train") == 0) return cli_train(argc - 1, argv + 1);
    if (strcmp(c, "bench") == 0) return cmd_bench(argc - 1, argv + 1);
    fprintf(stderr, "tapegrad: unknown command '%s'\n\n", c);
    return usage(stderr, CLI_USAGE);
}
