/*
 * core.c — the floor every call stands on: status strings and the per-thread error
 *          detail (ai_fail, ai_ok, attn_last_error), the version, the dtype table,
 *          the checks of one tensor (ai_check_tensor, ai_check_output_strides), the
 *          params' view of a tensor's data (ai_view_data) and the workspace a call
 *          uses or allocates (ai_workspace_acquire).
 *
 * What it is not: an entry point or a path. It calls nothing else of the library, so
 * every other file may call it without an include circle.
 */
#define _DEFAULT_SOURCE  // madvise's MADV_HUGEPAGE (Linux, huge_pages.h)
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "alloc.h"
#include "huge_pages.h"
#include "attn_internal.h"

/* ---- status strings and the per-thread error detail ------------------------------ */

static const char *const g_status_text[] = {
#define ATTN_X_TEXT(name, msg) msg,
    ATTN_STATUS_LIST(ATTN_X_TEXT)
#undef ATTN_X_TEXT
};

static _Thread_local char g_last_error[512];

const char *attn_status_string(attn_status status) {
    if ((unsigned)status >= (unsigned)ATTN_STATUS_COUNT) return "unknown status";
    return g_status_text[status];
}

const char *attn_last_error(void) { return g_last_error; }

const char *attn_version(void) {
#define ATTN_STR2(x) #x
#define ATTN_STR(x) ATTN_STR2(x)
    return ATTN_STR(ATTN_VERSION_MAJOR) "." ATTN_STR(ATTN_VERSION_MINOR) "." ATTN_STR(
        ATTN_VERSION_PATCH);
}

attn_status ai_fail(attn_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_last_error, sizeof g_last_error, fmt, ap);
    va_end(ap);
    return status;
}

attn_status ai_ok(void) {
    g_last_error[0] = '\0';
    return ATTN_OK;
}

/* ---- checked 64-bit arithmetic ----------------------------------------------------- */

static bool mul_ok(int64_t a, int64_t b, int64_t *r) { return !__builtin_mul_overflow(a, b, r); }
static bool add_ok(int64_t a, int64_t b, int64_t *r) { return !__builtin_add_overflow(a, b, r); }

const char *attn_dtype_name(attn_dtype t) {
    switch (t) {
#define ATTN_X_NAME(e, name, bytes) case e: return name;
        ATTN_DTYPE_LIST(ATTN_X_NAME)
#undef ATTN_X_NAME
    default: return "unknown";
    }
}

size_t attn_dtype_size(attn_dtype t) { return (size_t)attn_elem_bytes(t); }

int64_t attn_dtype_block(attn_dtype t) {
    if ((unsigned)t >= (unsigned)ATTN_DTYPE_COUNT) return 0;
    return attn_is_block_dtype(t) ? 32 : 1;
}

/* An fp8 cache's scale (attn.h, attn_options.k_scale): float32 {1, 1, 1, 1} or {Hkv, 1,
 * 1, 1}, only with an fp8 kv_dt, each value finite and > 0 (read when need_data). *data
 * gets its first element (NULL when t is), *stride the step between heads (0: one scale
 * for every head). */
attn_status ai_check_kv_scale(const attn_tensor *t, const char *name, attn_dtype kv_dt,
                              int64_t Hkv, bool need_data, const float **data,
                              int64_t *stride) {
    *data = NULL;
    *stride = 0;
    if (!t) return ATTN_OK;
    if (kv_dt != ATTN_FP8_E4M3 && kv_dt != ATTN_FP8_E5M2)
        return ai_fail(ATTN_ERR_VALUE, "%s: given with a %s cache (scales are for the fp8 "
                       "dtypes only)", name, attn_dtype_name(kv_dt));
    TRY(ai_check_tensor(t, name, ATTN_F32, need_data));
    if ((t->shape[0] != 1 && t->shape[0] != Hkv) || t->shape[1] != 1 || t->shape[2] != 1 ||
        t->shape[3] != 1)
        return ai_fail(ATTN_ERR_SHAPE, "%s: shape [%lld, %lld, %lld, %lld], expected [1 or "
                       "Hkv = %lld, 1, 1, 1]", name, (long long)t->shape[0],
                       (long long)t->shape[1], (long long)t->shape[2],
                       (long long)t->shape[3], (long long)Hkv);
    const int64_t n = t->shape[0], st = n == 1 ? 0 : t->stride[0];
    const float *x = t->data;
    for (int64_t g = 0; need_data && g < n; g++)
        if (!(x[g * st] > 0.0f) || isinf(x[g * st]))
            return ai_fail(ATTN_ERR_VALUE, "%s[%lld] is %g, expected a finite scale > 0", name,
                           (long long)g, (double)x[g * st]);
    *data = x;
    *stride = st;
    return ATTN_OK;
}

/* A tensor's basic soundness: present, the expected dtype, sizes >= 0, element count
 * and extreme offsets representable in int64, data present when non-empty. */
/* a block dtype's layout rules (attn.h, q8_0's; q4_0 the same), for ai_check_tensor */
attn_status ai_check_q8_0_layout(const attn_tensor *t, const char *name) {
    const char *dn = attn_dtype_name(t->dtype);
    if (t->shape[3] % 32 != 0)
        return ai_fail(ATTN_ERR_SHAPE, "%s: %s needs shape[3] (the head dimension) a "
                       "multiple of 32, got %lld", name, dn, (long long)t->shape[3]);
    int64_t span = 0;
    for (int d = 0; d < 4; d++) {
        if (t->shape[d] == 0) return ATTN_OK;  // no element: no block to place
        span += (t->shape[d] - 1) * (t->stride[d] < 0 ? -t->stride[d] : t->stride[d]);
    }
    if (t->stride[3] != 1)
        return ai_fail(ATTN_ERR_STRIDE, "%s: %s needs stride[3] = 1 (32 consecutive "
                       "elements share a block), got %lld", name, dn, (long long)t->stride[3]);
    for (int d = 0; d < 3; d++)
        if (t->shape[d] > 1 && t->stride[d] % 32 != 0)
            return ai_fail(ATTN_ERR_STRIDE, "%s: %s needs stride[%d] a multiple of 32 "
                           "elements (every row starts a block), got %lld", name, dn, d,
                           (long long)t->stride[d]);
    /* the span (in elements, within int64: ai_check_tensor) in bytes, one block more */
    if (span / 32 > INT64_MAX / attn_elem_bytes(t->dtype) - 1)
        return ai_fail(ATTN_ERR_OVERFLOW, "%s: %s byte offsets overflow int64", name, dn);
    return ATTN_OK;
}

attn_status ai_check_tensor(const attn_tensor *t, const char *name, attn_dtype want,
                            bool need_data) {
    if (!t) return ai_fail(ATTN_ERR_NULL, "%s: tensor pointer is NULL", name);
    /* want = ATTN_F32 for q, k, v, o means any floating type: float32, float16, bfloat16 */
    const bool floating = t->dtype == ATTN_F32 || t->dtype == ATTN_F16 || t->dtype == ATTN_BF16;
    if (want == ATTN_DTYPE_COUNT ? !floating : t->dtype != want)
        return ai_fail(ATTN_ERR_DTYPE, "%s: dtype is %s, expected %s", name,
                    attn_dtype_name(t->dtype),
                    want == ATTN_DTYPE_COUNT ? "float32, float16 or bfloat16" : attn_dtype_name(want));
    int64_t count = 1, span = 0, extent = 1;
    for (int d = 0; d < 4; d++) {
        if (t->shape[d] < 0)
            return ai_fail(ATTN_ERR_SHAPE, "%s: shape[%d] = %lld is negative", name, d,
                        (long long)t->shape[d]);
        if (!mul_ok(count, t->shape[d], &count))
            return ai_fail(ATTN_ERR_OVERFLOW, "%s: element count overflows int64", name);
        /* the sizes other than 0 too: an empty tensor whose other sizes' product does not
         * fit has no dense layout (NumPy refuses to make one) */
        if (t->shape[d] > 0 && !mul_ok(extent, t->shape[d], &extent))
            return ai_fail(ATTN_ERR_OVERFLOW, "%s: the product of the sizes other than 0 "
                           "overflows int64", name);
    }
    for (int d = 0; d < 4 && count > 0; d++) {
        int64_t s = t->stride[d], ext;
        if (s == INT64_MIN || !mul_ok(t->shape[d] - 1, s < 0 ? -s : s, &ext) ||
            !add_ok(span, ext, &span))
            return ai_fail(ATTN_ERR_OVERFLOW, "%s: offsets overflow int64 (stride[%d] = %lld)",
                        name, d, (long long)s);
    }
    if (need_data && count > 0 && !t->data)
        return ai_fail(ATTN_ERR_NULL, "%s: data is NULL for %lld elements", name,
                    (long long)count);
    if (attn_is_block_dtype(t->dtype)) return ai_check_q8_0_layout(t, name);  // want was it
    /* every element at a multiple of its size (strides count elements, so the first
     * decides): the kernels load a float through a float pointer, which a misaligned
     * address makes undefined (and a trap on some CPUs). q8_0 blocks are read by byte. */
    const size_t es = attn_dtype_size(t->dtype);
    if (count > 0 && t->data && es > 1 && (uintptr_t)t->data % es != 0)
        return ai_fail(ATTN_ERR_STRIDE, "%s: data %p is not aligned to its element size "
                       "(%zu bytes for %s)", name, t->data, es, attn_dtype_name(t->dtype));
    return ATTN_OK;
}

/* An output must not write one element twice. Sufficient test: with the dimensions of
 * size > 1 sorted by |stride|, each stride exceeds the farthest offset the smaller ones
 * reach. (Exotic interleaved layouts that never overlap are refused too.) */
attn_status ai_check_output_strides(const attn_tensor *t, const char *name, int dims) {
    int64_t st[4], sh[4];
    int idx[4], m = 0;
    for (int d = 0; d < 4; d++)
        if (t->shape[d] == 0) return ATTN_OK;  // no elements, nothing to overlap
    for (int d = 0; d < dims; d++) {
        if (t->shape[d] <= 1) continue;
        st[m] = t->stride[d] < 0 ? -t->stride[d] : t->stride[d];
        sh[m] = t->shape[d];
        idx[m++] = d;
    }
    for (int a = 1; a < m; a++)  // insertion sort by |stride|
        for (int b = a; b > 0 && st[b] < st[b - 1]; b--) {
            int64_t x = st[b]; st[b] = st[b - 1]; st[b - 1] = x;
            x = sh[b]; sh[b] = sh[b - 1]; sh[b - 1] = x;
            int y = idx[b]; idx[b] = idx[b - 1]; idx[b - 1] = y;
        }
    int64_t reach = 0;  // the largest offset the dimensions so far can form
    for (int a = 0; a < m; a++) {
        if (st[a] <= reach)
            return ai_fail(ATTN_ERR_STRIDE, "%s: stride[%d] = %lld makes elements overlap (the "
                        "smaller dimensions already reach offset %lld)", name, idx[a],
                        (long long)t->stride[idx[a]], (long long)reach);
        reach += (sh[a] - 1) * st[a];
    }
    return ATTN_OK;
}

/* The address the params hold for an empty tensor (and the workspace of a call that
 * needs none): real memory no path ever reads or writes, since there is nothing there,
 * so that no path does arithmetic on NULL or on an empty tensor's arbitrary strides. */
static _Alignas(64) char g_nothing[64];

const void *ai_view_data(const attn_tensor *t, int64_t *s, int n) {
    for (int d = 0; d < 4; d++)
        if (t->shape[d] == 0) {
            memset(s, 0, sizeof *s * (size_t)n);
            return g_nothing;
        }
    memcpy(s, t->stride, sizeof *s * (size_t)n);
    return t->data;
}

attn_status ai_workspace_acquire(const attn_options *opt, size_t need, void **ws,
                                 void **owned) {
    *ws = opt ? opt->workspace : NULL;
    *owned = NULL;
    if (need == (size_t)-1) return ai_fail(ATTN_ERR_OVERFLOW, "workspace size overflows size_t");
    if (*ws) {
        if (opt->workspace_bytes < need)
            return ai_fail(ATTN_ERR_WORKSPACE, "options.workspace_bytes is %zu, this call "
                           "needs %zu", opt->workspace_bytes, need);
    } else if (need > 0) {
        *owned = *ws = ai_malloc(need);
        if (!*ws) return ai_fail(ATTN_ERR_NOMEM, "workspace: could not allocate %zu bytes", need);
        ai_huge_pages(*ws, need);
    } else {
        *ws = g_nothing;  // none needed: still no path computes on NULL
    }
    return ATTN_OK;
}

/* attn.h. MADV_COLLAPSE is 25 in Linux's uapi headers from 6.1; glibc's may not name it
 * yet. An older kernel refuses it (EINVAL): the advice alone then covers later faults. */
attn_status attn_huge_pages(void *p, size_t bytes) {
    if (bytes == 0) return ai_ok();
    if (!p) return ai_fail(ATTN_ERR_NULL, "attn_huge_pages: p is NULL with bytes %zu", bytes);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    uintptr_t a, b;
    if (!ai_huge_range(p, bytes, &a, &b)) return ai_ok();
    if (madvise((void *)a, b - a, MADV_HUGEPAGE) != 0)
        return ai_fail(ATTN_ERR_UNSUPPORTED, "attn_huge_pages: the system gives no huge pages "
                       "on request (madvise MADV_HUGEPAGE refused)");
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25
#endif
    (void)madvise((void *)a, b - a, MADV_COLLAPSE);
    return ai_ok();
#else
    return ai_fail(ATTN_ERR_UNSUPPORTED, "attn_huge_pages: huge pages on request are Linux's "
                   "(madvise), not this system's");
#endif
}
