"""Session 11: one plan per spattn_fused_create flag set (FLAGS_A, FLAGS_B, e.g. 1024 = never / 512 = always the
band kernel's running-max steps), timed in alternation in one process as CUDA graphs (gpu_bench.time_paired), on
the same inputs. Usage: python3 ab_flags.py LIB FLAGS_A FLAGS_B [rounds] -> one line per (case, round)."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import gpu_bench as gb  # noqa: E402

lib = gb.Lib(sys.argv[1])
fa, fb = int(sys.argv[2]), int(sys.argv[3])
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
B, H, D = 2, 16, 64
cases = [("local", "local(256)", 4096), ("causal", "causal", 4096), ("local", "local(256)", 16384),
         ("causal", "causal", 16384), ("local1024", "local(1024)", 8192), ("causal_b1h2", "causal", 4096)]
for name, spec, L in cases:
    b, h = (1, 2) if name == "causal_b1h2" else (B, H)
    plans = [gb.Fused(lib, spec, L, D, force_sm80=f) for f in (fa, fb)]
    q, k, v = (torch.randn(b, h, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    outs = [torch.empty_like(q) for _ in plans]
    fns = [lambda i=i: plans[i].forward(q, k, v, outs[i]) for i in range(2)]
    for r in range(rounds):
        ms, how = gb.time_paired(fns, 30)
        tf = [4.0 * plans[0].nnz * D * b * h / (m * 1e-3) / 1e12 for m in ms]
        err = (outs[0].float() - outs[1].float()).abs().max().item()
        print(f"{name:12s} L={L:5d} round {r}: flags {fa} {tf[0]:6.1f}  {fb} {tf[1]:6.1f} TF/s  ratio {tf[1] / tf[0]:.4f}"
              f"  ({how[0]}, max |diff| {err:.2e})", flush=True)
