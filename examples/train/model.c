/*
 * model.c — `attn train`'s transformer (model.h): parameters, activations, the forward
 *           and backward passes of the whole network, AdamW.
 *
 * The embeddings, layer norms, GELU and cross-entropy are examples/train/model_ops.h,
 * instantiated here for float; every matrix product is the library's BLAS door
 * (ai_gemm_f32, src/core/blas.h). Each block's attention layer is the library's multi-head
 * module (attn_mha_forward / attn_mha_backward): W_Q, W_K and W_V are the three column
 * blocks of the packed (C, 3C) w_qkv, read in place with leading dimension 3C, their
 * gradients written the same way into the packed gradient. A forward with targets (one
 * that a backward follows) keeps each block's projections, attention output and LSE in
 * the block's saved buffer (attn_mha_forward_save), and the backward reads them
 * (attn_mha_backward_saved) instead of running the block's forward again.
 * What it is not: a general framework (one architecture, float32, sizes fixed at
 * creation) or the sampler and the training loop (examples/train/cli_train.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "core/blas.h"
#include "linear.h"
#include "model.h"

#define REAL float
#define OP(name) name##_f
#include "model_ops.h"
#include "rng.h"
#undef REAL
#undef OP

/* one block's parameters (and, with the same shapes, their gradients) */
typedef struct block_params {
    float *ln1_g, *ln1_b;   /* (C)                 */
    float *w_qkv, *b_qkv;   /* (C, 3C), (3C)       */
    float *w_o, *b_o;       /* (C, C), (C)         */
    float *ln2_g, *ln2_b;   /* (C)                 */
    float *w_fc, *b_fc;     /* (C, 4C), (4C)       */
    float *w_pr, *b_pr;     /* (4C, C), (C)        */
} block_params;

typedef struct params {
    float *wte, *wpe;       /* (V, C), (T, C)      */
    block_params *block;    /* (layers)            */
    float *lnf_g, *lnf_b;   /* (C)                 */
    float *w_out;           /* (C, V)              */
} params;

/* one block's activations, for B·T = N rows */
typedef struct block_acts {
    float *x;                     /* (N, C)  the block's input (the residual stream)  */
    float *ln1, *ln1_mean, *ln1_rstd;   /* (N, C), (N), (N)                            */
    float *x2;                    /* (N, C)  x + the attention layer's output         */
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fc, *fch;              /* (N, 4C) before and after GELU                    */
    void *saved;                  /* the attention layer's kept activations           */
} block_acts;

/* a parameter tensor: where it is, how big, whether AdamW decays it */
typedef struct segment {
    int64_t off, size;
    bool decay;
} segment;

struct model {
    model_config cfg;
    int64_t n_params;
    float *mem_params, *mem_grads, *adam_m, *adam_v;
    params p, g;
    segment *seg;
    int n_seg;
    int64_t adam_t;

    /* activations of the latest forward */
    float *mem_acts;
    char *mem_saved;              /* (layers · saved_bytes) the blocks' saved buffers   */
    size_t saved_bytes;           /* attn_mha_saved_size of (batch, ctx), 64-byte steps */
    block_acts *act;
    float *x_final, *lnf, *lnf_mean, *lnf_rstd, *probs, *losses;  /* (N, C) ... (N, V), (N) */
    int *tokens, *targets;        /* (N) */
    int fb, ft;                   /* the latest forward's b and t */
    bool has_targets;

    /* backward scratch */
    float *mem_back;
    float *dx, *dx2, *dln, *dfc, *dfch, *dlogits;

    char err[300];
};

/* ---- layout ----------------------------------------------------------------------------- */

/* Assigns the tensors of a parameter (or gradient) array in order; with seg, also records
 * the segments. Returns the number of floats. */
static int64_t bind_params(const model_config *c, float *base, params *p, block_params *blocks,
                           segment *seg, int *n_seg) {
    const int64_t V = c->vocab, T = c->ctx, C = c->d_model;
    int64_t at = 0;
    int ns = 0;
#define TAKE(ptr, n, dec)                                               \
    do {                                                                \
        (ptr) = base ? base + at : NULL;                                \
        if (seg) seg[ns] = (segment){at, (n), (dec)};                   \
        ns++;                                                           \
        at += (n);                                                      \
    } while (0)
    TAKE(p->wte, V * C, true);
    TAKE(p->wpe, T * C, true);
    p->block = blocks;
    for (int l = 0; l < c->layers; l++) {
        block_params *b = &blocks[l];
        TAKE(b->ln1_g, C, false);
        TAKE(b->ln1_b, C, false);
        TAKE(b->w_qkv, C * 3 * C, true);
        TAKE(b->b_qkv, 3 * C, false);
        TAKE(b->w_o, C * C, true);
        TAKE(b->b_o, C, false);
        TAKE(b->ln2_g, C, false);
        TAKE(b->ln2_b, C, false);
        TAKE(b->w_fc, C * 4 * C, true);
        TAKE(b->b_fc, 4 * C, false);
        TAKE(b->w_pr, 4 * C * C, true);
        TAKE(b->b_pr, C, false);
    }
    TAKE(p->lnf_g, C, false);
    TAKE(p->lnf_b, C, false);
    TAKE(p->w_out, C * V, true);
#undef TAKE
    if (n_seg) *n_seg = ns;
    return at;
}

/* the initialization's normal draws */
static void fill_normal(float *x, int64_t n, double std, rng_t *s) {
    for (int64_t e = 0; e < n; e++) x[e] = (float)(std * rng_gauss(s));
}
static void fill_const(float *x, int64_t n, float v) {
    for (int64_t e = 0; e < n; e++) x[e] = v;
}

/* GPT-2's initialization: N(0, 0.02) matrices, the two projections into the residual
 * stream scaled by 1/sqrt(2 layers), zero biases, unit layer-norm gains */
static void init_params(model *m) {
    const model_config *c = &m->cfg;
    const int64_t V = c->vocab, T = c->ctx, C = c->d_model;
    rng_t s = {c->seed * 0x2545F4914F6CDD1Dull + 1};
    const double std = 0.02, std_res = 0.02 / sqrt(2.0 * c->layers);
    memset(m->mem_params, 0, (size_t)m->n_params * sizeof(float));
    fill_normal(m->p.wte, V * C, std, &s);
    fill_normal(m->p.wpe, T * C, std, &s);
    for (int l = 0; l < c->layers; l++) {
        block_params *b = &m->p.block[l];
        fill_const(b->ln1_g, C, 1.0f);
        fill_const(b->ln2_g, C, 1.0f);
        fill_normal(b->w_qkv, C * 3 * C, std, &s);
        fill_normal(b->w_o, C * C, std_res, &s);
        fill_normal(b->w_fc, C * 4 * C, std, &s);
        fill_normal(b->w_pr, 4 * C * C, std_res, &s);
    }
    fill_const(m->p.lnf_g, C, 1.0f);
    fill_normal(m->p.w_out, C * V, std, &s);
}

static float *carve(float **at, int64_t n) {
    float *p = *at;
    *at += (n + 15) / 16 * 16;  // 64-byte steps
    return p;
}

static int saved_layout(model *m);

model *model_create(const model_config *cfg, const char **why) {
    const model_config *c = cfg;
    if (c->vocab < 1 || c->ctx < 1 || c->d_model < 1 || c->heads < 1 || c->layers < 1 ||
        c->batch < 1 || c->d_model % c->heads != 0 || c->vocab > 65536 || c->ctx > 65536 ||
        c->d_model > 8192 || c->layers > 64 || c->batch > 4096) {
        if (why) *why = "invalid model sizes (d_model must be a multiple of heads)";
        return NULL;
    }
    model *m = calloc(1, sizeof *m);
    if (!m) goto nomem;
    m->cfg = *c;
    const int64_t V = c->vocab, T = c->ctx, C = c->d_model, L = c->layers;
    const int64_t N = (int64_t)c->batch * T;

    /* parameters, gradients, AdamW's moments */
    block_params *pb = calloc((size_t)L, sizeof *pb), *gb = calloc((size_t)L, sizeof *gb);
    m->seg = calloc((size_t)(12 * L + 8), sizeof *m->seg);
    m->act = calloc((size_t)L, sizeof *m->act);
    m->p.block = pb;
    m->g.block = gb;
    if (!pb || !gb || !m->seg || !m->act) goto nomem_m;
    m->n_params = bind_params(c, NULL, &m->p, pb, m->seg, &m->n_seg);
    m->mem_params = calloc((size_t)m->n_params, sizeof(float));
    m->mem_grads = calloc((size_t)m->n_params, sizeof(float));
    m->adam_m = calloc((size_t)m->n_params, sizeof(float));
    m->adam_v = calloc((size_t)m->n_params, sizeof(float));
    bind_params(c, m->mem_params, &m->p, pb, NULL, NULL);
    bind_params(c, m->mem_grads, &m->g, gb, NULL, NULL);
    if (!m->mem_params || !m->mem_grads || !m->adam_m || !m->adam_v) goto nomem_m;
    init_params(m);

    /* activations: counted in a first pass, carved in a second */
    int64_t acts = 0;
    for (int pass = 0; pass < 2; pass++) {
        float *at = m->mem_acts;
        int64_t used = 0;
#define A(ptr, n)                                                 \
        do {                                                      \
            if (pass) (ptr) = carve(&at, (n));                    \
            used += ((n) + 15) / 16 * 16;                         \
        } while (0)
        for (int l = 0; l < L; l++) {
            block_acts *a = &m->act[l];
            A(a->x, N * C);
            A(a->ln1, N * C); A(a->ln1_mean, N); A(a->ln1_rstd, N);
            A(a->x2, N * C);
            A(a->ln2, N * C); A(a->ln2_mean, N); A(a->ln2_rstd, N);
            A(a->fc, N * 4 * C); A(a->fch, N * 4 * C);
        }
        A(m->x_final, N * C);
        A(m->lnf, N * C); A(m->lnf_mean, N); A(m->lnf_rstd, N);
        A(m->probs, N * V);
        A(m->losses, N);
#undef A
        if (!pass) {
            acts = used;
            m->mem_acts = calloc((size_t)acts, sizeof(float));
            if (!m->mem_acts) goto nomem_m;
        }
    }
    m->tokens = calloc((size_t)N, sizeof(int));
    m->targets = calloc((size_t)N, sizeof(int));
    if (saved_layout(m) != 0) goto nomem_m;

    /* backward scratch */
    const int64_t back = 3 * N * C + 2 * N * 4 * C + N * V + 16 * 6;  // + 16 per carve
    m->mem_back = calloc((size_t)back, sizeof(float));
    if (!m->tokens || !m->targets || !m->mem_back) goto nomem_m;
    float *at = m->mem_back;
    m->dx = carve(&at, N * C);
    m->dx2 = carve(&at, N * C);
    m->dln = carve(&at, N * C);
    m->dfc = carve(&at, N * 4 * C);
    m->dfch = carve(&at, N * 4 * C);
    m->dlogits = carve(&at, N * V);
    return m;

nomem_m:
    model_free(m);
nomem:
    if (why) *why = "out of memory";
    return NULL;
}

void model_free(model *m) {
    if (!m) return;
    free(m->p.block);
    free(m->g.block);
    free(m->seg);
    free(m->act);
    free(m->mem_params);
    free(m->mem_grads);
    free(m->adam_m);
    free(m->adam_v);
    free(m->mem_acts);
    free(m->mem_saved);
    free(m->tokens);
    free(m->targets);
    free(m->mem_back);
    free(m);
}

int64_t model_param_count(const model *m) { return m->n_params; }
float *model_params(model *m) { return m->mem_params; }
float *model_grads(model *m) { return m->mem_grads; }
const float *model_probs(const model *m) { return m->probs; }
const float *model_losses(const model *m) { return m->losses; }
const char *model_error(const model *m) { return m->err; }

void model_zero_grad(model *m) { memset(m->mem_grads, 0, (size_t)m->n_params * sizeof(float)); }

/* ---- the library's parts: the BLAS and the multi-head module ------------------------- */

/* One block's attention layer as the module reads it: q, k, v the column blocks of the
 * packed (C, 3C) w_qkv (leading dimension 3C), o the (C, C) w_o; tensors over p's
 * arrays, so the same function describes the parameters and their gradients. */
typedef struct block_mha {
    attn_tensor w[4], b[4];
    attn_mha m;
    attn_mha_grads g;  /* of the tensors of the gradient block, when built from one */
    attn_options opt;
} block_mha;

static void block_tensors(const model *m, const block_params *p, attn_tensor w[4], attn_tensor b[4]) {
    const int64_t C = m->cfg.d_model;
    for (int k = 0; k < 3; k++) {
        w[k] = (attn_tensor){p->w_qkv + k * C, ATTN_F32, {C, C, 1, 1}, {3 * C, 1, 1, 1}};
        b[k] = attn_tensor_4d(p->b_qkv + k * C, ATTN_F32, C, 1, 1, 1);
    }
    w[3] = attn_tensor_4d(p->w_o, ATTN_F32, C, C, 1, 1);
    b[3] = attn_tensor_4d(p->b_o, ATTN_F32, C, 1, 1, 1);
}

/* bm over p (and its gradients over g, if not NULL); its tensors point into bm itself */
static void block_mha_init(block_mha *bm, const model *m, const block_params *p,
                           const block_params *g, attn_tensor gw[4], attn_tensor gb[4]) {
    block_tensors(m, p, bm->w, bm->b);
    bm->m = (attn_mha){.Hq = m->cfg.heads, .w_q = &bm->w[0], .w_k = &bm->w[1],
                       .w_v = &bm->w[2], .w_o = &bm->w[3], .b_q = &bm->b[0],
                       .b_k = &bm->b[1], .b_v = &bm->b[2], .b_o = &bm->b[3]};
    if (g) {
        block_tensors(m, g, gw, gb);
        bm->g = (attn_mha_grads){.dw_q = &gw[0], .dw_k = &gw[1], .dw_v = &gw[2], .dw_o = &gw[3],
                                 .db_q = &gb[0], .db_k = &gb[1], .db_v = &gb[2], .db_o = &gb[3]};
    }
    memset(&bm->opt, 0, sizeof bm->opt);
    if (m->cfg.reversed) {
        /* the seed's reversed mask, triu(diagonal = 0): row i keeps the keys j >= i, a
         * window with no left side and an unbounded right side */
        bm->opt.has_window = true;
        bm->opt.window_left = 0;
        bm->opt.window_right = -1;
    } else {
        bm->opt.causal = true;  // j <= i
    }
}

/* The blocks' saved buffers (attn_mha_forward_save): each the size the module asks for
 * the largest forward, batch sequences of ctx tokens (a smaller one fits in it), one
 * allocation for all blocks. 0, or -1 when out of memory. */
static int saved_layout(model *m) {
    const model_config *c = &m->cfg;
    block_mha bm;
    block_mha_init(&bm, m, &m->p.block[0], NULL, NULL, NULL);
    const attn_tensor x = attn_tensor_4d(NULL, ATTN_F32, c->batch, c->ctx, c->d_model, 1);
    size_t bytes;
    if (attn_mha_saved_size(&bm.m, &x, NULL, &bytes) != ATTN_OK) return -1;
    m->saved_bytes = (bytes + 63) & ~(size_t)63;
    m->mem_saved = malloc(m->saved_bytes * (size_t)c->layers);
    if (!m->mem_saved) return -1;
    for (int l = 0; l < c->layers; l++) m->act[l].saved = m->mem_saved + (size_t)l * m->saved_bytes;
    return 0;
}

static int fail(model *m, const char *what, attn_status st) {
    snprintf(m->err, sizeof m->err, "%s: %s: %s", what, attn_status_string(st), attn_last_error());
    return -1;
}

/* ---- forward ---------------------------------------------------------------------------- */

int model_forward(model *m, const int *tokens, const int *targets, int b, int t, double *loss) {
    const model_config *c = &m->cfg;
    const int64_t V = c->vocab, C = c->d_model, N = (int64_t)b * t;
    if (b < 1 || t < 1 || b > c->batch || t > c->ctx) {
        snprintf(m->err, sizeof m->err, "forward: %d x %d tokens, at most %d x %d", b, t,
                 c->batch, c->ctx);
        return -1;
    }
    memcpy(m->tokens, tokens, (size_t)N * sizeof(int));
    if (targets) memcpy(m->targets, targets, (size_t)N * sizeof(int));
    else memset(m->targets, 0, (size_t)N * sizeof(int));
    m->fb = b;
    m->ft = t;
    m->has_targets = targets != NULL;

    encoder_forward_f(m->act[0].x, m->tokens, m->p.wte, m->p.wpe, N, t, C);
    for (int l = 0; l < c->layers; l++) {
        const block_params *p = &m->p.block[l];
        block_acts *a = &m->act[l];
        float *out = l + 1 < c->layers ? m->act[l + 1].x : m->x_final;
        layernorm_forward_f(a->ln1, a->ln1_mean, a->ln1_rstd, a->x, p->ln1_g, p->ln1_b, N, C);
        block_mha bm;
        block_mha_init(&bm, m, p, NULL, NULL, NULL);
        const attn_tensor x = attn_tensor_4d(a->ln1, ATTN_F32, b, t, C, 1);
        const attn_tensor y = attn_tensor_4d(a->x2, ATTN_F32, b, t, C, 1);
        attn_status st = targets ? attn_mha_forward_save(&bm.m, &x, NULL, &y, NULL, false,
                                                         &bm.opt, a->saved, m->saved_bytes)
                                 : attn_mha_forward(&bm.m, &x, NULL, &y, NULL, false, &bm.opt);
        if (st != ATTN_OK)
            return fail(m, targets ? "attn_mha_forward_save" : "attn_mha_forward", st);
        for (int64_t e = 0; e < N * C; e++) a->x2[e] += a->x[e];  // x2 = x + attention
        layernorm_forward_f(a->ln2, a->ln2_mean, a->ln2_rstd, a->x2, p->ln2_g, p->ln2_b, N, C);
        st = linear_forward(a->fc, a->ln2, p->w_fc, p->b_fc, N, C, 4 * C);
        if (st != ATTN_OK) return fail(m, "ai_gemm_f32", st);
        gelu_forward_f(a->fch, a->fc, N * 4 * C);
        st = linear_forward(out, a->fch, p->w_pr, p->b_pr, N, 4 * C, C);
        if (st != ATTN_OK) return fail(m, "ai_gemm_f32", st);
        for (int64_t e = 0; e < N * C; e++) out[e] += a->x2[e];  // out = x2 + MLP
    }
    layernorm_forward_f(m->lnf, m->lnf_mean, m->lnf_rstd, m->x_final, m->p.lnf_g, m->p.lnf_b, N, C);
    const attn_status st = linear_forward(m->probs, m->lnf, m->p.w_out, NULL, N, C, V);  // the logits,
    if (st != ATTN_OK) return fail(m, "ai_gemm_f32", st);                           // then
    const double mean = crossentropy_forward_f(m->probs, m->losses, m->probs, m->targets, N, V);
    if (loss) *loss = targets ? mean : 0.0;
    return 0;
}

int model_attention_inputs(const model *m, int layer, float *out) {
    if (layer < 0 || layer >= m->cfg.layers) return -1;
    const int64_t C = m->cfg.d_model, H = m->cfg.heads, D = C / H, t = m->ft;
    /* the layer's projections of sequence 0 again: qkv (t, 3C) = ln1 w_qkv + b_qkv, [T, H, D]
     * per third (recomputed: a forward without targets keeps none) */
    float *qkv = malloc((size_t)(t > 0 ? t : 1) * 3 * (size_t)C * sizeof(float));
    if (!qkv) return -1;
    const block_params *bp = &m->p.block[layer];
    if (linear_forward(qkv, m->act[layer].ln1, bp->w_qkv, bp->b_qkv, t, C, 3 * C) != ATTN_OK) {
        free(qkv);
        return -1;
    }
    for (int64_t x = 0; x < 3; x++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < t; i++)
                for (int64_t d = 0; d < D; d++)
                    out[((x * H + h) * t + i) * D + d] = qkv[i * 3 * C + x * C + h * D + d];
    free(qkv);
    return 0;
}

/* ---- backward ----------------------------------------------------------------------------- */

int model_backward(model *m) {
    const model_config *c = &m->cfg;
    if (!m->has_targets) {
        snprintf(m->err, sizeof m->err, "backward: the latest forward had no targets");
        return -1;
    }
    const int b = m->fb, t = m->ft;
    const int64_t V = c->vocab, C = c->d_model, N = (int64_t)b * t;
    const size_t nc = (size_t)(N * C) * sizeof(float);

    /* forward: loss = mean cross-entropy of softmax(logits); logits = lnf w_out */
    crossentropy_backward_f(m->dlogits, m->probs, m->targets, N, V);
    memset(m->dln, 0, nc);
    attn_status st = linear_backward(m->dln, m->g.w_out, NULL, m->dlogits, m->lnf, m->p.w_out,
                                     N, C, V);
    if (st != ATTN_OK) return fail(m, "ai_gemm_f32", st);
    /* forward: lnf = LN(x_final) */
    memset(m->dx, 0, nc);
    layernorm_backward_f(m->dx, m->g.lnf_g, m->g.lnf_b, m->dln, m->x_final, m->p.lnf_g,
                         m->lnf_mean, m->lnf_rstd, N, C);

    for (int l = c->layers - 1; l >= 0; l--) {
        const block_params *p = &m->p.block[l];
        block_params *g = &m->g.block[l];
        block_acts *a = &m->act[l];
        /* forward: out = x2 + (fch w_pr + b_pr), so dx2 = dout, and the MLP gets dout;
         * m->dx holds dout */
        memset(m->dfch, 0, (size_t)(N * 4 * C) * sizeof(float));
        st = linear_backward(m->dfch, g->w_pr, g->b_pr, m->dx, a->fch, p->w_pr, N, 4 * C, C);
        if (st != ATTN_OK) return fail(m, "ai_gemm_f32", st);
        /* forward: fch = GELU(fc) */
        memset(m->dfc, 0, (size_t)(N * 4 * C) * sizeof(float));
        gelu_backward_f(m->dfc, a->fc, m->dfch, N * 4 * C);
        /* forward: fc = ln2 w_fc + b_fc */
        memset(m->dln, 0, nc);
        st = linear_backward(m->dln, g->w_fc, g->b_fc, m->dfc, a->ln2, p->w_fc, N, C, 4 * C);
        if (st != ATTN_OK) return fail(m, "ai_gemm_f32", st);
        /* forward: ln2 = LN(x2); dx2 = dout + LN's share */
        memcpy(m->dx2, m->dx, nc);
        layernorm_backward_f(m->dx2, g->ln2_g, g->ln2_b, m->dln, a->x2, p->ln2_g, a->ln2_mean,
                             a->ln2_rstd, N, C);
        /* forward: x2 = x + mha(ln1), so the layer gets dx2, its activations read from
         * the block's saved buffer. The module's backward overwrites its gradients (dln, the block's w_qkv, b_qkv, w_o, b_o), which is
         * adding them to the zeroed ones: each is used once per forward. */
        block_mha bm;
        attn_tensor gw[4], gb[4];
        block_mha_init(&bm, m, p, g, gw, gb);
        const attn_tensor x = attn_tensor_4d(a->ln1, ATTN_F32, b, t, C, 1);
        const attn_tensor dy = attn_tensor_4d(m->dx2, ATTN_F32, b, t, C, 1);
        const attn_tensor dln = attn_tensor_4d(m->dln, ATTN_F32, b, t, C, 1);
        bm.g.dx_q = &dln;
        st = attn_mha_backward_saved(&bm.m, &x, NULL, &dy, &bm.g, &bm.opt, a->saved,
                                     m->saved_bytes);
        if (st != ATTN_OK) return fail(m, "attn_mha_backward_saved", st);
        /* forward: ln1 = LN(x); dx = dx2 + LN's share */
        memcpy(m->dx, m->dx2, nc);
        layernorm_backward_f(m->dx, g->ln1_g, g->ln1_b, m->dln, a->x, p->ln1_g, a->ln1_mean,
                             a->ln1_rstd, N, C);
    }
    /* forward: x = wte[tokens] + wpe[positions] */
    encoder_backward_f(m->g.wte, m->g.wpe, m->dx, m->tokens, N, t, C);
    return 0;
}

/* ---- AdamW ------------------------------------------------------------------------------------ */

double model_adamw(model *m, double lr, double wd, double clip) {
    const double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
    double sq = 0;  // in order: the same norm on any thread count
    for (int64_t e = 0; e < m->n_params; e++) sq += (double)m->mem_grads[e] * m->mem_grads[e];
    const double norm = sqrt(sq);
    const double k = clip > 0 && norm > clip ? clip / norm : 1.0;
    m->adam_t++;
    const double c1 = 1.0 - pow(beta1, (double)m->adam_t), c2 = 1.0 - pow(beta2, (double)m->adam_t);
    for (int s = 0; s < m->n_seg; s++) {
        const segment *sg = &m->seg[s];
        const float decay = sg->decay ? (float)wd : 0.0f;
#pragma omp parallel for schedule(static)
        for (int64_t e = sg->off; e < sg->off + sg->size; e++) {
            const float gr = (float)(m->mem_grads[e] * k);
            m->adam_m[e] = (float)(beta1 * m->adam_m[e] + (1 - beta1) * gr);
            m->adam_v[e] = (float)(beta2 * m->adam_v[e] + (1 - beta2) * gr * gr);
            const double mh = m->adam_m[e] / c1, vh = m->adam_v[e] / c2;
            m->mem_params[e] -= (float)(lr * (mh / (sqrt(vh) + eps) + decay * m->mem_params[e]));
        }
    }
    return norm;
}
