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

static int run(int argc, char **argv) {
    run_args a;
    attn_options opt;
    int rc = cli_run_parse(argc, argv, &a, &opt);  // prints its own usage errors (every process)
    if (rc) return rc;
    const char *refused = a.mask ? "--mask" : a.alibi ? "--alibi" : a.weights ? "--weights"
                          : a.block_table ? "--block-table" : NULL;  // a paged cache: not split
    if (refused)
        return say(g_rank == 0, 2, "%s is not taken by the ring (see 'attn ring --help')", refused);

    /* the files by attn run's rules, on process 0, before anything is read */
    cli_path in[4], out[2];
    int n_in = 0, n_out = 0;
    in[n_in++] = (cli_path){.opt = "--q", .path = a.q};
    in[n_in++] = (cli_path){.opt = "--k", .path = a.k};
    in[n_in++] = (cli_path){.opt = "--v", .path = a.v};
    if (a.kv_len) in[n_in++] = (cli_path){.opt = "--kv-len", .path = a.kv_len};
    out[n_out++] = (cli_path){.opt = "--out", .path = a.out};
    if (a.lse) out[n_out++] = (cli_path){.opt = "--lse", .path = a.lse};
    if (g_rank == 0) {
        char err[512];
        const int x = cli_files_check(in, n_in, out, n_out, err, sizeof err);
        if (x) rc = say(true, x == -2 ? 2 : 1, "%s", err);
    }
    if ((rc = agree(rc))) {
        if (g_rank == 0) cli_files_abort(out, n_out);
        return rc;
    }

    npy_array q = {0}, k = {0}, v = {0}, kvl = {0};
    void *o = NULL, *go = NULL;
    float *lse = NULL, *glse = NULL;
    attn_tensor tkvl;
    /* the shapes, then this process's rows */
    if ((rc = read_shape(a.q, &q)) || (rc = read_shape(a.k, &k)) || (rc = read_shape(a.v, &v))) goto done;
    if (q.ndim != 4 || k.ndim != 4 || v.ndim != 4) {
        rc = say(g_rank == 0, 1, "%s: rank %d, expected rank 4 [B, H, L, D]",
                 q.ndim != 4 ? a.q : k.ndim != 4 ? a.k : a.v, q.ndim != 4 ? q.ndim : k.ndim != 4 ? k.ndim : v.ndim);
        goto done;
    }
    const int64_t B = q.shape[0], Hq = q.shape[1], Lq = q.shape[2], Dk = q.shape[3];
    const int64_t Hkv = k.shape[1], Lk = k.shape[2], Dv = v.shape[3];
    if (k.shape[0] != B || k.shape[3] != Dk || v.shape[0] != B || v.shape[1] != Hkv || v.shape[2] != Lk) {
        rc = say(g_rank == 0, 1, "%s, %s, %s: shapes do not agree (Q [B, Hq, Lq, Dk], K [B, Hkv, "
                 "Lk, Dk], V [B, Hkv, Lk, Dv])", a.q, a.k, a.v);
        goto done;
    }
    if (!a.dtype && k.dtype != v.dtype) {
        rc = say(g_rank == 0, 1, "%s: dtype %s, expected %s like %s (K and V share one dtype; "
                 "or use --dtype)", a.v, attn_dtype_name(v.dtype), attn_dtype_name(k.dtype), a.k);
        goto done;
    }
    const bool zz = opt.causal;
    int64_t fq[2], nq[2], fk[2], nk[2];
    attn_ring_slice(Lq, g_size, g_rank, zz, fq, nq);
    attn_ring_slice(Lk, g_size, g_rank, zz, fk, nk);
    npy_free(&q), npy_free(&k), npy_free(&v);
    rc = read_slice(a.q, fq, nq, &q);
    if (!rc) rc = read_slice(a.k, fk, nk, &k);
    if (!rc) rc = read_slice(a.v, fk, nk, &v);
    attn_dtype o_dt = q.dtype == ATTN_F16 && k.dtype == ATTN_F16 && v.dtype == ATTN_F16 ? ATTN_F16 : ATTN_F32;
    if (!rc && a.dtype) {
        o_dt = !strcmp(a.dtype, "f16") ? ATTN_F16 : !strcmp(a.dtype, "bf16") ? ATTN_BF16 : ATTN_F32;
        if (!(rc = convert_to(&q, o_dt)) && !(rc = convert_to(&k, o_dt))) rc = convert_to(&v, o_dt);
    }
    if (!rc && a.kv_len) {
        char err[256];
        if (npy_read(a.kv_len, &kvl, err, sizeof err)) {
            rc = say(g_rank == 0, 1, "%s: %s", a.kv_len, err);
        } else if ((kvl.dtype != ATTN_I32 && kvl.dtype != ATTN_I64) || kvl.ndim != 1 || kvl.shape[0] != B) {
            rc = say(g_rank == 0, 1, "%s: expected int32 or int64 [B] = [%lld]", a.kv_len, (long long)B);
        } else {
            tkvl = attn_tensor_4d(kvl.data, kvl.dtype, B, 1, 1, 1);
            opt.kv_len = &tkvl;
        }
    }
    if ((rc = agree(rc))) goto done;

    const int64_t lq = nq[0] + nq[1], lk = nk[0] + nk[1];
    const size_t o_es = attn_dtype_size(o_dt);
    o = calloc((size_t)(B * Hq * lq * Dv) + 1, o_es);
    lse = calloc((size_t)(B * Hq * lq) + 1, sizeof(float));
    if (!o || !lse) rc = say(true, 1, "out of memory");
    if ((rc = agree(rc))) goto done;
    const attn_tensor tq = attn_tensor_4d(q.data, q.dtype, B, Hq, lq, Dk);
    const attn_tensor tk = attn_tensor_4d(k.data, k.dtype, B, Hkv, lk, Dk);
    const attn_tensor tv = attn_tensor_4d(v.data, v.dtype, B, Hkv, lk, Dv);
    const attn_tensor to = attn_tensor_4d(o, o_dt, B, Hq, lq, Dv);
    const attn_tensor tl = attn_tensor_4d(lse, ATTN_F32, B, Hq, lq, 1);
    opt.lse = &tl;
    const attn_status st = attn_ring_forward(&tq, &tk, &tv, &to, &opt, MPI_COMM_WORLD, NULL);
    if (st != ATTN_OK) {  // every process has the same status
        const char *d = attn_ring_last_error();
        rc = say(g_rank == 0, 1, "%s (%s)", *d ? d : attn_status_string(st), attn_status_string(st));
        goto done;
    }

    /* gathered at process 0 and written there */
    if (g_rank == 0) {
        go = malloc((size_t)(B * Hq * Lq * Dv + 1) * 4);  // room to widen bfloat16 in place
        glse = malloc((size_t)(B * Hq * Lq + 1) * sizeof(float));
        if (!go || !glse) rc = say(true, 1, "out of memory gathering O");
    }
    if ((rc = agree(rc))) goto done;
    gather_rows(go, o, B * Hq, Lq, Dv, o_es, zz);
    gather_rows((char *)glse, lse, B * Hq, Lq, 1, 4, zz);
    if (g_rank == 0) {
        char err[512];
        const int64_t n = B * Hq * Lq * Dv;
        if (o_dt == ATTN_BF16) {  // NumPy has no bfloat16: its float32 values, exactly
            for (int64_t e = n - 1; e >= 0; e--)
                ((float *)go)[e] = attn_bf16_to_f32(((const uint16_t *)go)[e]);
            o_dt = ATTN_F32;
        }
        if (cli_files_write(&out[0], o_dt, 4, (int64_t[]){B, Hq, Lq, Dv}, go, err, sizeof err) ||
            (a.lse && cli_files_write(&out[1], ATTN_F32, 3, (int64_t[]){B, Hq, Lq}, glse, err, sizeof err)) ||
            cli_files_commit(out, n_out, err, sizeof err))
            rc = say(true, 1, "%s", err);
    }
    rc = agree(rc);

done:
    if (g_rank == 0) cli_files_abort(out, n_out);
    npy_free(&q), npy_free(&k), npy_free(&v), npy_free(&kvl);
    free(o), free(lse), free(go), free(glse);
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
