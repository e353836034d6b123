#!/usr/bin/env python3
"""Baselines: bench/baselines/NAME.json (a bench's JSON with a "meta" block: commit, date, command) and NAME.png.

Turns the JSON of `spattn bench --json` (CPU, or CUDA: Multigrain vs cuSPARSE) or of `spattn tsvd bench --json` into
a baseline, and draws the plot of any baseline (bench/gpu_bench.py's fused runs too, with the plot gpu_bench.py itself
writes):

  python3 bench/baseline.py out/cpu.json cpu-epyc-2c        # -> bench/baselines/cpu-epyc-2c.{json,png}
  python3 bench/baseline.py --png bench/baselines/*.json     # redraw the plots of existing baselines

The recorded JSON text is kept as it is; only the meta block is put in front of it. The commit is $SPATTN_COMMIT
(for trees without their own .git: git archive copies, the device machine), else the working tree's (git rev-parse,
"+dirty" if it has changes), else "unknown"; the date is the run's own where the JSON has one. Plots need matplotlib
(`pip install matplotlib`); without it the JSON is still written. bench/tables.py imports this file: nothing here
may need more than the standard library at import time.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# $SPATTN_BASELINES: write them elsewhere (on a machine whose tree does not come back, e.g. $OUT/baselines)
BASELINES = os.environ.get("SPATTN_BASELINES") or os.path.join(HERE, "baselines")


def commit():
    """$SPATTN_COMMIT, else the commit the working tree is at ("+dirty" with uncommitted changes), else "unknown"."""
    if os.environ.get("SPATTN_COMMIT"):
        return os.environ["SPATTN_COMMIT"]
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def meta(name, command, date=None):
    return {"baseline": name, "commit": commit(), "date": date or datetime.datetime.now().isoformat(timespec="seconds"),
            "command": command}


def with_meta(text, block):
    """The JSON text with a top-level "meta" block put first; the rest of the text kept byte for byte."""
    if "meta" in json.loads(text):
        raise ValueError("the JSON already has a meta block")
    i = text.index("{") + 1
    m = json.dumps(block)
    return text[:i] + (f'\n "meta": {m},' if text[i:i + 1] == "\n" else f'"meta": {m},\n ') + text[i:]


def kind(doc):
    """fused (bench/gpu_bench.py), unfused (spattn bench --device cuda), cpu (spattn bench --device cpu), backward
    (bench/bwd_bench.py), tsvd (spattn tsvd bench: rows with tsvd_ms; a "kind": "tsvd" field where it has one) or
    model (bench/model_bench.py), windows (bench/windows_bench.py) or runtime (bench/runtime_bench.py)."""
    if doc.get("kind") in ("backward", "tsvd", "model", "windows", "runtime"):
        return doc["kind"]
    if doc.get("rows") and all("tsvd_ms" in r for r in doc["rows"]):
        return "tsvd"
    if doc.get("kind") == "strided":  # bench/strided_bench.py
        return "strided"
    if doc.get("machine", {}).get("device") == "cpu":
        return "cpu"
    impls = {r.get("impl") for r in doc["rows"]}
    if "spattn:sddmm" in impls:
        return "unfused"
    if "flex_attention" in impls or "sdpa_cudnn" in impls:
        return "fused"
    raise ValueError("not a bench JSON this file knows")


def index(rows):
    """Rows by (impl, pattern, L, D); the first row of each key."""
    ix = {}
    for r in rows:
        ix.setdefault((r["impl"], r["pattern"], r["L"], r["D"]), r)
    return ix


def cases(rows, impl):
    """The (pattern, L, D) of impl's rows, in the order the bench ran them."""
    return [(r["pattern"], r["L"], r["D"]) for r in rows if r["impl"] == impl]


# TSVD (spattn tsvd bench): the shapes by (K, N), and its bar.
TSVD_MODELS = {(12288, 12288): "GPT-3 175B", (1024, 1024): "GPT-2 medium attention", (1024, 4096): "GPT-2 medium FF"}


def tsvd_cases(rows):
    """One dict per (M, K, N, ratio), in the bench's order: the tile whose auto time is best (the library's own choice,
    kernels["auto"]; the row's best kernel where the run had no auto) and, at that tile, auto's time and kernel and
    the best forced kernel's (forced_ms, forced: None where auto ran that kernel or none was forced)."""
    out = {}
    for r in rows:
        ks, ran = r.get("kernels", {}), r.get("kernels_ran", {})
        auto_ms = ks.get("auto", r["tsvd_ms"])
        c = out.get((r["M"], r["K"], r["N"], r["ratio"]))
        if c and c["ms"] <= auto_ms:
            continue
        kernel = ran.get("auto", r["tsvd_kernel"]).split(" ")[0]
        forced = {k: ms for k, ms in ks.items() if k != "auto"}
        best = min(forced, key=forced.get) if forced else None
        if best == kernel or (best and forced[best] >= auto_ms):
            best = None
        out[(r["M"], r["K"], r["N"], r["ratio"])] = {
            "row": r, "ms": auto_ms, "kernel": kernel, "forced": best, "forced_ms": forced[best] if best else None,
            "x_svd": r["svd_ms"] / auto_ms, "x_dense": r["dense_ms"] / auto_ms}
    return list(out.values())


def tsvd_svd_bar(M, K, N):
    """The speedup over SVD-matmul the issue asks of a shape: above 1.0 at M = 1 and for GPT-2 medium, at least 0.9
    for GPT-3 at 2048 tokens; None for a shape outside the issue."""
    model = TSVD_MODELS.get((K, N))
    if M == 1 or (model and model.startswith("GPT-2")):
        return 1.0
    return 0.9 if model == "GPT-3 175B" else None


def tsvd_meets(M, K, N, ratio, x_svd, x_dense):
    """True / False against the issue's bar (x dense above 1 too at M = 1 and ratio >= 4); None outside the issue."""
    bar = tsvd_svd_bar(M, K, N)
    if bar is None:
        return None
    ok = x_svd > 1.0 if bar == 1.0 else x_svd >= bar
    return ok and (x_dense > 1.0 if M == 1 and ratio >= 4 else True)


# ---------------------------------------------------------------------------------------------------- plots


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _shape(r):
    """bf16, B=2, H=16, L=4096, D=64 (of one row)."""
    return f"{r['dtype']}, B={r['B']}, H={r['Hq']}, L={r['L']}, D={r['D']}"


def _finish(plt, fig, ax, title, png, **legend):
    ax.set_title(title)
    ax.legend(**legend)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def plot_fused(doc, png):
    """Ours and FlexAttention per case, dense cuDNN SDPA of the same (L, D) as a mark (gpu_bench.py's plot)."""
    plt = _pyplot()
    rows = doc["rows"]
    ix = index(rows)
    keys = cases(rows, "spattn")

    def eff(impl, p, L, D):
        r = ix.get((impl, p, L, D))
        return (r or {}).get("eff_tflops") or 0

    x = range(len(keys))
    fig, ax = plt.subplots(figsize=(max(8, len(keys) * 0.9), 4.5))
    ax.bar([i - 0.2 for i in x], [eff("spattn", *k) for k in keys], 0.4, label="spattn fused")
    ax.bar([i + 0.2 for i in x], [eff("flex_attention", *k) for k in keys], 0.4, label="FlexAttention")
    ax.plot(list(x), [eff("sdpa_cudnn", "dense", L, D) for _p, L, D in keys], "k_", markersize=20,
            label="dense cuDNN SDPA")
    ax.set_xticks(list(x))
    ax.set_xticklabels([f"{p}\nL={L}\nD={D}" for p, L, D in keys], fontsize=7)
    ax.set_ylabel("effective TFLOP/s (nnz-counted)")
    r0 = rows[0]
    _finish(plt, fig, ax, f"{doc['machine']['gpu']}, {r0['dtype']}, B={r0['B']}, H={r0['Hq']}", png)


def plot_unfused(doc, png):
    """Speedup over cuSPARSE per pattern: SDDMM, SpMM, attention without and with P (vs cuSPARSE SDDMM + SpMM)."""
    plt = _pyplot()
    rows = doc["rows"]
    ix = index(rows)
    keys = cases(rows, "spattn:sddmm")

    def ms(impl, k):
        return ix[(impl,) + k]["ms"]

    series = [("SDDMM", lambda k: ms("cusparse_sddmm", k) / ms("spattn:sddmm", k)),
              ("SpMM", lambda k: ms("cusparse_spmm", k) / ms("spattn:spmm", k)),
              ("attention", lambda k: (ms("cusparse_sddmm", k) + ms("cusparse_spmm", k)) / ms("spattn:unfused", k)),
              ("attention with P",
               lambda k: (ms("cusparse_sddmm", k) + ms("cusparse_spmm", k)) / ms("spattn:unfused_p", k))]
    w = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(8, len(keys) * 1.1), 4.5))
    for j, (label, f) in enumerate(series):
        ax.bar([i + (j - (len(series) - 1) / 2) * w for i in range(len(keys))], [f(k) for k in keys], w, label=label)
    ax.axhline(1.0, color="k", linewidth=0.8)
    ax.set_xticks(list(range(len(keys))))
    ax.set_xticklabels([p for p, _L, _D in keys])
    ax.set_yscale("log")
    ticks = [1, 2, 3, 5, 10, 20, 30, 50]
    ax.set_yticks(ticks)
    ax.set_yticklabels([f"{t}x" for t in ticks])
    ax.set_ylabel("speedup over cuSPARSE")
    _finish(plt, fig, ax, f"Multigrain vs cuSPARSE, {doc['machine']['gpu']}, {_shape(rows[0])}", png, fontsize=8)


def plot_cpu(doc, png):
    """GFLOP/s per pattern with the sgemm probe timed interleaved with it as a mark."""
    plt = _pyplot()
    rows = [r for r in doc["rows"] if r["impl"] == "spattn"]
    m = doc["machine"]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.9), 4.5))
    ax.bar(list(x), [r["eff_tflops"] * 1e3 for r in rows], 0.6, label="spattn fused (CPU)")
    ax.plot(list(x), [r["sgemm_probe_interleaved_gflops"] for r in rows], "k_", markersize=24,
            label="square sgemm probe (interleaved)")
    for i, r in enumerate(rows):
        ax.text(i, r["eff_tflops"] * 1e3, f"{100 * r['ratio_to_sgemm_probe']:.0f}%", ha="center", va="bottom",
                fontsize=8)
    ax.set_xticks(list(x))
    ax.set_xticklabels([r["pattern"] for r in rows])
    ax.set_ylabel("effective GFLOP/s (nnz-counted)")
    _finish(plt, fig, ax, f"{m['cpu']}, {m['threads']} threads, {m['kernels']}, {_shape(rows[0])}", png, fontsize=8)


def plot_backward(doc, png):
    """Ours and FlexAttention's backward per case (bwd_bench.py)."""
    plt = _pyplot()
    rows = [r for r in doc["rows"] if "tflops" in r]  # (not the rows a budget skipped)
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.9), 4.5))
    ax.bar([i - 0.2 for i in x], [r["tflops"] for r in rows], 0.4, label="spattn backward")
    ax.bar([i + 0.2 for i in x], [r.get("flex_tflops", 0) for r in rows], 0.4, label="FlexAttention backward")
    ax.set_xticks(list(x))
    ax.set_xticklabels([f"{r['pattern']}\nD={r['D']}" for r in rows], fontsize=8)
    ax.set_ylabel("effective TFLOP/s (2.5x the forward's kept-score FLOPs)")
    r0 = rows[0]
    _finish(plt, fig, ax, f"{doc['machine']['gpu']}, bf16, B={r0['B']}, H={r0['H']}, L={r0['L']}", png, fontsize=8)


def plot_tsvd(doc, png):
    """Per shape and ratio, the speedup over SVD-matmul of the library's auto choice and of the best forced kernel
    (the tile of tsvd_cases), auto's over dense cuBLAS as a mark; the issue's bar as lines (1.0, 0.9 for GPT-3's
    2048 tokens)."""
    plt = _pyplot()
    cs = tsvd_cases(doc["rows"])
    x = list(range(len(cs)))
    fig, ax = plt.subplots(figsize=(max(9, len(cs) * 0.6), 5))
    ax.bar([i - 0.2 for i in x], [c["x_svd"] for c in cs], 0.4, label="TSVD auto (the library's choice)")
    ax.bar([i + 0.2 for i in x], [c["row"]["svd_ms"] / (c["forced_ms"] or c["ms"]) for c in cs], 0.4,
           label="TSVD best kernel (forced)")
    ax.plot(x, [c["x_dense"] for c in cs], "k_", markersize=12, label="TSVD auto: speedup over dense cuBLAS GEMM")
    ax.axhline(1.0, color="k", linewidth=0.8, label="bar 1.0x (SVD-matmul; dense at M=1, R>=4)")
    shapes = []
    for i, c in enumerate(cs):
        r = c["row"]
        key = (r["M"], r["K"], r["N"])
        if not shapes or shapes[-1][0] != key:
            shapes.append((key, [i]))
        else:
            shapes[-1][1].append(i)
    for (M, K, N), idx in shapes:
        bar = tsvd_svd_bar(M, K, N)
        if bar is not None and bar != 1.0:
            ax.hlines(bar, idx[0] - 0.45, idx[-1] + 0.45, colors="r", linestyles="--", linewidth=1,
                      label=f"bar {bar}x ({TSVD_MODELS[(K, N)]}, M={M})")
        if idx[0]:
            ax.axvline(idx[0] - 0.5, color="0.8", linewidth=0.8)
        ax.text((idx[0] + idx[-1]) / 2, -0.13, f"{TSVD_MODELS.get((K, N), '')}\n{M}x{K}x{N}", ha="center",
                va="top", fontsize=8, transform=ax.get_xaxis_transform())
    ax.set_xticks(x)
    ax.set_xticklabels([f"R={c['row']['ratio']}\nt={c['row']['tile']}" for c in cs], fontsize=7)
    ax.set_yscale("log")
    ticks = [t for t in (0.25, 0.5, 0.9, 1, 2, 4, 8, 16) if t <= 1 or t <= 2 * max(c["x_dense"] for c in cs)]
    ax.set_yticks(ticks)
    ax.set_yticklabels([f"{t:g}x" for t in ticks])
    ax.minorticks_off()
    ax.set_ylim(top=2.5 * max(max(c["x_svd"], c["x_dense"]) for c in cs))
    ax.set_ylabel("speedup over SVD-matmul (2 cuBLAS GEMMs)")
    _finish(plt, fig, ax, f"TSVD matmul, {doc['machine']['gpu']}, {doc.get('dtype', '')}, ratio R, tile t",
            png, fontsize=8)


def plot_model(doc, png):
    """bench/model_bench.py: spattn's training-step speedup over each other backend against the sequence length."""
    plt = _pyplot()
    rows, c = doc["rows"], doc["config"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    others = [b for b in ("flex_attention", "fa4", "sdpa_causal") if any(b in r["step_ms"] for r in rows)]
    for b in others:
        pts = [(r["seq_len"], r["step_ms"][b] / r["step_ms"]["spattn"]) for r in rows
               if b in r["step_ms"] and "spattn" in r["step_ms"]]
        if pts:
            ax.plot(*zip(*pts), marker="o", label=f"x {b}")
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length (tokens, batch 1)")
    ax.set_ylabel("spattn step speedup (their ms / ours)")
    _finish(plt, fig, ax, f"{doc['machine']['gpu']}: {c['layers']}-layer decoder, width {c['width']}, GQA "
            f"{c['heads']}/{c['kv_heads']}, window {c['window']}, {c['dtype']}", png, fontsize=8)


# The HBM rate a strided baseline's roofline assumes where its JSON records none (an H200's device-to-device copy
# measured ~4.2 TB/s, session 26).
HBM_TBS = 4.2


def strided_roofline(r, hbm_tbs=HBM_TBS):
    """The memory roofline of a strided row (bench/strided_bench.py): the best effective TFLOP/s any kernel could
    reach when the fewest bytes a call must move go at hbm_tbs TB/s. Forward: Q and K and V read once, O written
    once (bf16, D each per token), the LSE written (fp32 per token), for each of the B * H heads; every key is read
    because every suite pattern keeps the diagonal; FLOPs 4 * nnz * D per head, as the bench counts. Backward: Q, K,
    V, O, dO read, dQ, dK, dV written, the LSE read (2.5x the forward's FLOPs). The
    intensity is about nnz / L / 2 FLOP per byte (half the kept keys per query): dilated(64, 32) keeps ~121-127
    keys a query, ~60 FLOP/B, ~250 TFLOP/s at 4.2 TB/s. Returns {"roofline_tflops", "bwd_roofline_tflops",
    "intensity"}."""
    heads, L, D = r["B"] * r["H"], r["L"], r["D"]
    flop = 4.0 * r["nnz"] * D * heads
    fwd_bytes = heads * (4 * L * D * 2 + L * 4)
    bwd_bytes = heads * (8 * L * D * 2 + L * 4)
    return {"roofline_tflops": flop / fwd_bytes * hbm_tbs, "bwd_roofline_tflops": 2.5 * flop / bwd_bytes * hbm_tbs,
            "intensity": flop / fwd_bytes}


def plot_strided(doc, png):
    """bench/strided_bench.py: forward and backward TFLOP/s of ours and Flex's per case; dense cuDNN's forward rate
    and 0.4 of it (the issue's bar per kept score) as marks on the forward panel."""
    plt = _pyplot()
    rows = doc["rows"]
    x = list(range(len(rows)))
    fig, axes = plt.subplots(1, 2, figsize=(max(10, len(rows) * 1.2), 4.8))
    for ax, p in zip(axes, ("fwd", "bwd")):
        ax.bar([i - 0.2 for i in x], [r[f"{p}_tflops"] for r in rows], 0.4, label=f"spattn {p}")
        ax.bar([i + 0.2 for i in x], [r[f"flex_{p}_tflops"] for r in rows], 0.4, label=f"FlexAttention {p}")
        if p == "fwd":
            ax.plot(x, [r["cudnn_dense_fwd_tflops"] for r in rows], "k_", markersize=16, label="dense cuDNN SDPA")
            ax.plot(x, [doc["bar"]["fwd_frac_of_cudnn"] * r["cudnn_dense_fwd_tflops"] for r in rows], "r_",
                    markersize=16, label=f"{doc['bar']['fwd_frac_of_cudnn']} of dense cuDNN (bar)")
        hbm = doc["machine"].get("hbm_tbs", HBM_TBS)
        roof = [strided_roofline(r, hbm)[("" if p == "fwd" else "bwd_") + "roofline_tflops"] for r in rows]
        ax.plot(x, roof, "g_", markersize=16, label=f"memory roofline ({hbm:.2f} TB/s)")
        ax.set_ylim(0, 1.15 * max(max(r[f"{p}_tflops"], r.get("cudnn_dense_fwd_tflops", 0)) for r in rows))
        ax.set_xticks(x)
        ax.set_xticklabels([f"{r['pattern']}\nL={r['L']}\nD={r['D']}" for r in rows], fontsize=7)
        ax.set_ylabel(f"{p} effective TFLOP/s (kept scores" + (", 2.5x the forward's)" if p == "bwd" else ")"))
        ax.legend(fontsize=7)
    r0 = rows[0]
    fig.suptitle(f"strided cases (issue 42), {doc['machine']['gpu']}, bf16, B={r0['B']}, H={r0['H']}")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


PLOTS = {"model": plot_model, "fused": plot_fused, "unfused": plot_unfused, "cpu": plot_cpu, "backward": plot_backward, "tsvd": plot_tsvd}
PLOTS["strided"] = plot_strided


def plot(doc, png):
    """Draw doc's plot into png; False (and a line on stderr) where it cannot (no matplotlib, no rows)."""
    try:
        PLOTS[kind(doc)](doc, png)
        return True
    except ImportError as e:
        print(f"# no plot ({e}); pip install matplotlib", file=sys.stderr)
    except Exception as e:  # noqa: BLE001 -- a plot must not cost the run its JSON and table
        print(f"# no plot: {e}", file=sys.stderr)
    return False


# ---------------------------------------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+", help="SRC.json NAME, or with --png the baseline files to redraw")
    ap.add_argument("--png", action="store_true", help="only redraw the PNG beside each JSON given")
    ap.add_argument("--command", default=None,
                    help="the command that made SRC (default: the JSON's own machine.command, if any)")
    args = ap.parse_args()
    if args.png:
        for path in args.json:
            with open(path) as f:
                plot(json.load(f), os.path.splitext(path)[0] + ".png")
        return
    if len(args.json) != 2:
        ap.error("give SRC.json and NAME")
    src, name = args.json
    with open(src) as f:
        text = f.read()
    doc = json.loads(text)
    machine = doc.get("machine", {})
    command = args.command or machine.get("command") or doc.get("command") or "unknown"
    os.makedirs(BASELINES, exist_ok=True)
    out = os.path.join(BASELINES, name + ".json")
    with open(out, "w") as f:
        f.write(with_meta(text, meta(name, command, machine.get("date"))))
    print(f"wrote {out}")
    if plot(doc, os.path.join(BASELINES, name + ".png")):
        print(f"wrote {os.path.join(BASELINES, name + '.png')}")


if __name__ == "__main__":
    main()
