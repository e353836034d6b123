#!/usr/bin/env python3
"""The backward pass against FlexAttention's on the GPU (both timed in one process, on the same inputs).

    python3 bench/bwd_bench.py --lib build/libspattn.so [--lengths 16384] [--patterns local,causal] [--dims 64,128]
                               [--kernel sm90_bwd|sm90_bwd_ws|cuda_csr_bwd|ROW[,...]] [--json out.json]

Patterns and FlexAttention masks: gpu_bench.py's suite (`suite(L)`). Ours: spattn_plan_backward (C API) after one
forward (o, lse); the row that ran is reported (spattn_plan_last_backward_kernel). Several --kernel values (comma
separated, '' the chosen one) time each on its own plan, all alternated with Flex in one loop: an A/B in one process. Flex: torch.autograd.grad through
the compiled flex_attention with the block mask of the same pattern (its forward is not timed: the graph's backward
only, via retain_graph). Medians of CUDA-event timings of the calls, ours and Flex's alternated. Effective TFLOP/s of
a backward count 2.5x the forward's kept-score FLOPs (4 * nnz * D * B * H * 2.5). Errors: ours and Flex's gradients
against each other (relative Frobenius, the largest of dq, dk, dv); ours against the fp64 reference is the GPU tests'.
Each row also has our forward's time and rate (fwd_ms, fwd_tflops), bwd_over_fwd (the backward's effective TFLOP/s
over the forward's) and bwd_ratio_vs_flex (Flex's backward time over ours).

    --compound: the compound cases of issue 39 instead of the suite (COMPOUND below: sparse_fixed, band | random,
    longformer, a causal window with sinks at L = 32768 GQA 32/8 D = 128, bigbird), each at its own length, heads
    and head dim; a compound plan's backward runs by parts (the kernel column reads parts(row+row...)).
    --issue: issue 39's table (issue_cases: sparse_fixed, band | random(8), two neighborhoods, local(256) at D = 64
    and GQA 32/4 D = 128, bigbird, the causal window with sinks, longformer).
Every row carries issue 39's bar ("class", "bar": 0.8 on bands, blocks and causal, else 0.6; BAR_CLASS names them),
and the run a "summary" (geomeans, the least ratios, the rows below the bar), the suite's runs as the table's.

    python3 bench/bwd_bench.py --lib build/libspattn.so --baseline h200-bwd

writes bench/baselines/h200-bwd.json (+ .png; $SPATTN_BASELINES elsewhere) from the --issue cases (the default
with --baseline unless --compound or --patterns is given), within --budget-s seconds (default 230 with --baseline:
cases not started by then are rows marked "skipped": "budget").
"""
import argparse
import ctypes
import json
import math
import sys
import time
from pathlib import Path

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_bench import Lib, neighborhood_mask, suite, time_pair, with_env  # noqa: E402
from gpu_bench import bhld_strides as strides  # noqa: E402  ([B, H, L, D] tensor as [B, L, H, D])

i64, vp = ctypes.c_int64, ctypes.c_void_p


def sinks_causal(b, h, q, k):  # (local(left=2048, right=0) | global_cols(0:4)) & causal
    return (q >= k) & ((q - k <= 2048) | (k < 4))


def longformer(b, h, q, k):  # longformer(256, 32)
    return ((q - k).abs() <= 256) | (q < 32) | (k < 32)


def local256(b, h, q, k):
    return (q - k).abs() <= 256


# Issue 39's bar: the backward's effective TFLOP/s at least this share of the same plan's forward (0.8 on bands,
# blocks and causal, 0.6 elsewhere); against FlexAttention's backward a geomean of 2.5x and no case below 1.5x.
# BAR_CLASS: the classes by case name, issue 39's table's names, then the suite's (gpu_bench.suite) that are bands,
# blocks or causal; any other name is "other" (bar 0.6).
BAR_CLASS = {"local": "band", "local_gqa": "band", "bigbird": "blocks", "sinks_causal": "causal",
             "lfcols": "band", "sinks": "band", "causal": "causal", "dense": "blocks"}
BAR_FLEX_GEOMEAN, BAR_FLEX_MIN = 2.5, 1.5


def bar_of(name):
    return 0.8 if name in BAR_CLASS else 0.6


def issue_cases(L):
    """(name, spec, mask_mod or None, B, H, HK, L, D): issue 39's table, and longformer (L: the default length)."""
    return [
        ("sparse_fixed", "sparse_fixed(128, 4)", None, 2, 16, 16, L, 64),
        ("bandrand8", "local(256) | random(8)", None, 2, 16, 16, L, 64),
        ("na2d_96", "neighborhood(dims=(96,96), kernel=7)", neighborhood_mask((96, 96), (7, 7)), 4, 16, 16, 9216, 64),
        ("na2d_112", "neighborhood(dims=(112,112), kernel=9)", neighborhood_mask((112, 112), (9, 9)), 2, 8, 8, 12544,
         128),
        ("local", "local(256)", local256, 2, 16, 16, L, 64),
        ("local_gqa", "local(256)", local256, 2, 32, 4, L, 128),
        ("bigbird", "bigbird(64, 3, 2, 3)", None, 2, 16, 16, L, 64),
        ("sinks_causal", "(local(left=2048, right=0) | global_cols(0:4)) & causal", sinks_causal, 1, 32, 8, 2 * L, 128),
        ("longformer", "longformer(256, 32)", longformer, 2, 16, 16, L, 64),
    ]


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summary(rows):
    """The run against the bar: geomeans and least values of bwd_over_fwd and bwd_ratio_vs_flex, rows below."""
    done = [r for r in rows if "tflops" in r]
    vs = [r["bwd_ratio_vs_flex"] for r in done if "bwd_ratio_vs_flex" in r]
    bo = [r["bwd_over_fwd"] for r in done]
    return {"cases": len(done), "skipped": [r["pattern"] for r in rows if "skipped" in r],
            "geomean_bwd_over_fwd": geomean(bo), "min_bwd_over_fwd": min(bo, default=None),
            "geomean_bwd_ratio_vs_flex": geomean(vs), "min_bwd_ratio_vs_flex": min(vs, default=None),
            "below_bar_bwd_over_fwd": [f"{r['pattern']} D={r['D']}" for r in done
                                       if "bar" in r and r["bwd_over_fwd"] < r["bar"]],
            "below_flex_min": [f"{r['pattern']} D={r['D']}" for r in done
                               if r.get("bwd_ratio_vs_flex", BAR_FLEX_MIN) < BAR_FLEX_MIN],
            "bar": f"bwd_over_fwd >= 0.8 on band, blocks, causal (else 0.6); geomean bwd_ratio_vs_flex >= "
                   f"{BAR_FLEX_GEOMEAN}, none below {BAR_FLEX_MIN}"}


def compound_cases(L):
    """(name, spec, mask_mod or None, B, H, HK, L, D): issue 39's compound cases (L: the default length)."""
    return [
        ("sparse_fixed", "sparse_fixed(128, 4)", None, 2, 16, 16, L, 64),
        ("bandrand8", "local(256) | random(8)", None, 2, 16, 16, L, 64),
        ("longformer", "longformer(256, 32)", longformer, 2, 16, 16, L, 64),
        ("sinks_causal", "(local(left=2048, right=0) | global_cols(0:4)) & causal", sinks_causal, 1, 32, 8, 2 * L, 128),
        ("bigbird", "bigbird(64, 3, 2, 3)", None, 2, 16, 16, L, 64),
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True)
    ap.add_argument("--lengths", default="16384")
    ap.add_argument("--patterns", default="local,longformer,bigbird,dilated,causal,fixed,na2d",
                    help="suite names; name:D runs that head dim only (else every --dims)")
    ap.add_argument("--dims", default="64")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--options", default="", help="more PlanOptions for every plan, key=value,... (e.g. perm_d=1)")
    ap.add_argument("--kernel", default="", help="PlanOptions::backward_kernel ('' chosen); a comma list times each")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--compound", action="store_true", help="issue 39's compound cases (compound_cases) instead")
    ap.add_argument("--json", default="")
    ap.add_argument("--env-ab", default="", help="VAR=VALUE[,VAR=VALUE]: also time the (first) plan's backward with "
                    "these set at each call, alternated with the rest (an A/B in one process: SPATTN_HEAD_SECTION=0 runs "
                    "the tile backward in one head section); its rows are marked forced: env:...")
    ap.add_argument("--issue", action="store_true", help="issue 39's table (issue_cases) instead")
    ap.add_argument("--baseline", default="", help="also write bench/baselines/NAME.json (+ .png) through baseline.py "
                    "(the --issue cases unless --compound or --patterns is given)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no case past this many seconds (default: none; 230 with --baseline)")
    args = ap.parse_args()
    if args.baseline and not args.compound and args.patterns == ap.get_default("patterns"):
        args.issue = True
    budget = args.budget_s if args.budget_s is not None else (230.0 if args.baseline else None)
    t_start = time.monotonic()
    lib = Lib(args.lib)
    L_ = lib.lib  # (Lib sets the argument types of the plan calls)

    def ok(rc, what):
        if rc:
            raise RuntimeError(f"{what}: {L_.spattn_last_error().decode()}")

    B, H = args.batch, args.heads
    torch._dynamo.config.cache_size_limit = 64
    flex = torch.compile(flex_attention, dynamic=False)
    dev = torch.cuda.get_device_name()
    kernels = args.kernel.split(",")
    env = dict(x.split("=", 1) for x in args.env_ab.split(",") if x)
    print(f"# {dev}  B={B} H={H} bf16  backward_kernel={','.join(k or 'chosen' for k in kernels)}", flush=True)
    rows = []
    for L0 in (int(x) for x in args.lengths.split(",")):
        if args.compound or args.issue:
            cases = (issue_cases if args.issue else compound_cases)(L0)
            runs = [c for c in cases if args.patterns == ap.get_default("patterns") or c[0] in
                    args.patterns.split(",")]
        else:
            cases = {c[0]: c for c in suite(L0)}
            runs = []
            for entry in args.patterns.split(","):
                name, _, dpin = entry.partition(":")  # "name:D" runs that head dim only
                _, spec, mod, _dims = cases[name]
                for D in ([int(dpin)] if dpin else [int(x) for x in args.dims.split(",")]):
                    runs.append((name, spec, mod, B, H, H, L0, D))
        for name, spec, mod, B, H, HK, L, D in runs:
                if budget is not None and time.monotonic() - t_start > budget:
                    print(f"{name:12s} L={L:5d} D={D:3d} skipped: past the budget of {budget:.0f} s", flush=True)
                    rows.append({"pattern": name, "spec": spec, "L": L, "D": D, "B": B, "H": H, "HK": HK,
                                 "skipped": "budget"})
                    continue
                torch.manual_seed(0)
                q, do = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
                k, v = (torch.randn(B, HK, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
                o, dq = torch.empty_like(q), torch.empty_like(q)
                dk, dv = torch.empty_like(k), torch.empty_like(v)
                lse = torch.empty(B, H, L, device="cuda", dtype=torch.float32)
                st = lambda: vp(torch.cuda.current_stream().cuda_stream)  # noqa: E731
                hs = []
                for kern in kernels:
                    h = vp()
                    opts = ",".join(x for x in (f"backward_kernel={kern}" if kern else "", args.options) if x)
                    ok(L_.spattn_plan_create(spec.encode(), 0, 0, B, H, HK, L, L, D, float("nan"), opts.encode(),
                                             ctypes.byref(h)), spec)
                    hs.append(h)

                def forward(h):
                    return lambda: ok(L_.spattn_plan_forward(
                        h, q.data_ptr(), strides(q), k.data_ptr(), strides(k), v.data_ptr(), strides(v), o.data_ptr(),
                        strides(o), lse.data_ptr(), st()), "forward")
                forward(hs[0])()

                def backward(h):
                    return lambda: ok(L_.spattn_plan_backward(
                        h, q.data_ptr(), strides(q), k.data_ptr(), strides(k), v.data_ptr(), strides(v), o.data_ptr(),
                        strides(o), lse.data_ptr(), do.data_ptr(), strides(do), dq.data_ptr(), strides(dq),
                        dk.data_ptr(), strides(dk), dv.data_ptr(), strides(dv), st()), "backward")
                # (plan, label, env): each plan, then the first plan under --env-ab's variables
                variants = [(h, kern, None) for h, kern in zip(hs, kernels)]
                if env:
                    variants.append((hs[0], "env:" + args.env_ab, env))
                fns = [with_env(backward(h), e) for h, _, e in variants]
                full = None
                if not args.no_flex:
                    if mod is None:
                        full = lib.mask_rows(spec, L, [(0, L)]).cuda()
                        mm = lambda b, hh, qi, ki: full[qi, ki]  # noqa: E731
                    else:
                        mm = mod
                    bm = create_block_mask(mm, None, None, L, L, device="cuda")
                    qf, kf, vf = (t.detach().clone().requires_grad_() for t in (q, k, v))
                    of = flex(qf, kf, vf, block_mask=bm, enable_gqa=HK != H)
                    fns.append(lambda: torch.autograd.grad(of, (qf, kf, vf), do, retain_graph=True))
                times = time_pair(fns, args.reps)
                # The forward of the same plan, timed on its own (after the backward: the plan's o and lse are what
                # the backward read).
                fwd_ms = time_pair([forward(hs[0])], args.reps)[0]
                forward(hs[0])()
                nnz = i64()
                ok(L_.spattn_pattern_nnz(spec.encode(), L, L, ctypes.byref(nnz)), "nnz")
                ffl = 4 * nnz.value * D * B * H
                fl = ffl * 2.5
                grads = None
                if not args.no_flex:
                    grads = torch.autograd.grad(of, (qf, kf, vf), do, retain_graph=True)
                for j, (h, label, _) in enumerate(variants):
                    fns[j]()  # (the name of what this variant runs: the timing loop ended on another)
                    torch.cuda.synchronize()
                    ran = L_.spattn_plan_last_backward_kernel(h).decode()
                    r = {"pattern": name, "spec": spec, "L": L, "D": D, "B": B, "H": H, "HK": HK, "kernel": ran,
                         "ms": times[j], "tflops": fl / times[j] / 1e9, "fwd_ms": fwd_ms,
                         "fwd_tflops": ffl / fwd_ms / 1e9}
                    r["bwd_tflops"] = r["tflops"]
                    r["bwd_over_fwd"] = r["tflops"] / r["fwd_tflops"]
                    r["class"] = BAR_CLASS.get(name, "other")
                    r["bar"] = bar_of(name)
                    if label:
                        r["forced"] = label
                    line = (f"{name:12s} L={L:5d} D={D:3d} {ran:14s} fwd {fwd_ms:7.3f} ms ({r['fwd_tflops']:6.1f} TF/s) "
                            f"bwd {times[j]:8.3f} ms ({r['tflops']:6.1f} TF/s) bwd/fwd {r['bwd_over_fwd']:.2f}")
                    if grads is not None:
                        gq, gk, gv = grads
                        err = max(((a.float() - b.float()).norm() / b.float().norm()).item()
                                  for a, b in ((dq, gq), (dk, gk), (dv, gv)))
                        r.update(flex_ms=times[-1], flex_tflops=fl / times[-1] / 1e9, speedup=times[-1] / times[j],
                                 bwd_ratio_vs_flex=times[-1] / times[j], diff_vs_flex=err)
                        line += (f"  flex {times[-1]:8.3f} ms ({r['flex_tflops']:6.1f} TF/s)  flex/ours "
                                 f"{r['speedup']:5.2f}  diff vs flex {err:.1e}")
                    print(line, flush=True)
                    rows.append(r)
                for h in hs:
                    L_.spattn_plan_destroy(h)
                if grads is not None:
                    del of, grads, bm
                del q, k, v, do, o, dq, dk, dv, lse, full
    for kern in kernels + (["env:" + args.env_ab] if env else []):
        sp = [r["speedup"] for r in rows if "speedup" in r and r.get("forced", "") == kern]
        if sp:
            print(f"# geomean flex/ours {math.exp(sum(math.log(x) for x in sp) / len(sp)):.3f} over {len(sp)} cases"
                  + (f" ({kern if kern.startswith('env:') else 'backward_kernel=' + kern})" if kern else ""))
    doc = {"kind": "backward", "machine": {"gpu": dev, "command": "python3 bench/bwd_bench.py " + " ".join(sys.argv[1:])},
           "rows": rows}
    if rows:
        doc["summary"] = summary([r for r in rows if not r.get("forced")])
        sm = doc["summary"]
        fmt = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
        print(f"# summary: bwd/fwd geomean {fmt(sm['geomean_bwd_over_fwd'])} (least {fmt(sm['min_bwd_over_fwd'])}), "
              f"vs Flex geomean {fmt(sm['geomean_bwd_ratio_vs_flex'])} (least {fmt(sm['min_bwd_ratio_vs_flex'])}); "
              f"below the bwd/fwd bar: {','.join(sm['below_bar_bwd_over_fwd']) or 'none'}; "
              f"skipped: {','.join(sm['skipped']) or 'none'}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=1))
    if args.baseline:
        import subprocess
        src = args.json or "/tmp/bwd_bench.json"
        Path(src).write_text(json.dumps(doc, indent=1))
        subprocess.run([sys.executable, str(Path(__file__).resolve().parent / "baseline.py"), src, args.baseline],
                       check=True)


if __name__ == "__main__":
    main()
