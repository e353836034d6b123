#!/usr/bin/env python3
"""Sliding windows and causal masks through the PyTorch operator, against FlashAttention-4, FlexAttention and cuDNN.

The six training cases of the windows table (bf16; B x L x Hq/Hkv, D): each is run through
`spattn.torch.sparse_attention` as a user calls it, through FlashAttention-4's `flash_attn_func` (the CuTe DSL
package; optional, skipped with a note where `flash_attn.cute` does not import), through FlexAttention (compiled,
with a block mask of the same pairs) and through dense cuDNN SDPA (causal where the case is causal, else full:
a rate anchor, not the same pairs). All in one process:

  forward   each implementation captured once in a CUDA graph; replays timed in alternation (one of each, in turn),
            median of --reps;
  backward  torch.autograd.grad over a retained forward graph, timed in alternation, median of --reps.

Effective TFLOP/s count kept scores only: 4 * D * kept per (batch, head) forward, 2.5 times that backward.
Before timing, each implementation's output and gradients are compared with an fp32 reference on sampled query
rows (forward) and with the fp32 gradients of a smaller copy of the case (backward: L reduced to 2048). Writes
rows with `fwd_ratio_vs_fa4` and `bwd_ratio_vs_fa4` (null where FA4 is absent) and `..._vs_flex`.

  python3 bench/windows_bench.py --json out/windows.json                 # needs spattn importable (pip install .)
  python3 bench/windows_bench.py --baseline h200-windows                 # bench/baselines/h200-windows.{json,png}
"""
import argparse
import datetime
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_bench import time_pair, time_paired  # noqa: E402  (eager calls: the backward; graph replays: the forward)

# (name, B, L, Hq, Hkv, D, left, right, causal): left/right None = unbounded on that side
CASES = [
    ("local(256)", 2, 16384, 16, 16, 64, 256, 256, False),
    ("local(1024)", 1, 32768, 16, 16, 128, 1024, 1024, False),
    ("causal", 2, 8192, 16, 16, 128, None, 0, True),
    ("causal", 2, 16384, 16, 16, 64, None, 0, True),
    ("local(left=4096, right=0)", 1, 16384, 32, 8, 128, 4096, 0, True),
    ("local(left=1024, right=0)", 1, 32768, 32, 8, 64, 1024, 0, True),
]


def kept(L, left, right):
    """Kept (q, k) pairs of a [L, L] band left <= q - k ... : q - left <= k <= q + right (None: unbounded)."""
    n = 0
    lo_w = L if left is None else left
    hi_w = L if right is None else right
    for q in range(L):
        n += min(q, lo_w) + 1 + min(L - 1 - q, hi_w)
    return n


def mask_fn(left, right):
    def m(b, h, q, k):
        ok = k <= q + (right if right is not None else 1 << 30)
        if left is not None:
            ok = ok & (k >= q - left)
        return ok
    return m


def fa4():
    try:
        from flash_attn.cute import flash_attn_func  # noqa: PLC0415
        return flash_attn_func
    except Exception as e:  # noqa: BLE001
        print(f"# FlashAttention-4 not importable ({type(e).__name__}: {str(e)[:120]}): its columns are left empty")
        return None


def reference(q, k, v, left, right, rows):
    """fp32 attention of the query rows `rows` (q, k, v [B, L, H, D], GQA by repetition) -> [B, len(rows), H, D]."""
    B, L, Hq, D = q.shape
    g = Hq // k.shape[2]
    kk = k.float().repeat_interleave(g, dim=2)
    vv = v.float().repeat_interleave(g, dim=2)
    qi = torch.tensor(rows, device=q.device)
    s = torch.einsum("bqhd,bkhd->bhqk", q[:, qi].float(), kk) / math.sqrt(D)
    kpos = torch.arange(L, device=q.device)[None, :]
    d = qi[:, None] - kpos
    ok = torch.ones_like(d, dtype=torch.bool)
    if left is not None:
        ok &= d <= left
    if right is not None:
        ok &= -d <= right
    s = s.masked_fill(~ok, float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), vv)


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--cases", default="", help="comma-separated case indices (0-5); default all")
    ap.add_argument("--json", default="")
    ap.add_argument("--baseline", default="", help="write bench/baselines/NAME.json (+ .png)")
    ap.add_argument("--no-flex", action="store_true")
    args = ap.parse_args()

    import spattn.torch as st  # noqa: PLC0415
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: PLC0415

    flash = fa4()
    flex = torch.compile(flex_attention, dynamic=False)
    torch._dynamo.config.cache_size_limit = 64
    rows = []
    picks = [int(x) for x in args.cases.split(",")] if args.cases else range(len(CASES))
    for ci in picks:
        spec, B, L, Hq, Hkv, D, left, right, causal = CASES[ci]
        torch.manual_seed(ci)
        q = torch.randn(B, L, Hq, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, L, Hkv, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, L, Hkv, D, device="cuda", dtype=torch.bfloat16)
        do = torch.randn(B, L, Hq, D, device="cuda", dtype=torch.bfloat16)
        n = kept(L, left, right)
        fwd_flop = 4.0 * D * n * B * Hq
        impls = {}
        impls["spattn"] = lambda q, k, v: st.sparse_attention(q, k, v, spec)
        if flash is not None:
            if causal and left is None:
                impls["fa4"] = lambda q, k, v: flash(q, k, v, causal=True)[0]
            else:  # FA4 keeps q - left <= k <= q + right (None: unbounded)
                impls["fa4"] = lambda q, k, v: flash(q, k, v, window_size=(left, right))[0]
        if not args.no_flex:
            masks = {}  # one block mask a length (the backward check runs a shorter copy)

            def fx(q, k, v):
                n = q.shape[1]
                if n not in masks:
                    masks[n] = create_block_mask(mask_fn(left, right), None, None, n, n, device="cuda")
                return flex(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=masks[n],
                            enable_gqa=Hq != Hkv).transpose(1, 2)
            impls["flex"] = fx

        def cudnn(q, k, v):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                      is_causal=causal, enable_gqa=Hq != Hkv).transpose(1, 2)
        # check: sampled rows against fp32
        sample = sorted(set([0, 1, L // 2, L // 2 + 1, L - 2, L - 1] + list(range(0, L, max(1, L // 16)))))
        ref = reference(q, k, v, left, right, sample)
        row = {"spec": spec, "B": B, "L": L, "Hq": Hq, "Hkv": Hkv, "D": D, "kept": n, "device": torch.cuda.get_device_name()}
        for name, f in impls.items():
            row[f"{name}_fwd_err"] = rel(f(q, k, v)[:, sample], ref)
        # forward: graphs in alternation
        fwd_ms, _ = time_paired([lambda f=f: f(q, k, v) for f in impls.values()], args.reps)
        dense_ms = time_paired([lambda: cudnn(q, k, v)], args.reps)[0][0]
        dense_kept = L * (L + 1) // 2 if causal else L * L
        # backward: autograd.grad in alternation over retained graphs
        bwd = []
        for name, f in impls.items():
            qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))
            o = f(qg, kg, vg)
            bwd.append(lambda o=o, qg=qg, kg=kg, vg=vg: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True))
        bwd_ms = time_pair(bwd, args.reps)
        for (name, _f), fm, bm_ in zip(impls.items(), fwd_ms, bwd_ms):
            row[f"{name}_fwd_ms"] = fm
            row[f"{name}_bwd_ms"] = bm_
            row[f"{name}_fwd_tflops"] = fwd_flop / fm / 1e9
            row[f"{name}_bwd_tflops"] = 2.5 * fwd_flop / bm_ / 1e9
        row["cudnn_dense_fwd_tflops"] = 4.0 * D * dense_kept * B * Hq / dense_ms / 1e9
        for a in ("fa4", "flex"):
            for p in ("fwd", "bwd"):
                row[f"{p}_ratio_vs_{a}"] = (row[f"{a}_{p}_ms"] / row[f"spattn_{p}_ms"]) if f"{a}_{p}_ms" in row else None
        # backward correctness on a shorter copy (fp32 autograd reference)
        Ls = min(L, 2048)
        qs, ks, vs, dos = (x[:, :Ls].detach().clone() for x in (q, k, v, do))
        qr, kr, vr = (x.float().requires_grad_() for x in (qs, ks, vs))
        g = Hq // Hkv
        s = torch.einsum("bqhd,bkhd->bhqk", qr, kr.repeat_interleave(g, 2)) / math.sqrt(D)
        d = torch.arange(Ls, device="cuda")[:, None] - torch.arange(Ls, device="cuda")[None, :]
        ok = torch.ones_like(d, dtype=torch.bool)
        if left is not None:
            ok &= d <= left
        if right is not None:
            ok &= -d <= right
        oref = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s.masked_fill(~ok, float("-inf")), -1),
                            vr.repeat_interleave(g, 2))
        gref = torch.autograd.grad(oref, (qr, kr, vr), dos.float())
        for name, f in impls.items():
            qg, kg, vg = (x.requires_grad_() for x in (qs.clone(), ks.clone(), vs.clone()))
            gg = torch.autograd.grad(f(qg, kg, vg), (qg, kg, vg), dos)
            row[f"{name}_bwd_err"] = max(rel(a, b) for a, b in zip(gg, gref))
        rows.append(row)
        fa = f"{row.get('fa4_fwd_tflops', float('nan')):6.0f}" if flash else "     -"
        fb = f"{row.get('fa4_bwd_tflops', float('nan')):6.0f}" if flash else "     -"
        print(f"{spec:28s} {B}x{L}x{Hq}/{Hkv} D{D}: fwd ours {row['spattn_fwd_tflops']:6.0f} fa4 {fa} "
              f"flex {row.get('flex_fwd_tflops', float('nan')):6.0f} cudnn {row['cudnn_dense_fwd_tflops']:6.0f} | "
              f"bwd ours {row['spattn_bwd_tflops']:6.0f} fa4 {fb} flex {row.get('flex_bwd_tflops', float('nan')):6.0f}"
              f" | err fwd {row['spattn_fwd_err']:.1e} bwd {row['spattn_bwd_err']:.1e}", flush=True)
        del q, k, v, do, bwd
        torch.cuda.empty_cache()

    def gm(key):
        xs = [r[key] for r in rows if r.get(key)]
        return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None
    summary = {k: gm(k) for k in ("fwd_ratio_vs_fa4", "bwd_ratio_vs_fa4", "fwd_ratio_vs_flex", "bwd_ratio_vs_flex")}
    print("geomean:", {k: (round(v, 3) if v else None) for k, v in summary.items()})
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    out = {"kind": "windows", "meta": {"commit": os.environ.get("SPATTN_COMMIT", commit), "date": datetime.date.today().isoformat(),
                    "command": "python3 bench/windows_bench.py " + " ".join(sys.argv[1:])},
           "machine": torch.cuda.get_device_name(), "summary": summary, "rows": rows}
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    if args.baseline:
        d = os.environ.get("SPATTN_BASELINES", os.path.join(os.path.dirname(os.path.abspath(__file__)), "baselines"))
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, args.baseline + ".json"), "w") as f:
            json.dump(out, f, indent=1)
        try:
            import matplotlib  # noqa: PLC0415
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt  # noqa: PLC0415
            labels = [f"{r['spec']}\n{r['B']}x{r['L']} D{r['D']}" for r in rows]
            fig, ax = plt.subplots(1, 2, figsize=(13, 4.5))
            for a, p in zip(ax, ("fwd", "bwd")):
                xs = range(len(rows))
                for j, (impl, c) in enumerate((("spattn", "C0"), ("fa4", "C1"), ("flex", "C2"))):
                    ys = [r.get(f"{impl}_{p}_tflops", 0) or 0 for r in rows]
                    a.bar([x + 0.27 * (j - 1) for x in xs], ys, 0.27, label=impl, color=c)
                a.set_xticks(list(xs))
                a.set_xticklabels(labels, fontsize=6)
                a.set_ylabel(f"{p} effective TFLOP/s (bf16)")
                a.legend()
            fig.suptitle(f"windows and causal masks, {torch.cuda.get_device_name()}")
            fig.tight_layout()
            fig.savefig(os.path.join(d, args.baseline + ".png"), dpi=110)
        except ImportError:
            print("# matplotlib missing: no plot")


if __name__ == "__main__":
    main()
