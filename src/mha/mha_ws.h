/*
 * mha_ws.h — what the multi-head module's files share below mha.h: the workspace's bump
 *            allocator (mha_ws, mha_take), and the averaged-weights attention of
 *            mha_weights.c that mha.c calls (mha_attend_average).
 *
 * What it is not: the module's plan or its operands (mha.h).
 */
#ifndef ATTN_MHA_WS_H
#define ATTN_MHA_WS_H

#include "core/attn_internal.h"

/* A bump allocator over the workspace, 64-byte aligned pieces; count_only: it counts. */
typedef struct mha_ws {
    char *base;
    size_t used;
    bool overflow;
    bool count_only;  /* the size query: nothing is read or written */
} mha_ws;
/* The next nfloats floats of the workspace (NULL when counting, or on overflow) */
static inline void *mha_take(mha_ws *w, int64_t nfloats) {
    const size_t bytes = ((size_t)nfloats * sizeof(float) + 63) & ~(size_t)63;
    if (nfloats < 0 || (size_t)nfloats > SIZE_MAX / 8 || w->used > SIZE_MAX - bytes) {
        w->overflow = true;
        return NULL;
    }
    void *p = w->count_only ? NULL : w->base + w->used;
    w->used += bytes;
    return p;
}

/* mha_attend's averaged weights (mha_weights.c): opt as mha_attend passes it on (its
 * lse set, no weights, no workspace), weights [B, 1, Lq, Lk] checked. */
ATTN_PRIVATE attn_status mha_attend_average(const attn_tensor *q, const attn_tensor *k,
                                            const attn_tensor *v, const attn_tensor *o,
                                            const attn_tensor *lse, const attn_tensor *weights,
                                            const attn_options *opt, mha_ws *w);

#endif /* ATTN_MHA_WS_H */
