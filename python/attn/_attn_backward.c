/*
 * _attn_backward.c — backward() of the CPython extension, behind the autograd of
 *                    attn.scaled_dot_product_attention: the forward call's arguments again
 *                    (_attn_inputs.c), its output and LSE, grad_out, and the gradients
 *                    written by attn_backward with the GIL released — into the caller's
 *                    tensor where it has the call's full shape, else into a scratch summed
 *                    over the broadcast dimensions in float64 and rounded once to the
 *                    caller's dtype.
 *
 * What it is not: the autograd Function (python/attn/__init__.py) or the forward
 * (_attn_forward.c).
 */
#include "_attn.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/half.h"  // the library's float32 -> float16/bfloat16 rounding (src/core/half.h)

/* One gradient the library writes. Where the caller's tensor has every size of the call's
 * view (dX of the broadcast input), the library writes it in place, whatever its strides
 * and whatever its dtype (float32, float16 or bfloat16: the library rounds each gradient
 * once to it). Where it has a size-1 batch or head dimension that the call broadcast (a
 * query of rank 2 under a key of rank 4, a key shared by every batch, ...), or where the
 * caller passed None, the library writes a dense float32 scratch of the call's shape,
 * which is then summed over the broadcast dimensions (in float64) into the caller's
 * tensor, rounded once to its dtype. */
typedef struct grad_slot {
    imported imp;      // the caller's tensor, when given
    bool given;
    attn_tensor call;  // what the library writes
    attn_tensor dest;  // the caller's 4-D view, summed into from call when temp is set
    void *temp;        // owned scratch (float32, or float64 for a float64 input), NULL
                       // when the library writes the caller's memory
    bool reduce[2];    // batch, heads
} grad_slot;

static int grad_setup(grad_slot *g, PyObject *obj, const char *arg, const imported *input,
                      const char *input_name, const attn_tensor *x) {
    const int64_t *shape = x->shape;
    bool need_temp = obj == Py_None;
    if (obj != Py_None) {
        if (import_tensor(obj, arg, true, &g->imp) != 0) return -1;
        g->given = true;
        if (check_same_shape(&g->imp, input, arg, input_name) != 0) return -1;
        g->dest = to_4d(&g->imp);
        for (int d = 0; d < 2; d++) {
            g->reduce[d] = g->dest.shape[d] != shape[d];  // 1 under a broadcast size
            need_temp |= g->reduce[d];
        }
        if (!need_temp) {
            g->call = g->dest;
            return 0;
        }
        if (g->imp.dtype != ATTN_F32 && g->imp.dtype != ATTN_F16 &&
            g->imp.dtype != ATTN_BF16 && g->imp.dtype != ATTN_F64) {
            PyErr_Format(PyExc_TypeError, "%s: dtype %s, expected float32, float16, "
                         "bfloat16 or float64", arg, attn_dtype_name(g->imp.dtype));
            return -1;
        }
        for (int d = 0; d < 4; d++)
            if (g->dest.shape[d] > 1 && g->dest.stride[d] == 0) {
                PyErr_Format(PyExc_ValueError, "%s: stride 0 on dimension %d of size %lld: "
                             "its elements would overlap", arg, d - (4 - g->imp.ndim),
                             (long long)g->dest.shape[d]);
                return -1;
            }
    }
    int64_t count = 1;
    for (int d = 0; d < 4; d++)
        if (__builtin_mul_overflow(count, shape[d], &count) || count > (int64_t)(SIZE_MAX / 8)) {
            PyErr_Format(PyExc_ValueError, "%s: the broadcast gradient's size overflows", arg);
            return -1;
        }
    const attn_dtype tdt = x->dtype == ATTN_F64 ? ATTN_F64 : ATTN_F32;
    const size_t tsz = tdt == ATTN_F64 ? sizeof(double) : sizeof(float);
    g->temp = malloc((size_t)(count > 0 ? count : 1) * tsz);
    if (!g->temp) {
        PyErr_Format(PyExc_MemoryError, "%s: could not allocate %lld bytes for the broadcast "
                     "gradient", arg, (long long)count * (long long)tsz);
        return -1;
    }
    g->call = attn_tensor_4d(g->temp, tdt, shape[0], shape[1], shape[2], shape[3]);
    return 0;
}

/* x rounded once to dt (float32, float16 or bfloat16), to nearest even, stored at
 * base[idx]. For a 16-bit dt, x is first rounded to float32 *to odd* (the float32 nearest
 * x, moved one step towards x when it is inexact and even): float32 keeps at least two
 * more bits than either 16-bit type, so the library's float32 -> 16-bit rounding of that
 * is the correct rounding of x itself, with no double rounding. */
static void store_rounded(attn_dtype dt, void *base, int64_t idx, double x) {
    if (dt == ATTN_F64) {  // a float64 gradient: the float64 sum as it is
        ((double *)base)[idx] = x;
        return;
    }
    float f = (float)x;
    if (dt != ATTN_F32 && isfinite(f) && (double)f != x && !(attn_f32_bits(f) & 1u))
        f = nextafterf(f, x > (double)f ? INFINITY : -INFINITY);
    attn_store(dt, base, idx, f);
}

/* dest[b', h', i, e] = the sum of call[b, h, i, e] over the broadcast batch and head
 * indices (those of a dimension dest has as 1), in float64, in index order, rounded once
 * to dest's dtype. Runs without the GIL. */
static void grad_reduce(const grad_slot *g) {
    const attn_tensor *c = &g->call, *d = &g->dest;
    const float *src = c->data;
    const double *src64 = c->data;  // when the scratch is float64
    const int64_t B = c->shape[0], H = c->shape[1], L = c->shape[2], D = c->shape[3];
    for (int64_t b2 = 0; b2 < d->shape[0]; b2++)
        for (int64_t h2 = 0; h2 < d->shape[1]; h2++) {
            const int64_t b_lo = g->reduce[0] ? 0 : b2, b_hi = g->reduce[0] ? B : b2 + 1;
            const int64_t h_lo = g->reduce[1] ? 0 : h2, h_hi = g->reduce[1] ? H : h2 + 1;
            for (int64_t i = 0; i < L; i++)
                for (int64_t e = 0; e < D; e++) {
                    double s = 0.0;
                    for (int64_t b = b_lo; b < b_hi; b++)
                        for (int64_t h = h_lo; h < h_hi; h++)
                            s += c->dtype == ATTN_F64 ? src64[((b * H + h) * L + i) * D + e]
                                                      : src[((b * H + h) * L + i) * D + e];
                    store_rounded(d->dtype, d->data, b2 * d->stride[0] + h2 * d->stride[1] +
                                  i * d->stride[2] + e * d->stride[3], s);
                }
        }
}

static void grad_release(grad_slot *g) {
    imported_release(&g->imp);
    free(g->temp);
    g->temp = NULL;
}

const char py_backward_doc[] = PyDoc_STR(
"backward(query, key, value, out, grad_out, lse, grad_query, grad_key, grad_value,\n"
"         attn_mask, is_causal, scale, enable_gqa, align, window, softcap, alibi_slopes,\n"
"         kv_len, path, precision, threads, sinks=None, grad_sinks=None, *,\n"
"         dropout_p=0.0, dropout_seed=0, dropout_offset=0, grad_attn_mask=None)\n"
"--\n\n"
"Private: the gradients of forward() (attn_backward), behind the autograd of\n"
"attn.scaled_dot_product_attention. query ... threads are exactly the forward call's\n"
"arguments; out and lse are the forward's output and LSE (lse float32), grad_out =\n"
"dLoss/dout (any strides, stride 0 too). grad_query, grad_key and grad_value are writable\n"
"tensors of the shapes of query, key and value (any strides; None = not wanted), written\n"
"in place: the gradients of a broadcast batch or head dimension are summed (dK and dV\n"
"over the query heads of a group too). query, key/value (alike), out, grad_out and each\n"
"gradient may be float32, float16 or bfloat16: the library computes in float32 and\n"
"rounds each gradient once to its own dtype. No gradient for a bool mask or the slopes;\n"
"grad_attn_mask: None or a writable float32 tensor of a float attn_mask's shape that\n"
"gets its gradient (summed over its broadcast dimensions; options.d_bias). sinks: the\n"
"forward's (H,) float32 or None; grad_sinks: None or a writable (H,) float32 tensor that\n"
"gets the sinks' gradient (summed over the batch and rows).\n"
"The GIL is released. Returns None; on error nothing is written.");

PyObject *py_backward(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"query", "key", "value", "out", "grad_out", "lse", "grad_query",
                             "grad_key", "grad_value", "attn_mask", "is_causal", "scale",
                             "enable_gqa", "align", "window", "softcap", "alibi_slopes",
                             "kv_len", "path", "precision", "threads", "sinks", "grad_sinks",
                             "dropout_p", "dropout_seed", "dropout_offset", "grad_attn_mask",
                             NULL};
    PyObject *oq, *ok, *ov, *oo, *odo, *olse, *odq, *odk, *odv, *omask, *oscale, *owindow,
        *oalibi, *okvlen, *osinks = Py_None, *odsinks = Py_None, *odmask = Py_None;
    int causal, gqa, align, path, precision, threads;
    double softcap, dropout_p = 0.0;
    unsigned long long dropout_seed = 0, dropout_offset = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOOOOOpOpiOdOOiii|OO$dKKO:backward",
                                     kwlist, &oq, &ok, &ov, &oo, &odo, &olse, &odq, &odk, &odv,
                                     &omask, &causal, &oscale, &gqa, &align, &owindow, &softcap,
                                     &oalibi, &okvlen, &path, &precision, &threads, &osinks,
                                     &odsinks, &dropout_p, &dropout_seed, &dropout_offset,
                                     &odmask))
        return NULL;

    call_inputs c;
    if (call_options(&c, oscale, softcap, causal, align, owindow, path, precision, threads,
                     dropout_p, dropout_seed, dropout_offset) != 0)
        return NULL;

    enum { OUT, DOUT, LSE, DSINKS, DMASK, N_T };
    imported t[N_T];
    memset(t, 0, sizeof t);
    grad_slot g[3];
    memset(g, 0, sizeof g);
    PyObject *result = NULL;

    if (resolve_inputs(&c, oq, ok, ov, omask, oalibi, okvlen, gqa, true) != 0 ||
        set_sinks(&c, osinks) != 0)
        goto done;
    /* the sinks' gradient [H], float32, written in place */
    attn_tensor d_sinks;
    if (odsinks != Py_None) {
        if (import_tensor(odsinks, "grad_sinks", true, &t[DSINKS]) ||
            check_rank(&t[DSINKS], 1, 1, "1 (one per query head)"))
            goto done;
        d_sinks = (attn_tensor){t[DSINKS].data, t[DSINKS].dtype, {t[DSINKS].shape[0], 1, 1, 1},
                                {t[DSINKS].stride[0], 0, 0, 0}};
        c.opt.d_sinks = &d_sinks;
    }
    /* the float mask's gradient (options.d_bias): float32, attn_mask's shape, written in
     * place */
    attn_tensor d_bias;
    if (odmask != Py_None) {
        if (!c.opt.bias) {
            PyErr_SetString(PyExc_ValueError, "grad_attn_mask: attn_mask is not a float mask "
                            "(a bool mask or none has no gradient)");
            goto done;
        }
        if (import_tensor(odmask, "grad_attn_mask", true, &t[DMASK])) goto done;
        if (t[DMASK].dtype != ATTN_F32 || t[DMASK].ndim != c.t[IN_MASK].ndim) {
            PyErr_SetString(PyExc_ValueError, "grad_attn_mask: a float32 tensor of attn_mask's "
                            "shape is expected");
            goto done;
        }
        for (int d = 0; d < t[DMASK].ndim; d++)
            if (t[DMASK].shape[d] != c.t[IN_MASK].shape[d]) {
                PyErr_SetString(PyExc_ValueError, "grad_attn_mask: a float32 tensor of "
                                "attn_mask's shape is expected");
                goto done;
            }
        d_bias = to_4d(&t[DMASK]);
        for (int d = 0; d < 4; d++)
            if (d_bias.shape[d] == 1) d_bias.stride[d] = 0;
        c.opt.d_bias = &d_bias;
    }
    if (import_tensor(oo, "out", false, &t[OUT]) ||
        import_tensor(odo, "grad_out", false, &t[DOUT]) ||
        import_tensor(olse, "lse", false, &t[LSE]))
        goto done;
    const char *o_rank = "2 to 4 (..., L, Dv)";
    if (check_rank(&t[OUT], 2, 4, o_rank) || check_rank(&t[DOUT], 2, 4, o_rank) ||
        check_rank(&t[LSE], 1, 3, "1 to 3 (..., L)"))
        goto done;
    const attn_tensor o = to_4d(&t[OUT]), d_o = to_4d(&t[DOUT]), lse = lse_view(&t[LSE]);

    if (grad_setup(&g[0], odq, "grad_query", &c.t[IN_Q], "query", &c.q) ||
        grad_setup(&g[1], odk, "grad_key", &c.t[IN_K], "key", &c.k) ||
        grad_setup(&g[2], odv, "grad_value", &c.t[IN_V], "value", &c.v))
        goto done;

    attn_status st;
    size_t need = 0;
    const bool kept = attn_backward_workspace_size(&c.q, &c.k, &c.v, &o, &d_o, &lse, &g[0].call,
                                                   &g[1].call, &g[2].call, &c.opt,
                                                   &need) == ATTN_OK &&
                      workspace_take(WORKSPACE_BACKWARD, need, &c.opt);
    Py_BEGIN_ALLOW_THREADS
    st = attn_backward(&c.q, &c.k, &c.v, &o, &d_o, &lse, &g[0].call, &g[1].call, &g[2].call,
                       &c.opt);
    if (st == ATTN_OK)
        for (int i = 0; i < 3; i++)
            if (g[i].given && g[i].temp) grad_reduce(&g[i]);
    Py_END_ALLOW_THREADS
    if (kept) workspace_give(WORKSPACE_BACKWARD, &c.opt);
    if (st != ATTN_OK) {
        raise_status(st, g_backward_names, "attn_backward");
        goto done;
    }
    Py_INCREF(Py_None);
    result = Py_None;

done:
    inputs_release(&c);
    for (int i = 0; i < N_T; i++) imported_release(&t[i]);
    for (int i = 0; i < 3; i++) grad_release(&g[i]);
    return result;
}
