/* tapegrad - command-line front end: list the op registry, gradient-check
 * every differentiable op, run a training demo, print the core benchmark.
 * Written against the public API only; this is where output is printed
 * (the library never prints). Exit status: 0 success, 1 a check or a
 * library call failed, 2 usage error. */
#include <errno.h>
#include <signal.h>
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
    "  ops [--markdown]             list the op registry: name, arity, backward, cost class, doc;\n"
    "                               --markdown prints docs/ops.md, made from the registry\n"
    "  gradcheck [--backend ref|cpu|both] [--order 1|2] [--fast] [--summary] [OP...]\n"
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
    "                               tiny chain mlp elementwise fused rnn conv deep (default\n"
    "                               all),\n"
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

static const char ops_usage[] =
    "usage: tapegrad ops [--markdown]\n"
    "\n"
    "List the op registry: name, arity, backward, cost class, doc.\n"
    "  --markdown  print docs/ops.md instead, made from the registry\n";

static const char gradcheck_usage[] =
    "usage: tapegrad gradcheck [--backend ref|cpu|both] [--order 1|2] [--fast] [--summary]\n"
    "                          [OP...]\n"
    "\n"
    "Gradient-check every differentiable op (or the OPs named) on the cases its\n"
    "sample function makes, against central differences in f64.\n"
    "  --backend B  ref, cpu or both (default both)\n"
    "  --order N    1: gradients (default); 2: second derivatives\n"
    "  --fast       compare random directional derivatives only\n"
    "  --summary    print only failures and the totals\n"
    "exit status: 0 all passed, 1 a check failed, 2 usage error\n";

/* True when any argument of a command asks for help. */
static bool wants_help(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) return true;
    return false;
}

static int unknown_option(const char *cmd, const char *arg)
{
    fprintf(stderr, "tapegrad %s: unknown option '%s' (see 'tapegrad %s --help')\n", cmd, arg,
            cmd);
    return CLI_USAGE;
}

/* ---- ops --markdown: docs/ops.md, generated from the registry alone, in
 * registry order, so that the committed page can be compared byte for byte
 * with this output (the ops_md test). Nothing here may depend on the
 * machine, the build type or the time. */

/* "in0, in1, out" for the TG_SAVE_* bits of saves; "-" for none. */
static void saves_str(const tg_op *op, char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < TG_OP_MAX_INPUTS; i++)
        if (op->saves & TG_SAVE_INPUT(i))
            n += (size_t)snprintf(buf + n, len - n, "%sin%d", n ? ", " : "", i);
    if (op->saves & TG_SAVE_OUTPUT) n += (size_t)snprintf(buf + n, len - n, "%sout", n ? ", " : "");
    if (n == 0) snprintf(buf, len, "-");
}

/* "strided, mixed, pointwise" for the TG_OP_* bits of flags (unknown bits
 * in hex, so that a new flag shows up before it has a name here). */
static void flags_str(const tg_op *op, char *buf, size_t len)
{
    static const struct {
        unsigned bit;
        const char *name;
    } names[] = {{TG_OP_STRIDED_INPUTS, "strided"},
                 {TG_OP_MIXED_BACKENDS, "mixed"},
                 {TG_OP_POINTWISE, "pointwise"}};
    size_t n = 0;
    unsigned rest = op->flags;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (op->flags & names[i].bit) {
            n += (size_t)snprintf(buf + n, len - n, "%s%s", n ? ", " : "", names[i].name);
            rest &= ~names[i].bit;
        }
    if (rest) n += (size_t)snprintf(buf + n, len - n, "%s0x%x", n ? ", " : "", rest);
    if (n == 0) snprintf(buf, len, "-");
}

/* Number of gradcheck cases the op's sample yields (0 without a sample,
 * -1 when a case fails to build). The cases are built and released. */
static int sample_cases(const tg_op *op)
{
    enum { MAX_CASES = 64 };
    if (!op->sample) return 0;
    int k;
    for (k = 0; k < MAX_CASES; k++) {
        tg_tensor *in[TG_OP_MAX_INPUTS] = {0};
        tg_op_attrs attrs;
        memset(&attrs, 0, sizeof attrs);
        tg_rng rng;
        tg_rng_seed(&rng, 1u + (uint64_t)k);
        tg_scope_begin();
        int n = op->sample(k, &rng, in, &attrs);
        for (int i = 0; i < TG_OP_MAX_INPUTS; i++)
            tg_scope_keep(in[i]); /* own them whatever the sample did */
        tg_scope_end();
        for (int i = 0; i < TG_OP_MAX_INPUTS; i++) tg_tensor_release(in[i]);
        if (n == 0) break;
        if (n < 0) return -1;
    }
    return k == MAX_CASES ? -1 : k;
}

/* A table cell: '|' escaped, so that a doc line cannot split the row. */
static void put_cell(const char *s)
{
    for (; s && *s; s++) {
        if (*s == '|') fputs("\\|", stdout);
        else putchar(*s);
    }
}

static const char ops_md_head[] =
    "# Built-in ops\n"
    "\n"
    "<!-- Generated by `tapegrad ops --markdown` from the op registry: do not edit by hand.\n"
    "     Regenerate it from the source root after building:\n"
    "         ./build/tools/tapegrad ops --markdown > docs/ops.md\n"
    "     The ops_md test fails while this file differs from that output. -->\n"
    "\n"
    "Every op is an entry of the registry (see "
    "[api.md](api.md#registryh-the-registry-and-your-own-ops)).\n"
    "The registry is the source of truth: this page is printed from it by `tapegrad ops\n"
    "--markdown`, `tapegrad ops` prints the name, arity, autodiff mark, cost class and one-line\n"
    "math of every entry, and `tapegrad gradcheck` checks every entry with a backward on both\n"
    "backends. The tests that need every op walk the registry too; none keeps a list of op\n"
    "names.\n"
    "\n";

static const char ops_md_columns[] =
    "## How this page is made\n"
    "\n"
    "`./build/tools/tapegrad ops --markdown > docs/ops.md` writes this whole page from the\n"
    "registry (`tg_op_count` / `tg_op_at`, in registry order). The test `ops_md`\n"
    "(`meson test -C build ops_md`) compares the committed page with that output and fails on\n"
    "any difference, so an op that is added, removed or changed without regenerating the page\n"
    "fails the suite.\n"
    "\n"
    "Columns:\n"
    "\n"
    "- **backward**: `yes` (differentiable), `non-differentiable` (results are never tracked, even\n"
    "  on tracked inputs; no error, nothing recorded) or `unmarked` (neither: on a tracked input the\n"
    "  call fails with `TG_ERR_NOT_DIFFERENTIABLE`).\n"
    "- **cost**: the cost class. Under `TG_CHECKPOINT_BALANCED` and `TG_CHECKPOINT_BUDGET` a\n"
    "  *memory-bound* op is recomputed in backward instead of saving; a *compute-bound* op keeps its\n"
    "  saves ([checkpointing.md](checkpointing.md)).\n"
    "- **saves**: what the entry keeps on the tape for its backward under `TG_CHECKPOINT_NONE`:\n"
    "  `in0`, `in1`, ... for `TG_SAVE_INPUT(i)`, `out` for `TG_SAVE_OUTPUT`; `-` for nothing. A saved\n"
    "  leaf costs the tape nothing (`tg_tape_saved_bytes` does not count it); every other saved\n"
    "  tensor counts its full `numel * dtype size` (a view of a leaf too). A node that is recomputed\n"
    "  saves none of this.\n"
    "- **flags**: `strided` (`TG_OP_STRIDED_INPUTS`: the forward takes strided views as they are;\n"
    "  otherwise dispatch hands it contiguous copies, and those copies are what is saved), `mixed`\n"
    "  (`TG_OP_MIXED_BACKENDS`: inputs may live on different backends) and `pointwise`\n"
    "  (`TG_OP_POINTWISE`: element k of the output depends only on element k of each input, so a\n"
    "  recomputing policy may run chains of such ops in backward on cache-sized slices).\n"
    "- **cases**: how many gradcheck cases the entry's `sample` yields (`-`: no sample). Every entry\n"
    "  with a backward must have some: the registry sweep (`tests/test_registry_sweep.c`) and\n"
    "  `tapegrad gradcheck` check each case against central differences in f64.\n"
    "- **doc**: the entry's one line of math.\n"
    "\n"
    "Not in the registry, so not on this page: the extra tensors a forward keeps with\n"
    "`tg_op_ctx_save` (indices of a maximum, a dropout mask, normalisation statistics: they are\n"
    "decided at run time, and counted in the saved bytes like any saved tensor), and how each\n"
    "backward is computed. Both are in the entry's source under `src/ops/`; the fused kernels a\n"
    "backward calls are the entries named `<op>_backward*` (and `bias_grad`), whose doc column gives\n"
    "their formulas.\n"
    "\n";

static const char ops_md_tail[] =
    "\n"
    "## C API\n"
    "\n"
    "Each entry with a public wrapper is called `tg_<name>` in `ops.h` or `nn.h`, with these\n"
    "exceptions and additions:\n"
    "\n"
    "- `sum`: `tg_sum`, `tg_sum_dims`; `mean`: `tg_mean`, `tg_mean_dims`; `permute`: `tg_permute`,\n"
    "  `tg_transpose`.\n"
    "- `concat`: `tg_concat(n, xs, dim)` records `n - 1` binary `concat` nodes.\n"
    "- `affine` (3 inputs): `tg_affine(x, w, b)` = x Wᵀ + b; `tg_linear_forward` and the RNN and\n"
    "  LSTM cells call it for every map with a bias.\n"
    "- `conv2d` (3 inputs): `tg_conv2d(x, w, bias, opts)` (and `tg_conv2d_layer_forward`; a NULL bias\n"
    "  is passed as zeros); `layer_norm`, `batch_norm`: `tg_layer_norm`, `tg_batch_norm` (NULL\n"
    "  weight and bias are passed as ones and zeros; evaluation-mode `tg_batch_norm` is built from\n"
    "  other ops and records no `batch_norm` node).\n"
    "- `tg_loss_cross_entropy` without options calls `cross_entropy`; with label smoothing or class\n"
    "  weights, and `tg_loss_nll`, `tg_loss_bce_with_logits`, `tg_loss_huber`, it is built from other\n"
    "  ops; `tg_loss_mse` is `mse_loss`.\n"
    "- The `*_backward*` entries and `bias_grad` have no wrapper: they are the fused kernels that\n"
    "  the backward of the op named in their prefix calls through `tg_op_call`. The table says\n"
    "  which of them have a backward of their own (and are gradchecked like any op) and which are\n"
    "  unmarked (backward runs with grad recording off, so ordinary use never records them, and\n"
    "  applying one to a tracked input fails with `TG_ERR_NOT_DIFFERENTIABLE`). Look any of them up\n"
    "  with `tg_op_find` to call it yourself.\n";

static int cmd_ops_markdown(void)
{
    int n = tg_op_count(), counts[3] = {0};
    for (int i = 0; i < n; i++) {
        const tg_op *op = tg_op_at(i);
        if (!op) return cli_lib_error("ops", "reading the registry");
        counts[tg_op_mark(op)]++;
    }
    fputs(ops_md_head, stdout);
    printf("This build has **%d entries**: %d with a backward, %d non-differentiable, %d unmarked\n"
           "(the last line of `tapegrad ops`).\n\n",
           n, counts[TG_AD_BACKWARD], counts[TG_AD_NONDIFFERENTIABLE], counts[TG_AD_UNMARKED]);
    fputs(ops_md_columns, stdout);
    printf("## The registry\n\n");
    printf("| op | arity | backward | cost | saves | flags | cases | doc |\n");
    printf("|---|---|---|---|---|---|---|---|\n");
    /* Samples build tensors on the default backend: make it fixed. */
    tg_backend prev = tg_set_default_backend(TG_BACKEND_REF);
    for (int i = 0; i < n; i++) {
        const tg_op *op = tg_op_at(i);
        char sv[64], fl[64], cs[16];
        saves_str(op, sv, sizeof sv);
        flags_str(op, fl, sizeof fl);
        int nc = sample_cases(op);
        if (nc < 0) {
            tg_set_default_backend(prev);
            fprintf(stderr, "tapegrad ops: op '%s': its sample fails to build a case: %s\n",
                    op->name, tg_last_error_message());
            return CLI_FAIL;
        }
        if (op->sample) snprintf(cs, sizeof cs, "%d", nc);
        else snprintf(cs, sizeof cs, "-");
        printf("| `%s` | %d | %s | %s | %s | %s | %s | ", op->name, op->arity,
               tg_ad_mark_name(tg_op_mark(op)), tg_cost_name(op->cost), sv, fl, cs);
        put_cell(op->doc ? op->doc : "-");
        printf(" |\n");
    }
    tg_set_default_backend(prev);
    tg_error_clear();
    fputs(ops_md_tail, stdout);
    return fflush(stdout) == 0 ? CLI_OK : CLI_FAIL;
}

/* ---- ops */
static int cmd_ops(int argc, char **argv)
{
    if (wants_help(argc, argv)) return fputs(ops_usage, stdout) < 0 ? CLI_FAIL : CLI_OK;
    bool markdown = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--markdown") != 0) return unknown_option("ops", argv[i]);
        markdown = true;
    }
    if (markdown) return cmd_ops_markdown();
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
    if (wants_help(argc, argv)) return fputs(gradcheck_usage, stdout) < 0 ? CLI_FAIL : CLI_OK;
    bool use[TG_BACKEND_COUNT] = {true, true};
    bool summary = false; /* one screen: failures and totals only */
    double worst_abs = 0, worst_rel = 0;
    const char *worst_op = "-";
    tg_gradcheck_opts opts = {.seed = 1};
    int order = 1; /* 2: second derivatives (tg_gradgradcheck_op) */
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
        if (strcmp(a, "--order") == 0 || strncmp(a, "--order=", 8) == 0) {
            const char *o = a[7] == '=' ? a + 8 : (i + 1 < argc ? argv[++i] : "");
            if (strcmp(o, "1") != 0 && strcmp(o, "2") != 0) {
                fprintf(stderr, "tapegrad %s: --order needs 1 or 2, got '%s'\n", cmd, o);
                goto out;
            }
            order = o[0] - '0';
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

    printf("gradcheck: %s, %s mode (%s), backends:%s%s\n",
           order == 2 ? "second derivatives (gradgradcheck)" : "first derivatives",
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
            tg_status st = order == 2 ? tg_gradgradcheck_op(op, (tg_backend)b, &opts, &rep)
                                      : tg_gradcheck_op(op, (tg_backend)b, &opts, &rep);
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
    /* A save past `ulimit -f` then fails with EFBIG and cleans up its
     * temporary file, instead of the process dying of SIGXFSZ mid-write. */
    signal(SIGXFSZ, SIG_IGN);
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
