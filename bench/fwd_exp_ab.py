#!/usr/bin/env python3
"""Issue 40's forward experiments (SPATTN_FWD_EXP, temporary) against the measured loop, in one process.

The six cases of bench/windows_bench.py under each value of SPATTN_FWD_EXP: "0" (the measured kernels), "ovl"
(softmax_i under PV_{i-1}), "ovl,p2" (row max and sum in two chains), "lazy" (FlashAttention-4's lazy rescale),
"p2,lazy" and "ovl,p2,lazy,pre" (the next tile's entry loaded a step ahead). The D=128 cases' long rows run on the TMA
kernel's 128x128 loop, which takes every bit; the D=64 windows run on the band kernel's plain steps, which take "ovl"
alone (every value but "0" is "ovl" there); causal D=64 runs the running-max band steps (no experiment: a control).
"band:VALUE": the band kernel forced (kernel="sm90_band": plain steps) with SPATTN_FWD_EXP=VALUE, to see whether the
band kernel with the overlap beats the TMA kernel on the D=128 long rows. The variable is read when a launch's
parameters are built, so each variant is captured in a CUDA graph of its own while it is set; the graphs are replayed
in alternation (gpu_bench.time_paired), median of --reps, with FlashAttention-4 alongside where it imports. Each variant's output is compared with the
measured loop's (relative difference; the C++ tests check every variant against the fp64 reference).

  python3 bench/fwd_exp_ab.py [--reps 20] [--cases 1,2,4] [--variants "0;ovl;band:ovl"] [--json out/fwd_exp.json]
"""
import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_bench import time_paired  # noqa: E402
from windows_bench import CASES, fa4, kept, rel  # noqa: E402

VARIANTS = ["0", "ovl", "ovl,p2", "lazy", "p2,lazy", "ovl,p2,lazy,pre", "band:0", "band:ovl"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--cases", default="0,1,2,3,4,5", help="indices into windows_bench.CASES (D=128: 1, 2, 4)")
    ap.add_argument("--variants", default=";".join(VARIANTS), help="SPATTN_FWD_EXP values, ';'-separated")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    import spattn.torch as st  # noqa: PLC0415

    variants = args.variants.split(";")
    flash = fa4()
    rows = []
    for ci in [int(x) for x in args.cases.split(",")]:
        spec, B, L, Hq, Hkv, D, left, right, causal = CASES[ci]
        torch.manual_seed(ci)
        q = torch.randn(B, L, Hq, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, L, Hkv, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, L, Hkv, D, device="cuda", dtype=torch.bfloat16)
        flop = 4.0 * D * kept(L, left, right) * B * Hq

        def ours(val):
            kernel = None
            if val.startswith("band:"):
                kernel, val = "sm90_band", val[len("band:"):]

            def fn():
                os.environ["SPATTN_FWD_EXP"] = val
                try:
                    return st.sparse_attention(q, k, v, spec, kernel=kernel)
                finally:
                    os.environ.pop("SPATTN_FWD_EXP", None)
            return fn

        fns = [ours(val) for val in variants]
        names = list(variants)
        if flash is not None:
            if causal and left is None:
                fns.append(lambda: flash(q, k, v, causal=True)[0])
            else:
                fns.append(lambda: flash(q, k, v, window_size=(left, right))[0])
            names.append("fa4")
        with torch.no_grad():
            base = fns[0]()
            diffs = {n: rel(f(), base) for n, f in zip(names, fns)}
            ms, how = time_paired(fns, args.reps)
        row = {"case": f"{spec} {B}x{L}x{Hq}/{Hkv} D{D}", "ms": dict(zip(names, ms)), "timing": how,
               "tflops": {n: flop / (t * 1e-3) / 1e12 for n, t in zip(names, ms)}, "rel_diff_vs_0": diffs}
        rows.append(row)
        print(f"{row['case']}:")
        for n in names:
            t = row["tflops"][n]
            vs0 = row["ms"]["0"] / row["ms"][n]
            vs_fa4 = f" {row['ms']['fa4'] / row['ms'][n]:.3f}x FA4" if "fa4" in row["ms"] else ""
            print(f"  {n:18s} {row['ms'][n]:8.3f} ms {t:6.0f} TFLOP/s  {vs0:.3f}x measured{vs_fa4}"
                  f"  rel diff {diffs[n]:.1e}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
