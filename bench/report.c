/* report.c - the suite's readable table and its JSON (every figure the
 * table shows, and those it leaves out). */
#include <errno.h>
#include <string.h>

#include "bench.h"

static const double MiB = 1024.0 * 1024.0;

void bench_print_header(FILE *f, const bench_env *env, const bench_suite_opts *o)
{
    bench_print_env(f, env);
    fprintf(f, "policy    %s", bench_policy_name(o->policy));
    if (o->policy == BENCH_POLICY_BUDGET) fprintf(f, " (%zu bytes)", o->budget_bytes);
    fprintf(f, "; f32, cpu backend\n");
    if (o->quick)
        fprintf(f, "QUICK RUN: 5 samples after 1 warm-up (not 20 after 3); a smoke run, not a "
                   "measurement\n");
    else
        fprintf(f, "samples   20 per figure after 3 warm-up rounds, variants interleaved\n");
    /* The load average lags by a minute (and counts a run just finished),
     * so the warning goes by what the cpus did while the suite started. */
    if (env->busy > 0.2)
        fprintf(f,
                "WARNING: %.0f%% of the cpus were busy at start (load average %.2f): the "
                "machine is shared, figures will be noisy\n",
                100 * env->busy, env->load1);
}

void bench_print_table_head(FILE *f)
{
    fprintf(f, "\nms per iteration: median, then min-max below; baseline: the workload's raw GEMMs "
               "(elementwise: one fused pass);\nfb/base = fwd+bwd / baseline\n");
    fprintf(f, "%-12s %17s %17s %17s %17s %7s %9s %9s  %s\n", "workload", "forward", "fwd+bwd",
            "train step", "baseline f+b", "fb/base", "peak MiB", "saved MiB", "rate");
}

static void stat_range(char *buf, size_t n, bench_stat s)
{
    snprintf(buf, n, "%.4g-%.4g", s.min, s.max);
}

void bench_print_result(FILE *f, const bench_result *r)
{
    const bench_workload *w = r->wl;
    if (!r->ok) {
        fprintf(f, "%-12s FAILED: %s\n", w->name, r->error);
        return;
    }
    char gemm[32] = "-", ratio[16] = "-", rate[48] = "";
    if (r->have_gemm) {
        snprintf(gemm, sizeof gemm, "%.4g", r->gemm_all.median);
        snprintf(ratio, sizeof ratio, "%.3f", r->ratio_fwd_bwd);
        if (w->gemm_flops_all > 0)
            snprintf(rate, sizeof rate, "%.1f GFLOP/s",
                     w->gemm_flops_all / (r->fwd_bwd.median * 1e6));
    }
    if (w == &bench_wl_chain)
        snprintf(rate, sizeof rate, "%.0f ns/op fwd+bwd", r->fwd_bwd.median * 1e6 / 100);
    if (w == &bench_wl_elementwise || w == &bench_wl_fused) /* x read, its gradient written */
        snprintf(rate, sizeof rate, "%.1f GB/s min. traffic",
                 8.0 * (1 << 20) / (r->fwd_bwd.median * 1e6));
    fprintf(f, "%-12s %17.4g %17.4g %17.4g %17s %7s %9.3f %9.3f  %s\n", w->name, r->fwd.median,
            r->fwd_bwd.median, r->train.median, gemm, ratio, r->mem_peak_bytes / MiB,
            r->saved_peak_bytes / MiB, rate);
    char a[40], b[40], c[40], d[40] = "";
    stat_range(a, sizeof a, r->fwd);
    stat_range(b, sizeof b, r->fwd_bwd);
    stat_range(c, sizeof c, r->train);
    if (r->have_gemm) stat_range(d, sizeof d, r->gemm_all);
    fprintf(f, "%-12s %17s %17s %17s %17s\n", "", a, b, c, d);
}

/* The checks and the figures that do not fit the table. */
static void print_notes(FILE *f, const bench_result *r)
{
    const bench_workload *w = r->wl;
    fprintf(f, "%s: %s\n", w->name, w->desc);
    fprintf(f, "  checked: loss %.7g vs plain-C reference %.7g (rel %.2g)", r->loss, r->ref_loss,
            r->loss_rel_err);
    if (r->have_grad_check) fprintf(f, ", gradient vs plain C rel %.2g", r->grad_rel_err);
    fprintf(f, "; |grad| %.6g, bitwise repeatable\n", r->grad_norm);
    fprintf(f,
            "  %lld nodes, %lld recomputed in backward; %d iteration%s per sample; "
            "train-step peak %.3f MiB\n",
            (long long)r->nodes, (long long)r->recomputes, r->reps, r->reps == 1 ? "" : "s",
            r->mem_train_peak_bytes / MiB);
    if (r->have_gemm && w->baseline)
        fprintf(f,
                "  baseline, %s (%s): forward %.4g ms (tapegrad forward %.3fx), fwd+bwd %.4g ms "
                "(tapegrad %.3fx)\n",
                w->baseline, w->gemm_desc, r->gemm_fwd.median, r->ratio_fwd, r->gemm_all.median,
                r->ratio_fwd_bwd);
    else if (r->have_gemm)
        fprintf(f,
                "  raw GEMMs (%s): forward %.4g ms (tapegrad forward %.3fx), fwd+bwd %.4g ms "
                "(%.1f GFLOP/s, tapegrad %.3fx)\n",
                w->gemm_desc, r->gemm_fwd.median, r->ratio_fwd, r->gemm_all.median,
                w->gemm_flops_all / (r->gemm_all.median * 1e6), r->ratio_fwd_bwd);
    if (r->have_chain)
        fprintf(f,
                "  core figure: record+backward %.1f ns/op, forward with grad off %.1f ns/op, "
                "plain C %.2f ns/op (median of %d)\n",
                r->chain.fwd_bwd_ns, r->chain.fwd_only_ns, r->chain.plain_ns, r->chain.runs);
}

void bench_print_profile(FILE *f, const bench_result *r)
{
    const bench_profile *p = &r->profile;
    double tf = 0, tb = 0, tr = 0;
    for (int i = 0; i < p->nrows; i++) {
        tf += p->rows[i].forward_ms;
        tb += p->rows[i].backward_ms;
        tr += p->rows[i].recompute_ms;
    }
    double total = tf + tb + tr;
    fprintf(f,
            "  profile, per fwd+bwd step (mean of %d profiled steps; profiling adds two clock "
            "reads per op):\n",
            p->steps);
    fprintf(f, "  %-16s %7s %11s %9s %11s %12s %6s %9s %6s\n", "op", "calls", "forward ms",
            "bwd calls", "backward ms", "saved bytes", "recomp", "recomp ms", "share");
    for (int i = 0; i < p->nrows; i++) {
        const tg_profile_row *w = &p->rows[i];
        double t = w->forward_ms + w->backward_ms + w->recompute_ms;
        fprintf(f, "  %-16s %7lld %11.4f %9lld %11.4f %12zu %6lld %9.4f %5.1f%%\n", w->op,
                (long long)w->calls, w->forward_ms, (long long)w->backward_calls, w->backward_ms,
                w->saved_bytes, (long long)w->recomputes, w->recompute_ms,
                total > 0 ? 100 * t / total : 0);
    }
    fprintf(f, "  %-16s %7s %11.4f %9s %11.4f %12s %6s %9.4f   (step median %.4g ms)\n", "total",
            "", tf, "", tb, "", "", tr, r->fwd_bwd.median);
}

void bench_print_notes(FILE *f, const bench_result *r)
{
    if (!r->ok) return;
    print_notes(f, r);
    if (r->have_profile) bench_print_profile(f, r);
}

static void json_stat(FILE *f, const char *key, bench_stat s)
{
    fprintf(f, "\"%s\": {\"median\": %.6g, \"min\": %.6g, \"max\": %.6g}", key, s.median, s.min,
            s.max);
}

static void json_result(FILE *f, const bench_result *r)
{
    const bench_workload *w = r->wl;
    fprintf(f, "    {\"name\": ");
    bench_json_str(f, w->name);
    fprintf(f, ", \"description\": ");
    bench_json_str(f, w->desc);
    fprintf(f, ", \"ok\": %s", r->ok ? "true" : "false");
    if (!r->ok) {
        fprintf(f, ", \"error\": ");
        bench_json_str(f, r->error);
        fprintf(f, "}");
        return;
    }
    fprintf(f,
            ",\n     \"runs\": %d, \"warmup\": %d, \"iterations_per_sample\": %d, "
            "\"unit\": \"ms per iteration\",\n     ",
            r->runs, r->warmup, r->reps);
    json_stat(f, "forward", r->fwd);
    fprintf(f, ",\n     ");
    json_stat(f, "fwd_bwd", r->fwd_bwd);
    fprintf(f, ",\n     ");
    json_stat(f, "train_step", r->train);
    if (r->have_gemm) {
        /* "gemm" for raw GEMMs, "baseline" for another baseline (flops 0) */
        fprintf(f, ",\n     \"%s\": {\"what\": ", w->baseline ? "baseline" : "gemm");
        bench_json_str(f, w->gemm_desc);
        fprintf(f, ", \"flops_forward\": %.0f, \"flops_fwd_bwd\": %.0f, ", w->gemm_flops_fwd,
                w->gemm_flops_all);
        json_stat(f, "forward", r->gemm_fwd);
        fprintf(f, ", ");
        json_stat(f, "fwd_bwd", r->gemm_all);
        fprintf(f,
                ", \"ratio_forward\": %.6g, \"ratio_fwd_bwd\": %.6g, "
                "\"tapegrad_fwd_bwd_gflops\": %.6g, \"raw_fwd_bwd_gflops\": %.6g}",
                r->ratio_fwd, r->ratio_fwd_bwd, w->gemm_flops_all / (r->fwd_bwd.median * 1e6),
                w->gemm_flops_all / (r->gemm_all.median * 1e6));
    }
    fprintf(f,
            ",\n     \"mem_peak_fwd_bwd_bytes\": %zu, \"mem_peak_train_bytes\": %zu, "
            "\"saved_peak_bytes\": %zu, \"nodes\": %lld, \"recomputes\": %lld",
            r->mem_peak_bytes, r->mem_train_peak_bytes, r->saved_peak_bytes, (long long)r->nodes,
            (long long)r->recomputes);
    fprintf(f,
            ",\n     \"check\": {\"loss\": %.9g, \"reference_loss\": %.9g, "
            "\"loss_rel_error\": %.3g, \"tolerance\": %.3g, \"grad_norm\": %.9g, "
            "\"repeatable\": %s",
            r->loss, r->ref_loss, r->loss_rel_err, w->check_tol, r->grad_norm,
            r->grad_repeatable ? "true" : "false");
    if (r->have_grad_check) fprintf(f, ", \"grad_rel_error\": %.3g", r->grad_rel_err);
    fprintf(f, "}");
    if (r->have_chain) {
        fprintf(f, ",\n     \"core_chain\": ");
        bench_json_chain(f, &r->chain);
    }
    if (r->have_profile) {
        const bench_profile *p = &r->profile;
        fprintf(f, ",\n     \"profile\": {\"steps\": %d, \"per\": \"step\", \"rows\": [", p->steps);
        for (int i = 0; i < p->nrows; i++) {
            const tg_profile_row *q = &p->rows[i];
            fprintf(f, "%s\n       {\"op\": ", i ? "," : "");
            bench_json_str(f, q->op);
            fprintf(f,
                    ", \"calls\": %lld, \"forward_ms\": %.6g, \"backward_calls\": %lld, "
                    "\"backward_ms\": %.6g, \"saved_bytes\": %zu, \"recomputes\": %lld, "
                    "\"recompute_ms\": %.6g}",
                    (long long)q->calls, q->forward_ms, (long long)q->backward_calls,
                    q->backward_ms, q->saved_bytes, (long long)q->recomputes, q->recompute_ms);
        }
        fprintf(f, "]}");
    }
    fprintf(f, "}");
}

int bench_write_json(const char *path, const bench_env *env, const bench_suite_opts *o,
                     const bench_result *res, int n)
{
    FILE *f = fopen(path, "w");
    if (!f) return -1;
    fprintf(f, "{\n  \"tapegrad_version\": ");
    bench_json_str(f, env->version);
    fprintf(f, ",\n  \"allocator\": ");
    bench_json_str(f, env->allocator);
    fprintf(f, ",\n  \"vector_isa\": ");
    bench_json_str(f, env->vector_isa);
    fprintf(f, ",\n  \"cpu\": ");
    bench_json_str(f, env->cpu);
    fprintf(f, ",\n  \"online_cpus\": %d, \"load_average_at_start\": %.2f", env->ncpu, env->load1);
    fprintf(f, ",\n  \"openblas_threads\": %d, \"tapegrad_threads\": %d, \"openblas_core\": ",
            env->blas_threads, env->tg_threads);
    bench_json_str(f, env->blas_core);
    fprintf(f, ",\n  \"openblas_config\": ");
    bench_json_str(f, env->blas_config);
    fprintf(f, ",\n  \"env_OPENBLAS_NUM_THREADS\": ");
    bench_json_str(f, env->env_threads);
    fprintf(f, ", \"env_OMP_NUM_THREADS\": ");
    bench_json_str(f, env->env_omp);
    fprintf(f, ", \"env_OPENBLAS_CORETYPE\": ");
    bench_json_str(f, env->env_coretype);
    fprintf(f, ",\n  \"quick\": %s, \"policy\": ", o->quick ? "true" : "false");
    bench_json_str(f, bench_policy_name(o->policy));
    fprintf(f, ", \"budget_bytes\": %zu, \"dtype\": \"f32\", \"backend\": \"cpu\"",
            o->policy == BENCH_POLICY_BUDGET ? o->budget_bytes : 0);
    fprintf(f, ",\n  \"workloads\": [\n");
    for (int i = 0; i < n; i++) {
        json_result(f, &res[i]);
        fprintf(f, "%s\n", i + 1 < n ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        if (!errno) errno = EIO;
        return -1;
    }
    return 0;
}
