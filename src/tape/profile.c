/* The per-tape profiler and the Graphviz export.
 *
 * With profiling on, dispatch times each recorded forward and the sweep
 * times each backward and recompute; figures accumulate per op entry
 * (pointer) across tape resets until tg_tape_profile_clear. Timing uses
 * CLOCK_MONOTONIC and costs two clock reads per op, only when enabled. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tape/tape_internal.h"

uint64_t tg__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The row of op, created on first use; NULL when out of memory. */
static tg_profile_row *row_of(tg_tape *tape, const tg_op *op)
{
    for (int i = 0; i < tape->nprof; i++)
        if (tape->prof_ops[i] == op) return &tape->prof[i];
    if (tape->nprof == tape->capprof) {
        int cap = tape->capprof ? tape->capprof * 2 : 16;
        tg_profile_row *p = realloc(tape->prof, (size_t)cap * sizeof *p);
        if (!p) return NULL;
        tape->prof = p;
        const tg_op **q = realloc(tape->prof_ops, (size_t)cap * sizeof *q);
        if (!q) return NULL;
        tape->prof_ops = q;
        tape->capprof = cap;
    }
    tg_profile_row *r = &tape->prof[tape->nprof];
    memset(r, 0, sizeof *r);
    r->op = op->name;
    tape->prof_ops[tape->nprof++] = op;
    return r;
}

void tg__profile_forward(tg_tape *tape, const tg_op *op, uint64_t ns, size_t saved)
{
    tg_profile_row *r = row_of(tape, op);
    if (!r) return;
    r->calls++;
    r->forward_ms += (double)ns * 1e-6;
    r->saved_bytes += saved;
}

void tg__profile_backward(tg_tape *tape, const tg_op *op, uint64_t ns)
{
    tg_profile_row *r = row_of(tape, op);
    if (!r) return;
    r->backward_calls++;
    r->backward_ms += (double)ns * 1e-6;
}

void tg__profile_recompute(tg_tape *tape, const tg_op *op, uint64_t ns)
{
    tg_profile_row *r = row_of(tape, op);
    if (!r) return;
    r->recomputes++;
    r->recompute_ms += (double)ns * 1e-6;
}

tg_status tg_tape_profile_enable(tg_tape *tape, bool on)
{
    if (!tape) return tg__err(TG_ERR_NULL, "bad argument #1 to 'tape_profile_enable' (NULL tape)");
    tape->profiling = on;
    return TG_OK;
}

int tg_tape_profile_rows(const tg_tape *tape, tg_profile_row *rows, int cap)
{
    if (!tape) return 0;
    for (int i = 0; rows && i < tape->nprof && i < cap; i++) rows[i] = tape->prof[i];
    return tape->nprof;
}

void tg_tape_profile_clear(tg_tape *tape)
{
    if (tape) tape->nprof = 0;
}

void tg__profile_free(tg_tape *tape)
{
    free(tape->prof);
    free(tape->prof_ops);
}

/* ---- DOT export of the current record */
static void spec_str(const tg_spec *s, char *buf, size_t len)
{
    tg_shape_str(s->ndim, s->shape, buf, len);
}

tg_status tg_tape_export_dot(const tg_tape *tape, const char *path)
{
    if (!tape || !path)
        return tg__err(TG_ERR_NULL, "bad argument to 'tape_export_dot' (NULL %s)",
                       tape ? "path" : "tape");
    FILE *f = fopen(path, "w");
    if (!f) return tg__err(TG_ERR_IO, "cannot write '%s'", path);
    fprintf(f, "digraph tape {\n  rankdir=TB;\n  node [shape=box, fontname=\"Helvetica\", "
               "fontsize=10];\n");
    fprintf(f, "  // policy %d; recompute nodes are dashed orange; saved bytes per node\n",
            (int)tape->opts.policy);
    char buf[96];
    for (int64_t i = 0; i < tape->nnodes; i++) {
        const tg_node *n = &tape->nodes[i];
        spec_str(tg__node_out_spec(tape, n), buf, sizeof buf);
        fprintf(f, "  n%lld [label=\"%s\\n%s %s\\nsaved %zu B%s\"%s];\n", (long long)i,
                n->op->name, tg_dtype_name(tg__node_out_spec(tape, n)->dtype), buf, n->saved_bytes,
                n->recompute ? "\\nrecomputed" : "",
                n->recompute ? ", style=dashed, color=darkorange" : "");
        for (int k = 0; k < n->nin; k++) {
            if (n->in_node[k] >= 0) {
                fprintf(f, "  n%lld -> n%lld;\n", (long long)n->in_node[k], (long long)i);
                continue;
            }
            spec_str(tg__node_in_spec(tape, n, k), buf, sizeof buf);
            bool leaf = n->in_slot[k] >= 0;
            fprintf(f, "  i%lld_%d [label=\"%s %s\", shape=%s];\n  i%lld_%d -> n%lld;\n",
                    (long long)i, k, leaf ? "leaf" : "input", buf, leaf ? "ellipse" : "note",
                    (long long)i, k, (long long)i);
        }
    }
    fprintf(f, "}\n");
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad) return tg__err(TG_ERR_IO, "error writing '%s'", path);
    return TG_OK;
}
