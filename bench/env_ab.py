#!/usr/bin/env python3
"""A/B of an environment switch in one process, through the PyTorch operator as users call it.

    python3 bench/env_ab.py VAR=VALUE [--reps 12] [--cases a,b,...] [--fwd-only | --bwd-only] [--budget-s S]
                            [--json out.json]

Each case (CASES below: the window table's six cases, the compound, neighborhood and block-mask cases of the suite)
runs spattn.torch.sparse_attention's forward (no grad) and backward (torch.autograd.grad) with VAR unset (the
default) and with VAR=VALUE, the two in alternation, medians of CUDA-event timings of eager calls. The switch is set
around each call (the library reads its switches at each launch). Before timing, the two outputs are compared: the
forward's largest absolute difference and the gradients' largest relative one (a variant that computes the same
values shows 0 and fp32 summation noise). Each line prints the variant's time over the default's (below 1: the
variant is faster). Needs a CUDA GPU and the spattn Python module with its CUDA kernels.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch

import spattn.torch as st

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_bench import time_pair, with_env  # noqa: E402

CASES = [  # name, spec, B, L, Hq, Hkv, D
    ("w_local256_d64", "local(256)", 2, 16384, 16, 16, 64),
    ("w_local1024_d128", "local(1024)", 1, 32768, 16, 16, 128),
    ("w_causal_d128", "causal", 2, 8192, 16, 16, 128),
    ("w_causal_d64", "causal", 2, 16384, 16, 16, 64),
    ("w_left4096_gqa_d128", "local(left=4096, right=0)", 1, 16384, 32, 8, 128),
    ("w_left1024_gqa_d64", "local(left=1024, right=0)", 1, 32768, 32, 8, 64),
    ("bigbird", "bigbird(64, 3, 2, 3)", 2, 16384, 16, 16, 64),
    ("fixed", "sparse_fixed(128, 4)", 2, 16384, 16, 16, 64),
    ("bandrand", "local(256) | random(8)", 2, 16384, 16, 16, 64),
    ("longformer", "longformer(256, 32)", 2, 16384, 16, 16, 64),
    ("strided256", "sparse_strided(256)", 2, 16384, 16, 16, 64),
    ("na2d_96", "neighborhood(dims=(96,96), kernel=7)", 4, 9216, 16, 16, 64),
    ("sinks_gqa", "(local(left=2048, right=0) | global_cols(0:4)) & causal", 1, 32768, 32, 8, 128),
    ("blocked", "blocked(128, random(8) | local(0)) & causal", 1, 32768, 16, 16, 128),
    ("dense_d128", "dense", 1, 8192, 16, 16, 128),
    ("local_gqa_d128", "local(256)", 2, 16384, 32, 4, 128),
    ("local_d128", "local(256)", 2, 16384, 16, 16, 128),
    ("na1d_d128", "neighborhood(kernel=257)", 2, 16384, 16, 16, 128),
    ("na3d_d128", "neighborhood(dims=(16,32,32), kernel=7, causal=(1,0,0))", 2, 16384, 16, 16, 128),
]


def run_case(case, var, value, args):
    name, spec, B, L, H, HK, D = case
    torch.manual_seed(0)
    q = torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, L, HK, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, L, HK, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16)

    def fwd():
        with torch.no_grad():
            return st.sparse_attention(q, k, v, spec)

    o = st.sparse_attention(q, k, v, spec)

    def bwd():
        return torch.autograd.grad(o, (q, k, v), do, retain_graph=True)

    off, on = {var: None}, {var: value}
    oa, ob = with_env(fwd, off)(), with_env(fwd, on)()
    ga, gb = with_env(bwd, off)(), with_env(bwd, on)()
    fdiff = (oa.float() - ob.float()).abs().max().item()
    gdiff = max(((x.float() - y.float()).abs().max() / y.float().abs().max().clamp_min(1e-9)).item()
                for x, y in zip(ga, gb))
    nan2 = [float("nan")] * 2
    tf = nan2 if args.bwd_only else time_pair([with_env(fwd, off), with_env(fwd, on)], args.reps)
    tb = nan2 if args.fwd_only else time_pair([with_env(bwd, off), with_env(bwd, on)], args.reps)
    return dict(case=name, spec=spec, B=B, L=L, Hq=H, Hkv=HK, D=D, fwd_default_ms=tf[0], fwd_variant_ms=tf[1],
                bwd_default_ms=tb[0], bwd_variant_ms=tb[1], fwd_variant_over_default=tf[1] / tf[0],
                bwd_variant_over_default=tb[1] / tb[0], fwd_maxdiff=fdiff, grad_reldiff=gdiff)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("switch", help="VAR=VALUE: the variant's environment")
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--cases", default="", help="comma list of CASES names (default: all)")
    only = ap.add_mutually_exclusive_group()
    only.add_argument("--fwd-only", action="store_true")
    only.add_argument("--bwd-only", action="store_true")
    ap.add_argument("--budget-s", type=float, default=None, help="start no case past this many seconds")
    ap.add_argument("--json", default="", help="also write the rows there")
    args = ap.parse_args()
    var, sep, value = args.switch.partition("=")
    if not sep or not var:
        ap.error(f"switch {args.switch!r}: expected VAR=VALUE")
    names = [c[0] for c in CASES]
    wanted = [x for x in args.cases.split(",") if x]
    unknown = [x for x in wanted if x not in names]
    if unknown:
        ap.error(f"unknown cases {unknown}; known: {', '.join(names)}")
    if not torch.cuda.is_available():
        raise SystemExit("env_ab.py: needs a CUDA GPU")
    t0 = time.monotonic()
    rows = []
    for case in CASES:
        if wanted and case[0] not in wanted:
            continue
        if args.budget_s is not None and time.monotonic() - t0 > args.budget_s:
            print(f"# budget: {case[0]} and later skipped")
            break
        r = run_case(case, var, value, args)
        rows.append(r)
        print(f"{r['case']:22s} fwd {r['fwd_default_ms']:7.3f} / {r['fwd_variant_ms']:7.3f} ms "
              f"(variant/default {r['fwd_variant_over_default']:5.3f})  bwd {r['bwd_default_ms']:7.3f} / "
              f"{r['bwd_variant_ms']:7.3f} ms ({r['bwd_variant_over_default']:5.3f})  diff fwd {r['fwd_maxdiff']:.1e} "
              f"grad {r['grad_reldiff']:.1e}", flush=True)
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(variable=var, value=value, device=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
