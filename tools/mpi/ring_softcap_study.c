/*
 * ring_softcap_study.c — where the ring's dV error at softcap 20 comes from (docs/RING.md,
 *                        "The softcap gradient tolerance"): make build/ring_softcap_study.
 *
 * Where the ring's dV error at softcap 20 comes from: the test_ring case "causal softcap
 * and scale" (L = 30, D = 16, Hq = 2, Hkv = 1, softcap 20, scale 0.7), P = 3 zigzag chunks
 * of 5 rows, emulated with one process's calls. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "attn.h"
#include "rng.h"
enum { B = 1, HQ = 2, HKV = 1, L = 30, D = 16, NC = 6, C = 5 };
static float q[B*HQ*L*D], k[B*HKV*L*D], v[B*HKV*L*D], dO[B*HQ*L*D], O[B*HQ*L*D], lse[B*HQ*L];
static double rel(const float *g, const double *r, int n) {
    double a = 0, b = 0; for (int i = 0; i < n; i++) { a += (g[i]-r[i])*(g[i]-r[i]); b += r[i]*r[i]; } return sqrt(a/b);
}
static double reld(const double *g, const double *r, int n) {
    double a = 0, b = 0; for (int i = 0; i < n; i++) { a += (g[i]-r[i])*(g[i]-r[i]); b += r[i]*r[i]; } return sqrt(a/b);
}
/* rows [r0, r0+n) of a [1, H, L, D] dense tensor as a view */
static attn_tensor rows(float *p, int64_t H, int64_t r0, int64_t n, int64_t Dd) {
    attn_tensor t = attn_tensor_4d(p + r0 * Dd, ATTN_F32, B, H, n, Dd);
    t.stride[0] = H * L * Dd; t.stride[1] = L * Dd; return t;
}
int main(void) {
    rng_t r = {1234 + 30 * 31 + 30};
    for (int i = 0; i < B*HQ*L*D; i++) q[i] = (float)rng_normal(&r);
    for (int i = 0; i < B*HKV*L*D; i++) k[i] = (float)rng_normal(&r);
    for (int i = 0; i < B*HKV*L*D; i++) v[i] = (float)rng_normal(&r);
    for (int i = 0; i < B*HQ*L*D; i++) dO[i] = (float)rng_normal(&r);
    attn_tensor Q = attn_tensor_4d(q, ATTN_F32, B, HQ, L, D), K = attn_tensor_4d(k, ATTN_F32, B, HKV, L, D);
    attn_tensor V = attn_tensor_4d(v, ATTN_F32, B, HKV, L, D), Ot = attn_tensor_4d(O, ATTN_F32, B, HQ, L, D);
    attn_tensor Lt = attn_tensor_4d(lse, ATTN_F32, B, HQ, L, 1), DOt = attn_tensor_4d(dO, ATTN_F32, B, HQ, L, D);
    attn_options ro = {.causal = true, .softcap = 20, .has_scale = true, .scale = 0.7f, .threads = 1,
                       .path = ATTN_PATH_REFERENCE, .lse = &Lt};
    attn_forward(&Q, &K, &V, &Ot, &ro);
    ro.lse = NULL;
    static float dq[B*HQ*L*D], dk[B*HKV*L*D], dvr[B*HKV*L*D], dvf[B*HKV*L*D];
    attn_tensor DQ = attn_tensor_4d(dq, ATTN_F32, B, HQ, L, D), DK = attn_tensor_4d(dk, ATTN_F32, B, HKV, L, D);
    attn_tensor DVR = attn_tensor_4d(dvr, ATTN_F32, B, HKV, L, D), DVF = attn_tensor_4d(dvf, ATTN_F32, B, HKV, L, D);
    attn_backward(&Q, &K, &V, &Ot, &DOt, &Lt, &DQ, &DK, &DVR, &ro);
    /* the float64 reference's dV, also in float64: recomputed here from its definition */
    static double ref[B*HKV*L*D];
    for (int h = 0; h < HQ; h++) for (int i = 0; i < L; i++) for (int j = 0; j <= i; j++) {
        double s = 0; for (int d = 0; d < D; d++) s += (double)q[(h*L+i)*D+d] * k[j*D+d];
        s = 20.0 * tanh(0.7 * s / 20.0);
        const double p = exp(s - lse[h*L+i]);
        for (int d = 0; d < D; d++) ref[j*D+d] += p * dO[(h*L+i)*D+d];
    }
    attn_options fo = ro; fo.path = ATTN_PATH_FUSED;
    attn_backward(&Q, &K, &V, &Ot, &DOt, &Lt, &DQ, &DK, &DVF, &fo);
    printf("reference path float32 dV vs float64 sums: rel %.3g\n", rel(dvr, ref, L*D));
    printf("one fused call:                             rel %.3g\n", rel(dvf, ref, L*D));
    /* the ring's pieces: query chunk cq against key chunk ck <= cq (P = 3: chunks 0..5,
     * process p holds chunks p and 5 - p), each dV partial float32 from attn_backward */
    static float part[NC][NC][C*D*HKV];  // [ck][cq]
    static float tq[B*HQ*L*D], tk2[B*HKV*C*D];
    for (int ck = 0; ck < NC; ck++) for (int cq = ck; cq < NC; cq++) {
        attn_tensor qx = rows(q, HQ, cq*C, C, D), ox = rows(O, HQ, cq*C, C, D), dox = rows(dO, HQ, cq*C, C, D);
        attn_tensor lx = rows(lse, HQ, cq*C, C, 1), dqx = rows(tq, HQ, cq*C, C, D);
        attn_tensor kx = rows(k, HKV, ck*C, C, D), vx = rows(v, HKV, ck*C, C, D);
        attn_tensor dkx = attn_tensor_4d(tk2, ATTN_F32, B, HKV, C, D);
        attn_tensor dvx = attn_tensor_4d(part[ck][cq], ATTN_F32, B, HKV, C, D);
        attn_options po = fo; po.causal = cq == ck;
        if (attn_backward(&qx, &kx, &vx, &ox, &dox, &lx, &dqx, &dkx, &dvx, &po)) { printf("fail %s\n", attn_last_error()); return 1; }
    }
    /* summed: float32 in query-chunk order; float64; and float32 in reverse order */
    static float s32[L*D], s32r[L*D]; static double s64[L*D];
    for (int ck = 0; ck < NC; ck++) for (int e = 0; e < C*D; e++) {
        float a = 0, b = 0; double c = 0;
        for (int cq = ck; cq < NC; cq++) { a += part[ck][cq][e]; c += part[ck][cq][e]; }
        for (int cq = NC - 1; cq >= ck; cq--) b += part[ck][cq][e];
        s32[ck*C*D+e] = a; s32r[ck*C*D+e] = b; s64[ck*C*D+e] = c;
    }
    printf("pieces summed in float32:                   rel %.3g\n", rel(s32, ref, L*D));
    printf("pieces summed in float32, reverse order:    rel %.3g\n", rel(s32r, ref, L*D));
    printf("pieces summed in float64:                   rel %.3g\n", reld(s64, ref, L*D));
    /* how far the sum is from cancelling: sum |terms| / |sum| over dV */
    double num = 0, den = 0;
    for (int ck = 0; ck < NC; ck++) for (int e = 0; e < C*D; e++) {
        double a = 0; for (int cq = ck; cq < NC; cq++) a += fabs(part[ck][cq][e]);
        num += a * a; den += ref[ck*C*D+e] * ref[ck*C*D+e];
    }
    printf("keys 10..19 (process 2's slice at P = 3): fused %.3g, pieces float32 %.3g, float64 %.3g, reference path %.3g\n",
           rel(dvf + 10*D, ref + 10*D, 10*D), rel(s32 + 10*D, ref + 10*D, 10*D), reld(s64 + 10*D, ref + 10*D, 10*D), rel(dvr + 10*D, ref + 10*D, 10*D));
    /* per piece: each partial's own error against its float64 value */
    for (int ck = 2; ck < 4; ck++) for (int cq = ck; cq < NC; cq++) {
        static double pr[C*D]; memset(pr, 0, sizeof pr);
        for (int h = 0; h < HQ; h++) for (int i = cq*C; i < cq*C + C; i++) for (int j = ck*C; j < ck*C + C; j++) {
            if (j > i) continue;
            double s = 0; for (int d = 0; d < D; d++) s += (double)q[(h*L+i)*D+d] * k[j*D+d];
            s = 20.0 * tanh(0.7 * s / 20.0);
            const double p = exp(s - lse[h*L+i]);
            for (int d = 0; d < D; d++) pr[(j-ck*C)*D+d] += p * dO[(h*L+i)*D+d];
        }
        double a = 0, b = 0, mx = 0;
        for (int e = 0; e < C*D; e++) { a += (part[ck][cq][e]-pr[e])*(part[ck][cq][e]-pr[e]); b += pr[e]*pr[e]; }
        for (int e = 0; e < C*D; e++) if (fabs(ref[ck*C*D+e]) > mx) mx = fabs(ref[ck*C*D+e]);
        printf("  piece q chunk %d, k chunk %d: |err| %.3g (partial's own rel %.3g), ||partial|| %.3g\n", cq, ck, sqrt(a), sqrt(a/b), sqrt(b));
    }
    { double b = 0; for (int e = 10*D; e < 20*D; e++) b += ref[e]*ref[e]; printf("  ||dV|| of keys 10..19: %.3g\n", sqrt(b)); }
    {   /* one call: every query against keys 10..19 alone (a key view), causal offsets by a
         * window: keys j in [10, 20) seen by rows i >= j */
        static float dv2[10*D], dk3[10*D];
        attn_tensor kx = rows(k, HKV, 10, 10, D), vx = rows(v, HKV, 10, 10, D);
        attn_tensor dkx = attn_tensor_4d(dk3, ATTN_F32, B, HKV, 10, D), dvx = attn_tensor_4d(dv2, ATTN_F32, B, HKV, 10, D);
        attn_tensor qx = rows(q, HQ, 10, 20, D), ox = rows(O, HQ, 10, 20, D), dox = rows(dO, HQ, 10, 20, D);
        attn_tensor lx = rows(lse, HQ, 10, 20, 1), dqx = rows(tq, HQ, 10, 20, D);
        attn_options po = fo; po.causal = true;
        attn_backward(&qx, &kx, &vx, &ox, &dox, &lx, &dqx, &dkx, &dvx, &po);
        printf("one call, rows 10..29 against keys 10..19 only: rel %.3g\n", rel(dv2, ref + 10*D, 10*D));
    }
    printf("||sum of |partials| || / ||dV||: %.3g\n", sqrt(num / den));
    return 0;
}
