/*
 * onnx_case.h — one ONNX Attention conformance case as its manifest.json describes it
 *               (the attributes and which inputs and outputs exist), for test_onnx.c.
 */
#ifndef ATTN_TESTS_ONNX_CASE_H
#define ATTN_TESTS_ONNX_CASE_H

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "json.h"

/* ONNX's positional inputs and outputs; the .npy files are named after them. */
enum { IN_Q, IN_K, IN_V, IN_MASK, IN_PAST_K, IN_PAST_V, IN_NONPAD, IN_COUNT };
enum { OUT_Y, OUT_PRESENT_K, OUT_PRESENT_V, OUT_QK, OUT_COUNT };
static const char *const in_names[IN_COUNT] = {
    "Q", "K", "V", "attn_mask", "past_key", "past_value", "nonpad_kv_seqlen"};
static const char *const out_names[OUT_COUNT] = {"Y", "present_key", "present_value",
                                                 "qk_matmul_output"};

typedef struct onnx_case {
    const char *name;
    /* attributes_effective */
    bool causal, has_scale, has_window, has_softmax_precision;
    double scale, softcap;
    int64_t qk_mode, window_left, window_right;
    /* derived */
    bool layout3d, fp16;
    int64_t B, Hq, Hkv, Sq, Skv, past, T, D, Dv;
    bool has_in[IN_COUNT], has_out[OUT_COUNT];
} onnx_case;

/* Fills c from the manifest; 0 on success, -1 with a reason. */
static int parse_manifest(const jnode *m, onnx_case *c, char *err, size_t errlen) {
    const jnode *attr = jget(m, "attributes_effective");
    const jnode *der = jget(m, "derived");
    const jnode *ins = jget(m, "node_inputs_positional");
    const jnode *outs = jget(m, "node_outputs_positional");
    if (!attr || attr->type != J_OBJ || !der || der->type != J_OBJ || !ins ||
        ins->type != J_ARR || !outs || outs->type != J_ARR) {
        snprintf(err, errlen,
                 "manifest lacks attributes_effective, derived or node_*_positional");
        return -1;
    }
    int64_t v;
    if (jget_i64(attr, "is_causal", &v) != 0 || (v != 0 && v != 1)) {
        snprintf(err, errlen, "is_causal missing or not 0/1");
        return -1;
    }
    c->causal = v == 1;
    const jnode *sc = jget(attr, "scale");
    if (!sc || (sc->type != J_NULL && sc->type != J_NUM)) {
        snprintf(err, errlen, "scale missing or neither null nor a number");
        return -1;
    }
    c->has_scale = sc->type == J_NUM;
    c->scale = c->has_scale ? sc->num : 0.0;
    const jnode *cap = jget(attr, "softcap");
    c->softcap = (cap && cap->type == J_NUM) ? cap->num : 0.0;
    if (cap && cap->type != J_NUM && cap->type != J_NULL) {
        snprintf(err, errlen, "softcap is not a number");
        return -1;
    }
    c->qk_mode = 0;
    const jnode *qm = jget(attr, "qk_matmul_output_mode");
    if (qm && qm->type != J_NULL &&
        (jget_i64(attr, "qk_matmul_output_mode", &c->qk_mode) != 0 || c->qk_mode < 0 ||
         c->qk_mode > 3)) {
        snprintf(err, errlen, "qk_matmul_output_mode is not 0..3");
        return -1;
    }
    const jnode *sp = jget(attr, "softmax_precision");
    c->has_softmax_precision = sp && sp->type != J_NULL;
    /* Opset 25 windows; the keys are absent before opset 25. -1 = unbounded. */
    const jnode *wl = jget(attr, "left_window_size"), *wr = jget(attr, "right_window_size");
    c->window_left = c->window_right = -1;
    if ((wl && wl->type != J_NULL &&
         jget_i64(attr, "left_window_size", &c->window_left) != 0) ||
        (wr && wr->type != J_NULL &&
         jget_i64(attr, "right_window_size", &c->window_right) != 0) ||
        c->window_left < -1 || c->window_right < -1) {
        snprintf(err, errlen, "left/right_window_size not integers >= -1");
        return -1;
    }
    c->has_window = (wl && wl->type != J_NULL) || (wr && wr->type != J_NULL);

    const jnode *layout = jget(der, "layout"), *dtype = jget(der, "dtype");
    if (!layout || layout->type != J_STR || !dtype || dtype->type != J_STR) {
        snprintf(err, errlen, "derived.layout / derived.dtype missing");
        return -1;
    }
    if (strcmp(layout->str, "3D") == 0)
        c->layout3d = true;
    else if (strcmp(layout->str, "4D") == 0)
        c->layout3d = false;
    else {
        snprintf(err, errlen, "unknown layout '%s'", layout->str);
        return -1;
    }
    if (strcmp(dtype->str, "float16") == 0)
        c->fp16 = true;
    else if (strcmp(dtype->str, "float32") == 0)
        c->fp16 = false;
    else {
        snprintf(err, errlen, "unsupported dtype '%s'", dtype->str);
        return -1;
    }

    struct {
        const char *key;
        int64_t *dst;
    } dims[] = {
        {"batch", &c->B},     {"q_num_heads", &c->Hq}, {"kv_num_heads", &c->Hkv},
        {"q_seq", &c->Sq},    {"kv_seq", &c->Skv},     {"past_seq", &c->past},
        {"total_seq", &c->T}, {"head_size", &c->D},    {"v_head_size", &c->Dv},
    };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        if (jget_i64(der, dims[i].key, dims[i].dst) != 0 || *dims[i].dst < 0) {
            snprintf(err, errlen, "derived.%s missing or negative", dims[i].key);
            return -1;
        }
    }
    if (c->T != c->past + c->Skv) {
        snprintf(err, errlen, "total_seq %lld != past_seq %lld + kv_seq %lld", (long long)c->T,
                 (long long)c->past, (long long)c->Skv);
        return -1;
    }
    /* In the 3-D layout the head counts come from the attributes; they must agree. */
    if (c->layout3d) {
        int64_t hq, hkv;
        if (jget_i64(attr, "q_num_heads", &hq) != 0 ||
            jget_i64(attr, "kv_num_heads", &hkv) != 0 || hq != c->Hq || hkv != c->Hkv) {
            snprintf(err, errlen,
                     "3-D layout without q_num_heads/kv_num_heads matching derived");
            return -1;
        }
    }

    int i = 0;
    for (const jnode *n = ins->child; n; n = n->next, i++) {
        if (n->type != J_STR || i >= IN_COUNT) {
            snprintf(err, errlen, "bad node_inputs_positional");
            return -1;
        }
        c->has_in[i] = n->str[0] != '\0';
    }
    i = 0;
    for (const jnode *n = outs->child; n; n = n->next, i++) {
        if (n->type != J_STR || i >= OUT_COUNT) {
            snprintf(err, errlen, "bad node_outputs_positional");
            return -1;
        }
        c->has_out[i] = n->str[0] != '\0';
    }
    if (!c->has_in[IN_Q] || !c->has_in[IN_K] || !c->has_in[IN_V] || !c->has_out[OUT_Y]) {
        snprintf(err, errlen, "Q, K, V or Y missing");
        return -1;
    }
    if (c->has_in[IN_PAST_K] != c->has_in[IN_PAST_V] ||
        (!c->has_in[IN_PAST_K] && c->past != 0)) {
        snprintf(err, errlen, "past_key/past_value inconsistent with past_seq");
        return -1;
    }
    return 0;
}

#endif /* ATTN_TESTS_ONNX_CASE_H */
