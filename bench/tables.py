#!/usr/bin/env python3
"""Result tables from bench/baselines/*.json (standard library only).

docs/RESULTS.md holds one block per baseline, and README.md a short summary of one, between marker comments:

  <!-- tables:NAME -->            (or <!-- tables:summary.NAME -->: the summary of a fused-attention baseline)
  (generated from bench/baselines/NAME.json; not edited by hand)
  <!-- /tables:NAME -->

  python3 bench/tables.py            # print every baseline's block
  python3 bench/tables.py --write    # rewrite the blocks in README.md and docs/RESULTS.md
  python3 bench/tables.py --check    # exit 1 if a block differs from what its baseline gives (or has no baseline)

Effective rates count only the kept scores (4 * nnz * D * B * H / time); ratios are of unrounded figures.
"""
import argparse
import difflib
import glob
import json
import math
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from baseline import (BASELINES, HBM_TBS, ROOT, TSVD_MODELS, cases, index, kind, strided_roofline, tsvd_cases,  # noqa: E402
                      tsvd_meets)

# The fused table's "of dense cuDNN" column: the clustered patterns (the scattered ones run at a few % of a dense
# rate, where a share of cuDNN says nothing).
CLUSTERED = ("local", "longformer", "bigbird", "dilated", "causal")
MARKER = re.compile(r"(<!-- tables:([\w.-]+) -->\n)(.*?)(<!-- /tables:\2 -->)", re.S)


def e(x, digits=1):
    """2.3e-3 (not 2.3e-03)."""
    m, ex = f"{x:.{digits}e}".split("e")
    return f"{m}e{int(ex)}"


def row(cells):
    return "| " + " | ".join(cells) + " |"


def rule(n):
    return "|" + "---|" * n


# The repository root as the document being filled reaches it ("" for README.md, "../" for docs/*.md): the
# captions' links resolve from either.
UP = ""


def caption(name, doc, what):
    m = doc.get("meta", {})
    made = f"commit {m['commit']}, {m['date'][:10]}; " if m else ""
    plot = (f", [plot]({UP}bench/baselines/{name}.png)" if os.path.exists(os.path.join(BASELINES, name + ".png"))
            else "")
    # meta "note": what a reader must know of the figures (a row that a later commit changed, e.g.), after the caption
    note = f" ({m['note']})" if m.get("note") else ""
    return f"{what}; {made}[{name}.json]({UP}bench/baselines/{name}.json){plot}{note}:"


def fused(name, doc):
    rows = doc["rows"]
    ix = index(rows)
    r0 = rows[0]
    Ls = sorted({L for _p, L, _D in cases(rows, "spattn")})
    Lmax = Ls[-1]
    # A row per (pattern, D) of the longest length, but dense and causal D=128 (the line below the table); a D column
    # where the baseline has other head dims than 64 (the suite's baselines have not).
    pats = []
    for p, _L, D in cases(rows, "spattn"):
        if p != "dense" and (p, D) != ("causal", 128) and (p, D) not in pats:
            pats.append((p, D))
    dims = any(D != 64 for _p, D in pats)

    def eff(impl, p, L, D=64):
        r = ix.get((impl, p, L, D))
        return r["eff_tflops"] if r and r["eff_tflops"] else None

    what = f"{doc['machine']['gpu']}, {r0['dtype']}, B={r0['B']}, H={r0['Hq']}" + ("" if dims else ", D=64")
    out = [caption(name, doc, what), ""]
    head = ["pattern"] + (["D"] if dims else [])
    for L in Ls:
        head += [f"L={L} ours", "FlexAttention", "ratio"]
    out += [row(head + [f"of dense cuDNN (L={Lmax})"]), rule(len(head) + 1)]
    for p, D in pats:
        cells = [p] + ([str(D)] if dims else [])
        for L in Ls:  # a case the run skipped (--budget-s, or its length not run for it) stays empty
            o, f = eff("spattn", p, L, D), eff("flex_attention", p, L, D)
            cells += [f"{o:.1f}" if o else "", f"{f:.1f}" if f else "", f"{o / f:.2f}" if o and f else ""]
        o, cudnn = eff("spattn", p, Lmax, D), eff("sdpa_cudnn", "dense", Lmax, D)
        cells.append(f"{o / cudnn:.2f}" if p in CLUSTERED and o and cudnn else "")
        out.append(row(cells))
    cudnn = eff("sdpa_cudnn", "dense", Lmax)
    d64, d128 = eff("spattn", "dense", Lmax), eff("spattn", "dense", Lmax, 128)
    c64, c128 = cudnn, eff("sdpa_cudnn", "dense", Lmax, 128)
    cz, cf = eff("spattn", "causal", Lmax, 128), eff("flex_attention", "causal", Lmax, 128)
    err = max(r["rel_err"] for r in rows if r["impl"] == "spattn")
    dense = ""
    if d64 and d128 and c64 and c128 and cz and cf:
        dense = (f"Dense, L={Lmax}: D=64 {d64:.1f} TFLOP/s ({d64 / c64:.2f} of cuDNN SDPA, {c64:.1f}), D=128 "
                 f"{d128:.1f} ({d128 / c128:.2f} of cuDNN, {c128:.1f}); causal D=128 {cz:.1f} ({cz / cf:.2f}x "
                 f"FlexAttention). ")
    return out + ["", f"{dense}Relative error vs the reference <= {e(err)}."]


def summary(name, doc):
    """The longest length's patterns: ours and FlexAttention in effective TFLOP/s and the ratio, one row each."""
    rows = doc["rows"]
    ix = index(rows)
    r0 = rows[0]
    Lmax = max(L for _p, L, _D in cases(rows, "spattn"))
    out = [f"{doc['machine']['gpu']}, {r0['dtype']}, B={r0['B']}, H={r0['Hq']}, D=64, L={Lmax}, effective TFLOP/s "
           f"([{name}.json]({UP}bench/baselines/{name}.json)):", "",
           row(["pattern", "spattn", "FlexAttention", "spattn / Flex"]), rule(4)]
    for p, L, D in cases(rows, "spattn"):
        o, f = ix.get(("spattn", p, L, D)), ix.get(("flex_attention", p, L, D))
        if L != Lmax or D != 64 or not (o and f and o["eff_tflops"] and f["eff_tflops"]):
            continue
        out.append(row([p, f"{o['eff_tflops']:.1f}", f"{f['eff_tflops']:.1f}", f"{o['eff_tflops'] / f['eff_tflops']:.2f}x"]))
    cudnn = ix.get(("sdpa_cudnn", "dense", Lmax, 64))
    if cudnn and cudnn["eff_tflops"]:
        out += ["", f"The dense anchor, cuDNN SDPA over all L^2 scores at L={Lmax}: {cudnn['eff_tflops']:.1f} TFLOP/s."]
    return out


def unfused(name, doc):
    rows = doc["rows"]
    ix = index(rows)
    r0 = rows[0]

    def ms(impl, k):
        return ix[(impl,) + k]["ms"]

    out = [caption(name, doc, f"{doc['machine']['gpu']}, {r0['dtype']}, B={r0['B']}, H={r0['Hq']}, L={r0['L']}, "
                              f"D={r0['D']}"), "",
           row(["pattern", "SDDMM vs cuSPARSE", "SpMM vs cuSPARSE", "attention ms", "vs cuSPARSE SDDMM + SpMM",
                "with P ms", "vs cuSPARSE", "max rel err"]), rule(8)]
    sd, sp, att, attp = {}, {}, {}, {}
    errs = []
    for k in cases(rows, "spattn:sddmm"):
        p = k[0]
        cus = ms("cusparse_sddmm", k) + ms("cusparse_spmm", k)
        sd[p] = ms("cusparse_sddmm", k) / ms("spattn:sddmm", k)
        sp[p] = ms("cusparse_spmm", k) / ms("spattn:spmm", k)
        att[p] = cus / ms("spattn:unfused", k)
        attp[p] = (cus / ms("spattn:unfused_p", k), ms("spattn:unfused_p", k), cus)
        err = max(ix[(i,) + k]["rel_err"] for i in ("spattn:sddmm", "spattn:spmm", "spattn:unfused", "spattn:unfused_p"))
        errs.append(err)
        out.append(row([p, f"{sd[p]:.2f}x", f"{sp[p]:.2f}x", f"{ms('spattn:unfused', k):.3f}", f"{att[p]:.2f}x",
                        f"{ms('spattn:unfused_p', k):.3f}", f"{attp[p][0]:.2f}x", e(err)]))

    def geo(d):
        return math.exp(sum(math.log(v) for v in d.values()) / len(d))

    def lo(d, f=lambda v: v):
        p = min(d, key=lambda q: f(d[q]))
        return p, d[p]

    (psd, vsd), (psp, vsp), (pa, va) = lo(sd), lo(sp), lo(att)
    pp, (vp, msp, cusp) = lo(attp, lambda v: v[0])
    out += ["", f"Geomean over the patterns: SDDMM {geo(sd):.2f}x cuSPARSE (min {vsd:.2f}x, {psd}), SpMM "
                f"{geo(sp):.2f}x (min {vsp:.2f}x, {psp}); attention min {va:.2f}x without P ({pa}), {vp:.2f}x with "
                f"P ({pp}: {msp:.3f} ms against {cusp:.3f}); max rel err {e(max(errs), 2)}."]
    return out


def cpu(name, doc):
    m = doc["machine"]
    rows = [r for r in doc["rows"] if r["impl"] == "spattn"]
    r0 = rows[0]
    out = [caption(name, doc, f"{m['cpu']}, {m['threads']} threads ({m['kernels']} kernels), {r0['dtype']}, "
                              f"B={r0['B']}, H={r0['Hq']}, L={r0['L']}, D={r0['D']}; square-sgemm probe "
                              f"{m['sgemm_probe_gflops']:.1f} GFLOP/s (median over the run)"), "",
           row(["pattern", "GFLOP/s", "of sgemm probe", "vs dense masked (sgemm)", "rel err"]), rule(5)]
    for r in rows:
        out.append(row([r["pattern"], f"{r['eff_tflops'] * 1e3:.1f}", f"{100 * r['ratio_to_sgemm_probe']:.1f}%",
                        f"{r['speedup_vs_dense_masked']:.1f}x", e(r["rel_err"])]))
    return out


def backward(name, doc):
    """bench/bwd_bench.py: the backward against FlexAttention's; where the rows carry the forward's rate (issue 39's
    table), its column and bwd / fwd with the issue's bar."""
    rows = doc["rows"]
    r0 = rows[0]
    fwd = all("bwd_over_fwd" in r for r in rows)
    shape = f"B={r0['B']}, H={r0['H']}, L={r0['L']}" if not fwd else "B=2, H=16, L=16384 unless the table says"
    out = [caption(name, doc, f"{doc['machine']['gpu']}, bf16, {shape}; backward TFLOP/s count 2.5x the forward's "
                              f"kept-score FLOPs"), "",
           row(["pattern", "D", "kernel"] + (["fwd TFLOP/s"] if fwd else []) + ["ours ms", "ours TFLOP/s"]
               + (["bwd / fwd"] if fwd else []) + ["Flex ms", "Flex TFLOP/s", "ratio"]), rule(10 if fwd else 8)]
    for r in rows:
        name_ = r["pattern"] if not fwd or (r["L"], r["B"], r["H"]) == (16384, 2, 16) else \
            f"{r['pattern']} (B={r['B']}, H={r['H']}, L={r['L']})"
        out.append(row([name_, str(r["D"]), r["kernel"]] + ([f"{r['fwd_tflops']:.1f}"] if fwd else [])
                       + [f"{r['ms']:.3f}", f"{r['tflops']:.1f}"] + ([f"{r['bwd_over_fwd']:.2f}"] if fwd else [])
                       + [f"{r['flex_ms']:.3f}" if "flex_ms" in r else "",
                          f"{r['flex_tflops']:.1f}" if "flex_ms" in r else "",
                          f"{r['speedup']:.2f}" if "speedup" in r else ""]))
    sp = [r["speedup"] for r in rows if "speedup" in r]
    if sp:
        out += ["", f"Geomean over these cases: {math.exp(sum(math.log(x) for x in sp) / len(sp)):.2f}x FlexAttention's "
                    f"backward; ours and Flex's gradients differ by <= {e(max(r['diff_vs_flex'] for r in rows if 'speedup' in r))} "
                    f"(relative)."]
    if fwd:
        bf = [r["bwd_over_fwd"] for r in rows]
        out += ["", f"bwd / fwd: geomean {math.exp(sum(map(math.log, bf)) / len(bf)):.2f}, lowest {min(bf):.2f}. The bar "
                    f"(issue 39): >= 0.6 on every case (0.8 on bands, blocks and causal), >= 2.5x Flex's backward in "
                    f"geomean and 1.5x on every case; below it: "
                    + (", ".join(f"{r['pattern']} D={r['D']}" for r in rows
                                 if r["bwd_over_fwd"] < r.get("bar", 0.6) or r.get("speedup", 9) < 1.5) or "none") + "."]
    return out


def tsvd(name, doc):
    cs = tsvd_cases(doc["rows"])
    tiles = " or ".join(str(t) for t in sorted({r["tile"] for r in doc["rows"]}))
    out = [caption(name, doc, f"{doc['machine']['gpu']}, {doc.get('dtype', '')}, {doc.get('reps', '?')} reps, "
                              f"{doc.get('timing', '')}; TSVD matmul against dense cuBLAS and SVD-matmul"), "",
           row(["shape (M x K x N)", "ratio", "dense ms", "SVD-matmul ms", "tile (rank)", "TSVD ms", "kernel",
                "best forced", "x SVD", "x dense", "meets bar"]), rule(11)]
    met, missed = 0, {}  # missed: the ratios of each shape that miss the bar
    for c in cs:
        r = c["row"]
        M, K, N = r["M"], r["K"], r["N"]
        model = TSVD_MODELS.get((K, N))
        ok = tsvd_meets(M, K, N, r["ratio"], c["x_svd"], c["x_dense"])
        bar = "" if ok is None else "yes" if ok else "no"
        if ok is False and c["forced"] and tsvd_meets(M, K, N, r["ratio"], r["svd_ms"] / c["forced_ms"],
                                                      r["dense_ms"] / c["forced_ms"]):
            bar += f" ({c['forced']}: yes)"
        met += ok is True
        if ok is False:
            missed.setdefault(f"{M}x{K}x{N}", []).append(str(r["ratio"]))
        out.append(row([f"{M} x {K} x {N}" + (f" ({model})" if model else ""), str(r["ratio"]), f"{r['dense_ms']:.4f}",
                        f"{r['svd_ms']:.4f}", f"{r['tile']} ({r['tsvd_rank']})", f"{c['ms']:.4f}", c["kernel"],
                        f"{c['forced']} {c['forced_ms']:.4f}" if c["forced"] else "", f"{c['x_svd']:.2f}x",
                        f"{c['x_dense']:.2f}x", bar]))
    judged = met + sum(len(v) for v in missed.values())
    not_met = "; not met: " + ", ".join(f"{k} (R={','.join(v)})" for k, v in missed.items()) if missed else ""
    return out + ["", f"TSVD is the library's own choice (`--kernel auto`) at the tile ({tiles}) whose auto time is "
                      f"best; \"best forced\" is the fastest kernel forced at that tile, shown where it differs from "
                      f"auto's and is faster. SVD-matmul keeps the global rank of the same ratio. The bar (the "
                      f"issue's): x SVD above 1 at M = 1 and for GPT-2 medium, at least 0.9 for GPT-3 at 2048 tokens; "
                      f"x dense above 1 at M = 1 and ratio >= 4. Met by auto in {met} of {judged} cases{not_met}."]


def model(name, doc):
    """bench/model_bench.py: step ms per backend and length, spattn's ratios, attention's share; the issue's bar."""
    c, rows = doc["config"], doc["rows"]
    names = [b for b in ("spattn", "flex_attention", "fa4", "sdpa_causal") if any(b in r["step_ms"] for r in rows)]
    ms = lambda r, b: f"{r['step_ms'][b]:.1f}" if b in r["step_ms"] else ""  # noqa: E731
    x = lambda r, b: (f"{r['step_ms'][b] / r['step_ms']['spattn']:.2f}x" if b in r["step_ms"]  # noqa: E731
                      and "spattn" in r["step_ms"] else "")
    out = [caption(name, doc, f"{doc['machine']['gpu']}, {c['dtype']}, batch 1: a {c['layers']}-layer decoder's "
                              f"training step (width {c['width']}, GQA {c['heads']}/{c['kv_heads']}, D {c['head_dim']}, "
                              f"SwiGLU {c['ffn']}, `{c['pattern']}` in every layer; SDPA: dense causal)"), "",
           row(["tokens"] + [f"{b} ms" for b in names] + [f"spattn x {b}" for b in names[1:]]
               + ["attention fwd+bwd ms/layer (spattn, Flex)", "attention share (spattn)"]),
           rule(1 + 2 * len(names) - 1 + 2)]
    for r in rows:
        att = " / ".join(f"{r['attn_ms'][b]:.2f}" for b in ("spattn", "flex_attention") if b in r["attn_ms"])
        sh = r["attn_share"].get("spattn")
        out.append(row([str(r["seq_len"])] + [ms(r, b) for b in names] + [x(r, b) for b in names[1:]]
                       + [att, f"{100 * sh:.0f}%" if sh else ""]))
    ck = doc.get("check") or {}
    if ck.get("spattn"):
        out += ["", f"Check (L={ck['seq_len']}, window {ck['window']}, {ck['dtype']}): spattn's loss and gradients "
                    f"against SDPA with the same mask within {e(max(ck['spattn']['loss_rel'], ck['spattn']['grad_rel_max']))}"
                    f" relative (bar {e(ck['bar'], 0)})."]
    bar = [r for r in rows if r["seq_len"] == 32768 and {"spattn", "flex_attention"} <= r["step_ms"].keys()]
    if bar:
        r = bar[0]
        xf = r["step_ms"]["flex_attention"] / r["step_ms"]["spattn"]
        fa4 = r["step_ms"].get("fa4")
        out += ["", f"The bar at 32K tokens: spattn's step >= 1.15x FlexAttention's ({xf:.2f}x: "
                    f"{'met' if xf >= 1.15 else 'not met'}) and at least as fast as FA4's "
                    + (f"({fa4 / r['step_ms']['spattn']:.2f}x: {'met' if fa4 >= r['step_ms']['spattn'] else 'not met'})."
                       if fa4 else "(FA4 not measured).")]
    return out


def windows(name, doc):
    """bench/windows_bench.py: the window and causal training cases against FlashAttention-4; issue 40's bar."""
    rows, sm = doc["rows"], doc["summary"]
    t = lambda r, k: f"{r[k]:.0f}" if r.get(k) else ""  # noqa: E731
    x = lambda r, k: f"{r[k]:.2f}x" if r.get(k) else ""  # noqa: E731
    out = [caption(name, doc, f"{doc['machine']}, bf16, effective TFLOP/s over kept scores (backward counted 2.5x "
                              f"the forward's flops), FlashAttention-4 and FlexAttention in the same process"), "",
           row(["spec", "B x L x Hq/Hkv, D", "fwd ours", "FA4", "Flex", "ratio vs FA4", "bwd ours", "FA4", "Flex",
                "ratio vs FA4"]), rule(10)]
    for r in rows:
        out.append(row([f"`{r['spec']}`", f"{r['B']} x {r['L']} x {r['Hq']}/{r['Hkv']}, {r['D']}",
                        t(r, "spattn_fwd_tflops"), t(r, "fa4_fwd_tflops"), t(r, "flex_fwd_tflops"),
                        x(r, "fwd_ratio_vs_fa4"), t(r, "spattn_bwd_tflops"), t(r, "fa4_bwd_tflops"),
                        t(r, "flex_bwd_tflops"), x(r, "bwd_ratio_vs_fa4")]))
    fa4 = [r for r in rows if r.get("fwd_ratio_vs_fa4")]
    if fa4:
        fmin = min(r["fwd_ratio_vs_fa4"] for r in fa4)
        bmin = min(r["bwd_ratio_vs_fa4"] for r in fa4)
        ok = fmin >= 1.0 and sm["fwd_ratio_vs_fa4"] >= 1.1 and bmin >= 1.0
        out += ["", f"Geomean against FA4: forward {sm['fwd_ratio_vs_fa4']:.2f}x (lowest {fmin:.2f}x), backward "
                    f"{sm['bwd_ratio_vs_fa4']:.2f}x (lowest {bmin:.2f}x); against FlexAttention: forward "
                    f"{sm['fwd_ratio_vs_flex']:.2f}x, backward {sm['bwd_ratio_vs_flex']:.2f}x. The bar (forward >= 1.0x "
                    f"FA4 on every case and 1.1x geomean, backward >= 1.0x on every case): "
                    f"{'met' if ok else 'not met'}."]
    return out


def runtime(name, doc):
    """bench/runtime_bench.py: masks chosen at run time against the static plan of the same pairs and FlexAttention."""
    f = lambda r, k, d=2: (f"{r[k]:.{d}f}" if r.get(k) is not None else "")  # noqa: E731
    out = [caption(name, doc, "NVIDIA H200, bf16, masks given at run time through `spattn.torch.sparse_attention` "
                              "(block mask, packed documents changing every call, top-k keys), the static plan of the "
                              "same pairs and FlexAttention (Triton backend) in one process"), "",
           row(["case", "shape", "fwd TFLOP/s", "x static", "x Flex", "bwd TFLOP/s", "x static", "x Flex", "notes"]),
           rule(9)]
    for r in doc["rows"]:
        shape = f"B={r['B']}, L={r['L']}, H={r.get('H', r.get('Hq'))}" + (f"/{r['Hkv']}" if "Hkv" in r else "") \
            + f", D={r['D']}"
        note = ""
        if r["case"] == "documents":
            note = f"+{r['host_us_over_static']:.0f} us host a call over the static plan"
        elif r["case"].startswith("topk"):
            note = (f"{r['K']} keys a query; of the gather floor: fwd {r['fraction_of_floor_fwd']:.2f}, "
                    f"bwd {r['fraction_of_floor_bwd']:.2f}")
        elif r["case"] == "blocks":
            note = f"blocks of {r['block']}, {r['key_blocks']} key blocks a query block, causal"
        out.append(row([r["case"], shape, f(r, "runtime_fwd_tflops", 0), f(r, "runtime_over_static_fwd"),
                        f(r, "ratio_vs_flex_fwd"), f(r, "runtime_bwd_tflops", 0), f(r, "runtime_over_static_bwd"),
                        f(r, "ratio_vs_flex_bwd"), note]))
    out += ["", "The bar (issue 44): a block mask >= 0.8x the static plan and >= 1.5x FlexAttention, forward and "
                "backward; documents >= 0.95x the static plan and <= 30 us host a call over it; top-k >= 0.5 of the "
                "gather floor, forward and backward."]
    return out


TABLES = {"runtime": runtime, "windows": windows, "model": model, "fused": fused, "unfused": unfused, "cpu": cpu, "backward": backward, "tsvd": tsvd}


def block(path, summarize=False):
    """The generated text between NAME's markers (ends in a newline)."""
    name = os.path.splitext(os.path.basename(path))[0]
    with open(path) as f:
        doc = json.load(f)
    if summarize and kind(doc) != "fused":
        raise ValueError(f"a summary is of a fused-attention baseline; {name} is {kind(doc)}")
    return "\n".join((summary if summarize else TABLES[kind(doc)])(name, doc)) + "\n"


def strided(name, doc):
    """bench/strided_bench.py: issue 42's cases, forward and backward against Flex and dense cuDNN; the bar."""
    rows, bar = doc["rows"], doc["bar"]
    r0 = rows[0]
    out = [caption(name, doc, f"{doc['machine']['gpu']}, bf16, B={r0['B']}, H={r0['H']}; TFLOP/s count kept scores "
                              f"(the backward 2.5x the forward's FLOPs)"), "",
           row(["pattern", "L", "D", "fwd TFLOP/s", "of dense cuDNN", "roofline (of cuDNN)", "of min(roofline, cuDNN)",
                "x Flex fwd", "bwd TFLOP/s", "x Flex bwd", "bwd / fwd", "kernels (fwd / bwd)", "meets bar"]), rule(13)]
    hbm = doc["machine"].get("hbm_tbs", HBM_TBS)
    for r in rows:
        roof = r.get("roofline_tflops") or strided_roofline(r, hbm)["roofline_tflops"]
        cud = r["cudnn_dense_fwd_tflops"]
        out.append(row([f"`{r['spec']}`", str(r["L"]), str(r["D"]), f"{r['fwd_tflops']:.1f}",
                        f"{r['fwd_frac_of_cudnn']:.2f}", f"{roof:.0f} ({roof / cud:.2f})",
                        f"{r['fwd_tflops'] / min(roof, cud):.2f}", f"{r['fwd_ratio_vs_flex']:.2f}", f"{r['bwd_tflops']:.1f}",
                        f"{r['bwd_ratio_vs_flex']:.2f}", f"{r['bwd_over_fwd']:.2f}",
                        f"{r['kernel']} / {r['bwd_kernel']}", "yes" if all(r["bar"].values()) else
                        "no (" + ", ".join(k for k, ok in r["bar"].items() if not ok) + ")"]))
    met = sum(all(r["bar"].values()) for r in rows)
    return out + ["", f"The bar (issue 42): forward >= {bar['fwd_frac_of_cudnn']} of dense cuDNN's rate per kept score "
                      f"and >= {bar['fwd_ratio_vs_flex']:g}x FlexAttention, backward >= {bar['bwd_over_fwd']}x the "
                      f"forward's rate. Met in {met} of {len(rows)} cases; forward errors <= "
                      f"{e(max(r['fwd_err'] for r in rows))} (fp32 reference, sampled rows), gradients within "
                      f"{e(max(r['bwd_diff_vs_flex'] for r in rows))} of Flex's. Roofline: the forward's fewest bytes "
                      f"(Q, K, V read, O and the LSE written, once per head) at {hbm:.2f} TB/s of HBM, as effective "
                      f"TFLOP/s (bench/baseline.py's strided_roofline); the bar lies above it in "
                      f"{sum(r.get('roofline_tflops') or strided_roofline(r, hbm)['roofline_tflops'] < bar['fwd_frac_of_cudnn'] * r['cudnn_dense_fwd_tflops'] for r in rows)} "
                      f"of {len(rows)} cases."]


TABLES["strided"] = strided


def main():
    global UP
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--write", action="store_true", help="rewrite the blocks in the documents")
    g.add_argument("--check", action="store_true", help="exit 1 if a document's blocks are stale")
    ap.add_argument("--docs", nargs="+", default=[os.path.join(ROOT, "README.md"), os.path.join(ROOT, "docs", "RESULTS.md")])
    ap.add_argument("--baselines", default=BASELINES)
    args = ap.parse_args()
    files = {os.path.splitext(os.path.basename(p))[0]: p for p in sorted(glob.glob(os.path.join(args.baselines, "*.json")))}
    if not (args.write or args.check):
        for name, path in files.items():
            try:
                print(f"<!-- tables:{name} -->\n{block(path)}<!-- /tables:{name} -->\n")
            except (ValueError, KeyError) as ex:  # an A/B record (bench/ab.py), not a bench baseline
                print(f"# {name}: no table ({ex!r})\n")
        return 0
    problems, shown = [], set()
    for path in args.docs:
        with open(path) as f:
            text = f.read()
        rel = os.path.relpath(ROOT, os.path.dirname(os.path.abspath(path)))
        UP = "" if rel == "." else rel + "/"

        def fill(mt):
            name = mt.group(2)
            base = name[len("summary."):] if name.startswith("summary.") else name
            if base not in files:
                problems.append(f"{path}: block '{name}' has no {args.baselines}/{base}.json")
                return mt.group(0)
            new = block(files[base], summarize=base != name)
            if new != mt.group(3):
                diff = difflib.unified_diff(mt.group(3).splitlines(), new.splitlines(), os.path.basename(path),
                                            base + ".json", lineterm="")
                problems.append(f"{path}: block '{name}' is stale:\n" + "\n".join(diff))
            return mt.group(1) + new + mt.group(4)

        new_text = MARKER.sub(fill, text)
        names = [mt.group(2) for mt in MARKER.finditer(text)]
        shown |= {n for n in names if not n.startswith("summary.")}
        if args.write and new_text != text:
            with open(path, "w") as f:
                f.write(new_text)
            print(f"rewrote {path}")
        if args.check and not [p for p in problems if p.startswith(path + ":")]:
            print(f"{path}: {len(names)} result blocks up to date")
    for name in files.keys() - shown:
        print(f"note: no block for baseline {name}", file=sys.stderr)
    if args.write:
        problems = [p for p in problems if "has no" in p]
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
