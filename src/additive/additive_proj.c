/*
 * additive_proj.c — additive attention's projections (see additive_proj.h): one
 *                   allocation sized with checked arithmetic, then per batch two
 *                   products through the BLAS door, Qp = Q W and Kpᵀ = Uᵀ Kᵀ, and the
 *                   bias added to Kpᵀ's rows. No product is written by hand here. The
 *                   callers run the batches on their own OpenMP team (one batch a thread),
 *                   where the BLAS runs single-threaded: no second thread pool spinning
 *                   beside theirs.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "additive_proj.h"
#include "core/blas.h"

static bool mul3(int64_t a, int64_t b, int64_t c, int64_t *r) {
    return !__builtin_mul_overflow(a, b, r) && !__builtin_mul_overflow(*r, c, r);
}

attn_status ai_proj_init(attn_additive_proj *pr, const attn_additive_params *p, int threads,
                         int64_t per_thread, int64_t extra) {
    const attn_params *m = &p->m;
    *pr = (attn_additive_proj){.Lq = m->Lq, .Lk = m->Lk, .A = p->A, .per_thread = per_thread};
    pr->per_gather = m->Lq * p->Dq > m->Lk * m->Dk ? m->Lq * p->Dq : m->Lk * m->Dk;
    int64_t nq, nk, nqg, nkg, ns, total = 0;
    if (!mul3(m->B, m->Lq, p->A, &nq) || !mul3(m->B, m->Lk, p->A, &nk) ||
        !mul3(m->Lq, p->Dq, 1, &nqg) || !mul3(m->Lk, m->Dk, 1, &nkg) ||
        !mul3(threads, per_thread, 1, &ns))
        return ai_fail(ATTN_ERR_OVERFLOW, "additive attention: workspace size overflows");
    /* each piece rounded up to 16 floats (64 bytes) */
    int64_t ng;
    if (!mul3(threads, nqg > nkg ? nqg : nkg, 1, &ng))
        return ai_fail(ATTN_ERR_OVERFLOW, "additive attention: workspace size overflows");
    int64_t sizes[6] = {nq, nk, p->A, ng, ns, extra}, off[6];
    for (int c = 0; c < 6; c++) {
        off[c] = total;
        if (__builtin_add_overflow(total, (sizes[c] + 15) / 16 * 16, &total))
            return ai_fail(ATTN_ERR_OVERFLOW, "additive attention: workspace size overflows");
    }
    if (total > (int64_t)(SIZE_MAX / sizeof(float)) - 16)
        return ai_fail(ATTN_ERR_OVERFLOW, "additive attention: workspace size overflows");
    pr->mem = ai_malloc((size_t)total * sizeof(float) + 64);
    if (!pr->mem)
        return ai_fail(ATTN_ERR_NOMEM, "additive attention: could not allocate %lld floats",
                       (long long)total);
    /* the blocks 64-byte aligned from the first whole line of the allocation */
    float *base = (float *)(((uintptr_t)pr->mem + 63) & ~(uintptr_t)63);
    pr->qp = base + off[0];
    pr->kpt = base + off[1];
    pr->vt = base + off[2];
    pr->gather = base + off[3];
    pr->scratch = base + off[4];
    pr->extra = base + off[5];
    return ATTN_OK;
}

void ai_proj_free(attn_additive_proj *pr) {
    ai_free(pr->mem);
    pr->mem = NULL;
}

const float *ai_proj_rows(const float *data, const int64_t s[4], int64_t b, int64_t L,
                          int64_t D, float *gather, int64_t *ld) {
    const float *base = data + b * s[0];
    if (s[3] == 1 && (L <= 1 || s[2] >= D)) {
        *ld = L > 1 ? s[2] : (D > 0 ? D : 1);
        return base;
    }
    for (int64_t r = 0; r < L; r++)
        for (int64_t d = 0; d < D; d++) gather[r * D + d] = base[r * s[2] + d * s[3]];
    *ld = D > 0 ? D : 1;
    return gather;
}

attn_status ai_proj_product(bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                            const float *a, int64_t lda, const float *b, int64_t ldb,
                            bool accumulate, float *c, int64_t ldc) {
    if (m == 0 || n == 0) return ATTN_OK;
    if (k == 0) {  /* no BLAS call: what a BLAS does with k = 0 is not everywhere the same */
        if (!accumulate)
            for (int64_t r = 0; r < m; r++) memset(c + r * ldc, 0, (size_t)n * sizeof(float));
        return ATTN_OK;
    }
    attn_status st = ai_gemm_f32(ta, tb, m, n, k, 1.0f, a, lda, b, ldb,
                                 accumulate ? 1.0f : 0.0f, c, ldc);
    return st == ATTN_OK ? st : ai_fail(st, "additive attention: the BLAS product failed");
}

void ai_proj_vt(attn_additive_proj *pr, const attn_additive_params *p) {
    ai_additive_effective_v(p, pr->vt);
}

attn_status ai_proj_batch(attn_additive_proj *pr, const attn_additive_params *p, int64_t b,
                          float *gather) {
    const attn_params *m = &p->m;
    const int64_t A = p->A;
    int64_t ld;
    /* Qp_b [Lq, A] = Q_b [Lq, Dq] · W [Dq, A] */
    const float *qb = ai_proj_rows(p->q, p->q_s, b, m->Lq, p->Dq, gather, &ld);
    attn_status st = ai_proj_product(false, false, m->Lq, A, p->Dq, qb, ld, p->w_query, A,
                                     false, pr->qp + b * m->Lq * A, A);
    if (st != ATTN_OK) return st;
    /* Kpᵀ_b [A, Lk] = Uᵀ [A, Dk] · K_bᵀ [Dk, Lk], then + b[a] on row a */
    const float *kb = ai_proj_rows(p->k, p->k_s, b, m->Lk, m->Dk, gather, &ld);
    float *kpt = pr->kpt + b * A * m->Lk;
    st = ai_proj_product(true, true, A, m->Lk, m->Dk, p->w_key, A, kb, ld, false, kpt, m->Lk);
    if (st != ATTN_OK) return st;
    for (int64_t a = 0; p->bias && a < A; a++)
        for (int64_t j = 0; j < m->Lk; j++) kpt[a * m->Lk + j] += p->bias[a];
    return ATTN_OK;
}
