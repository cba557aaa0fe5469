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
    X(ATTN_ERR_UNSUPPORTED, "this combination is not supported by the chosen path") \
    X(ATTN_ERR_IO, "a file could not be read or written (attn_tune's wisdom)")

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
 * Use attn_tensor_4d() for a dense C-order tensor.
 *
 * The block dtype ATTN_Q8_0 (llama.cpp's q8_0, byte for byte): runs of 32 consecutive
 * elements along the last dimension form a block of 34 bytes, a float16 scale d
 * (little-endian) then 32 int8 qs, element value d * qs[i]. Its strides still count
 * elements, logical ones: element offset e lies in block floor(e / 32) (at byte
 * 34 floor(e / 32) from data) at position e mod 32. So a q8_0 tensor needs shape[3] a
 * multiple of 32, stride[3] = 1 and stride[0..2] multiples of 32 (each row of D starts a
 * block); attn_tensor_4d() gives a dense one. A llama.cpp (ggml) view with byte strides
 * nb maps on as stride = nb / 34 * 32. attn_dtype_size(ATTN_Q8_0) is the bytes of one
 * block (34), attn_dtype_block(ATTN_Q8_0) its elements (32); a q8_0 tensor of n elements
 * is n / 32 * 34 bytes. Only attn_forward's and attn_varlen_forward's k and v (and the
 * conversions below) take it.
 *
 * The fp8 cache dtypes (vLLM's kv_cache_dtype "fp8_e4m3" / "fp8_e5m2"): one byte an
 * element, ordinary element strides (no blocks), and a float32 scale per tensor or per
 * key/value head (attn_options.k_scale, v_scale; 1 when not given): the value of a byte x
 * is fl32(fp8_to_f32(x) * scale), the exact value of the byte times the scale rounded once
 * to float32. ATTN_FP8_E4M3 is OCP E4M3FN: sign, 4 exponent bits (bias 7), 3 mantissa
 * bits, subnormals, no infinities, 0x7F and 0xFF NaN, largest 448. ATTN_FP8_E5M2 is OCP
 * E5M2 (the top byte of an IEEE float16): bias 15, 2 mantissa bits, +-inf (0x7C, 0xFC),
 * NaN (0x7D-0x7F and their negatives), largest finite 57344. attn_kv_append_scaled
 * writes them (docs/CONTRACT.md, "The fp8 cache dtypes"). Only attn_forward's and
 * attn_varlen_forward's k and v (and the appends) take them.
 *
 * The block dtype ATTN_Q4_0 (llama.cpp's block_q4_0, byte for byte): 32 consecutive
 * elements along the last dimension form a block of 18 bytes, a float16 scale d
 * (little-endian) then 16 bytes qs; element i < 16 is d * ((qs[i] & 0x0F) - 8), element
 * i + 16 is d * ((qs[i] >> 4) - 8). Every rule of q8_0 above holds with 18 for 34: strides
 * count logical elements, shape[3] a multiple of 32, stride[3] = 1, stride[0..2]
 * multiples of 32; attn_dtype_size(ATTN_Q4_0) is 18, attn_dtype_block 32.
 *
 * The block dtype ATTN_U4 (KIVI's and OpenVINO's u4 cache): 32 consecutive elements
 * along the last dimension form a block of 16 bytes and no scale inside; element i of a
 * block is the low nibble of byte i / 2 when i is even, the high nibble when i is odd
 * (OpenVINO's u4 order). A code c (0..15) stands for fmaf(c, scale, zero), one rounding,
 * with the scale and zero given outside the data (attn_options.k_scale, k_zero, v_scale,
 * v_zero): keys per channel (one pair per group of kv_group keys and per channel), values
 * per token (one pair per token and per 32 channels). Every layout rule of q4_0 holds
 * with 16 for 18; attn_dtype_size(ATTN_U4) is 16, attn_dtype_block 32. Only attn_forward's
 * contiguous k and v (both u4) and the conversions below take it (docs/CONTRACT.md, "The
 * u4 cache (KIVI)"). */
/* One list gives the enum, the names (attn_dtype_name) and the element sizes
 * (attn_dtype_size): X(enumerator, name, bytes); for a block dtype, the bytes of one
 * block. New dtypes go at the end. */
#define ATTN_DTYPE_LIST(X)                                                               \
    X(ATTN_F32, "float32", 4)   /* float                                              */ \
    X(ATTN_F16, "float16", 2)   /* IEEE binary16, stored as uint16_t                  */ \
    X(ATTN_BF16, "bfloat16", 2) /* bfloat16 (the top half of a float32), as uint16_t  */ \
    X(ATTN_BOOL, "bool", 1)     /* one byte, 0 = false, anything else = true          */ \
    X(ATTN_I32, "int32", 4)     /* int32_t                                            */ \
    X(ATTN_I64, "int64", 8)     /* int64_t                                            */ \
    X(ATTN_Q8_0, "q8_0", 34)    /* blocks of 32: float16 scale + 32 int8 (see above)  */ \
    X(ATTN_F64, "float64", 8)   /* double: q, k, v, o all float64 (docs/CONTRACT.md)   */ \
    X(ATTN_FP8_E4M3, "fp8_e4m3", 1) /* OCP E4M3FN byte, times a scale (see below)     */ \
    X(ATTN_FP8_E5M2, "fp8_e5m2", 1) /* OCP E5M2 byte, times a scale (see below)       */ \
    X(ATTN_Q4_0, "q4_0", 18)    /* blocks of 32: float16 scale + 16 bytes of nibbles  */ \
    X(ATTN_U4, "u4", 16)        /* blocks of 32: 16 bytes of nibbles, scales outside  */

typedef enum attn_dtype {
#define ATTN_X_ENUM(e, name, bytes) e,
    ATTN_DTYPE_LIST(ATTN_X_ENUM)
#undef ATTN_X_ENUM
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
                                    CPU's bf16 dot products. A kernel without them, and
                                    other dtypes: the same as DEFAULT (never slower)    */
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

    /* attention sinks (fields added after the rest): a learned logit per query head, an
     * extra term in each row's softmax denominator that contributes no value,
     *     o_i = sum_j exp(s_ij) v_j / (sum_j exp(s_ij) + exp(sink_h)),
     *     lse_i = ln(sum_j exp(s_ij) + exp(sink_h)).
     * ATTN_F32, shape {Hq, 1, 1, 1}, any strides; NULL = none. sink 0 is the off-by-one
     * softmax (PyTorch's add_zero_attn); -inf is no sink for that head; NaN or +inf make
     * every row of the head NaN (the sink is an unmasked logit). A fully masked row gives
     * o_i = 0 and lse_i = sink_h. The weights output then sums to less than 1. */
    const attn_tensor *sinks;
    /* attn_backward's output, float32 {Hq, 1, 1, 1}: d sink_h = -sum over b and i of
     * exp(sink_h - lse_bhi) * rowsum(dO ∘ O)_bhi, summed in a fixed order (bit-identical
     * for any thread count); written, not added to. NULL = not wanted. Requires sinks;
     * must be NULL in every other call (ATTN_ERR_VALUE). */
    const attn_tensor *d_sinks;

    /* float64 calls only (q, k, v, o ATTN_F64; ignored otherwise): the scale in float64,
     * used when has_scale is true and it is not 0 (then `scale` is not read). Without
     * has_scale a float64 call's default is 1/sqrt(Dk) computed in float64, not rounded
     * to float32. Added for float64 (CONTRACT.md "float64"). */
    double scale_f64;
    /* dropout on the attention weights, as PyTorch's dropout_p: 0 = off, 0 <= p <= 1
     * (p = 1 drops every weight: O = 0). Each weight P_ij is kept with probability 1 - p
     * and then scaled by 1 / (1 - p), dropped ones are 0, before P·V; the softmax's sum
     * and the LSE are those of the undropped P, and the weights output is the dropped and
     * scaled P that multiplied V. Which weights are kept is a pure function of (seed,
     * offset, b, h, i, j) through Philox4x32-10 (docs/CONTRACT.md, "Dropout"): the same
     * for every path, kernel, thread count and machine, so attn_backward with the same
     * options regenerates it. A caller drawing several masks from one seed gives each a
     * different offset. */
    float dropout_p;
    uint64_t dropout_seed;
    uint64_t dropout_offset;
    /* A paged key/value cache (NULL = k and v are [B, Hkv, Lk, D]).
     * ATTN_I32 [B, max_pages] (shape {B, max_pages, 1, 1}, any strides). k and v are then
     * page pools, k [num_pages, Hkv, page_size, Dk] and v [num_pages, Hkv, page_size, Dv]
     * (FlashAttention's [num_pages, page_size, Hkv, D] through strides), and the keys of
     * sequence b are Lk = max_pages * page_size rows: row j is row j % page_size of pool
     * page block_table[b][j / page_size]. kv_len gives the valid keys (default: all Lk);
     * only the entries of the pages that hold valid keys, p < ceil(kv_len[b] /
     * page_size), are read, and each must lie in [0, num_pages). Forward, the
     * reference and attn_weights_grid only: attn_backward, the additive and multi-head
     * modules refuse it (ATTN_ERR_UNSUPPORTED). docs/CONTRACT.md, "A paged KV cache". */
    const attn_tensor *block_table;
    /* attn_backward's output, the gradient of the float bias (fields added after the
     * rest): float32, the shape of opt->bias ([B|1, Hq|1, Lq|1, Lk|1], the same dims
     * broadcast), any strides. d bias = dLoss/ds, the gradient of the final logit
     *     d bias_ij = P_ij (dP_ij - D_i)      (dP_ij = Z_ij dO_i . v_j, D_i = dO_i . O_i)
     * (the bias is added after the scale and softcap, so neither multiplies it), summed
     * over every dimension the bias broadcasts along in a fixed order (bit-identical for
     * any thread count); 0 where the logit is masked (P = 0: a -inf bias, the bool mask,
     * causal, window, kv_len) and on fully masked rows. Written, not added to; NULL = not
     * wanted. Requires bias; must be NULL in every other call (ATTN_ERR_VALUE).
     * docs/CONTRACT.md, "The bias's gradient". */
    const attn_tensor *d_bias;
    /* A block-sparse bool mask (attn_block_mask_create, below; fields added after the
     * rest), applied as options.mask would be (true = attend) and together with it, by
     * attn_forward, attn_backward, attn_weights_grid and the reference path; built once
     * and reused by any number of calls, which read only its blocks that are not empty or
     * full. Its B and H must be the call's (or 1: shared), its Lq and Lk the call's.
     * NULL = none. Refused (ATTN_ERR_UNSUPPORTED) by the varlen, cascade, multi-head,
     * additive and MPI calls; a paged cache takes it as it takes a mask.
     * docs/CONTRACT.md, "Block masks". */
    const struct attn_block_mask *block_mask;
    /* A user score function (fields added after the rest): the scaled logit
     * s = scale * q_i . k_j becomes score_mod(s, b, h, i, j, score_mod_ctx) before
     * softcap, bias, ALiBi and the masks (b, h: the call's batch and query head, i, j:
     * the query row and key). attn_backward needs its derivative d score_mod / d s in
     * score_mod_grad (same arguments; NULL there: ATTN_ERR_VALUE). Both are called from
     * every thread of the call, concurrently, any number of times per logit, and must be
     * pure functions of their arguments. NULL = none. docs/CONTRACT.md, "Score
     * functions". */
    float (*score_mod)(float s, int64_t b, int64_t h, int64_t i, int64_t j, void *ctx);
    float (*score_mod_grad)(float s, int64_t b, int64_t h, int64_t i, int64_t j, void *ctx);
    void *score_mod_ctx;
    /* attn_forward's optional output for KV-cache eviction (fields added after the rest):
     * the attention mass each key received, over the call's query rows and the query
     * heads of its key/value head,
     *     key_scores[b, g, j] = sum over h of group g, i of P_bhij    (P = exp(s - lse))
     * float32 [B, Hkv, Lk] (shape {B, Hkv, Lk, 1}), any strides; 0 for a key no row
     * attends. P is the softmax weight as the weights output has it, before dropout (with
     * sinks the mass the sink took is no key's). Deterministic: the same bits for any
     * thread count. Computed from the forward's LSE by one more pass over K, as
     * attn_weights_grid does (docs/CONTRACT.md, "Eviction scores"); float32, float16,
     * bfloat16, q8_0, q4_0 and fp8 caches, contiguous or paged. NULL = not wanted; refused
     * (ATTN_ERR_UNSUPPORTED) by every other call and by float64 calls. */
    const attn_tensor *key_scores;
    /* The scales of an fp8 cache (fields added after the rest; vLLM's k_scale, v_scale):
     * element x of k stands for fl32(fp8_to_f32(x) * k_scale), of v likewise. ATTN_F32,
     * shape {1, 1, 1, 1} (one for the tensor) or {Hkv, 1, 1, 1} (one per key/value head),
     * any strides; each finite and > 0 (else ATTN_ERR_VALUE). NULL = 1. Only with k and v
     * of an fp8 dtype: given with another, ATTN_ERR_VALUE. docs/CONTRACT.md, "The fp8
     * cache dtypes". With k and v ATTN_U4 they are instead the u4 scales, below. */
    const attn_tensor *k_scale, *v_scale;
    /* A u4 cache (k and v ATTN_U4; fields added after the rest): a key code c of channel
     * d at key j stands for fmaf(c, k_scale[b, g, j / G, d], k_zero[b, g, j / G, d]), a
     * value code of channel d at key j for fmaf(c, v_scale[b, g, j, d / 32],
     * v_zero[b, g, j, d / 32]), G = kv_group (0 = 32) keys a key group.
     *   k_scale, k_zero  ATTN_F32 [B, Hkv, ceil(Lk / G), Dk]   per channel, per key group
     *   v_scale, v_zero  ATTN_F32 [B, Hkv, Lk, Dv / 32]        per token, per 32 channels
     * any strides; all four required (NULL: ATTN_ERR_NULL), scales finite and > 0, zeros
     * finite (else ATTN_ERR_VALUE); kv_group >= 0 (else ATTN_ERR_VALUE). k_zero, v_zero
     * or kv_group given with another cache dtype: ATTN_ERR_VALUE. attn_quantize_u4_keys
     * and attn_quantize_u4_values write them. docs/CONTRACT.md, "The u4 cache (KIVI)". */
    const attn_tensor *k_zero, *v_zero;
    int64_t kv_group;
} attn_options;

/* ---- calls -------------------------------------------------------------------------- */

/* O = attention(Q, K, V).
 *   q [B, Hq, Lq, Dk]   k [B, Hkv, Lk, Dk]   v [B, Hkv, Lk, Dv]   o [B, Hq, Lq, Dv]
 * Hq must be a multiple of Hkv (query head h reads key/value head h / (Hq / Hkv)).
 * dtypes: q, k, v and o each ATTN_F32, ATTN_F16 or ATTN_BF16, with k and v alike (a
 * 16-bit KV cache under float32 queries works); accumulation is float32 throughout and
 * o is rounded to its dtype once, at the end. k and v may also be ATTN_Q8_0, ATTN_Q4_0,
 * ATTN_U4 with opt->k_scale, k_zero, v_scale, v_zero (contiguous only), or
 * ATTN_FP8_E4M3 or ATTN_FP8_E5M2 with opt->k_scale, v_scale (both alike): the
 * result is attention over their dequantized values (queries of any of the three float
 * dtypes are widened to float32, never quantized). Or q, k, v and o all ATTN_F64 (no mixing):
 * accumulated in float64 on a fused path of its own (opt->lse then float32 or float64,
 * weights float32; CONTRACT.md "float64").
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
 * thread count. On error nothing is written.
 * With opt->sinks (as in the forward, whose lse includes them) the formulas are unchanged,
 * P = exp(s - lse); opt->d_sinks [Hq] (optional) gets the sinks' gradient.
 * With opt->bias, opt->d_bias (optional, the bias's shape) gets the bias's gradient. */
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

/* ---- block masks ----------------------------------------------------------------------
 * A bool mask over [B|1, H|1, Lq, Lk] (B or H of 1: the same for every batch or head),
 * kept as its structure: for every 64 query rows x 16 keys whether all are kept ("full"),
 * none ("empty"), or some ("partial"), each row's first and last kept key, and the
 * elements of the partial blocks only. Memory: 17 bytes per row, 9 bytes per block and
 * 1 KiB per partial block; a document or sliding-window mask of 8192 tokens holds about
 * 2 MiB where the dense mask is 64 MiB. Calls given it (options.block_mask) skip its
 * empty blocks without reading anything, run its full ones as if unmasked and read the
 * elements of its partial ones only. Immutable once made: any number of calls and
 * threads may share it. */
typedef struct attn_block_mask attn_block_mask;

/* Makes one from keep(b, h, i, j) (nonzero = attend), called once per element in order
 * (b, h, i, j), from the calling thread only. B, H, Lq, Lk >= 1 (B or H = 1: shared). */
ATTN_API attn_status attn_block_mask_create(int64_t B, int64_t H, int64_t Lq, int64_t Lk,
                                            int (*keep)(int64_t b, int64_t h, int64_t i,
                                                        int64_t j, void *ctx),
                                            void *ctx, attn_block_mask **out);

/* Makes one from a bool tensor [B|1, H|1, Lq, Lk] (any strides; a batch or head
 * dimension of stride 0 is stored once). */
ATTN_API attn_status attn_block_mask_from_tensor(const attn_tensor *mask, attn_block_mask **out);

/* Frees one (NULL: nothing). */
ATTN_API void attn_block_mask_free(attn_block_mask *mask);

/* What one holds: its dims (B, H: 1 when shared) and its blocks of 64 rows x 16 keys by
 * kind, and the bytes it takes. */
typedef struct attn_block_mask_info {
    int64_t B, H, Lq, Lk;
    int64_t block_rows, block_keys;       /* 64, 16 */
    int64_t empty, full, partial;         /* blocks of each kind, over B x H            */
    size_t bytes;
} attn_block_mask_info;
ATTN_API attn_status attn_block_mask_get_info(const attn_block_mask *mask,
                                              attn_block_mask_info *info);

/* ---- packed (variable-length) batches -------------------------------------------------
 * B sequences of different lengths packed along the row dimension, as FlashAttention's
 * flash_attn_varlen_func: sequence s is query rows [cu_seqlens_q[s], cu_seqlens_q[s+1])
 * and key rows [cu_seqlens_k[s], cu_seqlens_k[s+1]), and the result is, sequence by
 * sequence, attn_forward on those rows alone (B = 1), bit for bit.
 *   q [1, Hq, total_q, Dk]   k [1, Hkv, total_k, Dk]   v [1, Hkv, total_k, Dv]
 *   o [1, Hq, total_q, Dv]   opt->lse [1, Hq, total_q] (shape {1, Hq, total_q, 1})
 * any strides: FlashAttention's [total, H, D] memory is stride {., D, H·D, 1}.
 *   cu_seqlens_q, cu_seqlens_k  ATTN_I32 or ATTN_I64, B + 1 entries (shape {B + 1, 1, 1,
 *                 1}, any stride): 0 first, non-decreasing, total_q (total_k) last
 *   max_seqlen_q, max_seqlen_k  at least every sequence's length: dropout draws the mask
 *                 of the padded call [B, Hq, max_seqlen_q, max_seqlen_k] at b = s
 * Every attn_forward option applies per sequence (causal and its alignment, window,
 * ALiBi, softcap, sinks, GQA, scale, dtypes, dropout, path, threads), except mask, bias,
 * kv_len, block_table and weights (ATTN_ERR_UNSUPPORTED) — but see the paged forward:
 * Many requests in one call (a server's step): with opt->block_table, k and v are page
 * pools [num_pages, Hkv, page_size, D] (as attn_forward's), cu_seqlens_k is NULL and
 * opt->kv_len [B] (int32 or int64; FlashAttention's seqused_k) gives each request's keys,
 * new ones included; request s is attn_forward with B = 1 on its query rows, row s of the
 * table and kv_len[s], bit for bit, so decodes and chunks of prefill mix in one call.
 * opt->mask is then allowed, bool [B, Hq|1, max_seqlen_q, max_pages * page_size] over the
 * padded batch (request s reads its first Lq_s rows: a speculative-decoding tree). Forward
 * only (attn_varlen_backward refuses the table). A sequence may be empty; a
 * query row without keys is a fully masked row. opt->workspace, if given, is sized by
 * attn_varlen_forward_workspace_size, which reads cu_seqlens (their data must be there;
 * a paged call's kv_len too) and no other data. On error nothing is written. docs/CONTRACT.md, "Packed
 * (variable-length) batches". */
ATTN_API attn_status attn_varlen_forward(const attn_tensor *q, const attn_tensor *k,
                                         const attn_tensor *v, const attn_tensor *o,
                                         const attn_tensor *cu_seqlens_q,
                                         const attn_tensor *cu_seqlens_k, int64_t max_seqlen_q,
                                         int64_t max_seqlen_k, const attn_options *opt);
ATTN_API attn_status attn_varlen_forward_workspace_size(
    const attn_tensor *q, const attn_tensor *k, const attn_tensor *v, const attn_tensor *o,
    const attn_tensor *cu_seqlens_q, const attn_tensor *cu_seqlens_k, int64_t max_seqlen_q,
    int64_t max_seqlen_k, const attn_options *opt, size_t *bytes);

/* The gradients of attn_varlen_forward, as attn_backward's for each sequence: d_o, dq
 * packed like q and o, dk, dv like k and v, lse [1, Hq, total_q] the forward's; each
 * sequence's rows written by its own call. opt->d_sinks [Hq] gets the sum over the
 * sequences, added in sequence order (the same bits for any thread count). */
ATTN_API attn_status attn_varlen_backward(const attn_tensor *q, const attn_tensor *k,
                                          const attn_tensor *v, const attn_tensor *o,
                                          const attn_tensor *d_o, const attn_tensor *lse,
                                          const attn_tensor *dq, const attn_tensor *dk,
                                          const attn_tensor *dv, const attn_tensor *cu_seqlens_q,
                                          const attn_tensor *cu_seqlens_k, int64_t max_seqlen_q,
                                          int64_t max_seqlen_k, const attn_options *opt);
ATTN_API attn_status attn_varlen_backward_workspace_size(
    const attn_tensor *q, const attn_tensor *k, const attn_tensor *v, const attn_tensor *o,
    const attn_tensor *d_o, const attn_tensor *lse, const attn_tensor *dq, const attn_tensor *dk,
    const attn_tensor *dv, const attn_tensor *cu_seqlens_q, const attn_tensor *cu_seqlens_k,
    int64_t max_seqlen_q, int64_t max_seqlen_k, const attn_options *opt, size_t *bytes);

/* Writes the K and V rows of new tokens into a key/value cache the caller owns, converting
 * float32 to the cache's dtype (rounding to nearest even), as vLLM's reshape_and_cache and
 * FlashAttention's in-place k, v arguments do:
 *   k_new [B, Hkv, n, Dk]  v_new [B, Hkv, n, Dv]  float32, any strides (FlashAttention's
 *                          [B, n, Hkv, D] through strides)
 *   k_cache, v_cache       the cache, float32, float16, bfloat16, q8_0, q4_0 or fp8
 *                          (alike): written (fp8: as attn_kv_append_scaled with scales
 *                          1; q4_0 as attn_quantize_q4_0, the same bytes);
 *                          a q8_0 cache's rows are quantized as attn_quantize_q8_0 does,
 *                          the same bytes
 * Where token t of batch b goes, by the first of these that is given:
 *   slot_mapping  ATTN_I32 or ATTN_I64 [B, n] (shape {B, n, 1, 1}): slot s = page *
 *                 page_size + offset in the page pools k_cache [num_pages, Hkv,
 *                 page_size, Dk], v_cache [num_pages, Hkv, page_size, Dv]; s = -1 is a
 *                 padding token and is not written (vLLM's convention)
 *   block_table   ATTN_I32 [B, max_pages] as attn_options.block_table, with kv_len
 *                 (required): position kv_len[b] + t, through the table, in the pools
 *   neither       the contiguous cache k_cache [B, Hkv, Lmax, Dk]: row kv_len[b] + t
 *                 (kv_len required)
 * kv_len (ATTN_I32 or ATTN_I64 [B]) is read, never advanced: the caller adds n. Refused,
 * with nothing written: a slot or table entry outside the pool (negative included), a
 * position beyond the table's pages or the cache, a page size of 0, two tokens aimed at
 * one row, a cache overlapping an input or the other cache; for a q8_0 cache, a row to be
 * written holding a NaN or infinity or a block whose scale float16 cannot hold (as
 * attn_quantize_q8_0 refuses, ATTN_ERR_VALUE). */
ATTN_API attn_status attn_kv_append(const attn_tensor *k_new, const attn_tensor *v_new,
                                    const attn_tensor *k_cache, const attn_tensor *v_cache,
                                    const attn_tensor *slot_mapping,
                                    const attn_tensor *block_table,
                                    const attn_tensor *kv_len);

/* attn_kv_append with the scales of an fp8 cache (ATTN_FP8_E4M3 or ATTN_FP8_E5M2 k_cache
 * and v_cache): each value x of k_new is stored as fp8(fl32(x / k_scale)) of its head's
 * scale, rounded to nearest even, and saturating: a finite value beyond the format's
 * largest, and an infinity, become +-largest (448 for e4m3, 57344 for e5m2); NaN stays
 * NaN (0x7F or 0xFF for e4m3, 0x7E or 0xFE for e5m2). k_scale, v_scale as
 * attn_options.k_scale (ATTN_F32 {1, 1, 1, 1} or {Hkv, 1, 1, 1}, finite, > 0; NULL = 1),
 * only with an fp8 cache (else ATTN_ERR_VALUE); every other rule is attn_kv_append's,
 * which is this call with both scales NULL. Nothing written on error. */
ATTN_API attn_status attn_kv_append_scaled(const attn_tensor *k_new, const attn_tensor *v_new,
                                           const attn_tensor *k_cache,
                                           const attn_tensor *v_cache,
                                           const attn_tensor *slot_mapping,
                                           const attn_tensor *block_table,
                                           const attn_tensor *kv_len,
                                           const attn_tensor *k_scale,
                                           const attn_tensor *v_scale);

/* The name of a dtype ("float32", "bfloat16", ...), "unknown" for a value outside the
 * list; and the bytes of one element, 0 outside the list. */
ATTN_API const char *attn_dtype_name(attn_dtype dtype);
ATTN_API size_t attn_dtype_size(attn_dtype dtype);
/* The elements of one unit of attn_dtype_size: 32 for ATTN_Q8_0, ATTN_Q4_0 and ATTN_U4, 1 for the
 * other dtypes, 0 outside the list. */
ATTN_API int64_t attn_dtype_block(attn_dtype dtype);

/* ---- the q8_0 cache dtype ------------------------------------------------------------
 * Quantize a float32 tensor into q8_0 blocks, once (at append), as llama.cpp's reference
 * quantize_row_q8_0 does: per block of 32, amax = max |x|, d = amax / 127 (float32),
 * qs[i] = roundf(x[i] * (1 / d)) (nearest, ties away from zero; computed with the float32
 * d, not its float16 rounding), the stored scale float16(d) rounded to nearest even;
 * an all-zero block has d = 0 and qs = 0.
 *   src [d0, d1, d2, D]  ATTN_F32, any strides
 *   dst [d0, d1, d2, D]  ATTN_Q8_0 (layout rules above), the same shape; shares no byte
 *                        with src
 * ATTN_ERR_VALUE for a NaN or infinite input, or a block whose scale is beyond
 * float16's range (amax > 65504 * 127): nothing written then, nor on any other error. */
ATTN_API attn_status attn_quantize_q8_0(const attn_tensor *src, const attn_tensor *dst);

/* The values a q8_0 tensor holds, d * qs[i] (exact in float32), into dst.
 *   src  ATTN_Q8_0     dst  ATTN_F32, the same shape, any strides, sharing no byte */
ATTN_API attn_status attn_dequantize_q8_0(const attn_tensor *src, const attn_tensor *dst);

/* ---- the q4_0 cache dtype ------------------------------------------------------------
 * Quantize a float32 tensor into q4_0 blocks as llama.cpp's reference quantize_row_q4_0
 * does: per block of 32, max = the first element of largest |x| (its sign kept), d =
 * max / -8 (float32), q = min(15, (int)(x * (1 / d) + 8.5)) (truncated toward zero: the
 * nearest of 0..15 to x / d + 8, ties up), computed with the float32 d; the stored scale
 * float16(d), nearest even; an all-zero block has d = 0 and every q 8 (value 0). Shapes
 * and refusals as attn_quantize_q8_0's (a NaN or infinite input, or |max| / 8 beyond
 * float16's range: ATTN_ERR_VALUE, nothing written). */
ATTN_API attn_status attn_quantize_q4_0(const attn_tensor *src, const attn_tensor *dst);

/* The values a q4_0 tensor holds, d * (q - 8) (exact in float32), into dst. */
ATTN_API attn_status attn_dequantize_q4_0(const attn_tensor *src, const attn_tensor *dst);

/* ---- the u4 cache dtype (KIVI) ---------------------------------------------------------
 * Quantize float32 keys into a u4 cache, per channel over groups of G keys (KIVI's key
 * quantization; G = group, 0 = 32): for each (b, h, key group, channel d), over the group's
 * keys (a last partial group: the keys it has) the least value m and the largest M;
 * zero = m, scale = (M - m) / 15 in float32, or 1 when that is 0 (M == m, or a difference
 * that rounds to 0: every code then 0 and every value m, within 15 * 2^-149); each code
 * c = nearbyintf((x - zero) / scale) (float32, ties to even) clamped to 0..15; the value
 * read back is fmaf(c, scale, zero).
 *   src    [B, H, L, D]           ATTN_F32, any strides
 *   dst    [B, H, L, D]           ATTN_U4 (layout rules above)
 *   scale, zero [B, H, ceil(L / G), D]  ATTN_F32, any strides
 * The outputs share no byte with src or each other. ATTN_ERR_VALUE for a NaN or infinite
 * input, a group whose M - m overflows, or group < 0: nothing written then, nor on any
 * other error. */
ATTN_API attn_status attn_quantize_u4_keys(const attn_tensor *src, const attn_tensor *dst,
                                           const attn_tensor *scale, const attn_tensor *zero,
                                           int64_t group);
/* The same per token over each run of 32 channels (KIVI's value quantization):
 *   src, dst [B, H, L, D]   scale, zero [B, H, L, D / 32] */
ATTN_API attn_status attn_quantize_u4_values(const attn_tensor *src, const attn_tensor *dst,
                                             const attn_tensor *scale,
                                             const attn_tensor *zero);
/* The values a u4 tensor holds, fmaf(c, scale, zero), into dst (ATTN_F32, the same shape,
 * any strides, sharing no byte with the inputs); scale and zero as for the quantizers
 * above (keys: per channel over groups of `group` keys, 0 = 32; values: per token). */
ATTN_API attn_status attn_dequantize_u4_keys(const attn_tensor *src, const attn_tensor *dst,
                                             const attn_tensor *scale,
                                             const attn_tensor *zero, int64_t group);
ATTN_API attn_status attn_dequantize_u4_values(const attn_tensor *src, const attn_tensor *dst,
                                               const attn_tensor *scale,
                                               const attn_tensor *zero);

/* The (O, LSE) of attention over the union of the keys of n partial results of the same
 * rows (each, say, attn_forward with an lse output over its own range of keys):
 *   o_parts[c]   [B, Hq, Lq, Dv]  float32, c = 0..n-1, any strides
 *   lse_parts[c] [B, Hq, Lq]      float32 natural-log LSE (shape {B, Hq, Lq, 1})
 *   o            [B, Hq, Lq, Dv]  written: float32, float16 or bfloat16
 *   lse          [B, Hq, Lq]      written (float32), or NULL
 * Total: a partial with LSE -inf is empty and neutral (its O is not read); n = 0 or all
 * partials empty gives O 0 and LSE -inf; a NaN or +inf LSE makes its row NaN. o and lse
 * may be exactly the view of one of the partials (in-place); no other overlap. threads:
 * 0 = OpenMP's default; the result is bit-identical for any count. */
ATTN_API attn_status attn_merge(int64_t n, const attn_tensor *o_parts,
                                const attn_tensor *lse_parts, const attn_tensor *o,
                                const attn_tensor *lse, int32_t threads);

/* Shared-prefix (cascade) attention: B sequences whose keys are one prefix they all share
 * followed by each one's own suffix. The result is attn_forward of each sequence over
 * its concatenated keys [prefix; suffix_b], computed as one call over the prefix with
 * every sequence's queries as rows of one batch (each prefix key read once for all B),
 * one batched call over the suffixes, and attn_merge (docs/CONTRACT.md, "Shared-prefix
 * (cascade) attention"). A part is its keys and values, contiguous or page pools:
 *   k, v          prefix: [1, Hkv, P, Dk], [1, Hkv, P, Dv]; suffixes: [B, Hkv, S, ·];
 *                 or page pools [num_pages, Hkv, page_size, ·] with block_table
 *   block_table   NULL, or ATTN_I32 as attn_options.block_table: {1, max_pages} for the
 *                 prefix, {B, max_pages} for the suffixes
 *   kv_len        NULL (all keys), or the valid keys as attn_options.kv_len: {1} for
 *                 the prefix, {B} for the suffixes
 * A NULL part (or one with k and v NULL) has no keys. Each part's k and v may have their
 * own dtype (float32, float16, bfloat16 or q8_0, k and v alike). */
typedef struct attn_cascade_kv {
    const attn_tensor *k, *v;
    const attn_tensor *block_table;
    const attn_tensor *kv_len;
} attn_cascade_kv;

/*   q [B, Hq, Lq, Dk]   o [B, Hq, Lq, Dv]   float32, float16 or bfloat16, any strides
 * opt: scale, softcap, sinks (folded once per row), lse [B, Hq, Lq] (float32), causal
 * (bottom-right only, each suffix then holding S_b >= Lq - 1 keys so that every row sees
 * the whole prefix), path, precision, threads, workspace (attn_cascade_forward_workspace_
 * size). Refused: mask, bias, alibi_slopes, a window, weights, dropout (UNSUPPORTED);
 * opt->kv_len, opt->block_table (VALUE: each part has its own). On error nothing is
 * written to o or lse. */
ATTN_API attn_status attn_cascade_forward(const attn_tensor *q, const attn_cascade_kv *prefix,
                                          const attn_cascade_kv *suffix, const attn_tensor *o,
                                          const attn_options *opt);
ATTN_API attn_status attn_cascade_forward_workspace_size(const attn_tensor *q,
                                                         const attn_cascade_kv *prefix,
                                                         const attn_cascade_kv *suffix,
                                                         const attn_tensor *o,
                                                         const attn_options *opt, size_t *bytes);
/* ---- attention weights from the LSE, in blocks --------------------------------------
 * The weights p_ij = exp(s_ij - lse_i) of a forward call, recomputed from its LSE in one
 * pass over K and reduced over blocks: cell (r, c) of grid covers rows i with
 * floor(i R / Lq) = r and keys j with floor(j C / Lk) = c. Memory is the grid and a few
 * tiles; the Lq x Lk matrix is never held. R = Lq, C = Lk gives the weights themselves. */
typedef enum attn_reduce {
    ATTN_REDUCE_SUM = 0,  /* the sum of the block's weights                     */
    ATTN_REDUCE_MAX,      /* the largest weight of the block                    */
} attn_reduce;

/*   q, k, opt  exactly as in the forward call (masks, scale, softcap, path, threads...);
 *              opt->lse and opt->weights must be NULL
 *   lse  [B, Hq, Lq]     that call's log-sum-exp (shape {B, Hq, Lq, 1}), float32
 *   grid [B, Hq, R, C]   written, float32, 1 <= R <= Lq, 1 <= C <= Lk (0 for an empty side):
 *                        -inf in a cell every entry of whose block is masked
 * Deterministic for any thread count. On error nothing is written. */
ATTN_API attn_status attn_weights_grid(const attn_tensor *q, const attn_tensor *k,
                                       const attn_tensor *lse, const attn_tensor *grid,
                                       attn_reduce reduce, const attn_options *opt);

/* The fixed message of a status code. */
ATTN_API const char *attn_status_string(attn_status status);

/* The detail of the latest failed call on this thread ("" after a success). */
ATTN_API const char *attn_last_error(void);

/* "0.1.0" */
ATTN_API const char *attn_version(void);

/* The micro-kernels the fused path of this process runs (a name of attn_kernel_list():
 * "avx512bf16", "avx512", "avx2", "generic" in an x86-64 build), the best this CPU
 * supports unless the environment variable ATTN_ISA names another; "none" when ATTN_ISA
 * names one this CPU cannot run (fused calls then return ATTN_ERR_UNSUPPORTED).
 * ATTN_VERBOSE=1 prints the choice on stderr once. */
ATTN_API const char *attn_kernel_name(void);

/* Whether this build has the kernel `name` and this CPU can run it. */
ATTN_API bool attn_kernel_supported(const char *name);

/* Every kernel this build has, best first, NULL-terminated (whether or not this CPU can
 * run it: attn_kernel_supported). Static storage; never freed. */
ATTN_API const char *const *attn_kernel_list(void);

/* Asks that the memory [p, p + bytes) be backed by huge pages: meant for a KV cache or a
 * paged pool that every decoding step reads, allocated once. Under a virtual machine's
 * nested paging a 4 KiB page costs the decoding step a page walk every 16 to 64 keys; on
 * 2 MiB pages the same calls ran up to 23% faster (docs/BENCHMARKS.md, "Huge pages").
 * Covers the whole 2 MiB pages inside the range (the ends stay as they are): advises
 * them (Linux madvise MADV_HUGEPAGE, so pages touched later come huge), then moves the
 * pages already touched onto huge pages (MADV_COLLAPSE, Linux 6.1 and later; a copy by
 * the kernel, best effort, ignored where refused). No byte of the range changes, and
 * nothing is kept: the memory stays the caller's, freed as it was allocated.
 * ATTN_ERR_NULL for p NULL with bytes > 0; ATTN_ERR_UNSUPPORTED where the system gives no
 * huge pages on request (not Linux, or transparent huge pages "never"); ATTN_OK
 * otherwise, a range without a whole 2 MiB page included (nothing to do). */
ATTN_API attn_status attn_huge_pages(void *p, size_t bytes);

/* The BLAS this build calls for its matrix products (projections): OpenBLAS's own
 * description ("OpenBLAS 0.3.21 ..."), the name given at build time for another CBLAS,
 * or "none" for a build without one (calls that need it return ATTN_ERR_UNSUPPORTED). */
ATTN_API const char *attn_blas_name(void);

/* ---- additive (Bahdanau) attention -----------------------------------------------------
 * e_ij = ṽ · tanh(W q_i + U k_j + b),  O = softmax_j(e, masked) V,  ṽ = v, or g v / ‖v‖
 * when normalize (the weight-normalized form of TF-Addons' BahdanauAttention).
 * Extra letters: Dq query width, A units. Weights are dense row-major float32. */
typedef struct attn_additive_weights {
    int64_t units;          /* A >= 0                                              */
    const float *w_query;   /* W [Dq, A]                                           */
    const float *w_key;     /* U [Dk, A]                                           */
    const float *v;         /* v [A]                                               */
    const float *bias;      /* b [A], or NULL for none                             */
    bool normalize;         /* ṽ = g v / ‖v‖ (‖v‖ = 0 gives ṽ = 0)                 */
    float g;                /* used only when normalize; must be finite            */
} attn_additive_weights;

/* The weights' gradients; each pointer may be NULL (not wanted). Written, not added to. */
typedef struct attn_additive_grads {
    float *d_w_query;       /* [Dq, A] */
    float *d_w_key;         /* [Dk, A] */
    float *d_v;             /* [A]     */
    float *d_bias;          /* [A]     */
    float *d_g;             /* one float, when normalize */
} attn_additive_grads;

/* O = additive attention.
 *   q [B, 1, Lq, Dq]   k [B, 1, Lk, Dk]   v [B, 1, Lk, Dv]   o [B, 1, Lq, Dv]   all float32
 * Options as attn_forward where they make sense: kv_len, mask (bool, [B|1, 1, Lq|1, Lk|1]),
 * causal (with align), window; lse and weights outputs; path (FUSED or REFERENCE),
 * threads. Refused (ATTN_ERR_UNSUPPORTED): has_scale, softcap, bias, alibi_slopes, a
 * caller's workspace (the call allocates its own, linear in Lq + Lk). The projections
 * go through the BLAS: without one the fused path returns ATTN_ERR_UNSUPPORTED. */
ATTN_API attn_status attn_additive_forward(const attn_tensor *q, const attn_tensor *k,
                                           const attn_tensor *v,
                                           const attn_additive_weights *w,
                                           const attn_tensor *o, const attn_options *opt);

/* The gradients of attn_additive_forward: arguments as attn_backward (o, d_o, lse from
 * the forward; opt->lse and opt->weights NULL), plus the weights and their gradients.
 * dq, dk, dv may each be NULL. Deterministic for any thread count. */
ATTN_API attn_status attn_additive_backward(const attn_tensor *q, const attn_tensor *k,
                                            const attn_tensor *v,
                                            const attn_additive_weights *w,
                                            const attn_tensor *o, const attn_tensor *d_o,
                                            const attn_tensor *lse, const attn_tensor *dq,
                                            const attn_tensor *dk, const attn_tensor *dv,
                                            const attn_additive_grads *grads,
                                            const attn_options *opt);

/* Luong's forms. general: e_ij = q_i W k_jᵀ with W [Dq, Dk] dense: q is projected
 * through the BLAS, then attn_forward runs with scale 1 unless opt->has_scale (every
 * attn_forward option applies). concat: e_ij = vᵀ tanh(W [q_i; k_j]), which is the
 * additive form with W split into w_query and w_key: attn_additive_forward. */
ATTN_API attn_status attn_luong_general_forward(const attn_tensor *q, const attn_tensor *k,
                                                const attn_tensor *v, const float *w,
                                                const attn_tensor *o, const attn_options *opt);
ATTN_API attn_status attn_luong_concat_forward(const attn_tensor *q, const attn_tensor *k,
                                               const attn_tensor *v,
                                               const attn_additive_weights *w,
                                               const attn_tensor *o, const attn_options *opt);

/* The vectorized tanh of the additive scores, on n floats (the kernel attn_kernel_name()
 * names): error bound in docs/CONTRACT.md. For tests and benchmarks. */
ATTN_API attn_status attn_additive_tanh(int64_t n, const float *x, float *y);



/* ---- the multi-head attention module -------------------------------------------------
 * A transformer's attention layer around attn_forward: projections through the BLAS,
 * optional rotary positions, the heads' attention, the output projection.
 *   x_q [B, Lq, E]  (shape {B, Lq, E, 1})     x_kv [B, Lk, Ekv]  (NULL: self-attention)
 *   Q = x_q W_Q + b_Q    K = x_kv W_K + b_K    V = x_kv W_V + b_V    (then RoPE on Q, K)
 *   O = attention(Q, K, V) per head           y = O W_O + b_O        y [B, Lq, E]
 * Weights are logical [in, out] matrices, shape {in, out, 1, 1}, any strides with one of
 * the two equal to 1: stride {out, 1} is a row-major [in, out] matrix, stride {1, in} is
 * PyTorch's [out, in] rows (nn.Linear.weight, read transposed without a copy), so W_Q of
 * a packed in_proj_weight [3E, E] is {data, {E, E, 1, 1}, {1, E, 0, 0}}, W_K the same
 * at data + E·E, W_V at data + 2·E·E. Biases are {out, 1, 1, 1} or NULL. dtypes: x, y,
 * weights and biases float32 or bfloat16 (bfloat16 is widened to float32 in the
 * workspace; every product accumulates in float32). Full contract: docs/CONTRACT.md. */
typedef enum attn_rope_kind {
    ATTN_ROPE_NONE = 0,
    ATTN_ROPE_HALF,         /* pairs (d, d + r/2): GPT-NeoX, Llama             */
    ATTN_ROPE_INTERLEAVED,  /* pairs (2d, 2d + 1): GPT-J                        */
} attn_rope_kind;

typedef struct attn_rope {
    attn_rope_kind kind;
    int64_t rotary_dim;  /* r: the first r of Dk are rotated; 0 = Dk; even, <= Dk   */
    double base;         /* theta_d = pos * base^(-2d / r); 0 = 10000                */
    int64_t offset;      /* position of row 0 of x_q and of x_kv                     */
} attn_rope;

typedef struct attn_mha {
    int64_t Hq;          /* query heads: W_Q has Hq·Dk columns, W_O Hq·Dv rows         */
    int64_t Hkv;         /* key/value heads (0 = Hq); Hq a multiple of it             */
    const attn_tensor *w_q, *w_k, *w_v, *w_o;  /* [E, Hq·Dk] [Ekv, Hkv·Dk] [Ekv, Hkv·Dv] [Hq·Dv, E] */
    const attn_tensor *b_q, *b_k, *b_v, *b_o;  /* [Hq·Dk] [Hkv·Dk] [Hkv·Dv] [E], or NULL */
    attn_rope rope;
} attn_mha;

/* y = the layer on x_q (and x_kv). opt is attn_forward's, its masks and options read
 * against the heads' scores [B, Hq, Lq, Lk] (a key padding mask: kv_len, or a bool mask
 * {B, 1, 1, Lk}); opt->lse and opt->weights must be NULL; opt->workspace, if given, is
 * the module's whole scratch (attn_mha_forward_workspace_size). weights (NULL = not
 * wanted): [B, Hq, Lq, Lk] float32, or with average_weights [B, 1, Lq, Lk], the mean
 * over heads (PyTorch's need_weights / average_attn_weights). On error nothing is
 * written. */
ATTN_API attn_status attn_mha_forward(const attn_mha *m, const attn_tensor *x_q,
                                      const attn_tensor *x_kv, const attn_tensor *y,
                                      const attn_tensor *weights, bool average_weights,
                                      const attn_options *opt);
ATTN_API attn_status attn_mha_forward_workspace_size(const attn_mha *m, const attn_tensor *x_q,
                                                     const attn_tensor *x_kv,
                                                     const attn_tensor *y,
                                                     const attn_tensor *weights,
                                                     bool average_weights,
                                                     const attn_options *opt, size_t *bytes);

/* The gradients of attn_mha_forward for dy = dLoss/dy [B, Lq, E], each float32, each
 * NULL when not wanted, each overwritten (not accumulated); shapes as the tensor they
 * differentiate (strides free, so dW of a packed in_proj_weight is written in place).
 * Self-attention (x_kv NULL): dx_kv must be NULL and dx_q gets both paths' sum. The
 * forward is recomputed (nothing is kept between calls). Deterministic for any thread
 * count. On error nothing is written. */
typedef struct attn_mha_grads {
    const attn_tensor *dx_q, *dx_kv;
    const attn_tensor *dw_q, *dw_k, *dw_v, *dw_o;
    const attn_tensor *db_q, *db_k, *db_v, *db_o;
} attn_mha_grads;

ATTN_API attn_status attn_mha_backward(const attn_mha *m, const attn_tensor *x_q,
                                       const attn_tensor *x_kv, const attn_tensor *dy,
                                       const attn_mha_grads *g, const attn_options *opt);

/* Training without the recomputation. attn_mha_forward_save is attn_mha_forward that
 * also keeps Q, K, V (after RoPE), O and the LSE in saved, a caller's buffer of
 * attn_mha_saved_size bytes (aligned to a float; y required; it may be copied).
 * attn_mha_backward_saved is attn_mha_backward reading them instead of running the forward again: same arguments
 * (x_q, x_kv, the weights and opt as the forward's) plus that buffer, unchanged since;
 * same gradients (bit for bit when the forward's weights were NULL). A saved buffer of
 * another layer's shapes, or of a forward that failed, is refused (ATTN_ERR_VALUE); what
 * it holds is not otherwise checked. opt->workspace, if given, is each call's whole
 * scratch, sized by the two queries (saved NULL: attn_mha_backward's). */
ATTN_API attn_status attn_mha_saved_size(const attn_mha *m, const attn_tensor *x_q,
                                         const attn_tensor *x_kv, size_t *bytes);
ATTN_API attn_status attn_mha_forward_save(const attn_mha *m, const attn_tensor *x_q,
                                           const attn_tensor *x_kv, const attn_tensor *y,
                                           const attn_tensor *weights, bool average_weights,
                                           const attn_options *opt, void *saved,
                                           size_t saved_bytes);
ATTN_API attn_status attn_mha_forward_save_workspace_size(
    const attn_mha *m, const attn_tensor *x_q, const attn_tensor *x_kv, const attn_tensor *y,
    const attn_tensor *weights, bool average_weights, const attn_options *opt, size_t *bytes);
ATTN_API attn_status attn_mha_backward_saved(const attn_mha *m, const attn_tensor *x_q,
                                             const attn_tensor *x_kv, const attn_tensor *dy,
                                             const attn_mha_grads *g, const attn_options *opt,
                                             const void *saved, size_t saved_bytes);
ATTN_API attn_status attn_mha_backward_workspace_size(
    const attn_mha *m, const attn_tensor *x_q, const attn_tensor *x_kv, const attn_tensor *dy,
    const attn_mha_grads *g, const attn_options *opt, const void *saved, size_t saved_bytes,
    size_t *bytes);

/* A key/value cache the caller owns, appended to by attn_mha_decode. kind says how the
 * storage is laid out:
 *   ATTN_CACHE_CONTIGUOUS  k [B, Hkv, Lmax, Dk]   v [B, Hkv, Lmax, Dv]
 *   ATTN_CACHE_PAGED       page pools k [num_pages, Hkv, page_size, Dk] and
 *                          v [num_pages, Hkv, page_size, Dv] (vLLM's / FlashAttention's
 *                          [num_pages, page_size, Hkv, D] through strides) with
 *                          block_table ATTN_I32 [B, max_pages] (as attn_options.block_table):
 *                          position t of sequence b is row t % page_size of pool page
 *                          block_table[b][t / page_size]; Lmax = max_pages * page_size
 *   k, v                   float32, float16, bfloat16, q8_0, fp8_e4m3 or fp8_e5m2 (alike),
 *                          any strides (fp8: with k_scale, v_scale below)
 *   len [B]                tokens held per batch, read and advanced by each step */
typedef enum attn_cache_kind {
    ATTN_CACHE_CONTIGUOUS = 0,
    ATTN_CACHE_PAGED,  /* k, v page pools and block_table */
} attn_cache_kind;

typedef struct attn_kv_cache {
    attn_cache_kind kind;
    attn_tensor k, v;
    int64_t *len;
    /* ATTN_CACHE_PAGED only (added after the rest; must be NULL for a contiguous cache):
     * ATTN_I32 [B, max_pages] (shape {B, max_pages, 1, 1}, any strides). The entries of
     * the pages a step writes or reads, p < ceil((len[b] + n) / page_size), must lie in
     * [0, num_pages); the caller owns the pages (two sequences may share a page, but a
     * step that writes one row twice is refused, ATTN_ERR_VALUE, as attn_kv_append). */
    const attn_tensor *block_table;
    /* An fp8 cache's scales (fields added after the rest), as attn_options.k_scale and
     * v_scale: the new rows are written by attn_kv_append_scaled and read by attention
     * with them (opt's own must then be NULL: ATTN_ERR_VALUE). NULL = 1; given with
     * another dtype: ATTN_ERR_VALUE. */
    const attn_tensor *k_scale, *v_scale;
} attn_kv_cache;

/* One decoding step of a self-attention layer: projects x [B, n, E] (n new tokens per
 * batch), rotates them at positions len[b] + i (+ rope.offset), writes their K and V at
 * rows len[b] .. len[b] + n - 1 of the cache, attends to rows [0, len[b] + n) with
 * bottom-right causal alignment, writes y [B, n, E] and adds n to len[b]. opt as in
 * attn_mha_forward, except that causal, align and kv_len are the step's own (opt's must
 * be unset; opt->block_table too: a paged cache's table is the cache's own). The new
 * rows are stored as attn_kv_append stores them (rounded to nearest even, or quantized
 * to q8_0; fp8 as attn_kv_append_scaled with the cache's scales). ATTN_ERR_VALUE when
 * len[b] + n > Lmax, or a page entry the step needs is outside the pool. On error
 * nothing is written. */
ATTN_API attn_status attn_mha_decode(const attn_mha *m, const attn_tensor *x,
                                     const attn_kv_cache *cache, const attn_tensor *y,
                                     const attn_options *opt);

/* ---- the tuner ------------------------------------------------------------------------
 * attn_tune times candidate configurations of the fused path on this machine (the
 * kernel among those this CPU runs, the query and key block sizes, the decoding step's
 * split) for a list of shape classes (prefill, decode or backward; K/V dtype; head dim;
 * mask class; GQA ratio) and writes the winners to a wisdom file, which every later
 * process reads once at its first call: $ATTN_WISDOM, else $XDG_CACHE_HOME/attn/wisdom,
 * else ~/.cache/attn/wisdom. The static choice is always a candidate and is kept unless
 * another is 3% faster. A file made on another CPU or version, or one that does not
 * parse, is ignored whole with one line on stderr; ATTN_TUNE=0 ignores any file;
 * ATTN_TUNE=auto asks attn_tune_auto (below) for the quick tune when there is no file;
 * ATTN_ISA set means no wisdom is used. A configuration never depends on the thread count: for a
 * given wisdom, results are the same bits for any number of threads (docs/CONTRACT.md,
 * "Wisdom"); between wisdoms the last bits may differ. docs/KERNELS.md, "Tuner". */
typedef struct attn_tune_options {
    bool quick;        /* the common classes only, shorter timings (docs/KERNELS.md)     */
    const char *out;   /* the file written (atomically); NULL = the default path above    */
    int32_t threads;   /* the threads of the timed calls; 0 = OpenMP's default             */
    bool verbose;      /* a line on stderr per class as it is decided                      */
} attn_tune_options;

/* Tunes and writes the file (opt NULL: all defaults). ATTN_ERR_IO when it cannot be
 * written (nothing is left behind), ATTN_ERR_UNSUPPORTED when ATTN_ISA, ATTN_FWD_BQ,
 * ATTN_FWD_BK or ATTN_BWD_BQ is set (they would override what is measured). This process
 * keeps the wisdom it read at its first call; the new file takes effect in the next. */
ATTN_API attn_status attn_tune(const attn_tune_options *opt);

/* Whether this process would use the wisdom file at path (NULL: the default path):
 * ATTN_OK, or ATTN_ERR_IO (cannot be opened) or ATTN_ERR_VALUE (another CPU or version,
 * a line that does not parse), with the line and the reason in attn_last_error(). */
ATTN_API attn_status attn_tune_check(const char *path);

/* ATTN_TUNE=auto's step, run once a process (later calls return the first's status): when
 * the variable is "auto" and no file is at the default path, the quick tune (as attn_tune
 * with quick) writes one there, with one line on stderr, which then takes effect at the
 * process's first attention call (an existing file is never rewritten). Any other value,
 * or a file there: nothing, ATTN_OK. An attention call never tunes by itself: the attn
 * command runs this before its subcommand (not `attn tune`), the Python package when it
 * is imported; a C program calls it before its first attention call (after one, the file
 * takes effect in the next process). The error of attn_tune when the tuning fails (also
 * said on stderr; the calls then keep the static choices). */
ATTN_API attn_status attn_tune_auto(void);

#ifdef __cplusplus
}
#endif

#endif /* ATTN_H */
