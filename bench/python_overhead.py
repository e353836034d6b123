#!/usr/bin/env python3
"""Host overhead of spattn's Python entry points over the C++ call, with a cached plan.

    python3 bench/python_overhead.py [--device cpu|cuda] [--threads N] [--rounds 9] [--calls 3000] [--json FILE]

One small problem (B=1, L=16, H=1, D=16, local(2) on the CPU; L=128, D=64, bf16 on a GPU) so that the kernel is
short and what is measured is the path around it. Each round times, back to back, `--calls` calls of:

  cpp          Plan::forward in a C++ loop on the same arrays (spattn._core.Plan.time_forward): the baseline
  core         spattn._core.Plan.forward from Python, outputs preallocated (the binding and DLPack import)
  plan         spattn.Plan.forward on numpy / torch arrays, allocating O
  attention    spattn.attention (plan cache look-up, allocation)
  op           spattn.torch.sparse_attention without autograd (the spattn::sparse_attention_nograd operator:
               dispatch, plan cache, allocation)
  op_autograd  the same with q requiring grad (records the autograd node; forward only)

and reports, per path, the median over rounds of the mean time per call and its excess over `cpp`. On CUDA the
calls only enqueue (the GPU work overlaps); the numbers are host time per call.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

import spattn


def per_call(fn, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="CPU worker threads of the plan (0: all)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    try:
        import torch
        import spattn.torch as st
    except ImportError:
        torch = st = None

    cuda = args.device.startswith("cuda")
    if cuda and torch is None:
        print("--device cuda needs torch")
        return 2
    B, L, H, D = (1, 128, 2, 64) if cuda else (1, 16, 1, 16)
    spec = "local(16)" if cuda else "local(2)"
    paths: dict = {}

    if cuda:
        dev = torch.device(args.device)
        q, k, v = (torch.randn(B, L, H, D, device=dev, dtype=torch.bfloat16) for _ in range(3))
        p = spattn.plan(spec, L, L, H, H, D, args.device, dtype="bfloat16")
        o = torch.empty(B, L, H, D, device=dev, dtype=torch.bfloat16)
        lse = torch.empty(B, H, L, device=dev)
        qn = kn = vn = None
    else:
        rng = np.random.default_rng(0)
        qn, kn, vn = (rng.standard_normal((B, L, H, D)).astype(np.float32) for _ in range(3))
        p = spattn.plan(spec, L, L, H, H, D, threads=args.threads)
        on, lsen = np.empty((B, L, H, D), np.float32), np.empty((B, H, L), np.float32)
        paths["core_numpy"] = lambda: p._p.forward(qn, kn, vn, on, lsen, None, "blhd")
        paths["plan_numpy"] = lambda: p.forward(qn, kn, vn)
        paths["attention_numpy"] = lambda: spattn.attention(qn, kn, vn, spec, threads=args.threads)
        if torch is not None:
            q, k, v = (torch.from_numpy(x) for x in (qn, kn, vn))
            o, lse = torch.from_numpy(on), torch.from_numpy(lsen)
    if torch is not None:
        qg = q.detach().clone().requires_grad_()
        threads = None if cuda else args.threads
        paths["core_torch"] = lambda: p._p.forward(q, k, v, o, lse, None, "blhd")
        paths["plan_torch"] = lambda: p.forward(q, k, v)
        paths["op"] = lambda: st.sparse_attention(q, k, v, spec, threads=threads)
        paths["op_autograd"] = lambda: st.sparse_attention(qg, k, v, spec, threads=threads)
    cpp_args = (q, k, v, o, lse) if torch is not None else (qn, kn, vn, on, lsen)

    for fn in paths.values():  # plan, warm
        for _ in range(50):
            fn()
    rounds: dict = {name: [] for name in ["cpp", *paths]}
    for _ in range(args.rounds):
        rounds["cpp"].append(p._p.time_forward(*cpp_args, args.calls, "blhd"))
        for name, fn in paths.items():
            rounds[name].append(per_call(fn, args.calls))
        if cuda:
            torch.cuda.synchronize()

    med = {name: statistics.median(ts) * 1e6 for name, ts in rounds.items()}
    print(f"spattn {spattn.__version__}, {p.engine} on {p.device}, kernel {p.kernel()}, B={B} L={L} H={H} D={D} "
          f"'{spec}'; threads {args.threads or 'all'}; median of {args.rounds} rounds x {args.calls} calls")
    print(f"{'path':<16} {'us/call':>9} {'over C++':>9}")
    for name, us in med.items():
        print(f"{name:<16} {us:9.2f} {us - med['cpp']:9.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": p.device, "engine": p.engine, "kernel": p.kernel(), "problem": [B, L, H, D],
                       "pattern": spec, "threads": args.threads, "median_us": med,
                       "over_cpp_us": {n: us - med["cpp"] for n, us in med.items()},
                       "torch": getattr(torch, "__version__", None)}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
