/*
 * mha_gemv.c — the module's one-row products over a bfloat16 weight read in place
 *              (mha_gemv_bf16): the decoding step's projections, where the weight is
 *              the whole of the data and widening it to a float32 panel first would
 *              write and read it again (three times the bytes of the bfloat16 weight).
 *
 * A bfloat16 element widens to float32 exactly by its bits (the top half of a float32);
 * products and sums are float32, as the BLAS's on the widened panel. Two loops, by which
 * of the weight's strides is 1:
 *   rows:  the matrix is read row after row and each row, times its scalar of a, is
 *          added into c (c = Σ_r a[r] · row_r): the rows split into chunks, each
 *          chunk's partial sum (its rows in order) one thread's, the partials added in
 *          chunk order; or, without room for the partials or with few rows, columns
 *          split into tiles, one thread a tile, each c[j] the sum over r in row order;
 *   dots:  each c[r] is the dot product of a contiguous row with a: rows split across
 *          threads, each dot in eight lanes (element j into lane j mod 8) added in one
 *          fixed order at the end.
 * Either way an element's sequence of additions does not depend on the thread count or
 * the tiling, so the bits do not either. Each loop has an AVX2 twin (kernels/avx2/gemv.c,
 * taken under every x86-64 kernel but generic) with the same roundings in the same
 * order: the bits do not depend on the kernel. The rows loop's chunks and sums run in
 * one parallel region, and mha_gemv_bf16_many puts several products (the step's Q, K
 * and V) in one: one wake-up of the team, not two per product.
 * A one-row bfloat16 product has no CBLAS call: the loop is the library's own, by
 * choice (docs/CONTRACT.md, the multi-head layer's precision).
 *
 * What it is not: a GEMM (one row of a only; M > 1 widens panels for the BLAS, mha.c).
 */
#include <string.h>

#include "kernels/kernels.h"
#include "mha.h"
#include "mha_gemv.h"

/* columns of c one thread accumulates: 1024 floats (4 KiB, in L1), each row's part
 * 2 KiB of contiguous bfloat16 */
#define GEMV_TILE 1024
/* the rows loop over many rows: split into at most GEMV_PARTS chunks of at least
 * GEMV_CHUNK rows, each chunk's sum over its rows (read as one stream, row after row)
 * into its own partial vector, the partials then added in chunk order. The chunks
 * depend on the sizes only, never on the thread count. */
#define GEMV_PARTS MHA_GEMV_PARTS
#define GEMV_CHUNK 64

static inline float bf16_f32(uint16_t h) {
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

typedef void rows_fn(float *acc, const uint16_t *w, int64_t ld, int64_t r0, int64_t r1,
                     int64_t n, const float *a);

/* acc[0 .. n) += Σ_{r0 <= r < r1} a[r] · w[r·ld + 0 .. n), the portable loop */
static void rows_generic(float *acc, const uint16_t *w, int64_t ld, int64_t r0, int64_t r1,
                         int64_t n, const float *a) {
    for (int64_t r = r0; r < r1; r++) {
        const float ar = a[r];
        const uint16_t *row = w + r * ld;
#pragma omp simd
        for (int64_t j = 0; j < n; j++) acc[j] += ar * bf16_f32(row[j]);
    }
}

/* The rows loop of the selected kernel's table (gemv_rows_bf16: the AVX2 one of
 * kernels/avx2/gemv.c, bit for bit the portable loop, under the x86-64 kernels but
 * generic); the portable loop where the table has none (ATTN_ISA=generic, elsewhere). */
static rows_fn *rows_loop(void) {
    const attn_kernels *k = ai_select_kernels(NULL);
    return k && k->gemv_rows_bf16 ? k->gemv_rows_bf16 : rows_generic;
}

/* The rows loop's split of one product: parts chunks of rows rows, each chunk's partial
 * sum into scratch + p·N, then ntile tiles of c each the partials' sum in chunk order.
 * parts 0: no room for the partials, or too few rows (the tiles loop instead). */
typedef struct rows_plan {
    const uint16_t *w;
    int64_t ld, R, N;
    const float *a;
    float beta, *c, *scratch;
    int64_t parts, rows, ntile;
} rows_plan;

static rows_plan plan_rows(const uint16_t *w, int64_t ld, int64_t R, int64_t N, const float *a,
                           float beta, float *c, float *scratch, int64_t nscratch) {
    int64_t parts = R / GEMV_CHUNK;
    parts = parts < GEMV_PARTS ? parts : GEMV_PARTS;
    if (parts < 2 || parts * N > nscratch) parts = 0;
    return (rows_plan){w, ld, R, N, a, beta, c, scratch, parts,
                       parts ? (R + parts - 1) / parts : 0, (N + GEMV_TILE - 1) / GEMV_TILE};
}

/* chunk p's partial: scratch + p·N = Σ over its rows */
static void rows_part(rows_fn *rows_into, const rows_plan *q, int64_t p) {
    float *acc = q->scratch + p * q->N;
    const int64_t r0 = p * q->rows, r1 = r0 + q->rows < q->R ? r0 + q->rows : q->R;
    memset(acc, 0, (size_t)q->N * sizeof(float));
    rows_into(acc, q->w, q->ld, r0, r1, q->N, q->a);
}

/* tile t of c: beta·c + the partials in chunk order */
static void rows_sum(const rows_plan *q, int64_t t) {
    const int64_t N = q->N, j0 = t * GEMV_TILE, j1 = j0 + GEMV_TILE < N ? j0 + GEMV_TILE : N;
    for (int64_t j = j0; j < j1; j++) {
        float sum = q->beta == 0.0f ? 0.0f : q->beta * q->c[j];
        for (int64_t p = 0; p < q->parts; p++) sum += q->scratch[p * N + j];
        q->c[j] = sum;
    }
}

/* n products of planned partials in one parallel region: every product's chunks, taken
 * one at a time by whichever thread is free (on a machine other processes share, a
 * thread the system parks does not hold the others' share back; a chunk's partial is
 * the same whoever computes it), one barrier, every product's tiles; work, the
 * elements of the weights, decides whether to thread at all */
static void run_rows(rows_fn *rows_into, int n, const rows_plan *q, int64_t work) {
#pragma omp parallel if (work > (1 << 16))
    {
        for (int k = 0; k < n; k++) {
#pragma omp for schedule(dynamic, 1) nowait
            for (int64_t p = 0; p < q[k].parts; p++) rows_part(rows_into, &q[k], p);
        }
#pragma omp barrier
        for (int k = 0; k < n; k++) {
#pragma omp for schedule(static) nowait
            for (int64_t t = 0; t < q[k].ntile; t++) rows_sum(&q[k], t);
        }
    }
}

/* c[N] = beta·c + Σ_{r < R} a[r] · w[r·ld + 0 .. N) (beta 0: c's contents ignored);
 * scratch (nscratch floats) holds the chunks' partials when they fit */
static void gemv_rows(const uint16_t *w, int64_t ld, int64_t R, int64_t N, const float *a,
                      float beta, float *c, float *scratch, int64_t nscratch) {
    rows_fn *rows_into = rows_loop();
    const rows_plan q = plan_rows(w, ld, R, N, a, beta, c, scratch, nscratch);
    if (q.parts) {  /* one region: the chunks, a barrier, the sums */
        run_rows(rows_into, 1, &q, R * N);
        return;
    }
    const int64_t ntile = q.ntile;
#pragma omp parallel for schedule(static) if (R * N > (1 << 16))
    for (int64_t t = 0; t < ntile; t++) {
        const int64_t j0 = t * GEMV_TILE, nj = N - j0 < GEMV_TILE ? N - j0 : GEMV_TILE;
        float acc[GEMV_TILE];
        for (int64_t j = 0; j < nj; j++) acc[j] = beta == 0.0f ? 0.0f : beta * c[j0 + j];
        rows_into(acc, w + j0, ld, 0, R, nj, a);
        memcpy(c + j0, acc, (size_t)nj * sizeof(float));
    }
}

bool mha_gemv_bf16_many(int n, const float *a, const mha_op *const *w, const float *beta,
                        float *const *c) {
    rows_plan q[MHA_GEMV_MANY];
    int64_t work = 0;
    if (n < 1 || n > MHA_GEMV_MANY) return false;
    for (int k = 0; k < n; k++) {
        const attn_tensor *t = w[k]->src;
        if (!t || t->dtype != ATTN_BF16 || !(w[k]->out <= 1 || t->stride[1] == 1)) return false;
        q[k] = plan_rows(t->data, t->stride[0], w[k]->in, w[k]->out, a, beta[k], c[k],
                         (float *)w[k]->p, w[k]->panel);
        if (!q[k].parts) return false;
        work += q[k].R * q[k].N;
    }
    run_rows(rows_loop(), n, q, work);
    return true;
}

/* dot[r - r0] = row r · a for r0 <= r < r1, the portable loop: element j into lane
 * j mod 8, the lanes added in one fixed order */
static void dots_generic(float *dot, const uint16_t *w, int64_t ld, int64_t r0, int64_t r1,
                         int64_t N, const float *a) {
    for (int64_t r = r0; r < r1; r++) {
        const uint16_t *row = w + r * ld;
        float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int64_t j = 0;
        for (; j + 8 <= N; j += 8)
            for (int l = 0; l < 8; l++) s[l] += bf16_f32(row[j + l]) * a[j + l];
        for (int l = 0; j < N; j++, l++) s[l] += bf16_f32(row[j]) * a[j];
        dot[r - r0] = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    }
}

/* rows of the dots loop one call takes: four chains side by side in the AVX2 loop */
#define GEMV_DOT_ROWS 16

/* c[r] = beta·c[r] + Σ_{j < N} w[r·ld + j] · a[j] for r < R */
static void gemv_dots(const uint16_t *w, int64_t ld, int64_t R, int64_t N, const float *a,
                      float beta, float *c) {
    const attn_kernels *k = ai_select_kernels(NULL);
    rows_fn *dots = k && k->gemv_dots_bf16 ? k->gemv_dots_bf16 : dots_generic;
    const int64_t nb = (R + GEMV_DOT_ROWS - 1) / GEMV_DOT_ROWS;
    /* blocks taken one at a time by whichever thread is free, as run_rows's chunks */
#pragma omp parallel for schedule(dynamic, 1) if (R * N > (1 << 16))
    for (int64_t b = 0; b < nb; b++) {
        const int64_t r0 = b * GEMV_DOT_ROWS, r1 = r0 + GEMV_DOT_ROWS < R ? r0 + GEMV_DOT_ROWS : R;
        float dot[GEMV_DOT_ROWS];
        dots(dot, w, ld, r0, r1, N, a);
        for (int64_t r = r0; r < r1; r++)
            c[r] = beta == 0.0f ? dot[r - r0] : beta * c[r] + dot[r - r0];
    }
}

bool mha_gemv_reads(const attn_tensor *t) {
    const int64_t in = t->shape[0], out = t->shape[1];
    return t->dtype == ATTN_BF16 &&
           (out <= 1 || t->stride[1] == 1 || in <= 1 || t->stride[0] == 1);
}

bool mha_gemv_bf16(bool transposed, const float *a, const mha_op *w, float beta, float *c) {
    const attn_tensor *t = w->src;
    if (!t || t->dtype != ATTN_BF16) return false;
    const int64_t in = w->in, out = w->out, s0 = t->stride[0], s1 = t->stride[1];
    const uint16_t *p = t->data;
    /* the weight's panel (mha_weight_op), unused here: the rows loop's partials */
    float *scratch = (float *)w->p;
    const int64_t nscratch = w->panel;
    /* element (i, o) of the logical [in, out] weight is p[i·s0 + o·s1]; any strides
     * other than these two layouts take the panels */
    const bool rows_io = out <= 1 || s1 == 1;  /* row i contiguous along o */
    const bool rows_oi = in <= 1 || s0 == 1;   /* row o contiguous along i */
    if (rows_io) {
        if (!transposed)  /* c[out] = Σ_i a[i] W[i, :] */
            gemv_rows(p, s0, in, out, a, beta, c, scratch, nscratch);
        else  /* c[in] = W a */
            gemv_dots(p, s0, in, out, a, beta, c);
        return true;
    }
    if (rows_oi) {
        if (!transposed)  /* c[out] = Wᵀ a */
            gemv_dots(p, s1, out, in, a, beta, c);
        else  /* c[in] = Σ_o a[o] W[:, o] */
            gemv_rows(p, s1, out, in, a, beta, c, scratch, nscratch);
        return true;
    }
    return false;
}
