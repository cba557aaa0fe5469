/*
 * test_kernels.c — every micro-kernel this CPU can run, tested alone against float64:
 *                  the vectorized exp's error bound, and qk / softmax / pv on tiles of
 *                  awkward sizes (one under, at and over each register tile and vector
 *                  width), NaN in skipped value rows, and the tolerance checks failing on
 *                  planted errors.
 *
 * It calls the kernel tables directly (src/kernels/kernels.h), so a kernel that dispatch never
 * picks on this machine is still tested when the CPU can run it. Not a test of the
 * framework: test_forward and test_edge do that through the public API.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "core/half.h"
#include "kernels/kernels.h"
#include "rng.h"

/* Each test case reseeds the stream from its own parameters (RNG_CASE), never from the
 * kernel's name: every kernel sees the same data for the same case, and a case's data
 * does not depend on which kernels this CPU has or which cases ran before it. */
static rng_t g_rng;
static double uniform(void) { return rng_unif(&g_rng); }
static float sym(void) { return (float)rng_sym(&g_rng); }

/* distance in units in the last place of float, at the exact value's magnitude */
static double ulp_error(float got, double exact) {
    if (exact == 0.0) return got == 0.0f ? 0.0 : INFINITY;
    int e;
    frexp(exact, &e);
    double ulp = ldexp(1.0, (e - 24 < -149 ? -149 : e - 24));
    return fabs((double)got - exact) / ulp;
}

/* The exp bound (docs/KERNELS.md): at most 2 ulp where exp(x) >= 2^-126; below that the
 * absolute error is at most 2^-126 (AVX2 flushes there). -inf gives 0, NaN gives NaN. */
static void test_exp(const attn_kernels *k) {
    enum { N = 1 << 20 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    g_rng.s = RNG_CASE(1);
    for (int i = 0; i < N; i++) x[i] = (float)(-104.0 * i / (N - 1));  // [-104, 0]
    for (int i = 0; i < 4096; i++) x[i] = -(float)uniform() * 0.01f;    // near 0
    x[1] = -0.0f;
    x[2] = -87.33654f;
    x[3] = -87.4f;
    k->exp(N, x, y);
    double worst_ulp = 0, worst_abs = 0;
    float at = 0;
    for (int i = 0; i < N; i++) {
        const double e = exp((double)x[i]);
        if (e >= 0x1p-126) {
            const double u = ulp_error(y[i], e);
            if (u > worst_ulp) worst_ulp = u, at = x[i];
        } else if (fabs(y[i] - e) > worst_abs) {
            worst_abs = fabs(y[i] - e);
        }
    }
    CHECK(worst_ulp <= 2.0, "%s exp: %.2f ulp at x = %.9g (bound 2)", k->name, worst_ulp, at);
    CHECK(worst_abs <= 0x1p-126, "%s exp: %g absolute below 2^-126", k->name, worst_abs);
    printf("  %s exp: max %.2f ulp on [-104, 0] where exp >= 2^-126; max abs %.3g below\n",
           k->name, worst_ulp, worst_abs);

    float sp[5] = {-INFINITY, NAN, 0.0f, -200.0f, -1e30f}, sy[5];
    k->exp(5, sp, sy);
    CHECK(sy[0] == 0.0f, "%s exp(-inf) = %g, expected 0", k->name, sy[0]);
    CHECK(isnan(sy[1]), "%s exp(NaN) = %g, expected NaN", k->name, sy[1]);
    CHECK(sy[2] == 1.0f, "%s exp(0) = %.9g, expected 1", k->name, sy[2]);
    CHECK(sy[3] == 0.0f && sy[4] == 0.0f, "%s exp(-200), exp(-1e30) = %g, %g", k->name, sy[3], sy[4]);
    free(x);
    free(y);
}

/* One tile through qk, softmax and pv, against the same steps in float64. */
static void test_tile(const attn_kernels *k, int64_t n, int64_t nk, int64_t dk, int64_t dv,
                      bool with_nan) {
    const int64_t pad = k->geom.row_pad, npad = (n + pad - 1) / pad * pad;
    const int64_t ldq = npad + 16, lds = npad + 16, ldk = dk + 3, ldv = dv + 5, ldo = dv + 2;
    float *q = calloc((size_t)(n * (dk ? dk : 1)), sizeof(float));
    float *qt = calloc((size_t)((dk ? dk : 1) * ldq), sizeof(float));
    float *kk = malloc((size_t)(nk * ldk) * sizeof(float));
    float *v = malloc((size_t)(nk * ldv) * sizeof(float));
    float *s = malloc((size_t)(nk * lds) * sizeof(float));
    float *acc = malloc((size_t)(n * ldo) * sizeof(float));
    float m[80], l[80], alpha[80];
    double *ref_s = malloc((size_t)(nk * n) * sizeof(double));
    g_rng.s = RNG_CASE(2, n, nk, dk, dv, with_nan);
    for (int64_t r = 0; r < n; r++)
        for (int64_t d = 0; d < dk; d++) q[r * dk + d] = qt[d * ldq + r] = sym();
    for (int64_t c = 0; c < nk * ldk; c++) kk[c] = sym();
    for (int64_t c = 0; c < nk * ldv; c++) v[c] = sym();
    const float scale = 0.37f;

    /* qk */
    for (int64_t c = 0; c < nk * lds; c++) s[c] = NAN;  // every element must be written
    k->qk(n, npad, nk, dk, q, qt, ldq, kk, ldk, scale, s, lds);
    /* each logit within tol_dot_rel(dk) of its magnitude (tolerance.h: the contract's
     * error model), the padding rows finite */
    double worst_qk = 0;
    bool finite_pad = true;
    for (int64_t c = 0; c < nk; c++) {
        for (int64_t r = 0; r < n; r++) {
            double dot = 0, mag = 0;
            for (int64_t d = 0; d < dk; d++) {
                dot += (double)q[r * dk + d] * kk[c * ldk + d];
                mag += fabs((double)q[r * dk + d] * kk[c * ldk + d]);
            }
            ref_s[c * n + r] = scale * dot;
            const double e = fabs(s[c * lds + r] - ref_s[c * n + r]) /
                             (tol_dot_rel(dk) * scale * mag + 1e-45);
            if (!(e <= worst_qk)) worst_qk = e;
        }
        for (int64_t r = n; r < npad; r++) finite_pad &= isfinite(s[c * lds + r]);
    }
    CHECK(worst_qk <= 1.0 && finite_pad,
          "%s qk n=%lld nk=%lld dk=%lld: error %.3g of the bound, padding finite %d", k->name,
          (long long)n, (long long)nk, (long long)dk, worst_qk, finite_pad);
    if (n <= k->qk_q_rows) {
        /* qk_q_rows: the framework leaves qt unpacked for such blocks, so a Qᵀ of NaN must
         * give the same logits, bit for bit, padding rows finite */
        float *qt_nan = malloc((size_t)((dk ? dk : 1) * ldq) * sizeof(float));
        float *s2 = malloc((size_t)(nk * lds) * sizeof(float));
        for (int64_t c = 0; c < (dk ? dk : 1) * ldq; c++) qt_nan[c] = NAN;
        for (int64_t c = 0; c < nk * lds; c++) s2[c] = NAN;
        k->qk(n, npad, nk, dk, q, qt_nan, ldq, kk, ldk, scale, s2, lds);
        bool same = true;
        for (int64_t c = 0; c < nk; c++) {
            same &= memcmp(s2 + c * lds, s + c * lds, (size_t)n * sizeof(float)) == 0;
            for (int64_t r = n; r < npad; r++) same &= isfinite(s2[c * lds + r]) != 0;
        }
        CHECK(same, "%s qk n=%lld <= qk_q_rows %lld nk=%lld dk=%lld: read Qᵀ", k->name,
              (long long)n, (long long)k->qk_q_rows, (long long)nk, (long long)dk);
        free(qt_nan);
        free(s2);
    }

    /* softmax from a fresh state, with some keys masked (-inf) in some rows; one row
     * fully masked */
    for (int64_t c = 0; c < nk; c++)
        for (int64_t r = 0; r < n; r++) {
            bool masked = (r == n - 1 && n > 1) || (c + r) % 5 == 3;
            if (masked) s[c * lds + r] = -INFINITY, ref_s[c * n + r] = -INFINITY;
            else ref_s[c * n + r] = s[c * lds + r];  // continue from the kernel's logits
        }
    for (int64_t r = 0; r < npad; r++) m[r] = -INFINITY, l[r] = 0.0f;
    k->softmax(npad, nk, s, lds, m, l, alpha);
    bool ok = true;
    double worst = 0;
    for (int64_t r = 0; r < n; r++) {
        double mx = -INFINITY, sum = 0, sum_tol = 0;
        for (int64_t c = 0; c < nk; c++) mx = fmax(mx, ref_s[c * n + r]);
        for (int64_t c = 0; c < nk; c++) {
            double pe = mx == -INFINITY ? 0.0 : exp(ref_s[c * n + r] - mx);
            sum += pe;
            double err = fabs(s[c * lds + r] - pe);
            if (err > worst) worst = err;
            /* exp's E ulp (2E u) and the rounding of s - m (u |s - m|, relative to p);
             * 2^-126 absolute where the AVX2 exp flushes */
            const double x = ref_s[c * n + r] - mx;  // -inf for a masked key: p = 0
            const double tol = (pe > 0 ? (2.0 * TOL_EXP_ULP + fabs(x)) * TOL_U32 * pe : 0) + 0x1p-126;
            sum_tol += tol;
            ok &= err <= tol || (pe == 0 && s[c * lds + r] == 0);
        }
        /* l: the p's own errors, and the sum of nk of them */
        ok &= (mx == -INFINITY) ? (m[r] == -INFINITY && l[r] == 0.0f)
                                : ((float)mx == m[r] && fabs(l[r] - sum) <= sum_tol + tol_sum_rel(nk) * sum);
    }
    CHECK(ok, "%s softmax n=%lld nk=%lld: worst p error %.3g", k->name, (long long)n,
          (long long)nk, worst);

    /* pv: acc starts at 1, alpha as left by softmax; with_nan puts NaN into the value
     * row of a key that row 0 masks (p = 0): with skip_zeros it must not reach row 0 */
    int64_t nan_key = -1;
    if (with_nan)
        for (int64_t c = 0; c < nk && nan_key < 0; c++)
            if (s[c * lds + 0] == 0.0f) nan_key = c;
    if (nan_key >= 0)
        for (int64_t d = 0; d < dv; d++) v[nan_key * ldv + d] = NAN;
    for (int64_t r = 0; r < n; r++)
        for (int64_t d = 0; d < ldo; d++) acc[r * ldo + d] = d < dv ? 1.0f : 777.0f;
    k->pv(n, npad, nk, dv, s, lds, v, ldv, alpha, acc, ldo, with_nan);
    /* each element against float64, relative to the size of its terms (sums that cancel
     * are only as accurate as their largest term) */
    double worst_rel = 0;
    bool guard = true, nan_free = true;
    for (int64_t r = 0; r < n; r++) {
        for (int64_t d = 0; d < dv; d++) {
            double e = alpha[r], mag = fabs(alpha[r]);
            for (int64_t c = 0; c < nk; c++)
                if (s[c * lds + r] != 0.0f) {
                    e += (double)s[c * lds + r] * v[c * ldv + d];
                    mag += fabs((double)s[c * lds + r] * v[c * ldv + d]);
                }
            if (r == 0 && nan_key >= 0) nan_free &= !isnan(acc[d]);
            if (isnan(e)) continue;
            const double rel = fabs(acc[r * ldo + d] - e) / (mag > 0 ? mag : 1);
            if (!(rel <= worst_rel)) worst_rel = rel;
        }
        for (int64_t d = dv; d < ldo; d++) guard &= acc[r * ldo + d] == 777.0f;
    }
    CHECK(worst_rel <= tol_sum_rel(nk + 1) && guard && nan_free,
          "%s pv n=%lld nk=%lld dv=%lld: rel err %.3g, columns past dv untouched %d, "
          "NaN kept out %d", k->name, (long long)n, (long long)nk, (long long)dv, worst_rel,
          guard, nan_free);
    free(q), free(qt), free(kk), free(v), free(s), free(acc), free(ref_s);
}

/* The decoding step (kernels that have one): for n <= 4 rows, from a running state some
 * rows of which already hold keys (m finite, l and acc set) and some fresh (m = -inf),
 * against the same update in float64 on the same rounded inputs. K and V in each dtype
 * with row strides wider than the rows, asking for this tile's V and the K of a tile ahead
 * or for nothing. nan_key >= 0 stores NaN in that key's K row: every row's m must become
 * NaN. plant: the tolerance
 * must catch one accumulator element off by 1e-4 of its sum of magnitudes (the check's
 * denominator). round_p (the FAST
 * precision): the P the step multiplied V by, left in its scratch s[4c + r], must be
 * bfloat16 numbers within half a bfloat16 step (2^-8 relative, plus the exp's error) of the exact
 * p, and acc is checked against the sum over those; l still sums the exact p. */
static void test_decode(const attn_kernels *k, int64_t n, int64_t nk, int64_t dk, int64_t dv,
                        attn_dtype dt, bool round_p, bool prefetch, int64_t nan_key, bool plant) {
    const int64_t ldk = dk + 3, ldv = dv + 5, es = (int64_t)attn_dtype_size(dt);
    float *q = malloc((size_t)(4 * (dk ? dk : 1)) * sizeof(float));
    char *kk = malloc((size_t)(2 * nk * ldk * es + 64)), *v = malloc((size_t)(2 * nk * ldv * es + 64));
    double *kd = malloc((size_t)(nk * ldk) * sizeof(double)), *vd = malloc((size_t)(nk * ldv) * sizeof(double));
    float *s = malloc((size_t)(4 * (nk + 3)) * sizeof(float)), *acc = malloc((size_t)(4 * dv + 1) * sizeof(float));
    float m[4], l[4], alpha[4];
    double m0[4], l0[4], *acc0 = malloc((size_t)(4 * dv + 1) * sizeof(double));
    g_rng.s = RNG_CASE(3, n, nk, dk, dv, dt, round_p, prefetch, nan_key);
    for (int64_t i = 0; i < n * dk; i++) q[i] = 2.0f * sym();
    for (int64_t i = 0; i < 2 * nk * ldk; i++) {  // the second half: the tile ahead
        const float x = sym();
        attn_store(dt, kk, i, x);
        if (i < nk * ldk) kd[i] = attn_load(dt, kk, i);
    }
    for (int64_t i = 0; i < 2 * nk * ldv; i++) {
        const float x = sym();
        attn_store(dt, v, i, x);
        if (i < nk * ldv) vd[i] = attn_load(dt, v, i);
    }
    if (nan_key >= 0) {
        attn_store(dt, kk, nan_key * ldk, NAN);
        kd[nan_key * ldk] = NAN;
    }
    for (int64_t r = 0; r < n; r++) {  // row 1 fresh, the others with earlier keys
        const bool fresh = r == 1;
        m[r] = fresh ? -INFINITY : 0.5f * sym();
        l[r] = fresh ? 0.0f : 3.0f + sym();
        m0[r] = m[r], l0[r] = l[r];
        for (int64_t d = 0; d < dv; d++) acc0[r * dv + d] = acc[r * dv + d] = fresh ? 0.0f : sym();
    }
    const float scale = 0.37f;
    bool state_ok_qk = true;
    k->decode(n, nk, dk, dv, q, dt, round_p, kk, ldk, v, ldv, scale, 1.0f, 1.0f, s, m, l, alpha, acc,
              prefetch ? v : NULL, prefetch ? nk : 0, prefetch ? kk + nk * ldk * es : NULL,
              prefetch ? nk : 0);
    /* decode_qk: the step's logits alone, checked against float64 dot products below */
    const int64_t lds = n + 3;  // the tile's S^T layout, wider than the rows: the lanes
    float *sq = malloc((size_t)(lds * nk) * sizeof(float));  // past n must stay untouched
    for (int64_t i = 0; i < lds * nk; i++) sq[i] = 12345.0f;
    k->decode_qk(n, nk, dk, q, dt, kk, ldk, scale, 1.0f, sq, lds);
    for (int64_t i = 0; i < lds * nk; i++) state_ok_qk &= i % lds < n || sq[i] == 12345.0f;
    /* the bounds, from the contract's error model (tolerance.h): each logit within
     * tol_dot_rel(dk) of its magnitude, ds the largest such error of the row; m within ds;
     * each exp(x) within 2E u and u |x| (x's rounding) of itself, and 2 ds (s and m); the
     * sums of nk + 1 terms within tol_sum_rel(nk + 1) of their magnitudes */
    double worst = 0, worst_qk = 0;
    bool state_ok = true;
    for (int64_t r = 0; r < n; r++) {
        double mx = m0[r], sl[1024], ds = 0;
        for (int64_t c = 0; c < nk; c++) {
            double dot = 0;
            for (int64_t d = 0; d < dk; d++) dot += (double)q[r * dk + d] * kd[c * ldk + d];
            sl[c] = scale * dot;
            mx = isnan(sl[c]) || isnan(mx) ? NAN : fmax(mx, sl[c]);
            double mag = 0;
            for (int64_t d = 0; d < dk; d++) mag += fabs((double)q[r * dk + d] * kd[c * ldk + d]);
            const double e = fabs(sq[c * lds + r] - sl[c]) / (tol_dot_rel(dk) * scale * mag + 1e-45);
            if (!isnan(sl[c]) && !(e <= worst_qk)) worst_qk = e;
            if (tol_dot_rel(dk) * scale * mag > ds) ds = tol_dot_rel(dk) * scale * mag;
        }
        if (nan_key >= 0) {
            state_ok &= isnan(m[r]);
            continue;
        }
        const double a = m0[r] == -INFINITY ? 0.0 : exp(m0[r] - mx);
        /* the relative error of a p = exp(x), x = s - m <= 0 */
#define P_REL(x) ((2.0 * TOL_EXP_ULP + 1.0 + fabs(x)) * TOL_U32 + 2.0 * ds)
        const double a_tol = m0[r] == -INFINITY ? 0.0 : a * P_REL(m0[r] - mx) + 0x1p-126;
        double sum = l0[r] * a, sum_tol = l0[r] * a_tol, p_rel = 0;
        for (int64_t c = 0; c < nk; c++) {
            sum += exp(sl[c] - mx);
            sum_tol += exp(sl[c] - mx) * P_REL(sl[c] - mx) + 0x1p-126;
            if (P_REL(sl[c] - mx) > p_rel) p_rel = P_REL(sl[c] - mx);
        }
        if (m0[r] != -INFINITY && P_REL(m0[r] - mx) > p_rel) p_rel = P_REL(m0[r] - mx);
#undef P_REL
        state_ok &= fabs(m[r] - mx) <= ds + TOL_U32 * fabs(mx) &&
                    fabs(l[r] - sum) <= sum_tol + tol_sum_rel(nk + 1) * sum &&
                    fabs(alpha[r] - a) <= a_tol;
        double pv[1024];  // the p multiplying V: exact, or the step's own rounded ones
        for (int64_t c = 0; c < nk; c++) {
            const double exact = exp(sl[c] - mx);
            pv[c] = exact;
            if (!round_p) continue;
            const float got = s[4 * c + r];
            uint32_t bits;
            memcpy(&bits, &got, sizeof bits);
            state_ok &= (bits & 0xFFFFu) == 0 && fabs(got - exact) <= 0x1p-8 * exact + 1e-6 * exact + 1e-38;
            pv[c] = got;
        }
        for (int64_t d = 0; d < dv; d++) {
            double e = acc0[r * dv + d] * a, mag = fabs(e);
            for (int64_t c = 0; c < nk; c++) {
                const double t = pv[c] * vd[c * ldv + d];
                e += t, mag += fabs(t);
            }
            /* relative to the magnitude: the sum's error and its terms' (the p's, or
             * alpha's; FAST's rounded p are the ones it multiplied) */
            const double den = (mag > 0 ? mag : 1) * (tol_sum_rel(nk + 1) + p_rel);
            /* the planted error: 4 bounds of the very quantity the check divides by */
            if (plant && r == 0 && d == 0) acc[0] = (float)(e + 4.0 * den);
            const double rel = fabs(acc[r * dv + d] - e) / den;
            if (!(rel <= worst)) worst = rel;
        }
    }
    const bool pass = worst <= 1.0 && worst_qk <= 1.0 && state_ok && state_ok_qk;
    CHECK(plant ? !pass : pass,
          "%s decode%s n=%lld nk=%lld dk=%lld dv=%lld %s%s prefetch %d nan_key %lld: acc error "
          "%.3g of its bound, decode_qk %.3g of its, m/l/alpha (and rounded p) ok %d", k->name,
          plant ? " (planted error must fail)" : "", (long long)n, (long long)nk, (long long)dk,
          (long long)dv, attn_dtype_name(dt), round_p ? " FAST" : "", prefetch,
          (long long)nan_key, worst, worst_qk, state_ok);
    free(q), free(kk), free(v), free(kd), free(vd), free(s), free(acc), free(acc0), free(sq);
}

/* An fp8 step (decode_fp8) reads each byte as fl32(value · scale) (kernels.h): so its
 * decode and decode_qk must give the float32 step's bits over a float32 K and V holding
 * exactly those numbers, whatever the scales. The AVX-512 step moves a power-of-two scale
 * from 1 to 2^64 (e4m3's with its 2^8) off the values onto the query and p, where that is
 * exact; the scales here are on both sides of that rule (1, 4, 2^64, 2^65, 1/8, 0.37),
 * and a query with an element past 2^60 must take the multiply instead (the fold's
 * guard). Bytes of every finite code, none NaN or infinite. plant: one V value of the
 * float32 copy off by 2^-10 of itself must make the outputs differ. */
static void test_decode_fp8_bits(const attn_kernels *k, attn_dtype dt, int64_t n, int64_t nk,
                                 int64_t dk, int64_t dv, float ksc, float vsc, bool big_q,
                                 bool plant) {
    uint8_t *k8 = malloc((size_t)(nk * dk)), *v8 = malloc((size_t)(nk * dv));
    float *kf = malloc((size_t)(nk * dk) * sizeof(float)), *vf = malloc((size_t)(nk * dv) * sizeof(float));
    float q[4 * 256], s[4 * 132], sq[2][4 * 128], mm[2][4], ll[2][4], al[2][4], acc[2][4 * 256];
    g_rng.s = RNG_CASE(11, n, nk, dk, dv, dt, big_q, plant);
    for (int64_t i = 0; i < nk * dk + nk * dv; i++) {
        uint8_t b;
        do b = (uint8_t)(uniform() * 256.0);
        while (!isfinite(attn_fp8_to_f32(dt, b)));
        if (i < nk * dk) k8[i] = b, kf[i] = attn_fp8_to_f32(dt, b) * ksc;
        else v8[i - nk * dk] = b, vf[i - nk * dk] = attn_fp8_to_f32(dt, b) * vsc;
    }
    if (plant) vf[0] *= 1.0f + 0x1p-10f;
    /* logits of moderate size: the query shrunk by the keys' largest value */
    const double kmax = dt == ATTN_FP8_E4M3 ? 448.0 : 57344.0;
    for (int64_t i = 0; i < n * dk; i++) q[i] = (float)(sym() / (kmax * (double)ksc * (double)dk));
    if (big_q) q[dk / 2] = 0x1p61f, q[dk / 2 + 1] = -0x1p61f;  // their products cancel out of no logit: only the guard matters
    for (int w = 0; w < 2; w++) {
        for (int64_t r = 0; r < 4; r++) mm[w][r] = -INFINITY, ll[w][r] = 0;
        memset(acc[w], 0, sizeof acc[w]);
        const attn_dtype d = w ? ATTN_F32 : dt;
        const void *kp = w ? (const void *)kf : k8, *vp = w ? (const void *)vf : v8;
        k->decode(n, nk, dk, dv, q, d, false, kp, dk, vp, dv, 0.37f, w ? 1.0f : ksc, w ? 1.0f : vsc,
                  s, mm[w], ll[w], al[w], acc[w], NULL, 0, NULL, 0);
        k->decode_qk(n, nk, dk, q, d, kp, dk, 0.37f, w ? 1.0f : ksc, sq[w], n);
    }
    const bool same = memcmp(acc[0], acc[1], (size_t)(n * dv) * sizeof(float)) == 0 &&
                      memcmp(mm[0], mm[1], (size_t)n * sizeof(float)) == 0 &&
                      memcmp(ll[0], ll[1], (size_t)n * sizeof(float)) == 0 &&
                      memcmp(sq[0], sq[1], (size_t)(n * nk) * sizeof(float)) == 0;
    CHECK(plant ? !same : same, "%s decode %s%s n=%lld nk=%lld dk=%lld dv=%lld k_scale %g v_scale %g%s: "
          "the same bits as the float32 step over the dequantized values: %d", k->name, attn_dtype_name(dt),
          plant ? " (a planted change must differ)" : "", (long long)n, (long long)nk, (long long)dk,
          (long long)dv, (double)ksc, (double)vsc, big_q ? ", a query past 2^60" : "", same);
    free(k8), free(v8), free(kf), free(vf);
}

/* softmax_pairs (kernels that have it) against softmax followed by the packing pv_bf16
 * does: bit for bit the same m, l, alpha and rounded pairs, from a running state, with
 * masked keys and one fully masked row. */
static void test_softmax_pairs(const attn_kernels *k, int64_t npad, int64_t nk) {
    const int64_t lds = npad + 16, npairs = (nk + 1) / 2;
    float *s = malloc((size_t)(nk * lds) * sizeof(float)), *s2 = malloc((size_t)(nk * lds) * sizeof(float));
    uint32_t *pp = malloc((size_t)(npairs * npad) * sizeof(uint32_t));
    float m[64], l[64], a[64], m2[64], l2[64], a2[64];
    g_rng.s = RNG_CASE(4, npad, nk);
    for (int64_t c = 0; c < nk * lds; c++) {
        const int64_t r = c % lds, key = c / lds;
        s[c] = (r == 1 || (r + key) % 7 == 3) ? -INFINITY : 6.0f * sym();
    }
    memcpy(s2, s, (size_t)(nk * lds) * sizeof(float));
    for (int64_t r = 0; r < npad; r++) {
        m[r] = m2[r] = r % 3 == 0 ? -INFINITY : 2.0f * sym();
        l[r] = l2[r] = m[r] == -INFINITY ? 0.0f : 1.0f + (float)uniform();
    }
    k->softmax(npad, nk, s2, lds, m2, l2, a2);
    k->softmax_pairs(npad, nk, s, lds, m, l, a, pp, npad);
    int bad = 0;
    for (int64_t r = 0; r < npad; r++)
        bad += memcmp(&m[r], &m2[r], 4) != 0 || memcmp(&l[r], &l2[r], 4) != 0 || memcmp(&a[r], &a2[r], 4) != 0;
    for (int64_t c = 0; c < npairs; c++)
        for (int64_t r = 0; r < npad; r++) {
            const uint32_t lo = attn_f32_to_bf16(s2[2 * c * lds + r]);
            const uint32_t hi = 2 * c + 1 < nk ? attn_f32_to_bf16(s2[(2 * c + 1) * lds + r]) : 0;
            bad += pp[c * npad + r] != (lo | hi << 16);
        }
    CHECK(bad == 0, "%s softmax_pairs npad=%lld nk=%lld: %d values differ from softmax + packing",
          k->name, (long long)npad, (long long)nk, bad);
    free(s), free(s2), free(pp);
}

/* The bool mask on an S^T tile against the obvious loop, over row counts and key counts
 * around the vector widths, mask row strides including 0 (one row broadcast). */
static void test_mask_bool(const attn_kernels *k) {
    static const int64_t ns[] = {1, 3, 15, 16, 17, 33, 64}, nks[] = {1, 3, 4, 5, 63, 64, 130};
    static const int64_t ldms[] = {0, 130, 2049};
    int bad = 0;
    for (size_t a = 0; a < 7; a++)
        for (size_t b = 0; b < 7; b++)
            for (size_t e = 0; e < 3; e++) {
                const int64_t n = ns[a], nk = nks[b], ldm = ldms[e] < nk && ldms[e] ? nk : ldms[e];
                const int64_t lds = 64 + 16;
                uint8_t *m = malloc((size_t)(n * (ldm ? ldm : 1) + nk + 8));
                g_rng.s = RNG_CASE(5, n, nk, ldm);
                float *s = malloc((size_t)(nk * lds) * sizeof(float));
                /* true is any nonzero byte: 1 mostly, and bytes with bit 0 clear (2, 0x80) */
                for (int64_t i = 0; i < n * (ldm ? ldm : 1) + nk + 8; i++)
                    m[i] = uniform() < 0.7 ? (uint8_t)(i % 7 == 3 ? 0x80 : i % 7 == 5 ? 2 : 1) : 0;
                for (int64_t i = 0; i < nk * lds; i++) s[i] = (float)i;
                k->mask_bool(n, nk, m, ldm, s, lds);
                for (int64_t c = 0; c < nk; c++)
                    for (int64_t r = 0; r < lds; r++) {
                        const bool in = r < n, keep = !in || m[r * ldm + c];
                        const float want = keep ? (float)(c * lds + r) : -INFINITY;
                        bad += memcmp(&s[c * lds + r], &want, sizeof want) != 0;
                    }
                free(m);
                free(s);
            }
    CHECK(bad == 0, "%s mask_bool: %d logits differ from the obvious loop", k->name, bad);
}

/* The weights' transposing store against the obvious loop: row and key counts around
 * the 8 x 8 blocks, a tile stride wider than the rows, each output row in its own buffer
 * with guard words on both sides that must stay untouched. */
static void test_rows_from_st(const attn_kernels *k) {
    static const int64_t ns[] = {1, 7, 8, 9, 16, 23, 112}, nks[] = {1, 5, 8, 9, 64, 127};
    int bad = 0;
    for (size_t a = 0; a < 7; a++)
        for (size_t b = 0; b < 6; b++) {
            const int64_t n = ns[a], nk = nks[b], lds = n + 5, G = 4;
            float *s = malloc((size_t)(nk * lds) * sizeof(float));
            float *buf = malloc((size_t)(n * (nk + 2 * G)) * sizeof(float)), *out[112];
            for (int64_t i = 0; i < nk * lds; i++) s[i] = (float)i + 0.5f;
            for (int64_t i = 0; i < n * (nk + 2 * G); i++) buf[i] = -1.0f;
            for (int64_t r = 0; r < n; r++) out[r] = buf + r * (nk + 2 * G) + G;
            k->rows_from_st(n, nk, s, lds, out);
            for (int64_t r = 0; r < n; r++)
                for (int64_t c = -G; c < nk + G; c++) {
                    const float want = c < 0 || c >= nk ? -1.0f : s[c * lds + r];
                    bad += memcmp(&out[r][c], &want, sizeof want) != 0;
                }
            free(s);
            free(buf);
        }
    CHECK(bad == 0, "%s rows_from_st: %d words differ from the obvious loop", k->name, bad);
}

/* The ulp measure must see a planted error: one float step off is 1 ulp, not 0. */
static void test_planted(void) {
    const double e = exp(-1.0);
    const float good = (float)e, bad = nextafterf(nextafterf(nextafterf(good, 1), 1), 1);
    CHECK(ulp_error(good, e) <= 0.5, "ulp of a correctly rounded value: %g", ulp_error(good, e));
    CHECK(ulp_error(bad, e) > 2.0, "a value 3 floats off must fail the 2-ulp bound: %g",
          ulp_error(bad, e));
}

int main(void) {
    test_planted();
    static const int64_t ns[] = {1, 2, 3, 4, 5, 15, 16, 17, 33, 48, 63, 64};
    static const int64_t nks[] = {1, 5, 6, 7, 9, 12, 13, 63, 64, 127, 128};  // every nk % 6
    static const int64_t ds[] = {0, 1, 15, 16, 17, 63, 64, 65, 128, 257};
#define X_TEST(name, ...)                                                               \
    if (attn_kernel_supported(#name)) {                                                \
        const attn_kernels *k = &attn_kernels_##name;                                   \
        test_exp(k);                                                                    \
        test_mask_bool(k);                                                              \
        if (k->rows_from_st) test_rows_from_st(k);                                      \
        for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)                          \
            for (size_t b = 0; b < sizeof nks / sizeof nks[0]; b++) {                  \
                const int64_t dk = ds[(a + b) % 10], dv = ds[(a + 3 * b + 1) % 10];     \
                test_tile(k, ns[a], nks[b], dk, dv ? dv : 1, (a + b) % 2 == 0);         \
            }                                                                           \
        if (k->softmax_pairs)                                                           \
            for (size_t b = 0; b < sizeof nks / sizeof nks[0]; b++) {                  \
                test_softmax_pairs(k, 16, nks[b]);                                      \
                test_softmax_pairs(k, 64, nks[b]);                                      \
            }                                                                           \
        if (k->decode) {                                                                \
            static const attn_dtype dts[] = {ATTN_F32, ATTN_BF16, ATTN_F16};            \
            for (int64_t n = 1; n <= 4; n++)                                            \
                for (size_t b = 0; b < sizeof nks / sizeof nks[0]; b++)                \
                    for (size_t t = 0; t < 3; t++) {                                    \
                        const int64_t dk = ds[(n + b + 1) % 10], dv = ds[(n + 3 * b) % 10];   \
                        test_decode(k, n, nks[b], dk, dv ? dv : 1, dts[t], false,      \
                                    (b + t) % 2 == 0, -1, false);                       \
                        if (dts[t] == ATTN_BF16)                                        \
                            test_decode(k, n, nks[b], dk, dv ? dv : 1, dts[t], true,   \
                                        (b + t) % 2 == 1, -1, false);                   \
                    }                                                                   \
            test_decode(k, 4, 13, 64, 64, ATTN_F32, false, true, 6, false);             \
            test_decode(k, 3, 64, 128, 128, ATTN_BF16, false, true, 0, false);          \
            test_decode(k, 3, 64, 128, 128, ATTN_BF16, true, true, 0, false);           \
            test_decode(k, 4, 9, 600, 70, ATTN_BF16, false, true, -1, false);           \
            test_decode(k, 2, 9, 600, 33, ATTN_F16, false, true, -1, false);            \
            test_decode(k, 4, 64, 128, 128, ATTN_F32, false, true, -1, true);           \
            test_decode(k, 2, 7, 17, 65, ATTN_F16, false, false, -1, true);             \
            test_decode(k, 4, 66, 128, 128, ATTN_BF16, true, true, -1, true);           \
        }                                                                               \
        if (k->decode && k->decode_fp8) {                                              \
            static const float scs[] = {1.0f, 4.0f, 0x1p64f, 0x1p65f, 0.125f, 0.37f};   \
            for (int e = 0; e < 2; e++)                                                 \
                for (size_t a = 0; a < 6; a++) {                                        \
                    const attn_dtype dt = e ? ATTN_FP8_E5M2 : ATTN_FP8_E4M3;            \
                    const float ks = e ? scs[a] : scs[a] / 256.0f, vs = scs[(a + 2) % 6];\
                    test_decode_fp8_bits(k, dt, 1 + (int64_t)a % 4, 13 + 20 * (int64_t)a, \
                                         a % 2 ? 128 : 64, a % 3 ? 128 : 80, ks, vs, false, false); \
                    test_decode_fp8_bits(k, dt, 4, 64, 128, 128, ks, vs, true, false);  \
                }                                                                       \
            test_decode_fp8_bits(k, ATTN_FP8_E4M3, 4, 64, 128, 128, 1.0f, 1.0f, false, true); \
            test_decode_fp8_bits(k, ATTN_FP8_E5M2, 4, 64, 128, 128, 1.0f, 1.0f, false, true); \
        }                                                                               \
    } else {                                                                            \
        printf("  %s: skipped, this CPU cannot run it\n", #name);                      \
    }
    ATTN_KERNEL_LIST(X_TEST)
#undef X_TEST
    return check_summary("kernels");
}
