/*
 * bench_output.c — what `attn bench` prints: the machine line, the table of the cases
 *                  (medians, GFLOP/s, %peak, GB/s, %bw, the reference's and PyTorch's
 *                  times and ratios) with the failures after it, or the JSON document of
 *                  the same (--json, --json-out; docs/BENCHMARKS.md names its fields).
 *
 * What it is not: the measuring (bench_time.c, bench_machine.c) or a JSON library (it
 * writes this one document).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_sweep.h"

/* ---- output ------------------------------------------------------------------------- */

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

static void json_num(FILE *f, double v) {
    if (isfinite(v)) fprintf(f, "%.6g", v);
    else fputs("null", f);
}

double gflops(const bench_case *c, double t) { return t > 0 ? c->flop / t * 1e-9 : NAN; }

/* a decoding row's GB/s of K and V at its median time */
static double case_gbs(const bench_case *x) { return x->kv_bytes / x->t_med * 1e-9; }

void write_json(FILE *f, const machine *m, const bench_case *c, int n, const bench_args *a,
                const torch_proc *tp) {
    fprintf(f, "{\n  \"attn_version\": ");
    json_string(f, attn_version());
    fprintf(f, ",\n  \"kernel\": ");
    json_string(f, attn_kernel_name());
    fprintf(f, ",\n  \"threads\": %d,\n  \"reps\": %d,\n  \"warmup\": %d,\n  \"rounds\": %d,\n"
            "  \"quick\": %s,\n", m->threads, a->reps, a->warmup, a->rounds, a->quick ? "true" : "false");
    /* with a wisdom in use, each row's static and tuned medians (static_ms, tuned_ms) */
    fprintf(f, "  \"tuned\": %s, \"wisdom\": ", a->tuned ? "true" : "false");
    if (a->tuned && getenv("ATTN_WISDOM") && *getenv("ATTN_WISDOM")) json_string(f, getenv("ATTN_WISDOM"));
    else fputs(a->tuned ? "\"(the default path)\"" : "null", f);
    fputs(",\n", f);
    fprintf(f, "  \"machine\": {\"cpu\": ");
    json_string(f, m->cpu);
    fprintf(f, ", \"procs\": %d, \"measured\": %s", m->procs, m->measured ? "true" : "false");
    fprintf(f, ", \"others_cpu_pct\": ");
    json_num(f, m->others_pct);
    fprintf(f, ", \"loadavg_start\": [");
    for (int i = 0; i < 3; i++) json_num(f, m->load_start[i]), fputs(i < 2 ? ", " : "]", f);
    fprintf(f, ", \"loadavg_end\": [");
    for (int i = 0; i < 3; i++) json_num(f, m->load_end[i]), fputs(i < 2 ? ", " : "]", f);
    if (m->measured) {
        fprintf(f, ",\n    \"fma_peak\": [");
        for (int i = 0; i < m->npeaks; i++)
            fprintf(f, "%s{\"isa\": \"%s\", \"gflops_1\": %.1f, \"gflops_n\": %.1f}",
                    i ? ", " : "", m->peaks[i].isa, m->peaks[i].gflops_1, m->peaks[i].gflops_n);
        fprintf(f, "],\n    \"other_peaks\": [");
        for (int i = 0; i < m->nothers; i++)
            fprintf(f, "%s{\"isa\": \"%s\", \"what\": \"%s\", \"gflops_1\": %.1f, \"gflops_n\": %.1f}",
                    i ? ", " : "", m->others[i].isa, m->others[i].what, m->others[i].gflops_1,
                    m->others[i].gflops_n);
        fprintf(f, "],\n    \"peak_isa\": \"%s\", \"peak_gflops_1\": %.1f, \"peak_gflops_n\": %.1f,\n",
                m->peak_isa, m->peak_1, m->peak_n);
        fprintf(f, "    \"bw_isa\": \"%s\", \"bw_mib\": %g, \"bw_gbs_1\": %.4g, \"bw_gbs_n\": %.4g",
                m->bw_isa, m->bw_mib, m->bw_1, m->bw_n);
    }
    fprintf(f, "},\n  \"torch\": ");
    if (tp && tp->version[0]) {
        fprintf(f, "{\"version\": ");
        json_string(f, tp->version);
        fprintf(f, ", \"info\": ");
        json_string(f, tp->info);
        fprintf(f, "}");
    } else {
        fprintf(f, "null");
    }
    fprintf(f, ",\n  \"cases\": [\n");
    for (int i = 0; i < n; i++) {
        const bench_case *x = &c[i];
        fprintf(f, "    {\"name\": \"%s\", \"B\": %lld, \"Hq\": %lld, \"Hkv\": %lld, \"Lq\": %lld, "
                "\"Lk\": %lld, \"Dk\": %lld, \"Dv\": %lld, \"mask\": \"%s\", \"dtype\": \"float32\"",
                x->name, (long long)x->B, (long long)x->Hq, (long long)x->Hkv, (long long)x->Lq,
                (long long)x->Lk, (long long)x->Dk, (long long)x->Dv, MASK_NAME[x->mask]);
        if (x->mask == MASK_WINDOW)
            fprintf(f, ", \"window_left\": %lld, \"window_right\": %lld", (long long)x->win_left,
                    (long long)x->win_right);
        if (x->mask == MASK_BOOL) fprintf(f, ", \"mask_density\": %g", BOOL_MASK_DENSITY);
        fprintf(f, ", \"dtype\": \"%s\", \"kv_dtype\": \"%s\", \"precision\": \"%s\", "
                "\"direction\": \"%s\"", attn_dtype_name(x->qdt), attn_dtype_name(x->kvdt),
                x->prec == ATTN_PRECISION_FAST ? "fast" : "default",
                x->bwd ? "backward" : "forward");
        if (x->base[0]) fprintf(f, ", \"base\": \"%s\"", x->base);
        if (x->base_ratio > 0) fprintf(f, ", \"speedup_vs_base\": %.4g", x->base_ratio);
        if (x->qdt != ATTN_F32 || x->kvdt != ATTN_F32) {
            fprintf(f, ", \"naive_max_abs\": ");
            json_num(f, x->naive_err);
        }
        fprintf(f, ",\n     \"decode\": %s, \"flop\": %.6g, \"kv_bytes\": %.6g, \"rotate\": %d, "
                "\"threads\": %d, \"kernel\": \"%s\", \"ran\": %s, \"check\": \"%s\", \"checked\": ",
                x->decode ? "true" : "false", x->flop, x->kv_bytes, x->rotate, m->threads,
                attn_kernel_name(), x->ran ? "true" : "false",
                !x->ran ? "skipped" : x->error[0] ? "error" : x->pass ? "pass" : "fail");
        json_string(f, x->checked);
        fprintf(f, ", \"rel_fro\": ");
        json_num(f, x->rel_fro);
        fprintf(f, ", \"max_abs\": ");
        json_num(f, x->max_abs);
        fprintf(f, ", \"tol_abs\": ");
        json_num(f, x->tol_abs);
        if (x->error[0]) {
            fprintf(f, ", \"error\": ");
            json_string(f, x->error);
        }
        if (x->ran && !x->error[0] && x->pass) {
            fprintf(f, ",\n     \"reps\": %d, \"median_s\": %.6g, \"min_s\": %.6g, \"max_s\": %.6g, "
                    "\"gflops\": %.4g", x->reps, x->t_med, x->t_min, x->t_max, gflops(x, x->t_med));
            if (m->measured)
                fprintf(f, ", \"pct_peak\": %.1f",
                        100 * gflops(x, x->t_med) / machine_kernel_peak(m, attn_kernel_name(), NULL));
            if (x->s_med > 0)
                fprintf(f, ",\n     \"tuned_ms\": %.6g, \"static_ms\": %.6g, \"static_min_ms\": %.6g, "
                        "\"static_max_ms\": %.6g, \"static_over_tuned\": %.4g", 1e3 * x->t_med,
                        1e3 * x->s_med, 1e3 * x->s_min, 1e3 * x->s_max, x->s_med / x->t_med);
            if (x->decode) {
                fprintf(f, ", \"gbs\": %.4g", case_gbs(x));
                if (x->bw_here > 0)
                    fprintf(f, ", \"bw_here_gbs\": %.4g, \"pct_bw\": %.1f", x->bw_here,
                            100 * case_gbs(x) / x->bw_here);
                if (m->measured) fprintf(f, ", \"pct_bw_start\": %.1f", 100 * case_gbs(x) / m->bw_n);
            }
        }
        if (x->ref_med > 0)
            fprintf(f, ", \"ref_median_s\": %.6g, \"ref_gflops\": %.3f", x->ref_med, gflops(x, x->ref_med));
        if (x->torch_med > 0) {
            fprintf(f, ",\n     \"torch_reps\": %d, \"torch_median_s\": %.6g, \"torch_min_s\": %.6g, "
                    "\"torch_max_s\": %.6g, \"torch_gflops\": %.2f", x->torch_reps, x->torch_med,
                    x->torch_min, x->torch_max, gflops(x, x->torch_med));
            if (x->decode) fprintf(f, ", \"torch_gbs\": %.2f", x->kv_bytes / x->torch_med * 1e-9);
            if (x->ran && !x->error[0] && x->pass) fprintf(f, ", \"speedup_vs_torch\": %.4g", x->torch_med / x->t_med);
        }
        if (x->torch_error[0]) {
            fprintf(f, ", \"torch_error\": ");
            json_string(f, x->torch_error);
        }
        fprintf(f, "}%s\n", i + 1 < n ? "," : "");
    }
    fprintf(f, "  ]\n}\n");
}

void print_table(FILE *f, const machine *m, const bench_case *c, int n, const torch_proc *tp) {
    fprintf(f, "attn %s, kernel %s, %d threads, CPU: %s (%d logical); other processes used "
            "%.0f%% of the CPU time during this run (load average %.2f at the start, %.2f at the "
            "end)\n", attn_version(), attn_kernel_name(), m->threads, m->cpu, m->procs,
            m->others_pct, m->load_start[0], m->load_end[0]);
    if (m->measured) {
        fprintf(f, "fp32 FMA peak:");
        for (int i = 0; i < m->npeaks; i++)
            fprintf(f, "%s %s %.1f GFLOP/s on 1 thread, %.1f on %d", i ? ";" : "", m->peaks[i].isa,
                    m->peaks[i].gflops_1, m->peaks[i].gflops_n, m->threads);
        for (int i = 0; i < m->nothers; i++)
            fprintf(f, "\n%s peak: %.1f GFLOP/s on 1 thread, %.1f on %d (not the peak of the "
                    "fp32 rows)", m->others[i].what, m->others[i].gflops_1, m->others[i].gflops_n,
                    m->threads);
        fprintf(f, "\nread bandwidth (%g MiB, %s loads): %.1f GB/s on 1 thread, %.1f on %d\n",
                m->bw_mib, m->bw_isa, m->bw_1, m->bw_n, m->threads);
    }
    if (tp && tp->version[0]) fprintf(f, "torch %s (%s)\n", tp->version, tp->info);
    if (n == 0) return;
    const char *peak_isa;
    machine_kernel_peak(m, attn_kernel_name(), &peak_isa);
    fprintf(f, "medians; GFLOP/s = 2*(Dk+Dv)*B*Hq*pairs/time (x2.5 for bwd-* rows); %%peak of the "
            "%d-thread fp32 FMA peak of the kernel's ISA (%s loops); GB/s = K and V bytes/time; %%bw of the median GB/s of a plain "
            "read of as many bytes, timed after each call (memory bandwidth drifts); dtype Q/KV, "
            "+F = FAST precision; x f32 = this row's speed over the float32 row of the same shape\n\n",
            m->threads, peak_isa);
    bool tuned = false;  // a wisdom in use: the static medians too (cli_bench.c)
    for (int i = 0; i < n; i++) tuned |= c[i].sts != NULL;
    if (tuned)
        fprintf(f, "a wisdom is in use: ms = tuned; static ms = the same calls with the library's "
                "static choices, timed in turns with them; x static = static ms / ms\n\n");
    fprintf(f, "%-29s %-22s %-6s %-10s %3s %-10s %-5s %9s %8s %6s %7s %5s %9s %7s %9s %8s %7s %6s",
            "case", "B Hq/Hkv Lq Lk D", "mask", "dtype", "thr", "kernel", "check", "ms",
            "GFLOP/s", "%peak", "GB/s", "%bw", "ref ms", "x ref", "torch ms", "t GF/s", "x torch",
            "x f32");
    if (tuned) fprintf(f, " %9s %8s", "static ms", "x static");
    fputc('\n', f);
    for (int i = 0; i < n; i++) {
        const bench_case *x = &c[i];
        char shape[64], cell[16][24];
        snprintf(shape, sizeof shape, "%lld %lld/%lld %lld %lld %lld", (long long)x->B,
                 (long long)x->Hq, (long long)x->Hkv, (long long)x->Lq, (long long)x->Lk,
                 (long long)x->Dk);
        for (int k = 0; k < 16; k++) snprintf(cell[k], sizeof cell[k], "-");
        const bool ok = x->ran && !x->error[0] && x->pass;
        if (ok) {
            snprintf(cell[0], 24, "%.3f", x->t_med * 1e3);
            snprintf(cell[1], 24, "%.1f", gflops(x, x->t_med));
            if (m->measured)
                snprintf(cell[2], 24, "%.0f%%",
                         100 * gflops(x, x->t_med) / machine_kernel_peak(m, attn_kernel_name(), NULL));
            if (x->decode) {
                snprintf(cell[3], 24, "%.1f", case_gbs(x));
                const double bw = x->bw_here > 0 ? x->bw_here : m->measured ? m->bw_n : 0;
                if (bw > 0) snprintf(cell[4], 24, "%.0f%%", 100 * case_gbs(x) / bw);
            }
            if (x->ref_med > 0) {
                snprintf(cell[5], 24, "%.1f", x->ref_med * 1e3);
                snprintf(cell[6], 24, "%.0fx", x->ref_med / x->t_med);
            }
        }
        if (x->torch_med > 0) {
            snprintf(cell[7], 24, "%.3f", x->torch_med * 1e3);
            snprintf(cell[8], 24, "%.1f", gflops(x, x->torch_med));
            if (ok) snprintf(cell[9], 24, "%.2fx", x->torch_med / x->t_med);
        } else if (x->torch_error[0]) {
            snprintf(cell[7], 24, "error");
        }
        if (ok && x->base_ratio > 0) snprintf(cell[10], 24, "%.2fx", x->base_ratio);
        char dt[24];
        if (x->qdt == x->kvdt) snprintf(dt, sizeof dt, "%s", dtype_short(x->qdt));
        else snprintf(dt, sizeof dt, "%s/%s", dtype_short(x->qdt), dtype_short(x->kvdt));
        if (x->prec == ATTN_PRECISION_FAST) strcat(dt, "+F");
        fprintf(f, "%-29s %-22s %-6s %-10s %3d %-10s %-5s %9s %8s %6s %7s %5s %9s %7s %9s %8s %7s %6s",
                x->name, shape, MASK_NAME[x->mask], dt, m->threads, attn_kernel_name(),
                !x->ran ? "skip" : x->error[0] ? "ERROR" : x->pass ? "ok" : "FAIL", cell[0],
                cell[1], cell[2], cell[3], cell[4], cell[5], cell[6], cell[7], cell[8], cell[9],
                cell[10]);
        if (tuned && ok && x->s_med > 0) {
            snprintf(cell[11], 24, "%.3f", x->s_med * 1e3);
            snprintf(cell[12], 24, "%.2fx", x->s_med / x->t_med);
        }
        if (tuned) fprintf(f, " %9s %8s", cell[11], cell[12]);
        fputc('\n', f);
    }
    for (int i = 0; i < n; i++) {
        const bench_case *x = &c[i];
        if (x->error[0]) fprintf(f, "%s: %s\n", x->name, x->error);
        else if (x->ran && !x->pass && (x->qdt != ATTN_F32 || x->kvdt != ATTN_F32))
            fprintf(f, "%s: check FAILED (%s): max abs %.3g, limit %.3g = 2 x the naive "
                    "same-precision max abs %.3g + 2^-23 (1 + max|ref|)\n", x->name, x->checked,
                    x->max_abs, x->tol_abs, x->naive_err);
        else if (x->ran && !x->pass)
            fprintf(f, "%s: check FAILED (%s): relative Frobenius %.3g (limit 1e-6), max abs "
                    "%.3g (limit %.3g)\n", x->name, x->checked, x->rel_fro, x->max_abs, x->tol_abs);
        if (x->torch_error[0]) fprintf(f, "%s: torch: %s\n", x->name, x->torch_error);
    }
}
