/* cpu backend, vmath.c only: the exp, sigmoid and tanh loops of one vector
 * ISA, written once over the V* names vmath.c defines before including
 * this file (AVX2: 8 lanes, AVX-512: 16). They do the IEEE operations of
 * the scalar cores of the same suffix (VSFX) in the same order, so every
 * element gets the bits the scalar core would give it, and the scalar
 * cores finish each loop's tail. What needs the ISA is the table lookup
 * (a register permute: VLUT16) and the lane compare-and-select. The file
 * undefines the V* names at its end, so the next ISA defines its own. */
#define VCAT2(a, b) a##b
#define VCAT(a, b) VCAT2(a, b)
#define VNAME(name) VCAT(name, VCAT(_, VSFX))

/* 2^(j/16) e^r, as texp_poly, and the bits of t = magic + n: the low 22
 * bits hold n (two's complement), so its low four bits index the table. */
static inline VF VNAME(etexp_poly)(VF x, VI *t_out)
{
    const VF magic = VSET1(12582912.0f);
    VF t = VFMA(x, VSET1(TEXP_L16), magic);
    VF n = VSUB(t, magic);
    VF r = VFMA(n, VSET1(TEXP_C2), VFNMA(n, VSET1(TEXP_C1), x));
    VF p = VMUL(VFMA(VFMA(VSET1(TEXP_R3), r, VSET1(0.5f)), r, VSET1(1.0f)), r);
    VI tb = VCASTI(t);
    VF th = VLUT16(texp_hi, tb), tl = VLUT16(texp_lo, tb);
    *t_out = tb;
    return VADD(VFMA(th, p, tl), th);
}

/* texp_fast: 2^k added into the exponent field. k << 23 straight from t's
 * bits: (magic + 16k + j) with j cleared, shifted by 19, is k << 23 (the
 * magic's bits shift out), one integer op fewer than n >> 4 << 23. */
static inline VF VNAME(etexp_fast)(VF x)
{
    VI tb;
    VF y = VNAME(etexp_poly)(x, &tb);
    return VCASTF(VIADD(VCASTI(y), VISLL(VIAND(tb, VSET1I(~15)), 19)));
}

/* texp_full: clamped to [-104, 89], 2^k as two normal factors. The clamps
 * as min(c, x) and max(c, x): a NaN x passes, as in the scalar blends. */
static inline VF VNAME(etexp_full)(VF x)
{
    x = VMAX(VSET1(-104.0f), VMIN(VSET1(89.0f), x));
    VI tb;
    VF y = VNAME(etexp_poly)(x, &tb);
    VI k = VISRA(VISUB(tb, VSET1I(0x4B400000)), 4), k1 = VISRA(k, 1), k2 = VISUB(k, k1);
    VF s1 = VCASTF(VISLL(VIADD(k1, VSET1I(127)), 23));
    VF s2 = VCASTF(VISLL(VIADD(k2, VSET1I(127)), 23));
    return VMUL(VMUL(y, s1), s2);
}

static inline VF VNAME(etanh_small)(VF x)
{
    VF z = VMUL(x, x);
    VF p = VSET1(TANH_P4);
    p = VFMA(p, z, VSET1(TANH_P3));
    p = VFMA(p, z, VSET1(TANH_P2));
    p = VFMA(p, z, VSET1(TANH_P1));
    p = VFMA(p, z, VSET1(TANH_P0));
    return VFMA(VMUL(p, z), x, x);
}

/* sign(x) (1 - 2 / (e + 1)), e = e^2|x| with 2|x| clamped at 88.37626 (big)
 * or not (mid, |x| < 44). */
static inline VF VNAME(etanh_tail)(VF x, VF e)
{
    VF q = VSUB(VSET1(1.0f), VDIV(VSET1(2.0f), VADD(e, VSET1(1.0f))));
    return VXOR(q, VAND(x, VCASTF(VSET1I(INT32_MIN))));
}

static inline VF VNAME(etanh_mid)(VF x)
{
    VF a = VAND(x, VCASTF(VSET1I(INT32_MAX)));
    return VNAME(etanh_tail)(x, VNAME(etexp_fast)(VMUL(VSET1(2.0f), a)));
}

static inline VF VNAME(etanh_big)(VF x)
{
    VF a = VAND(x, VCASTF(VSET1I(INT32_MAX)));
    VF t = VMIN(VSET1(88.37626f), VMUL(VSET1(2.0f), a));
    return VNAME(etanh_tail)(x, VNAME(etexp_fast)(t));
}

/* The loops: m floats x -> y, groups of VU vectors, single vectors, then
 * the scalar core for the tail. A group's VU evaluations are independent;
 * vmath.c has GCC's first scheduling pass interleave them, which the
 * out-of-order core cannot do alone across a chain this long (one vector
 * at a time, these loops wait on latency, not throughput). */
#define VU 4
/* Evaluates vexpr (over v) for the VU vectors w[0..VU) and stores them at
 * y + i: the group step of both loops below. */
#define VGROUP(vexpr)                                                               \
    do {                                                                            \
        VF o[VU];                                                                   \
        _Pragma("GCC unroll 4") for (int u = 0; u < VU; u++) {                      \
            VF v = w[u];                                                            \
            o[u] = vexpr;                                                           \
        }                                                                           \
        _Pragma("GCC unroll 4") for (int u = 0; u < VU; u++)                        \
            VSTORE(y + i + u * VW, o[u]);                                           \
    } while (0)
#define VLOOP(name, vexpr, sexpr)                                                   \
    static void VNAME(name)(int64_t m, const float *restrict x, float *restrict y)  \
    {                                                                               \
        int64_t i = 0;                                                              \
        for (; i + VU * VW <= m; i += VU * VW) {                                    \
            VF w[VU];                                                               \
            _Pragma("GCC unroll 4") for (int u = 0; u < VU; u++)                    \
                w[u] = VLOAD(x + i + u * VW);                                       \
            VGROUP(vexpr);                                                          \
        }                                                                           \
        for (; i + VW <= m; i += VW) {                                              \
            VF v = VLOAD(x + i);                                                    \
            VSTORE(y + i, vexpr);                                                   \
        }                                                                           \
        for (; i < m; i++) y[i] = sexpr;                                            \
    }
/* A regime's run past the chunk that chose it: from element i of n, whole
 * groups while the bits of every |x| of the group (a) are in the regime
 * (vbad, the lanes outside it, is 0); returns where it stopped. The test is
 * the chunk check's, on the same bit patterns and bounds, and comes before
 * the evaluation and its store, so a run stops at a group boundary with
 * nothing written past it. */
#define VRUN(name, vexpr, vbad)                                                     \
    static int64_t VNAME(name##_run)(int64_t i, int64_t n, const float *restrict x, \
                                     float *restrict y)                             \
    {                                                                               \
        for (; i + VU * VW <= n; i += VU * VW) {                                    \
            VF w[VU];                                                               \
            unsigned bad = 0;                                                       \
            _Pragma("GCC unroll 4") for (int u = 0; u < VU; u++) {                  \
                w[u] = VLOAD(x + i + u * VW);                                       \
                VI a = VIAND(VCASTI(w[u]), VSET1I(INT32_MAX));                      \
                bad |= vbad;                                                        \
            }                                                                       \
            if (bad) break;                                                         \
            VGROUP(vexpr);                                                          \
        }                                                                           \
        return i;                                                                   \
    }
#define VLOOP_RUN(name, vexpr, sexpr, vbad)                                         \
    VLOOP(name, vexpr, sexpr)                                                       \
    VRUN(name, vexpr, vbad)
#define VE_SIGMOID(F)                                                               \
    VDIV(VSET1(1.0f), VADD(VSET1(1.0f), VNAME(F)(VXOR(v, VCASTF(VSET1I(INT32_MIN))))))
/* The regimes as tests of a, the bits of |x|, against the chunk check's
 * bounds: at or above a bound (NaN's bits lie above every number's) or
 * below it. */
#define VOUT_SAFE VBAD_GE(a, EXP_SAFE_BITS)
#define VOUT_SMALL VBAD_GE(a, TANH_SPLIT_BITS)
#define VOUT_BIG VBAD_LT(a, TANH_SPLIT_BITS)
#define VOUT_MIXED VBAD_GE(a, TANH_NOCLAMP_BITS)
VLOOP_RUN(vexp_fast, VNAME(etexp_fast)(v), VCAT(texp_fast_, VSFX)(x[i]), VOUT_SAFE)
VLOOP(vexp_full, VNAME(etexp_full)(v), VCAT(texp_full_, VSFX)(x[i]))
VLOOP_RUN(vsigmoid_fast, VE_SIGMOID(etexp_fast), 1.0f / (1.0f + VCAT(texp_fast_, VSFX)(-x[i])),
          VOUT_SAFE)
VLOOP(vsigmoid_full, VE_SIGMOID(etexp_full), 1.0f / (1.0f + VCAT(texp_full_, VSFX)(-x[i])))
VLOOP_RUN(vtanh_mid, VNAME(etanh_mid)(v), VCAT(tanh_mid_, VSFX)(x[i]), VOUT_BIG | VOUT_MIXED)
VLOOP_RUN(vtanh_big, VNAME(etanh_big)(v), VCAT(tanh_big_, VSFX)(x[i]), VOUT_BIG)
VLOOP_RUN(vtanh_small, VNAME(etanh_small)(v), VCAT(tanh_small_, VSFX)(x[i]), VOUT_SMALL)
/* |x| < 0.625 selects the polynomial (a NaN compares false: the other) */
VLOOP_RUN(vtanh_mixed,
          VSELECT_LT(VAND(v, VCASTF(VSET1I(INT32_MAX))), VSET1(0.625f), VNAME(etanh_small)(v),
                     VNAME(etanh_mid)(v)),
          VCAT(tanh_mixed_, VSFX)(x[i]), VOUT_MIXED)
VLOOP(vtanh_core,
      VSELECT_LT(VAND(v, VCASTF(VSET1I(INT32_MAX))), VSET1(0.625f), VNAME(etanh_small)(v),
                 VNAME(etanh_big)(v)),
      VCAT(tanh_core_, VSFX)(x[i]))
#undef VLOOP
#undef VGROUP
#undef VRUN
#undef VLOOP_RUN
#undef VE_SIGMOID
#undef VOUT_SAFE
#undef VOUT_SMALL
#undef VOUT_BIG
#undef VOUT_MIXED
#undef VU
#undef VNAME
#undef VCAT
#undef VCAT2
#undef VSFX
#undef VF
#undef VI
#undef VW
#undef VSET1
#undef VSET1I
#undef VLOAD
#undef VSTORE
#undef VFMA
#undef VFNMA
#undef VADD
#undef VSUB
#undef VMUL
#undef VDIV
#undef VMIN
#undef VMAX
#undef VAND
#undef VXOR
#undef VCASTI
#undef VCASTF
#undef VIADD
#undef VIAND
#undef VISUB
#undef VISRA
#undef VISLL
#undef VLUT16
#undef VSELECT_LT
#undef VBAD_GE
#undef VBAD_LT
