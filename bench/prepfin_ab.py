#!/usr/bin/env python3
"""The tensor-core backward's prep and finish kernels (src/cuda/backward/tile_bwd.cuh): the per-head-grid ones
(default) against the old flat-grid ones (SPATTN_BWD_PREPFIN=old, the temporary A/B switch read at each launch), in one
process through `spattn.torch`: each kernel's GPU time a backward (torch.profiler), the whole backward's (CUDA events,
the two in alternation, median of reps) and the gradients' largest difference (fp32 summation order only).

  python3 bench/prepfin_ab.py [--reps 20] [--cases causal_d128,local256_d64]
"""
import argparse
import os
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

import spattn.torch as st

VAR = "SPATTN_BWD_PREPFIN"
CASES = {  # name: spec, B, L, Hq, Hkv, D
    "causal_d128": ("causal", 2, 8192, 16, 16, 128),
    "local256_d64": ("local(256)", 2, 16384, 16, 16, 64),
    "causal_d64": ("causal", 2, 16384, 16, 16, 64),
    "left1024_gqa_d64": ("local(left=1024, right=0)", 1, 32768, 32, 8, 64),
    "left4096_gqa_d128": ("local(left=4096, right=0)", 1, 16384, 32, 8, 128),
    "dilated_d64": ("dilated(64, 32)", 2, 16384, 16, 16, 64),  # residue groups (perm_d 32)
}


def set_mode(old):
    if old:
        os.environ[VAR] = "old"
    else:
        os.environ.pop(VAR, None)


def kernel_us(fn, reps):
    """GPU microseconds a call of fn spends in each prep / finish kernel (by name)."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if "bwd_prep" in e.key or "bwd_finish" in e.key:
            t = getattr(e, "device_time_total", None)
            t = e.cuda_time_total if t is None else t
            kind = "prep" if "bwd_prep" in e.key else "finish"
            out[kind] = out.get(kind, 0.0) + t / reps
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--cases", default=",".join(CASES))
    a = ap.parse_args()
    for name in a.cases.split(","):
        spec, B, L, H, HK, D = CASES[name]
        torch.manual_seed(0)
        q = torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(B, L, HK, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(B, L, HK, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        do = torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16)
        o = st.sparse_attention(q, k, v, spec)
        bwd = lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)  # noqa: E731
        grads, kern = [], []
        for old in (False, True):
            set_mode(old)
            for _ in range(3):
                bwd()
            grads.append(bwd())
            kern.append(kernel_us(bwd, a.reps))
        times = [[], []]
        for _ in range(a.reps):
            for old in (False, True):
                set_mode(old)
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                bwd()
                e.record()
                times[old].append((s, e))
        set_mode(False)
        torch.cuda.synchronize()
        ms = [statistics.median(s.elapsed_time(e) for s, e in t) for t in times]
        diff = max(((x.float() - y.float()).abs().max() / y.float().abs().max().clamp_min(1e-9)).item()
                   for x, y in zip(*grads))
        f = lambda d, key: f"{d.get(key, float('nan')):6.1f}"  # noqa: E731
        print(f"{name:18s} prep new {f(kern[0], 'prep')} old {f(kern[1], 'prep')} us   finish new "
              f"{f(kern[0], 'finish')} old {f(kern[1], 'finish')} us   backward new {ms[0]:.3f} old {ms[1]:.3f} ms   "
              f"grad reldiff {diff:.1e}", flush=True)
        del q, k, v, do, o, grads
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
