/*
 * attn.h — the public interface of libattn: exact scaled dot-product attention,
 *          O = softmax(scale * Q Kᵀ + bias, masked) V, computed the same way on every path.
 *
 * What is here: tensor descriptors, the options struct, status codes, the forward pass
 * and its workspace query. What is not: anything a caller has to free, global state
 * beyond a cached CPU probe, or printing. Every call returns a status; user error never
 * aborts. The full semantics (edge cases included) are in docs/CONTRACT.md.
 *
 * Dimension letters, used in every shape comment of the project:
 *   B   batch                 Hq  query heads           Hkv key/value heads
 *   Lq  query rows            Lk  key/value rows        Dk  query/key width
 *   Dv  value width
 */
#ifndef ATTN_H
#define ATTN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define ATTN_API __declspec(dllexport)
#elif defined(__GNUC__)
#define ATTN_API __attribute__((visibility("default")))
#else
#define ATTN_API
#endif

#define ATTN_VERSION_MAJOR 0
#define ATTN_VERSION_MINOR 1
#define ATTN_VERSION_PATCH 0

/* ---- status codes ------------------------------------------------------------------
 * One list gives the enum and the messages (attn_status_string). Tests compare codes,
 * not wording. attn_last_error() adds the detail of the latest failure on this thread:
 * which argument, what was expected, what was found. */
#define ATTN_STATUS_LIST(X)                                                            \
    X(ATTN_OK, "success")                                                              \
    X(ATTN_ERR_NULL, "a required pointer is NULL")                                     \
    X(ATTN_ERR_DTYPE, "unsupported or mismatched element type")                        \
    X(ATTN_ERR_SHAPE, "tensor shapes do not agree")                                    \
    X(ATTN_ERR_STRIDE, "an output overlaps itself, an input or another output")        \
    X(ATTN_ERR_HEADS, "query heads are not a multiple of key/value heads")             \
    X(ATTN_ERR_MASK, "mask or bias has a shape that does not broadcast to the scores") \
    X(ATTN_ERR_VALUE, "an option has an invalid value")                                \
    X(ATTN_ERR_OVERFLOW, "a size or offset does not fit in 64 bits")                   \
    X(ATTN_ERR_WORKSPACE, "the workspace given is too small")                          \
    X(ATTN_ERR_NOMEM, "out of memory")                                                 \
    X(ATTN_ERR_UNSUPPORTED, "this combination is not supported by the chosen path")

typedef enum attn_status {
#define ATTN_X_ENUM(name, msg) name,
    ATTN_STATUS_LIST(ATTN_X_ENUM)
#undef ATTN_X_ENUM
    ATTN_STATUS_COUNT
} attn_status;

/* ---- tensors -------------------------------------------------------------------------
 * A strided view of at most four dimensions. stride[] is in elements (not bytes), any
 * int64 value: [B, L, H, D] storage is [B, H, L, D] with permuted strides, a key/value
 * cache view is a larger tensor's strides with a smaller shape, and stride 0 broadcasts.
 * Use attn_tensor_4d() for a dense C-order tensor. */
typedef enum attn_dtype {
    ATTN_F32 = 0, /* float                                                   */
    ATTN_F16,     /* IEEE binary16, stored as uint16_t                       */
    ATTN_BF16,    /* bfloat16 (the top half of a float32), as uint16_t        */
    ATTN_BOOL,    /* one byte, 0 = false, anything else = true               */
    ATTN_I32,     /* int32_t                                                 */
    ATTN_I64,     /* int64_t                                                 */
    ATTN_DTYPE_COUNT
} attn_dtype;

typedef struct attn_tensor {
    void *data;
    attn_dtype dtype;
    int64_t shape[4];
    int64_t stride[4];
} attn_tensor;

/* A dense C-order [d0, d1, d2, d3] tensor over `data`. The strides are products of the
 * sizes, computed without overflow: one that does not fit in int64 is INT64_MAX, and the
 * calls refuse such a tensor with ATTN_ERR_OVERFLOW (even when another size is 0). */
static inline int64_t attn_stride_product_(int64_t a, int64_t b) {
    if (a < 0 || b < 0) return 0; /* a negative size: refused by the calls as ATTN_ERR_SHAPE */
    if (a != 0 && b > INT64_MAX / a) return INT64_MAX;
    return a * b;
}
static inline attn_tensor attn_tensor_4d(void *data, attn_dtype dtype, int64_t d0,
                                         int64_t d1, int64_t d2, int64_t d3) {
    const int64_t s2 = d3, s1 = attn_stride_product_(d2, s2), s0 = attn_stride_product_(d1, s1);
    attn_tensor t = {data, dtype, {d0, d1, d2, d3}, {s0, s1, s2, 1}};
    return t;
}

/* ---- options ---------------------------------------------------------------------------
 * Zero means default everywhere: `attn_options opt = {0};` (or a NULL pointer) is plain
 * softmax(Q Kᵀ / sqrt(Dk)) V with no mask, on the default path, with all threads. */
typedef enum attn_align {
    ATTN_ALIGN_TOP_LEFT = 0,  /* diagonal d_i = i (PyTorch is_causal)                */
    ATTN_ALIGN_BOTTOM_RIGHT,  /* diagonal d_i = i + Lk_b - Lq (KV caches, FlashAttn) */
} attn_align;

typedef enum attn_path {
    ATTN_PATH_AUTO = 0,   /* the fastest exact path for the call (today: fused)           */
    ATTN_PATH_FUSED,      /* streaming FlashAttention-2 forward, O(1) memory in Lk        */
    ATTN_PATH_REFERENCE,  /* float64, materializes the scores: the oracle of every test   */
} attn_path;

typedef enum attn_precision {
    ATTN_PRECISION_DEFAULT = 0,  /* probabilities stay float32 for P·V                 */
    ATTN_PRECISION_FAST,         /* bfloat16 V: P rounded to bfloat16 for P·V, on the
                                    CPU's bf16 dot products where it has them. Other
                                    dtypes: the same as DEFAULT                         */
} attn_precision;

typedef struct attn_options {
    /* scale applied to Q·Kᵀ. Used only when has_scale is true (0 and negative scales are
     * legal), otherwise 1/sqrt(Dk). */
    bool has_scale;
    float scale;
    /* softcap > 0: s = softcap * tanh(s / softcap) before bias and masks. 0 = off. */
    float softcap;

    bool causal;       /* keep j <= d_i                                                */
    attn_align align;  /* the diagonal d_i shared by causal, window and ALiBi           */
    /* sliding window, used when has_window: keep d_i - left <= j <= d_i + right,
     * -1 = unbounded on that side. */
    bool has_window;
    int64_t window_left, window_right;

    /* bool mask, ATTN_BOOL, true = attend; broadcast [B|1, Hq|1, Lq|1, Lk]. NULL = none. */
    const attn_tensor *mask;
    /* float bias added to the logits (-inf allowed), ATTN_F32, same broadcast. */
    const attn_tensor *bias;
    /* per-batch key lengths [B], 0 <= kv_len[b] <= Lk: keys j >= kv_len[b] are masked.
     * ATTN_I32 or ATTN_I64, shape {B, 1, 1, 1} (or any shape with B elements on dim 0). */
    const attn_tensor *kv_len;
    /* ALiBi: bias_ij = -slope[h] * |d_i - j|, ATTN_F32, shape {Hq, 1, 1, 1}. */
    const attn_tensor *alibi_slopes;

    /* optional outputs, written only on success:
     * lse     [B, Hq, Lq]      float32, natural log-sum-exp of the final logits of each
     *                          row (shape {B, Hq, Lq, 1}); -inf for a fully masked row.
     * weights [B, Hq, Lq, Lk]  float32 attention weights; a fully masked row is all 0. */
    const attn_tensor *lse;
    const attn_tensor *weights;

    attn_path path;
    attn_precision precision;
    int32_t threads;  /* 0 = OpenMP's default, at most 512 (more are taken as 512);
                         results are bit-identical for any count */

    /* scratch memory; NULL = the call allocates (and frees) it itself, once. Its size
     * comes from attn_forward_workspace_size() for the same arguments. */
    void *workspace;
    size_t workspace_bytes;
} attn_options;

/* ---- calls -------------------------------------------------------------------------- */

/* O = attention(Q, K, V).
 *   q [B, Hq, Lq, Dk]   k [B, Hkv, Lk, Dk]   v [B, Hkv, Lk, Dv]   o [B, Hq, Lq, Dv]
 * Hq must be a multiple of Hkv (query head h reads key/value head h / (Hq / Hkv)).
 * dtypes: q, k, v and o each ATTN_F32, ATTN_F16 or ATTN_BF16, with k and v alike (a
 * 16-bit KV cache under float32 queries works); accumulation is float32 throughout and
 * o is rounded to its dtype once, at the end.
 * Any size may be 0. On error nothing is written to o, lse or weights. */
ATTN_API attn_status attn_forward(const attn_tensor *q, const attn_tensor *k,
                                  const attn_tensor *v, const attn_tensor *o,
                                  const attn_options *opt);

/* Bytes of workspace attn_forward needs for these arguments (the data pointers of the
 * tensors are not read and may be NULL). */
ATTN_API attn_status attn_forward_workspace_size(const attn_tensor *q, const attn_tensor *k,
                                                 const attn_tensor *v, const attn_tensor *o,
                                                 const attn_options *opt, size_t *bytes);

/* The gradients of attn_forward: given dO = dLoss/dO, writes dQ, dK, dV.
 *   q, k, v, opt   exactly as in the forward call (same masks, scale, softcap, ...);
 *                  opt->lse and opt->weights must be NULL (they are forward outputs)
 *   o    [B, Hq, Lq, Dv]   the forward's output
 *   d_o  [B, Hq, Lq, Dv]   the gradient of the loss with respect to o
 *   lse  [B, Hq, Lq]       the forward's log-sum-exp (shape {B, Hq, Lq, 1}), float32
 *   dq   [B, Hq, Lq, Dk]   written
 *   dk   [B, Hkv, Lk, Dk]  written: summed over the query heads of each group
 *   dv   [B, Hkv, Lk, Dv]  written: summed likewise
 * Fully masked rows contribute 0 to every gradient. Deterministic: bit-identical for any
 * thread count. On error nothing is written. */
ATTN_API attn_status attn_backward(const attn_tensor *q, const attn_tensor *k,
                                   const attn_tensor *v, const attn_tensor *o,
                                   const attn_tensor *d_o, const attn_tensor *lse,
                                   const attn_tensor *dq, const attn_tensor *dk,
                                   const attn_tensor *dv, const attn_options *opt);

/* Bytes of workspace attn_backward needs for these arguments (data pointers not read). */
ATTN_API attn_status attn_backward_workspace_size(const attn_tensor *q, const attn_tensor *k,
                                                  const attn_tensor *v, const attn_tensor *o,
                                                  const attn_tensor *d_o,
                                                  const attn_tensor *lse,
                                                  const attn_tensor *dq, const attn_tensor *dk,
                                                  const attn_tensor *dv,
                                                  const attn_options *opt, size_t *bytes);

/* The fixed message of a status code. */
ATTN_API const char *attn_status_string(attn_status status);

/* The detail of the latest failed call on this thread ("" after a success). */
ATTN_API const char *attn_last_error(void);

/* "0.1.0" */
ATTN_API const char *attn_version(void);

/* The micro-kernels the fused path of this process runs: "avx512", "avx2" or "generic",
 * the best this CPU supports unless the environment variable ATTN_ISA names another;
 * "none" when ATTN_ISA names one this CPU cannot run (fused calls then return
 * ATTN_ERR_UNSUPPORTED). ATTN_VERBOSE=1 prints the choice on stderr once. */
ATTN_API const char *attn_kernel_name(void);

/* Whether this build has the kernel `name` and this CPU can run it. */
ATTN_API bool attn_kernel_supported(const char *name);

/* The BLAS this build calls for its matrix products (projections): OpenBLAS's own
 * description ("OpenBLAS 0.3.21 ..."), the name given at build time for another CBLAS,
 * or "none" for a build without one (calls that need it return ATTN_ERR_UNSUPPORTED). */
ATTN_API const char *attn_blas_name(void);

#ifdef __cplusplus
}
#endif

#endif /* ATTN_H */
