#!/usr/bin/env python3
"""bench_plot.py — the plot and the Markdown table of docs/BENCHMARKS.md, from the JSON
that `attn bench --json` (or --json-out FILE) writes.

Usage (matplotlib is in the bench's venv, made by `attn bench --setup-torch`):
  .venv-bench/bin/python scripts/bench_plot.py bench.json --png docs/bench/fwd_fp32.png
  python3 scripts/bench_plot.py bench.json --markdown       (the table; needs no matplotlib)

--markdown prints the results table, then the targets of issues 3, 5 and 6 against this run.
The plot: GFLOP/s against the sequence length L = Lq = Lk of the "fwd-*" cases, one panel
without a mask and one causal, attn and PyTorch for each head dimension, with the
measured FMA peak as a line. What it is not: a measurement: it draws what the JSON holds.
"""
import argparse
import json
import sys


def fmt(v, spec, missing="–"):
    return missing if v is None else format(v, spec)


def ms(seconds):
    """milliseconds with three significant digits (at least the integer part)"""
    if seconds is None:
        return "–"
    v = seconds * 1e3
    return "%.0f" % v if v >= 100 else "%.3g" % v


def markdown(d):
    m = d["machine"]
    out = []
    if m.get("measured"):
        out.append("Measured in the same run: fp32 FMA peak %.1f GFLOP/s on 1 thread, %.1f on %d "
                   "(%s); read bandwidth %.1f GB/s on 1 thread, %.1f on %d."
                   % (m["peak_gflops_1"], m["peak_gflops_n"], d["threads"], m["peak_isa"],
                      m["bw_gbs_1"], m["bw_gbs_n"], d["threads"]))
    t = d.get("torch")
    out.append("attn %s, kernel %s, %d threads%s." % (
        d["attn_version"], d["kernel"], d["threads"],
        "; PyTorch %s (%s)" % (t["version"], t["info"]) if t else ""))
    out.append("")
    out.append("| case | B | Hq/Hkv | Lq | Lk | D | mask | dtype | check | attn ms | GFLOP/s | % peak "
               "| GB/s | % bw | reference ms | torch ms | torch GFLOP/s | attn / torch | × f32 row |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in d["cases"]:
        out.append("| %s | %d | %d/%d | %d | %d | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s "
                   "| %s | %s | %s | %s |" % (
                       c["name"], c["B"], c["Hq"], c["Hkv"], c["Lq"], c["Lk"], c["Dk"], c["mask"],
                       dtype(c), c["check"], ms(c.get("median_s")), fmt(c.get("gflops"), ".1f"),
                       fmt(c.get("pct_peak"), ".0f"), fmt(c.get("gbs"), ".1f"),
                       fmt(c.get("pct_bw"), ".0f"), ms(c.get("ref_median_s")),
                       ms(c.get("torch_median_s")), fmt(c.get("torch_gflops"), ".1f"),
                       fmt(c.get("speedup_vs_torch"), ".2f"), fmt(c.get("speedup_vs_base"), ".2f")))
    return "\n".join(out)


SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def dtype(c):
    """Q/KV dtype, + FAST precision, as the printed table writes it"""
    q, kv = SHORT[c.get("dtype", "float32")], SHORT[c.get("kv_dtype", "float32")]
    return (q if q == kv else q + "/" + kv) + (" FAST" if c.get("precision") == "fast" else "")


def bw_cell(c):
    """a decoding row's % of the read bandwidth: of the plain read timed beside its calls,
    and of the run's opening measurement when there was one"""
    here = c.get("bw_here_gbs")
    cell = "%.0f%%" % c["pct_bw"] + (" of %.1f GB/s read beside it" % here if here else "")
    if here and c.get("pct_bw_start") is not None:
        cell += " (%.0f%% of the opening measurement)" % c["pct_bw_start"]
    return cell


def targets(d):
    """issue 3's targets, each against this run: a Markdown table."""
    cases = {c["name"]: c for c in d["cases"]}
    rows = []

    issue = [3]

    def row(what, name, value, goal, ok):
        rows.append("| #%d | %s | %s | %s | %s | %s |" % (
            issue[0], what, name, value, goal, "–" if ok is None else "yes" if ok else "**no**"))

    for L in (2048, 4096):
        for D, pct in ((64, 65), (128, 70)):
            for causal in (False, True):
                name = "fwd-L%d-D%d%s" % (L, D, "-causal" if causal else "")
                c = cases.get(name)
                if not c or c.get("pct_peak") is None:
                    continue
                goal = 60 if causal else pct
                row("% of peak", name, "%.0f%%" % c["pct_peak"], "≥ %d%%" % goal, c["pct_peak"] >= goal)
                s = c.get("speedup_vs_torch")
                row("× PyTorch", name, "–" if s is None else "%.2f×" % s, "≥ 1.5×",
                    None if s is None else s >= 1.5)
    c = cases.get("decode-Lk16384-D128")
    if c and c.get("pct_bw") is not None:
        row("% of read bandwidth", c["name"], bw_cell(c), "≥ 75%", c["pct_bw"] >= 75)
    slower_ref = [c["name"] for c in d["cases"] if c.get("ref_median_s") and c.get("median_s")
                  and c["median_s"] > c["ref_median_s"]]
    timed_ref = [c for c in d["cases"] if c.get("ref_median_s")]
    row("not slower than the reference", "%d cases timed on both" % len(timed_ref),
        ", ".join(slower_ref) or "none slower", "none slower", not slower_ref if timed_ref else None)
    slower_torch = [c["name"] for c in d["cases"] if c.get("speedup_vs_torch") is not None
                    and c["speedup_vs_torch"] < 1]
    timed_torch = [c for c in d["cases"] if c.get("speedup_vs_torch") is not None]
    row("not slower than PyTorch", "%d cases timed on both" % len(timed_torch),
        ", ".join(slower_torch) or "none slower", "none slower",
        not slower_torch if timed_torch else None)
    # issue 5: 16-bit rows against the float32 row of the same shape, in the same run
    issue[0] = 5
    for name, goal in (("fwd-L4096-D128-bf16", 1.4), ("fwd-L4096-D128-bf16-fast", 1.8)):
        c = cases.get(name)
        if c and c.get("speedup_vs_base") is not None:
            row("× the float32 row", name, "%.2f×" % c["speedup_vs_base"], "≥ %.1f×" % goal,
                c["speedup_vs_base"] >= goal)
    for name in ("decode-Lk16384-D128-kvbf16", "decode-Lk16384-D128-kvf16", "decode-Lk16384-D128-bf16"):
        c = cases.get(name)
        if not c:
            continue
        if c.get("speedup_vs_base") is not None:
            row("× the float32-cache row", name, "%.2f×" % c["speedup_vs_base"], "≥ 1.8×",
                c["speedup_vs_base"] >= 1.8)
        if c.get("pct_bw") is not None:
            row("% of read bandwidth", name, bw_cell(c), "≥ 75%", c["pct_bw"] >= 75)
    torch16 = [c for c in d["cases"] if c.get("dtype", "float32") != "float32"
               or c.get("kv_dtype", "float32") != "float32"]
    if torch16:
        have = [c["name"] for c in torch16 if c.get("torch_median_s")]
        row("PyTorch 16-bit SDPA in the same table", "%d 16-bit rows" % len(torch16),
            "%d timed" % len(have), "all", len(have) == len(torch16))
    # issue 6: the float32 backward
    issue[0] = 6
    for c in d["cases"]:
        if c.get("direction") != "backward" or c["Lq"] != 2048:
            continue
        if c.get("pct_peak") is not None:
            row("% of peak", c["name"], "%.0f%%" % c["pct_peak"], "≥ 50%", c["pct_peak"] >= 50)
        s = c.get("speedup_vs_torch")
        row("× PyTorch backward", c["name"], "–" if s is None else "%.2f×" % s, "≥ 1.5×",
            None if s is None else s >= 1.5)
    return "\n".join(["| issue | target | case | measured | goal | met |",
                      "|---|---|---|---|---|---|"] + rows)


def plot(d, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fwd = [c for c in d["cases"] if c["name"].startswith("fwd-") and c.get("gflops")
           and c.get("dtype", "float32") == "float32"]
    dims = sorted({c["Dk"] for c in fwd})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), sharey=True)
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    for ax, mask, title in zip(axes, ["none", "causal"], ["no mask", "causal (top-left)"]):
        for ci, dim in enumerate(dims):
            rows = sorted((c for c in fwd if c["mask"] == mask and c["Dk"] == dim),
                          key=lambda c: c["Lq"])
            if not rows:
                continue
            L = [c["Lq"] for c in rows]
            ax.plot(L, [c["gflops"] for c in rows], "o-", color=colors[ci % 4],
                    label="attn D=%d" % dim)
            tr = [(c["Lq"], c["torch_gflops"]) for c in rows if c.get("torch_gflops")]
            if tr:
                ax.plot([x for x, _ in tr], [y for _, y in tr], "s--", color=colors[ci % 4],
                        alpha=0.6, label="PyTorch D=%d" % dim)
        m = d["machine"]
        if m.get("measured"):
            ax.axhline(m["peak_gflops_n"], color="gray", lw=1, ls=":")
            ax.text(min(c["Lq"] for c in fwd), m["peak_gflops_n"] * 0.97,
                    "measured fp32 FMA peak, %d threads" % d["threads"], va="top", fontsize=8,
                    color="gray")
        ax.set_xscale("log", base=2)
        ls = sorted({c["Lq"] for c in fwd})
        ax.set_xticks(ls)
        ax.set_xticklabels([str(x) for x in ls])
        ax.minorticks_off()
        ax.set_xlabel("sequence length L = Lq = Lk")
        ax.set_title("fp32 forward, B=%s, H=%s, %s" % (
            "/".join(sorted({str(c["B"]) for c in fwd})),
            "/".join(sorted({str(c["Hq"]) for c in fwd})), title))
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    axes[0].set_ylabel("GFLOP/s (causal: half the FLOPs)")
    axes[0].legend(fontsize=8, loc="lower right")
    t = d.get("torch")
    rounds = d.get("rounds", 1)
    fig.suptitle("attn %s (%s kernel) vs %s, %d threads, %s; medians of one run%s" % (
        d["attn_version"], d["kernel"], "PyTorch %s" % t["version"] if t else "(no PyTorch)",
        d["threads"], d["machine"]["cpu"], " (%d rounds)" % rounds if rounds > 1 else ""),
        fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", help="the output of attn bench --json")
    ap.add_argument("--png", help="write the plot here")
    ap.add_argument("--markdown", action="store_true", help="print the Markdown table")
    a = ap.parse_args()
    with open(a.json) as f:
        d = json.load(f)
    if a.markdown:
        print(markdown(d))
        print()
        print(targets(d))
    if a.png:
        plot(d, a.png)
    if not a.markdown and not a.png:
        ap.error("nothing to do: give --png and/or --markdown")
    return 0


if __name__ == "__main__":
    sys.exit(main())
