/*
 * model.h — the small character-level transformer of `attn train`, in plain C on top of
 *           libattn: token and position embeddings, `layers` blocks of pre-norm multi-head
 *           self-attention (the library's module, attn_mha_forward / attn_mha_backward)
 *           and a GELU MLP, a final layer norm, a projection to the vocabulary,
 *           cross-entropy, AdamW.
 *
 * What it is not: a framework. One model, float32, its products through the library's
 * BLAS, its other layers' forward and backward written by hand (examples/train/model_ops.h),
 * its activations allocated once for `batch`
 * sequences of `ctx` tokens. Deterministic: the same seed and data give the same bits on
 * any thread count (every loop and the library are).
 */
#ifndef ATTN_MODEL_H
#define ATTN_MODEL_H

#include <stdbool.h>
#include <stdint.h>

typedef struct model_config {
    int vocab;      /* V: token ids 0 .. V-1                                           */
    int ctx;        /* T: the longest sequence (learned positions 0 .. T-1)            */
    int d_model;    /* C                                                                */
    int heads;      /* H, with C % H == 0                                               */
    int layers;     /* blocks                                                           */
    int batch;      /* B: the most sequences one forward takes                          */
    bool reversed;  /* the attention mask: false = causal (each position sees itself and
                       the past), true = the reverse (itself and the future)            */
    uint64_t seed;  /* the initialization's random stream                               */
} model_config;

typedef struct model model;

/* A model with freshly initialized parameters; NULL when the sizes are invalid or memory
 * runs out (the reason in *why). */
model *model_create(const model_config *cfg, const char **why);
void model_free(model *m);

int64_t model_param_count(const model *m);
float *model_params(model *m);  /* (model_param_count) the parameters, one array   */
float *model_grads(model *m);   /* (model_param_count) their gradients            */

/* The forward pass over b sequences of t tokens (b <= batch, t <= ctx), tokens (b, t)
 * ids. With targets (b, t), *loss gets the mean cross-entropy in nats; without, the
 * probabilities are still computed. 0 on success, -1 when the library refuses a call
 * (the message in model_error). */
int model_forward(model *m, const int *tokens, const int *targets, int b, int t, double *loss);

/* The gradients of the latest forward's mean loss (it must have had targets), added to
 * model_grads (zero them first with model_zero_grad). 0 or -1 as model_forward. */
int model_backward(model *m);
void model_zero_grad(model *m);

/* One AdamW step (beta1 0.9, beta2 0.95, eps 1e-8; weight decay wd on the matrices only)
 * after clipping the gradient to a global norm of at most clip. Returns the norm before
 * clipping. */
double model_adamw(model *m, double lr, double wd, double clip);

/* After model_forward: probabilities (b * t, V) and per-token losses (b * t). */
const float *model_probs(const model *m);
const float *model_losses(const model *m);

const char *model_error(const model *m);

/* After model_forward: the attention inputs of block `layer` for sequence 0 of the latest
 * forward, Q, K and V each [H, t, D] dense, one after the other in out (3 * H * t * D
 * floats, t the forward's sequence length). 0, or -1 for a layer out of range. */
int model_attention_inputs(const model *m, int layer, float *out);

#endif /* ATTN_MODEL_H */
