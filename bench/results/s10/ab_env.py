"""Session 10: the band kernel of an experiment build (VAR=1) against its default (VAR=0), timed in alternation
in one process (one plan, two CUDA graphs captured with VAR=0 / 1, which an experiment build reads at each
launch).
Usage: python3 ab_env.py LIB VAR [rounds [A B]] (the two values, default 0 and 1; AB_CASES=name[@L],... a subset)
-> one line per (case, round):
ms and TFLOP/s of each."""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import gpu_bench as gb  # noqa: E402

lib = gb.Lib(sys.argv[1])
var = sys.argv[2]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
va, vb = (sys.argv[4], sys.argv[5]) if len(sys.argv) > 5 else ("0", "1")
B, H, D = 2, 16, 64
cases = [("local", "local(256)", 4096), ("causal", "causal", 4096), ("local", "local(256)", 16384),
         ("causal", "causal", 16384), ("local", "local(256)", 8192), ("causal_b1h2", "causal", 4096)]
only = os.environ.get("AB_CASES")  # optional: a comma-separated subset of the case names (session 11)
if only:
    cases = [c for c in cases if f"{c[0]}@{c[2]}" in only.split(",") or c[0] in only.split(",")]
for name, spec, L in cases:
    b, h = (1, 2) if name == "causal_b1h2" else (B, H)
    fp = gb.Fused(lib, spec, L, D)
    q, k, v = (torch.randn(b, h, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    outs = {}

    def make(t):
        o = torch.empty_like(q)
        outs[t] = o

        def fn():
            os.environ[var] = t
            fp.forward(q, k, v, o)
        return fn

    fns = [make(va), make(vb)]
    for r in range(rounds):
        ms, how = gb.time_paired(fns, 30)
        tf = [4.0 * fp.nnz * D * b * h / (m * 1e-3) / 1e12 for m in ms]
        same = torch.equal(outs[va], outs[vb])
        print(f"{name:12s} L={L:5d} round {r}: {var}={va} {tf[0]:6.1f} ={vb} {tf[1]:6.1f} TF/s  ratio {tf[1] / tf[0]:.4f}"
              f"  ({how[0]}, outputs equal: {same})", flush=True)
