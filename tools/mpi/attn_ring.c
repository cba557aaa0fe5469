/*
 * attn_ring.c — attn-ring, what `attn ring` runs (tools/attn/cli_ring_exec.c execs it): `attn
 *               run` over the processes of an MPI communicator with libattn_mpi's ring.
 *
 *   mpirun -n P attn ring --q Q.npy --k K.npy --v V.npy --out O.npy [--lse LSE.npy]
 *          [--causal] [--align ...] [--scale S] [--softcap C] [--window L,R]
 *          [--kv-len LENS.npy] [--dtype f32|f16|bf16] [--precision ...] [--threads N]
 *
 * The options are `attn run`'s, parsed by its own parser (cli_run_parse); --mask,
 * --alibi, --weights and --block-table are refused (usage): the ring takes no mask and no
 * paged cache, and the weights [B, Hq, Lq, Lk] are what a ring exists not to hold. Process 0 checks the paths by
 * `attn run`'s file rules before anything is read; every process reads only its own
 * rows of Q, K and V (npy_read_rows: contiguous, or zigzag with --causal), the ring
 * computes, and process 0 gathers O (and the LSE) and writes the files `attn run` would,
 * all-or-nothing. Every process returns the same exit status: 0, 1 data or library
 * error, 2 usage; messages are printed once (by process 0, or by the process whose read
 * failed).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_mpi.h"
#include "cli_files.h"
#include "cli_run.h"
#include "cliopt.h"
#include "core/half.h"
#include "npy.h"

static int g_rank, g_size;

static const char USAGE[] =
    "usage: mpirun -n P attn ring --q Q.npy --k K.npy --v V.npy --out O.npy [options]\n"
    "\n"
    "  attn run's attention, computed by P processes with ring attention over MPI: each\n"
    "  reads only its own rows of Q, K and V (contiguous; two chunks with --causal, the\n"
    "  zigzag split) and process 0 writes O (and --lse) as attn run would.\n"
    "\n"
    "  Options as attn run's: --causal, --align, --scale, --softcap, --window, --kv-len,\n"
    "  --lse, --threads (per process), --dtype, --precision, --reference (each block on\n"
    "  the float64 path). Not taken: --mask, --alibi, --weights, --block-table. --causal\n"
    "  needs Lq = Lk.\n"
    "  Exit status: 0 done, 1 bad data or library error, 2 usage error; the same on every\n"
    "  process.\n";

/* A message "attn: ring: ..." on stderr when `print`; returns code. */
#define say(print, code, ...) ((print) ? cli_say(code, "ring: ", __VA_ARGS__) : (code))

/* The worst exit status of every process (usage 2 over data 1 over 0). */
static int agree(int rc) {
    int all = 0;
    MPI_Allreduce(&rc, &all, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return all;
}

/* Q, K or V's rows [first, count) (two ranges) along axis 2, with the file's checks. */
static int read_slice(const char *path, const int64_t first[2], const int64_t count[2],
                      npy_array *a) {
    char err[256];
    if (npy_read_rows(path, 2, 2, first, count, a, NULL, err, sizeof err))
        return say(true, 1, "%s: %s", path, err);
    return 0;
}

/* Q, K or V's shape (nothing of its data is read); the same on every process. */
static int read_shape(const char *path, npy_array *a) {
    char err[256];
    int64_t len = 0;
    if (npy_read_rows(path, 2, 0, NULL, NULL, a, &len, err, sizeof err))
        return say(g_rank == 0, 1, "%s: %s", path, err);
    a->shape[2] = len;
    if (a->dtype != ATTN_F32 && a->dtype != ATTN_F16)
        return say(g_rank == 0, 1, "%s: dtype %s, expected float32 or float16", path,
                   attn_dtype_name(a->dtype));
    return 0;
}

static int convert_to(npy_array *a, attn_dtype dtype) {
    if (a->dtype == dtype) return 0;
    void *buf = malloc((size_t)(a->count > 0 ? a->count : 1) * attn_dtype_size(dtype));
    if (!buf) return say(true, 1, "out of memory converting to %s", attn_dtype_name(dtype));
    for (int64_t e = 0; e < a->count; e++) attn_store(dtype, buf, e, attn_load(a->dtype, a->data, e));
    free(a->data);
    a->data = buf;
    a->dtype = dtype;
    return 0;
}

/* Process p's rows of a [B, H, L, D] array (dense, its chunks one after the other) put
 * into place in the global dense array g. */
static void place_rows(char *g, const char *local, int64_t BH, int64_t L, int64_t D, size_t es,
                       const int64_t first[2], const int64_t count[2]) {
    for (int64_t bh = 0; bh < BH; bh++)
        for (int c = 0; c < 2; c++) {
            const size_t n = (size_t)(count[c] * D) * es;
            memcpy(g + (size_t)((bh * L + first[c]) * D) * es, local, n);
            local += n;
        }
}

/* bytes from process `from` to 0, in messages of at most 1 GiB */
static void recv_bytes(void *buf, size_t bytes, int from) {
    for (size_t at = 0; at < bytes; at += (size_t)1 << 30) {
        const size_t n = bytes - at < ((size_t)1 << 30) ? bytes - at : (size_t)1 << 30;
        MPI_Recv((char *)buf + at, (int)n, MPI_BYTE, from, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    }
}

static void send_bytes(const void *buf, size_t bytes) {
    for (size_t at = 0; at < bytes; at += (size_t)1 << 30) {
        const size_t n = bytes - at < ((size_t)1 << 30) ? bytes - at : (size_t)1 << 30;
        MPI_Send((const char *)buf + at, (int)n, MPI_BYTE, 0, 7, MPI_COMM_WORLD);
    }
}

/* Every process's slice of a [B, H, L, D] output (elements of es bytes) into g at 0. */
static void gather_rows(char *g, const void *local, int64_t BH, int64_t L, int64_t D, size_t es,
                        bool zigzag) {
    int64_t f[2], n[2];
    for (int p = 0; p < g_size; p++) {
        attn_ring_slice(L, g_size, p, zigzag, f, n);
        const size_t bytes = (size_t)(BH * (n[0] + n[1]) * D) * es;
        if (g_rank == 0) {
            char *buf = p == 0 ? (char *)local : malloc(bytes ? bytes : 1);
            if (p != 0) recv_bytes(buf, bytes, p);
            place_rows(g, buf, BH, L, D, es, f, n);
            if (p != 0) free(buf);
        } else if (p == g_rank) {
            send_bytes(local, bytes);
        }
    }
}

/* One call's work: the options, the files, this process's rows of the inputs and of the
 * outputs, and at process 0 the gathered outputs; ring_job_free releases it all. */
typedef struct ring_job {
    run_args a;
    attn_options opt;  // its kv_len points at tkvl
    cli_path in[4], out[2];
    int n_in, n_out;
    npy_array q, k, v, kvl;
    attn_tensor tkvl;
    int64_t B, Hq, Lq, Dk, Hkv, Lk, Dv;
    bool zz;                               // the zigzag split (--causal)
    int64_t fq[2], nq[2], fk[2], nk[2];    // this process's rows of Q and of K, V
    attn_dtype o_dt;
    void *o, *go;        // this process's O, the gathered one (process 0)
    float *lse, *glse;   // the same for the LSE
} ring_job;

/* attn run's options (its usage errors printed by every process), less those refused. */
static int parse_options(int argc, char **argv, ring_job *j) {
    const run_args *a = &j->a;
    int rc = cli_run_parse(argc, argv, &j->a, &j->opt);  // prints its own usage errors (every process)
    if (rc) return rc;
    const char *refused = a->mask ? "--mask" : a->alibi ? "--alibi" : a->weights ? "--weights"
                          : a->block_table ? "--block-table" : NULL;  // a paged cache: not split
    if (refused)
        return say(g_rank == 0, 2, "%s is not taken by the ring (see 'attn ring --help')", refused);
    return 0;
}

/* The files by attn run's rules, on process 0, before anything is read. */
static int check_files(ring_job *j) {
    const run_args *a = &j->a;
    int rc = 0;
    j->in[j->n_in++] = (cli_path){.opt = "--q", .path = a->q};
    j->in[j->n_in++] = (cli_path){.opt = "--k", .path = a->k};
    j->in[j->n_in++] = (cli_path){.opt = "--v", .path = a->v};
    if (a->kv_len) j->in[j->n_in++] = (cli_path){.opt = "--kv-len", .path = a->kv_len};
    j->out[j->n_out++] = (cli_path){.opt = "--out", .path = a->out};
    if (a->lse) j->out[j->n_out++] = (cli_path){.opt = "--lse", .path = a->lse};
    if (g_rank == 0) {
        char err[512];
        const int x = cli_files_check(j->in, j->n_in, j->out, j->n_out, err, sizeof err);
        if (x) rc = say(true, x == -2 ? 2 : 1, "%s", err);
    }
    if ((rc = agree(rc))) {
        if (g_rank == 0) cli_files_abort(j->out, j->n_out);
        return rc;
    }
    return 0;
}

/* Q, K and V's shapes (the same on every process) read and checked against each other. */
static int check_shapes(ring_job *j) {
    const run_args *a = &j->a;
    const npy_array *q = &j->q, *k = &j->k, *v = &j->v;
    int rc;
    if ((rc = read_shape(a->q, &j->q)) || (rc = read_shape(a->k, &j->k)) || (rc = read_shape(a->v, &j->v)))
        return rc;
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4)
        return say(g_rank == 0, 1, "%s: rank %d, expected rank 4 [B, H, L, D]",
                   q->ndim != 4 ? a->q : k->ndim != 4 ? a->k : a->v,
                   q->ndim != 4 ? q->ndim : k->ndim != 4 ? k->ndim : v->ndim);
    const int64_t B = j->B = q->shape[0], Dk = j->Dk = q->shape[3];
    j->Hq = q->shape[1], j->Lq = q->shape[2];
    const int64_t Hkv = j->Hkv = k->shape[1], Lk = j->Lk = k->shape[2];
    j->Dv = v->shape[3];
    if (k->shape[0] != B || k->shape[3] != Dk || v->shape[0] != B || v->shape[1] != Hkv || v->shape[2] != Lk)
        return say(g_rank == 0, 1, "%s, %s, %s: shapes do not agree (Q [B, Hq, Lq, Dk], K [B, Hkv, "
                   "Lk, Dk], V [B, Hkv, Lk, Dv])", a->q, a->k, a->v);
    if (!a->dtype && k->dtype != v->dtype)
        return say(g_rank == 0, 1, "%s: dtype %s, expected %s like %s (K and V share one dtype; "
                   "or use --dtype)", a->v, attn_dtype_name(v->dtype), attn_dtype_name(k->dtype), a->k);
    return 0;
}

/* This process's rows of Q, K and V, in the call's dtype, and --kv-len; the worst status
 * of every process. */
static int read_rows(ring_job *j) {
    const run_args *a = &j->a;
    npy_array *q = &j->q, *k = &j->k, *v = &j->v;
    j->zz = j->opt.causal;
    attn_ring_slice(j->Lq, g_size, g_rank, j->zz, j->fq, j->nq);
    attn_ring_slice(j->Lk, g_size, g_rank, j->zz, j->fk, j->nk);
    npy_free(q), npy_free(k), npy_free(v);
    int rc = read_slice(a->q, j->fq, j->nq, q);
    if (!rc) rc = read_slice(a->k, j->fk, j->nk, k);
    if (!rc) rc = read_slice(a->v, j->fk, j->nk, v);
    j->o_dt = q->dtype == ATTN_F16 && k->dtype == ATTN_F16 && v->dtype == ATTN_F16 ? ATTN_F16 : ATTN_F32;
    if (!rc && a->dtype) {
        j->o_dt = !strcmp(a->dtype, "f16") ? ATTN_F16 : !strcmp(a->dtype, "bf16") ? ATTN_BF16 : ATTN_F32;
        if (!(rc = convert_to(q, j->o_dt)) && !(rc = convert_to(k, j->o_dt))) rc = convert_to(v, j->o_dt);
    }
    if (!rc && a->kv_len) {
        char err[256];
        npy_array *kvl = &j->kvl;
        if (npy_read(a->kv_len, kvl, err, sizeof err)) {
            rc = say(g_rank == 0, 1, "%s: %s", a->kv_len, err);
        } else if ((kvl->dtype != ATTN_I32 && kvl->dtype != ATTN_I64) || kvl->ndim != 1 || kvl->shape[0] != j->B) {
            rc = say(g_rank == 0, 1, "%s: expected int32 or int64 [B] = [%lld]", a->kv_len, (long long)j->B);
        } else {
            j->tkvl = attn_tensor_4d(kvl->data, kvl->dtype, j->B, 1, 1, 1);
            j->opt.kv_len = &j->tkvl;
        }
    }
    return agree(rc);
}

/* The ring's forward on this process's rows, into its O and LSE. */
static int compute(ring_job *j) {
    const int64_t B = j->B, Hq = j->Hq, Hkv = j->Hkv, Dk = j->Dk, Dv = j->Dv;
    const int64_t lq = j->nq[0] + j->nq[1], lk = j->nk[0] + j->nk[1];
    int rc = 0;
    j->o = calloc((size_t)(B * Hq * lq * Dv) + 1, attn_dtype_size(j->o_dt));
    j->lse = calloc((size_t)(B * Hq * lq) + 1, sizeof(float));
    if (!j->o || !j->lse) rc = say(true, 1, "out of memory");
    if ((rc = agree(rc))) return rc;
    const attn_tensor tq = attn_tensor_4d(j->q.data, j->q.dtype, B, Hq, lq, Dk);
    const attn_tensor tk = attn_tensor_4d(j->k.data, j->k.dtype, B, Hkv, lk, Dk);
    const attn_tensor tv = attn_tensor_4d(j->v.data, j->v.dtype, B, Hkv, lk, Dv);
    const attn_tensor to = attn_tensor_4d(j->o, j->o_dt, B, Hq, lq, Dv);
    const attn_tensor tl = attn_tensor_4d(j->lse, ATTN_F32, B, Hq, lq, 1);
    attn_options opt = j->opt;
    opt.lse = &tl;
    const attn_status st = attn_ring_forward(&tq, &tk, &tv, &to, &opt, MPI_COMM_WORLD, NULL);
    if (st != ATTN_OK) {  // every process has the same status
        const char *d = attn_ring_last_error();
        return say(g_rank == 0, 1, "%s (%s)", *d ? d : attn_status_string(st), attn_status_string(st));
    }
    return 0;
}

/* O and the LSE gathered at process 0 and written there, all-or-nothing. */
static int gather_and_write(ring_job *j) {
    const int64_t B = j->B, Hq = j->Hq, Lq = j->Lq, Dv = j->Dv;
    int rc = 0;
    if (g_rank == 0) {
        j->go = malloc((size_t)(B * Hq * Lq * Dv + 1) * 4);  // room to widen bfloat16 in place
        j->glse = malloc((size_t)(B * Hq * Lq + 1) * sizeof(float));
        if (!j->go || !j->glse) rc = say(true, 1, "out of memory gathering O");
    }
    if ((rc = agree(rc))) return rc;
    gather_rows(j->go, j->o, B * Hq, Lq, Dv, attn_dtype_size(j->o_dt), j->zz);
    gather_rows((char *)j->glse, j->lse, B * Hq, Lq, 1, 4, j->zz);
    if (g_rank == 0) {
        char err[512];
        const int64_t n = B * Hq * Lq * Dv;
        attn_dtype o_dt = j->o_dt;
        if (o_dt == ATTN_BF16) {  // NumPy has no bfloat16: its float32 values, exactly
            for (int64_t e = n - 1; e >= 0; e--)
                ((float *)j->go)[e] = attn_bf16_to_f32(((const uint16_t *)j->go)[e]);
            o_dt = ATTN_F32;
        }
        if (cli_files_write(&j->out[0], o_dt, 4, (int64_t[]){B, Hq, Lq, Dv}, j->go, err, sizeof err) ||
            (j->a.lse && cli_files_write(&j->out[1], ATTN_F32, 3, (int64_t[]){B, Hq, Lq}, j->glse, err,
                                         sizeof err)) ||
            cli_files_commit(j->out, j->n_out, err, sizeof err))
            rc = say(true, 1, "%s", err);
    }
    return agree(rc);
}

static void ring_job_free(ring_job *j) {
    if (g_rank == 0) cli_files_abort(j->out, j->n_out);
    npy_free(&j->q), npy_free(&j->k), npy_free(&j->v), npy_free(&j->kvl);
    free(j->o), free(j->lse), free(j->go), free(j->glse);
}

static int run(int argc, char **argv) {
    ring_job j = {0};
    int rc = parse_options(argc, argv, &j);
    if (rc || (rc = check_files(&j))) return rc;
    if (!(rc = check_shapes(&j)) && !(rc = read_rows(&j)) && !(rc = compute(&j)))
        rc = gather_and_write(&j);
    ring_job_free(&j);
    return rc;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    int rc = 0;
    bool help = false;
    for (int i = 1; i < argc; i++) help |= !strcmp(argv[i], "--help") || !strcmp(argv[i], "-h");
    if (help) {
        if (g_rank == 0) fputs(USAGE, stdout);
    } else {
        rc = run(argc, argv);
    }
    MPI_Finalize();
    return rc;
}
