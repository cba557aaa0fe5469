/*
 * cli_seq2seq.c — `attn seq2seq`: Bahdanau's picture, run. A GRU encoder-decoder with
 *                 additive attention, written here in C on the library, learns to reverse
 *                 sequences of digits; the loss is printed as it trains, then greedy
 *                 decoding is scored on held-out sequences and the learned alignment
 *                 (α over encoder positions for each output step, averaged over the
 *                 held-out batch) is written as a PNG heatmap, where reversal shows as the
 *                 anti-diagonal.
 *
 * The model, for inputs x_1..x_T and targets y_t = x_{T+1-t}:
 *   encoder   bidirectional, as Bahdanau's: f_t = GRU_f(emb_enc[x_t], f_{t-1}), f_0 = 0,
 *             g_t = GRU_b(emb_enc[x_t], g_{t+1}), g_{T+1} = 0; annotations h_t = [f_t; g_t]
 *             (a one-way encoder's f_t also remembers x_{t-1}, and the alignment it learns
 *             is then off the anti-diagonal by one)
 *   decoder   s_0 = f_T;  at step t: c_t = attention(query s_{t-1}; keys = values = h_1..h_T)
 *             s_t = GRU_dec([emb_dec[y_{t-1}]; c_t], s_{t-1})   (y_0 = START; teacher forcing)
 *             logits_t = [s_t; c_t] Wo + bo,  loss = mean cross-entropy
 * attention is attn_additive_forward / attn_additive_backward (one call per decoder step,
 * Lq = 1); the dense layers and the cross-entropy are examples/train/model_ops.h's (instantiated
 * here for float). What it is not: a general RNN library, or fast.
 */
#include <math.h>
#include <omp.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn.h"
#include "cli.h"
#include "cli_files.h"
#include "cliopt.h"
#include "linear.h"
#include "heatmap.h"
#include "rng.h"

#define REAL float
#define OP(name) name##_s2s
#include "model_ops.h"

enum { VOCAB = 10, START = 10 };  /* digits 0..9; the decoder's start symbol */

typedef struct gru {
    float *Wx, *Wh, *bx, *bh;  /* (Din, 3H) (H, 3H) (3H) (3H): gates z, r, n side by side */
} gru;

typedef struct net {
    float *emb_enc, *emb_dec;   /* (VOCAB, E), (VOCAB + 1, E)   */
    gru enc, encb, dec;         /* Din = E, E, E + K              */
    float *Wq, *Uk, *va, *ba;   /* attention: (H, A) (K, A) (A) (A) */
    float *Wo, *bo;             /* (H + K, VOCAB), (VOCAB)        */
} net;

typedef struct dims {
    int B, T, E, H, A;
    int K;  /* the annotations' width, 2H */
} dims;

/* Points the parts of a net at consecutive slices of base; returns the float count. */
static int64_t layout(net *n, float *base, const dims *d) {
    int64_t off = 0;
#define TAKE(p, count) (p = base ? base + off : NULL, off += (count))
    const int64_t E = d->E, H = d->H, A = d->A, K = d->K;
    TAKE(n->emb_enc, VOCAB * E);
    TAKE(n->emb_dec, (VOCAB + 1) * E);
    TAKE(n->enc.Wx, E * 3 * H); TAKE(n->enc.Wh, H * 3 * H);
    TAKE(n->enc.bx, 3 * H);     TAKE(n->enc.bh, 3 * H);
    TAKE(n->encb.Wx, E * 3 * H); TAKE(n->encb.Wh, H * 3 * H);
    TAKE(n->encb.bx, 3 * H);     TAKE(n->encb.bh, 3 * H);
    TAKE(n->dec.Wx, (E + K) * 3 * H); TAKE(n->dec.Wh, H * 3 * H);
    TAKE(n->dec.bx, 3 * H);           TAKE(n->dec.bh, 3 * H);
    TAKE(n->Wq, H * A); TAKE(n->Uk, K * A); TAKE(n->va, A); TAKE(n->ba, A);
    TAKE(n->Wo, (H + K) * VOCAB); TAKE(n->bo, VOCAB);
#undef TAKE
    return off;
}

/* One GRU's values over T steps of B rows, kept for the backward: step t's input x,
 * previous state h, gate pre-activations gx = x Wx + bx and gh = h Wh + bh, gates z, r, n,
 * and new state out. */
typedef struct gru_steps {
    int ni, H;  /* input width (I is taken by <complex.h>, through <tgmath.h>) */
    float *x, *h, *gx, *gh, *z, *r, *n, *out;  /* (T, B, Din|H|3H|3H|H|H|H|H) */
} gru_steps;

typedef struct cache {
    gru_steps enc, encb, dec;     /* encb's step s is position T - 1 - s            */
    float *hs;                    /* (B, T, K): the annotations, keys and values    */
    float *c, *lse, *alpha;       /* (T, B, K|1|T): context, LSE, attention weights */
    float *oin, *logits;          /* (T, B, H+K|VOCAB)                              */
    int *yin, *tgt;               /* (T, B): the decoder's input and target symbols */
} cache;

static float *falloc(int64_t n) {
    float *p = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    if (!p) {
        fprintf(stderr, "attn seq2seq: out of memory\n");
        exit(1);
    }
    return p;
}

static void steps_alloc(gru_steps *g, int T, int B, int Din, int H) {
    const int64_t n = (int64_t)T * B;
    g->ni = Din; g->H = H;
    g->x = falloc(n * Din); g->h = falloc(n * H); g->gx = falloc(n * 3 * H); g->gh = falloc(n * 3 * H);
    g->z = falloc(n * H); g->r = falloc(n * H); g->n = falloc(n * H); g->out = falloc(n * H);
}

static void steps_free(gru_steps *g) {
    free(g->x); free(g->h); free(g->gx); free(g->gh); free(g->z); free(g->r); free(g->n);
    free(g->out);
}

static float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

/* h' = (1 - z) n + z h, z = σ(x Wx_z + h Wh_z + b), r likewise, n = tanh(x Wx_n + b + r (h Wh_n + b)) */
static void gru_forward(const gru *g, const float *x, const float *h, int B, int Din, int H,
                        float *gx, float *gh, float *z, float *r, float *n, float *out) {
    (void)linear_forward(gx, x, g->Wx, g->bx, B, Din, 3 * H);
    (void)linear_forward(gh, h, g->Wh, g->bh, B, H, 3 * H);
    for (int b = 0; b < B; b++)
        for (int k = 0; k < H; k++) {
            const int64_t i = (int64_t)b * H + k, j = (int64_t)b * 3 * H + k;
            z[i] = sigm(gx[j] + gh[j]);
            r[i] = sigm(gx[j + H] + gh[j + H]);
            n[i] = tanhf(gx[j + 2 * H] + r[i] * gh[j + 2 * H]);
            out[i] = (1.0f - z[i]) * n[i] + z[i] * h[i];
        }
}

/* Through h' = (1 - z) n + z h: dx += .., dh += .. (both (B, Din|H)), the weights' grads +=.
 * dgx, dgh (B, 3H) and wt (3H x max(Din, H)) are scratch. */
static void gru_backward(const gru *g, gru *dg, const float *x, const float *h, const float *gh,
                         const float *z, const float *r, const float *n, const float *dout,
                         int B, int Din, int H, float *dx, float *dh, float *dgx, float *dgh,
                         float *wt) {
    for (int b = 0; b < B; b++)
        for (int k = 0; k < H; k++) {
            const int64_t i = (int64_t)b * H + k, j = (int64_t)b * 3 * H + k;
            const float dn = dout[i] * (1.0f - z[i]), dzz = dout[i] * (h[i] - n[i]);
            dh[i] += dout[i] * z[i];
            const float dan = dn * (1.0f - n[i] * n[i]);          /* n = tanh(a_n)        */
            const float dar = dan * gh[j + 2 * H] * r[i] * (1.0f - r[i]);  /* a_n ∋ r gh_n */
            const float daz = dzz * z[i] * (1.0f - z[i]);
            dgx[j] = daz; dgx[j + H] = dar; dgx[j + 2 * H] = dan;
            dgh[j] = daz; dgh[j + H] = dar; dgh[j + 2 * H] = dan * r[i];
        }
    (void)linear_backward(dx, dg->Wx, dg->bx, dgx, x, g->Wx, B, Din, 3 * H);
    (void)linear_backward(dh, dg->Wh, dg->bh, dgh, h, g->Wh, B, H, 3 * H);
}

static attn_additive_weights attn_weights(const net *n, const dims *d) {
    return (attn_additive_weights){d->A, n->Wq, n->Uk, n->va, n->ba, false, 0.0f};
}

typedef struct work {
    cache c;
    float *probs, *losses;              /* (T B, VOCAB), (T B)            */
    int *x;                             /* (B, T) the encoder's input     */
    /* backward scratch */
    float *dlogits, *doin, *ds, *dsp, *dc, *du, *dgx, *dgh, *wt, *dq, *dk, *dv, *dhs, *dho;
    float *gWq, *gUk, *gva, *gba;
} work;

static void work_alloc(work *w, const dims *d) {
    const int64_t B = d->B, T = d->T, E = d->E, H = d->H, A = d->A, K = d->K, TB = T * B;
    memset(w, 0, sizeof *w);
    steps_alloc(&w->c.enc, d->T, d->B, d->E, d->H);
    steps_alloc(&w->c.encb, d->T, d->B, d->E, d->H);
    steps_alloc(&w->c.dec, d->T, d->B, d->E + d->K, d->H);
    w->c.hs = falloc(B * T * K);
    w->c.c = falloc(TB * K); w->c.lse = falloc(TB); w->c.alpha = falloc(TB * T);
    w->c.oin = falloc(TB * (H + K)); w->c.logits = falloc(TB * VOCAB);
    w->c.yin = calloc((size_t)TB, sizeof(int)); w->c.tgt = calloc((size_t)TB, sizeof(int));
    w->x = calloc((size_t)TB, sizeof(int));
    w->probs = falloc(TB * VOCAB); w->losses = falloc(TB);
    const int64_t wide = 3 * H * (E + K) > VOCAB * (H + K) ? 3 * H * (E + K) : VOCAB * (H + K);
    w->dlogits = falloc(TB * VOCAB); w->doin = falloc(B * (H + K)); w->ds = falloc(B * H);
    w->dsp = falloc(B * H); w->dc = falloc(B * K); w->du = falloc(B * (E + K));
    w->dgx = falloc(B * 3 * H); w->dgh = falloc(B * 3 * H); w->wt = falloc(wide);
    w->dq = falloc(B * H); w->dk = falloc(B * T * K); w->dv = falloc(B * T * K);
    w->dhs = falloc(B * T * K); w->dho = falloc(B * H);
    w->gWq = falloc(H * A); w->gUk = falloc(K * A); w->gva = falloc(A); w->gba = falloc(A);
}

static void work_free(work *w) {
    steps_free(&w->c.enc); steps_free(&w->c.encb); steps_free(&w->c.dec);
    float *f[] = {w->c.hs, w->c.c, w->c.lse, w->c.alpha, w->c.oin, w->c.logits, w->probs,
                  w->losses, w->dlogits, w->doin, w->ds, w->dsp, w->dc, w->du, w->dgx, w->dgh,
                  w->wt, w->dq, w->dk, w->dv, w->dhs, w->dho, w->gWq, w->gUk, w->gva, w->gba};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) free(f[i]);
    free(w->c.yin); free(w->c.tgt); free(w->x);
}

/* Step t of a GRU's run: its x and h rows at step t are set by the caller. */
static void step_forward(const gru *w, gru_steps *g, int t, int B) {
    const int64_t o = (int64_t)t * B, H = g->H;
    gru_forward(w, g->x + o * g->ni, g->h + o * H, B, g->ni, (int)H, g->gx + o * 3 * H,
                g->gh + o * 3 * H, g->z + o * H, g->r + o * H, g->n + o * H, g->out + o * H);
}

static void step_backward(const gru *w, gru *dw, const gru_steps *g, int t, int B,
                          const float *dout, float *dx, float *dh, work *k) {
    const int64_t o = (int64_t)t * B, H = g->H;
    gru_backward(w, dw, g->x + o * g->ni, g->h + o * H, g->gh + o * 3 * H, g->z + o * H,
                 g->r + o * H, g->n + o * H, dout, B, g->ni, (int)H, dx, dh, k->dgx, k->dgh, k->wt);
}

/* The attention tensors of decoder step t */
typedef struct step_tensors {
    attn_tensor q, kv, o, lse, alpha;
} step_tensors;

static step_tensors step_tensors_of(cache *c, const dims *d, int t) {
    const int64_t B = d->B, H = d->H, T = d->T, K = d->K;
    step_tensors s;
    s.q = attn_tensor_4d(c->dec.h + t * B * H, ATTN_F32, B, 1, 1, H);  /* s_{t-1} */
    s.kv = attn_tensor_4d(c->hs, ATTN_F32, B, 1, T, K);
    s.o = attn_tensor_4d(c->c + t * B * K, ATTN_F32, B, 1, 1, K);
    s.lse = attn_tensor_4d(c->lse + t * B, ATTN_F32, B, 1, 1, 1);
    s.alpha = attn_tensor_4d(c->alpha + t * B * T, ATTN_F32, B, 1, 1, T);
    return s;
}

/* The forward pass over w->x; teacher-forced on y (B, T) when given (returns the mean
 * loss), else greedy (pred (B, T) gets the symbols). Returns NAN if attention fails. */
static double forward(const net *n, const dims *d, work *w, const int *y, int *pred) {
    const int B = d->B, T = d->T, E = d->E, H = d->H, K = d->K;
    cache *c = &w->c;
    /* the two directions: step s of dir 0 reads position s, of dir 1 position T - 1 - s;
     * each writes its half of the annotation h_t */
    for (int dir = 0; dir < 2; dir++) {
        const gru *wg = dir ? &n->encb : &n->enc;
        gru_steps *gs = dir ? &c->encb : &c->enc;
        for (int s = 0; s < T; s++) {
            const int t = dir ? T - 1 - s : s;
            for (int b = 0; b < B; b++)
                memcpy(gs->x + ((int64_t)s * B + b) * E, n->emb_enc + (int64_t)w->x[b * T + t] * E,
                       (size_t)E * sizeof(float));
            float *h = gs->h + (int64_t)s * B * H;
            if (s) memcpy(h, gs->out + (int64_t)(s - 1) * B * H, (size_t)B * H * sizeof(float));
            else memset(h, 0, (size_t)B * H * sizeof(float));
            step_forward(wg, gs, s, B);
            for (int b = 0; b < B; b++)
                memcpy(c->hs + ((int64_t)b * T + t) * K + dir * H,
                       gs->out + ((int64_t)s * B + b) * H, (size_t)H * sizeof(float));
        }
    }
    const attn_additive_weights aw = attn_weights(n, d);
    for (int t = 0; t < T; t++) {
        float *sp = c->dec.h + (int64_t)t * B * H;
        memcpy(sp, t ? c->dec.out + (int64_t)(t - 1) * B * H : c->enc.out + (int64_t)(T - 1) * B * H,
               (size_t)B * H * sizeof(float));
        step_tensors st = step_tensors_of(c, d, t);
        attn_options opt = {.lse = &st.lse, .weights = &st.alpha};
        if (attn_additive_forward(&st.q, &st.kv, &st.kv, &aw, &st.o, &opt) != ATTN_OK) {
            fprintf(stderr, "attn seq2seq: attention: %s\n", attn_last_error());
            return NAN;
        }
        const float *ct = c->c + (int64_t)t * B * K;
        for (int b = 0; b < B; b++) {
            const int yin = t == 0 ? START : y ? y[b * T + t - 1] : pred[b * T + t - 1];
            c->yin[t * B + b] = yin;
            c->tgt[t * B + b] = y ? y[b * T + t] : 0;
            float *u = c->dec.x + ((int64_t)t * B + b) * (E + K);
            memcpy(u, n->emb_dec + (int64_t)yin * E, (size_t)E * sizeof(float));
            memcpy(u + E, ct + (int64_t)b * K, (size_t)K * sizeof(float));
        }
        step_forward(&n->dec, &c->dec, t, B);
        float *oin = c->oin + (int64_t)t * B * (H + K), *logits = c->logits + (int64_t)t * B * VOCAB;
        for (int b = 0; b < B; b++) {
            memcpy(oin + (int64_t)b * (H + K), c->dec.out + ((int64_t)t * B + b) * H, (size_t)H * sizeof(float));
            memcpy(oin + (int64_t)b * (H + K) + H, ct + (int64_t)b * K, (size_t)K * sizeof(float));
        }
        (void)linear_forward(logits, oin, n->Wo, n->bo, B, H + K, VOCAB);
        for (int b = 0; pred && b < B; b++) {
            int best = 0;
            for (int v = 1; v < VOCAB; v++)
                if (logits[b * VOCAB + v] > logits[b * VOCAB + best]) best = v;
            pred[b * T + t] = best;
        }
    }
    return y ? crossentropy_forward_s2s(w->probs, w->losses, c->logits, c->tgt, (int64_t)T * B, VOCAB)
             : 0.0;
}

static void add_to(float *dst, const float *src, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] += src[i];
}

/* The gradients of the latest teacher-forced forward into g (added: zero g first). */
static int backward(const net *n, net *g, const dims *d, work *w) {
    const int B = d->B, T = d->T, E = d->E, H = d->H, A = d->A, K = d->K;
    cache *c = &w->c;
    const int64_t BH = (int64_t)B * H, BK = (int64_t)B * K;
    crossentropy_backward_s2s(w->dlogits, w->probs, c->tgt, (int64_t)T * B, VOCAB);
    memset(w->dhs, 0, (size_t)(BK * T) * sizeof(float));
    memset(w->ds, 0, (size_t)BH * sizeof(float));
    const attn_additive_weights aw = attn_weights(n, d);
    for (int t = T - 1; t >= 0; t--) {
        /* logits = [s_t; c_t] Wo + bo */
        memset(w->doin, 0, (size_t)(BH + BK) * sizeof(float));
        (void)linear_backward(w->doin, g->Wo, g->bo, w->dlogits + (int64_t)t * B * VOCAB,
                              c->oin + (int64_t)t * B * (H + K), n->Wo, B, H + K, VOCAB);
        for (int b = 0; b < B; b++) {
            for (int k = 0; k < H; k++) w->ds[b * H + k] += w->doin[b * (H + K) + k];
            for (int k = 0; k < K; k++) w->dc[b * K + k] = w->doin[b * (H + K) + H + k];
        }
        /* s_t = GRU_dec([emb_dec[y_{t-1}]; c_t], s_{t-1}) */
        memset(w->du, 0, (size_t)B * (E + K) * sizeof(float));
        memset(w->dsp, 0, (size_t)BH * sizeof(float));
        step_backward(&n->dec, &g->dec, &c->dec, t, B, w->ds, w->du, w->dsp, w);
        for (int b = 0; b < B; b++) {
            add_to(g->emb_dec + (int64_t)c->yin[t * B + b] * E, w->du + (int64_t)b * (E + K), E);
            add_to(w->dc + (int64_t)b * K, w->du + (int64_t)b * (E + K) + E, K);
        }
        /* c_t = attention(s_{t-1}; h, h) */
        step_tensors st = step_tensors_of(c, d, t);
        attn_tensor tdo = attn_tensor_4d(w->dc, ATTN_F32, B, 1, 1, K);
        attn_tensor tdq = attn_tensor_4d(w->dq, ATTN_F32, B, 1, 1, H);
        attn_tensor tdk = attn_tensor_4d(w->dk, ATTN_F32, B, 1, T, K);
        attn_tensor tdv = attn_tensor_4d(w->dv, ATTN_F32, B, 1, T, K);
        attn_additive_grads gr = {w->gWq, w->gUk, w->gva, w->gba, NULL};
        attn_status s = attn_additive_backward(&st.q, &st.kv, &st.kv, &aw, &st.o, &tdo, &st.lse,
                                               &tdq, &tdk, &tdv, &gr, NULL);
        if (s != ATTN_OK) {
            fprintf(stderr, "attn seq2seq: attention backward: %s\n", attn_last_error());
            return -1;
        }
        add_to(w->dsp, w->dq, BH);
        add_to(w->dhs, w->dk, BK * T);
        add_to(w->dhs, w->dv, BK * T);
        add_to(g->Wq, w->gWq, (int64_t)H * A); add_to(g->Uk, w->gUk, (int64_t)K * A);
        add_to(g->va, w->gva, A); add_to(g->ba, w->gba, A);
        memcpy(w->ds, w->dsp, (size_t)BH * sizeof(float));
    }
    /* s_0 = f_T, the forward half of h_T */
    for (int b = 0; b < B; b++) add_to(w->dhs + ((int64_t)b * T + T - 1) * K, w->ds + (int64_t)b * H, H);
    for (int dir = 0; dir < 2; dir++) {
        const gru *wg = dir ? &n->encb : &n->enc;
        gru *dg = dir ? &g->encb : &g->enc;
        const gru_steps *gs = dir ? &c->encb : &c->enc;
        memset(w->dsp, 0, (size_t)BH * sizeof(float));  /* dL/d(state) from step s + 1 */
        for (int s = T - 1; s >= 0; s--) {
            const int t = dir ? T - 1 - s : s;
            for (int b = 0; b < B; b++)
                for (int k = 0; k < H; k++)
                    w->dho[b * H + k] = w->dhs[((int64_t)b * T + t) * K + dir * H + k] + w->dsp[b * H + k];
            memset(w->du, 0, (size_t)B * E * sizeof(float));
            memset(w->dsp, 0, (size_t)BH * sizeof(float));
            step_backward(wg, dg, gs, s, B, w->dho, w->du, w->dsp, w);
            for (int b = 0; b < B; b++)
                add_to(g->emb_enc + (int64_t)w->x[b * T + t] * E, w->du + (int64_t)b * E, E);
        }
    }
    return 0;
}

/* ---- data, optimizer, picture ---------------------------------------------------------- */

static rng_t g_rng;
static uint64_t rnd(void) { return rng_next(&g_rng); }
static float unif(float k) { return k * (float)rng_sym(&g_rng); }

/* B random sequences x (B, T) and their reversals y */
static void batch(int B, int T, int *x, int *y) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) x[b * T + t] = (int)(rnd() % VOCAB);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) y[b * T + t] = x[b * T + T - 1 - t];
}

static void init(net *n, const dims *d) {
    const float kh = 1.0f / sqrtf((float)d->H);
    for (int64_t i = 0; i < (int64_t)VOCAB * d->E; i++) n->emb_enc[i] = unif(1);
    for (int64_t i = 0; i < (int64_t)(VOCAB + 1) * d->E; i++) n->emb_dec[i] = unif(1);
    gru *gs[3] = {&n->enc, &n->encb, &n->dec};
    const int ins[3] = {d->E, d->E, d->E + d->K};
    for (int g = 0; g < 3; g++) {
        for (int64_t i = 0; i < (int64_t)ins[g] * 3 * d->H; i++) gs[g]->Wx[i] = unif(kh);
        for (int64_t i = 0; i < (int64_t)d->H * 3 * d->H; i++) gs[g]->Wh[i] = unif(kh);
        for (int64_t i = 0; i < 3 * d->H; i++) gs[g]->bx[i] = unif(kh), gs[g]->bh[i] = unif(kh);
    }
    for (int64_t i = 0; i < (int64_t)d->H * d->A; i++) n->Wq[i] = unif(kh);
    for (int64_t i = 0; i < (int64_t)d->K * d->A; i++) n->Uk[i] = unif(kh / 1.4142f);
    for (int64_t i = 0; i < d->A; i++) n->va[i] = unif(1.0f / sqrtf((float)d->A)), n->ba[i] = 0;
    for (int64_t i = 0; i < (int64_t)(d->H + d->K) * VOCAB; i++) n->Wo[i] = unif(kh / 1.7321f);
    for (int64_t i = 0; i < VOCAB; i++) n->bo[i] = 0;
}

/* Adam (β1 0.9, β2 0.999, ε 1e-8) after clipping the gradient's global norm at 5 */
static void adam(float *p, const float *g, float *m, float *v, int64_t n, float lr, int step) {
    double norm = 0;
    for (int64_t i = 0; i < n; i++) norm += (double)g[i] * g[i];
    const float clip = norm > 25.0 ? (float)(5.0 / sqrt(norm)) : 1.0f;
    const float b1 = 0.9f, b2 = 0.999f;
    const float c1 = 1.0f - powf(b1, (float)step), c2 = 1.0f - powf(b2, (float)step);
    for (int64_t i = 0; i < n; i++) {
        const float gi = g[i] * clip;
        m[i] = b1 * m[i] + (1 - b1) * gi;
        v[i] = b2 * v[i] + (1 - b2) * gi * gi;
        p[i] -= lr * (m[i] / c1) / (sqrtf(v[i] / c2) + 1e-8f);
    }
}

/* The mean alignment (T outputs x T inputs) as heatmap.h's picture: white 0 to dark blue
 * 1 with its colour bar, output steps top to bottom, each cell's weight printed, the
 * axes labelled (rows "out t", keys "in s"). */
static int write_alignment(const char *path, const double *al, int T) {
    float *cells = malloc((size_t)T * (size_t)T * sizeof(float));
    char (*names)[16] = malloc((size_t)2 * (size_t)T * sizeof *names);
    const char **labels = malloc((size_t)2 * (size_t)T * sizeof *labels);
    if (!cells || !names || !labels) {
        free(cells), free(names), free(labels);
        fprintf(stderr, "attn seq2seq: out of memory for the picture\n");
        return -1;
    }
    for (int x = 0; x < T * T; x++) cells[x] = (float)al[x];
    for (int t = 0; t < T; t++) {
        snprintf(names[t], sizeof names[t], "out %d", t);
        snprintf(names[T + t], sizeof names[T + t], "in %d", t);
        labels[t] = names[t], labels[T + t] = names[T + t];
    }
    const heat_panel panel = {cells, NULL};
    const heat_spec spec = {.title = "additive attention (attn seq2seq): mean alignment, output "
                                     "step x encoder position",
                            .panels = &panel, .n_panels = 1, .rows = T, .cols = T, .vmax = 1.0,
                            .scale_label = "weight", .row_labels = labels,
                            .col_labels = labels + T, .numbers = 1};
    char err[256];
    const int rc = heat_png(path, &spec, err, sizeof err);
    if (rc) fprintf(stderr, "attn seq2seq: %s\n", err);
    free(cells), free(names), free(labels);
    return rc;
}

static const char USAGE[] =
    "usage: attn seq2seq [options]\n"
    "\n"
    "  Trains a GRU encoder (bidirectional) and decoder with Bahdanau (additive) attention\n"
    "  to reverse sequences\n"
    "  of digits, printing the loss; then scores greedy decoding on 512 held-out sequences\n"
    "  and writes the learned alignment (mean attention weights, output step x encoder\n"
    "  position) as a PNG heatmap: reversal is the anti-diagonal.\n"
    "\n"
    "  --steps N      training steps (default 1500; --quick 150)\n"
    "  --len T        sequence length (default 10)\n"
    "  --batch B      sequences a step (default 64)\n"
    "  --hidden H     GRU width (default 64); --units A: attention units (default 32)\n"
    "  --lr X         Adam's learning rate (default 0.005)\n"
    "  --seed N       (default 1)\n"
    "  --threads N    threads for the products and attention (default 1: the calls are small)\n"
    "  --out PATH     the heatmap (default seq2seq_alignment.png)\n"
    "  --quick        a short run (for tests)\n";

static int int_opt(const char *s, int def, int lo, int hi, const char *name, int *out) {
    if (!s) return *out = def, 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < lo || v > hi) {
        fprintf(stderr, "attn: seq2seq: %s: expected an integer from %d to %d, got '%s'\n", name,
                lo, hi, s);
        return 2;
    }
    *out = (int)v;
    return 0;
}

int cli_seq2seq(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) return fputs(USAGE, stdout), 0;
    const char *steps_s = NULL, *len_s = NULL, *batch_s = NULL, *hidden_s = NULL, *units_s = NULL,
               *lr_s = NULL, *seed_s = NULL, *out = NULL, *threads_s = NULL;
    bool quick = false;
    const cli_opt opts[] = {{"--steps", &steps_s, NULL}, {"--len", &len_s, NULL},
                            {"--batch", &batch_s, NULL}, {"--hidden", &hidden_s, NULL},
                            {"--units", &units_s, NULL}, {"--lr", &lr_s, NULL},
                            {"--seed", &seed_s, NULL},   {"--out", &out, NULL},
                            {"--threads", &threads_s, NULL}, {"--quick", NULL, &quick}};
    int rc = cli_scan(argc, argv, opts, 10, "seq2seq: ", "seq2seq");
    if (rc) return rc;
    if (!out) out = "seq2seq_alignment.png";
    char ferr[512];  // the picture's path refused now, not after the training
    if ((rc = cli_files_check_one("--out", out, ferr, sizeof ferr)))
        return fprintf(stderr, "attn: seq2seq: %s\n", ferr), rc == -2 ? 2 : 1;
    int steps, seed, threads;
    dims d = {0};
    if ((rc = int_opt(threads_s, 1, 1, 512, "--threads", &threads)) ||
        (rc = int_opt(steps_s, quick ? 150 : 1500, 1, 1000000, "--steps", &steps)) ||
        (rc = int_opt(len_s, 10, 2, 64, "--len", &d.T)) ||
        (rc = int_opt(batch_s, 64, 1, 4096, "--batch", &d.B)) ||
        (rc = int_opt(hidden_s, 64, 1, 1024, "--hidden", &d.H)) ||
        (rc = int_opt(units_s, 32, 1, 1024, "--units", &d.A)) ||
        (rc = int_opt(seed_s, 1, 0, 1 << 30, "--seed", &seed)))
        return rc;
    const float lr = lr_s ? strtof(lr_s, NULL) : 0.005f;
    if (!(lr > 0 && lr < 1)) return fprintf(stderr, "attn: seq2seq: --lr: expected 0 < lr < 1\n"), 2;
    /* the dense layers' products need the BLAS (linear.h); with one, they cannot fail on
     * these small sizes, so their statuses are not checked step by step */
    if (strcmp(attn_blas_name(), "none") == 0)
        return fprintf(stderr, "attn: seq2seq: this build has no BLAS (make BLAS=...)\n"), 1;
    d.E = 16;
    d.K = 2 * d.H;
    /* one thread by default: each product and attention call here is small, and threads
     * would mostly wait for one another */
    omp_set_num_threads(threads);
    g_rng.s = (uint64_t)seed * 7919u + 1;

    net n, g;
    const int64_t np = layout(&n, NULL, &d);
    float *pbuf = falloc(np), *gbuf = falloc(np), *mbuf = falloc(np), *vbuf = falloc(np);
    layout(&n, pbuf, &d);
    layout(&g, gbuf, &d);
    init(&n, &d);
    printf("seq2seq: reverse %d digits; GRU %d, attention units %d, %lld parameters, batch %d, "
           "%d steps (kernel %s)\n", d.T, d.H, d.A, (long long)np, d.B, steps, attn_kernel_name());
    work w;
    work_alloc(&w, &d);
    int *y = calloc((size_t)d.B * d.T, sizeof(int));
    double avg = 0;
    for (int step = 1; step <= steps; step++) {
        batch(d.B, d.T, w.x, y);
        const double loss = forward(&n, &d, &w, y, NULL);
        memset(gbuf, 0, (size_t)np * sizeof(float));
        if (!(loss == loss) || backward(&n, &g, &d, &w)) return 1;
        adam(pbuf, gbuf, mbuf, vbuf, np, lr, step);
        avg = step == 1 ? loss : 0.95 * avg + 0.05 * loss;
        if (step % (steps >= 1000 ? 100 : 25) == 0 || step == 1 || step == steps)
            printf("  step %5d  loss %.4f  (running mean %.4f)\n", step, loss, avg);
    }
    /* held-out: greedy decoding and the mean alignment */
    dims de = d;
    de.B = 512;
    work we;
    work_alloc(&we, &de);
    int *ye = calloc((size_t)de.B * d.T, sizeof(int)), *pred = calloc((size_t)de.B * d.T, sizeof(int));
    batch(de.B, d.T, we.x, ye);
    if (forward(&n, &de, &we, NULL, pred) != 0.0) return 1;
    int64_t tok = 0, seq = 0;
    double *al = calloc((size_t)d.T * d.T, sizeof(double)), anti = 0;
    for (int b = 0; b < de.B; b++) {
        int all = 1;
        for (int t = 0; t < d.T; t++) {
            const int ok = pred[b * d.T + t] == ye[b * d.T + t];
            tok += ok;
            all &= ok;
            for (int j = 0; j < d.T; j++)
                al[t * d.T + j] += we.c.alpha[((int64_t)t * de.B + b) * d.T + j] / de.B;
        }
        seq += all;
    }
    for (int t = 0; t < d.T; t++) anti += al[t * d.T + d.T - 1 - t] / d.T;
    printf("held-out (512 sequences, greedy): %.1f%% of symbols, %.1f%% of sequences right; "
           "attention on the anti-diagonal: %.3f\n", 100.0 * tok / (de.B * d.T),
           100.0 * seq / de.B, anti);
    printf("alignment (rows: output step, columns: encoder position; # >= 0.5, + >= 0.1):\n");
    for (int t = 0; t < d.T; t++) {
        printf("  ");
        for (int j = 0; j < d.T; j++) {
            const double a = al[t * d.T + j];
            putchar(a >= 0.5 ? '#' : a >= 0.1 ? '+' : '.');
        }
        putchar('\n');
    }
    rc = write_alignment(out, al, d.T);
    if (!rc) printf("wrote %s\n", out);
    free(al); free(ye); free(pred); free(y);
    work_free(&we); work_free(&w);
    free(pbuf); free(gbuf); free(mbuf); free(vbuf);
    return rc ? 1 : 0;
}
