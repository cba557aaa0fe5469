/*
 * test_team_threshold.c — calls below the work threshold run on the calling thread
 *                         (src/core/team.h, ATTN_TEAM_MIN_FLOPS), above it on the team, and
 *                         either way give the bits of 1 thread.
 *
 * What it covers: for the threshold in force (the default, or the environment's), shapes
 * just below and just above it (B = 1, Hq = 4, Hkv = 2, Lq = 8, D = 16, Lk chosen from the
 * threshold; for the backward the threshold over ATTN_TEAM_BACKWARD_PASSES): the decision
 * itself (attn_run_parallel on the call's params), then O and the LSE of the float32
 * forward, with a bool mask that is not key padding as well, and dQ, dK, dV of the
 * backward, on 2 and 3 threads against 1 thread, bit for bit; the float64 forward
 * likewise. A negative control: the same comparison against a call with one element of
 * Q changed must see a difference.
 * What it is not: the threshold's value (docs/KERNELS.md has its measurement).
 */
#include <string.h>

#include "attn.h"
#include "check.h"
#include "core/team.h"

enum { HQ = 4, HKV = 2, LQ = 8, D = 16, LK_MAX = 4096 };

static float g_q[HQ * LQ * D], g_k[HKV * LK_MAX * D], g_v[HKV * LK_MAX * D], g_do[HQ * LQ * D];
static uint8_t g_mask[LQ * LK_MAX];

typedef struct result {
    float o[HQ * LQ * D], lse[HQ * LQ], dq[HQ * LQ * D], dk[HKV * LK_MAX * D], dv[HKV * LK_MAX * D];
    double o64[HQ * LQ * D];
} result;

/* the Lk whose flops (team.h) are just below (above = false) or at or above the threshold */
static int64_t lk_at(double threshold, bool above) {
    const double per_key = 2.0 * HQ * LQ * (2 * D);
    int64_t lk = (int64_t)(threshold / per_key);
    while (lk * per_key >= threshold) lk--;
    return above ? lk + 1 : lk;
}

static void run(int64_t lk, bool mask, int threads, bool backward, result *r) {
    attn_tensor q = attn_tensor_4d(g_q, ATTN_F32, 1, HQ, LQ, D);
    attn_tensor k = attn_tensor_4d(g_k, ATTN_F32, 1, HKV, lk, D);
    attn_tensor v = attn_tensor_4d(g_v, ATTN_F32, 1, HKV, lk, D);
    attn_tensor o = attn_tensor_4d(r->o, ATTN_F32, 1, HQ, LQ, D);
    attn_tensor lse = attn_tensor_4d(r->lse, ATTN_F32, 1, HQ, LQ, 1);
    attn_tensor m = attn_tensor_4d(g_mask, ATTN_BOOL, 1, 1, LQ, lk);
    m.stride[2] = LK_MAX;
    attn_options opt = {0};
    opt.threads = threads;
    opt.mask = mask ? &m : NULL;
    attn_options fo = opt;
    fo.lse = &lse;
    CHECK(attn_forward(&q, &k, &v, &o, &fo) == ATTN_OK, "forward: %s", attn_last_error());
    if (backward) {
        attn_tensor d_o = attn_tensor_4d(g_do, ATTN_F32, 1, HQ, LQ, D);
        attn_tensor dq = attn_tensor_4d(r->dq, ATTN_F32, 1, HQ, LQ, D);
        attn_tensor dk = attn_tensor_4d(r->dk, ATTN_F32, 1, HKV, lk, D);
        attn_tensor dv = attn_tensor_4d(r->dv, ATTN_F32, 1, HKV, lk, D);
        CHECK(attn_backward(&q, &k, &v, &o, &d_o, &lse, &dq, &dk, &dv, &opt) == ATTN_OK,
              "backward: %s", attn_last_error());
    }
    /* the float64 forward on the same values */
    static double q64[HQ * LQ * D], k64[HKV * LK_MAX * D], v64[HKV * LK_MAX * D];
    for (int i = 0; i < HQ * LQ * D; i++) q64[i] = g_q[i];
    for (int64_t i = 0; i < HKV * lk * D; i++) k64[i] = g_k[i], v64[i] = g_v[i];
    attn_tensor q2 = attn_tensor_4d(q64, ATTN_F64, 1, HQ, LQ, D);
    attn_tensor k2 = attn_tensor_4d(k64, ATTN_F64, 1, HKV, lk, D);
    attn_tensor v2 = attn_tensor_4d(v64, ATTN_F64, 1, HKV, lk, D);
    attn_tensor o2 = attn_tensor_4d(r->o64, ATTN_F64, 1, HQ, LQ, D);
    CHECK(attn_forward(&q2, &k2, &v2, &o2, &opt) == ATTN_OK, "float64 forward: %s", attn_last_error());
}

/* whether the call of Lk lk on threads threads would wake its team (backward: passes) */
static bool decides_team(int64_t lk, int threads, double passes) {
    attn_tensor q = attn_tensor_4d(g_q, ATTN_F32, 1, HQ, LQ, D);
    attn_tensor k = attn_tensor_4d(g_k, ATTN_F32, 1, HKV, lk, D);
    float o[HQ * LQ * D];
    attn_tensor to = attn_tensor_4d(o, ATTN_F32, 1, HQ, LQ, D);
    attn_options opt = {0};
    opt.threads = threads;
    attn_params p;
    CHECK(ai_params_init(&p, &q, &k, &k, &to, &opt, true) == ATTN_OK, "params: %s", attn_last_error());
    return attn_run_parallel(&p, passes);
}

static int differs(const result *a, const result *b, int64_t lk, bool backward) {
    int d = memcmp(a->o, b->o, sizeof a->o) != 0 || memcmp(a->lse, b->lse, sizeof a->lse) != 0;
    d |= (memcmp(a->o64, b->o64, sizeof a->o64) != 0) << 1;
    if (backward)
        d |= (memcmp(a->dq, b->dq, sizeof a->dq) != 0 || memcmp(a->dk, b->dk, (size_t)(HKV * lk * D) * 4) != 0 ||
              memcmp(a->dv, b->dv, (size_t)(HKV * lk * D) * 4) != 0) << 2;
    return d;
}

int main(void) {
    uint64_t s = 12345;
    for (int i = 0; i < HQ * LQ * D; i++) g_q[i] = (float)((s = s * 6364136223846793005u + 1) >> 40) / (1 << 24) - 0.5f;
    for (int i = 0; i < HQ * LQ * D; i++) g_do[i] = (float)((s = s * 6364136223846793005u + 1) >> 40) / (1 << 24) - 0.5f;
    for (int i = 0; i < HKV * LK_MAX * D; i++) {
        g_k[i] = (float)((s = s * 6364136223846793005u + 1) >> 40) / (1 << 24) - 0.5f;
        g_v[i] = (float)((s = s * 6364136223846793005u + 1) >> 40) / (1 << 24) - 0.5f;
    }
    for (int i = 0; i < LQ * LK_MAX; i++) g_mask[i] = (i * 2654435761u >> 7) % 5 != 0;  // not key padding
    static result one, many, other;
    const double t = ai_team_min_flops();
    printf("threshold %.3g flops\n", t);
    for (int bwd = 0; bwd <= 1; bwd++) {
        const double passes = bwd ? ATTN_TEAM_BACKWARD_PASSES : 1.0;
        for (int above = 0; above <= 1; above++) {
            const int64_t lk = lk_at(t / passes, above);
            if (lk < 1 || lk > LK_MAX) {
                printf("  %s %s: Lk %lld out of this test's range, skipped\n", bwd ? "backward" : "forward",
                       above ? "above" : "below", (long long)lk);
                continue;
            }
            CHECK(decides_team(lk, 2, passes) == (bool)above, "%s, Lk %lld: team %d, expected %d",
                  bwd ? "backward" : "forward", (long long)lk, !above, above);
            CHECK(!decides_team(lk, 1, passes), "Lk %lld: 1 thread wakes a team", (long long)lk);
            for (int mask = 0; mask <= 1; mask++) {
                run(lk, mask, 1, bwd, &one);
                for (int threads = 2; threads <= 3; threads++) {
                    run(lk, mask, threads, bwd, &many);
                    const int d = differs(&one, &many, lk, bwd);
                    CHECK(d == 0, "%s %s the threshold (Lk %lld), mask %d, %d threads: bits differ from 1 "
                          "thread (0x%x: 1 float32 O/LSE, 2 float64 O, 4 gradients)", bwd ? "backward" : "forward",
                          above ? "above" : "below", (long long)lk, mask, threads, d);
                }
                /* negative control: one element of Q changed must show */
                g_q[3] += 0.25f;
                run(lk, mask, 2, bwd, &other);
                g_q[3] -= 0.25f;
                const int d = differs(&one, &other, lk, bwd);
                CHECK((d & 3) == 3 && (!bwd || (d & 4)), "Lk %lld: a changed Q went unseen (0x%x)",
                      (long long)lk, d);
            }
        }
    }
    return check_summary("team_threshold");
}
