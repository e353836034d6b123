#!/usr/bin/env python3
"""Issue 42's strided cases, forward and backward, against FlexAttention and dense cuDNN, in one process.

The cases are gpu_bench.py's STRIDED (`sparse_strided(128 | 256 | 512)`, `dilated(64, 32)`, `stride(64) & causal`;
bf16, B = 2, H = 16) at each --lengths and --dims. For each it times
  forward   ours (spattn_plan_forward) and Flex's (compiled flex_attention, a block mask of the same pattern), CUDA-graph
            replays in alternation (gpu_bench.time_paired), median of --reps; dense cuDNN SDPA once per (L, D);
  backward  ours (spattn_plan_backward after one forward) and Flex's (autograd.grad over a retained graph), the calls
            in alternation (gpu_bench.time_pair), median of --reps;
and checks our output against an fp32 reference on sampled query rows (gpu_bench.reference, the library's own mask)
and our gradients against Flex's (relative Frobenius, the largest of dq, dk, dv; ours against the fp64 reference is
BackwardGpu.StridedPastSixteen's).

Effective TFLOP/s count kept scores: 4 * nnz * D * B * H forward, 2.5 times that backward. Each row: fwd_tflops,
bwd_tflops, fwd_frac_of_cudnn (ours per kept score over dense cuDNN's per score), fwd_ratio_vs_flex and
bwd_ratio_vs_flex (Flex's time over ours), bwd_over_fwd (backward TFLOP/s over forward's), the kernels, and "bar":
whether each of the issue's marks is met (fwd_frac_of_cudnn >= 0.4, fwd_ratio_vs_flex >= 5, bwd_over_fwd >= 0.6).
The memory roofline (baseline.strided_roofline: the fewest bytes a call must move, at the HBM rate of a timed
device-to-device copy, machine.hbm_tbs, or --hbm-tbs) gives roofline_tflops and bwd_roofline_tflops, the best any
kernel could reach, and frac_of_roofline, bwd_frac_of_roofline (ours over min(roofline, dense cuDNN's rate): the
forward cannot beat dense attention's compute rate either); bar_reachable: whether 0.4 of cuDNN lies under the
forward's roofline (dilated(64, 32) and stride(64) & causal at L = 16384 keep ~121-128 keys a query: ~60 FLOP/B).
The JSON ("kind": "strided") is rewritten after every case, so a run cut short by --budget-s or a timeout keeps what
it measured; --resume JSON continues such a run (its rows kept, its cases skipped).

  python3 bench/strided_bench.py --lib build/libspattn.so --json out/strided.json
  python3 bench/strided_bench.py --lib build/libspattn.so --baseline h200-strided   # bench/baselines/h200-strided.{json,png}

--env-ab VAR=VALUE[,VAR=VALUE] (an A/B switch of docs/CPP.md, e.g. SPATTN_HEAD_SECTION=0): also a second plan
of each case made with those set, its forward and its backward timed against the first's (the variables unset) in
alternation, the variables set around each call and each graph capture (what the library reads at launch, at make_plan
and where the backward's plans are built at its first call all apply); the row's "env_ab": the times, the speeds of
the default over the variant's, the variant's forward error against the same reference, its gradients against the
default's and its kernels.

  python3 bench/strided_bench.py --lib build/libspattn.so --lengths 16384 --env-ab SPATTN_HEAD_SECTION=0
"""
import argparse
import datetime
import json
import math
import os
import re
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import baseline  # noqa: E402  (meta block, BASELINES, plots)
import gpu_bench  # noqa: E402  (PROBLEM: the B and H Fused plans)
from gpu_bench import (STRIDED, Fused, Lib, reference, rel_err, sample_rows, suite, time_ms, time_pair, time_paired,  # noqa: E402
                       with_env)

# The bar.
BAR = {"fwd_frac_of_cudnn": 0.4, "fwd_ratio_vs_flex": 5.0, "bwd_over_fwd": 0.6}


def max_rel(a, b):
    return max(((x.float() - y.float()).norm() / y.float().norm().clamp_min(1e-30)).item() for x, y in zip(a, b))


def hbm_tbs():
    """The HBM rate (TB/s, read and write counted): runtime_bench.py's eager 1 GiB device copy, the one measure of it
    (timed as a CUDA-graph replay, time_ms, the copy is a memcpy node: 2.77 TB/s on an H200 against ~4.2 eager)."""
    from runtime_bench import copy_rate_gbs
    return copy_rate_gbs() / 1e3


def measure(lib, flex, create_block_mask, cudnn_time, name, spec, mask_mod, L, D, reps, env_ab=None, hbm=None):
    """One case's row: ours and Flex's forward and backward timed in alternation, dense cuDNN's forward (cudnn_time:
    (L, D, q, k, v) -> ms, cached by the caller), our output against the fp32 reference and our gradients against
    Flex's; env_ab ({var: value}): also our forward and backward under those against it (the module's docstring)."""
    B, H = gpu_bench.PROBLEM["batch"], gpu_bench.PROBLEM["heads"]
    torch.manual_seed(0)
    q, k, v, do = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    cudnn_ms = cudnn_time(L, D, q, k, v)
    fused = Fused(lib, spec, L, D)
    o, dq, dk, dv = (torch.empty_like(q) for _ in range(4))
    lse = torch.empty(B, H, L, device="cuda", dtype=torch.float32)
    bm = create_block_mask(mask_mod, B=None, H=None, Q_LEN=L, KV_LEN=L, device="cuda")
    flex(q, k, v, block_mask=bm)  # compile
    fwd_ms, _hows = time_paired([lambda: fused.forward(q, k, v, o, lse),
                                 lambda: flex(q, k, v, block_mask=bm)], reps)
    o.fill_(float("nan"))
    fused.forward(q, k, v, o, lse)
    rows_s = sample_rows(L)
    ref, idx = reference(q, k, v, lib.mask_rows(spec, L, rows_s), rows_s)
    fwd_err = rel_err(o, ref, idx)
    fwd_kernel = fused.last_kernel()
    ab = None
    if env_ab:
        on, off = env_ab, {var: None for var in env_ab}
        alt = with_env(lambda: Fused(lib, spec, L, D), on)()
        o2, lse2 = torch.empty_like(q), torch.empty_like(lse)
        ms, _hows = time_paired([with_env(lambda: fused.forward(q, k, v, o, lse), off),
                                 with_env(lambda: alt.forward(q, k, v, o2, lse2), on)], reps)
        o2.fill_(float("nan"))
        with_env(lambda: alt.forward(q, k, v, o2, lse2), on)()
        ab = {"env": ",".join(f"{var}={val}" for var, val in on.items()), "fwd_ms_default": ms[0], "fwd_ms_env": ms[1],
              "default_speed_over_env": ms[1] / ms[0],
              "fwd_err_env": rel_err(o2, ref, idx), "kernel_env": alt.last_kernel(),
              "perm_d_env": [int(x) for x in re.findall(r"perm_d (\d+)", alt.explain)]}
        # The backward too, each plan's after its own forward: its first call under VAR builds the variant's backward
        # plans (what is read where a plan is built applies), and VAR is set around each timed call.
        g1, g2 = [tuple(torch.empty_like(q) for _ in range(3)) for _ in range(2)]
        with_env(lambda: fused.backward(q, k, v, o, lse, do, *g1), off)()
        with_env(lambda: alt.backward(q, k, v, o2, lse2, do, *g2), on)()
        bms = time_pair([with_env(lambda: fused.backward(q, k, v, o, lse, do, *g1), off),
                         with_env(lambda: alt.backward(q, k, v, o2, lse2, do, *g2), on)], reps)
        ab.update({"bwd_ms_default": bms[0], "bwd_ms_env": bms[1], "default_bwd_speed_over_env": bms[1] / bms[0],
                   "bwd_diff_env_vs_default": max_rel(g2, g1), "bwd_kernel_env": alt.last_backward_kernel()})
        del alt, o2, lse2, g1, g2
    qf, kf, vf = (t.detach().clone().requires_grad_() for t in (q, k, v))
    of = flex(qf, kf, vf, block_mask=bm)
    bwd_ms = time_pair([lambda: fused.backward(q, k, v, o, lse, do, dq, dk, dv),
                        lambda: torch.autograd.grad(of, (qf, kf, vf), do, retain_graph=True)], reps)
    fused.backward(q, k, v, o, lse, do, dq, dk, dv)
    diff = max_rel((dq, dk, dv), torch.autograd.grad(of, (qf, kf, vf), do))
    torch.cuda.synchronize()
    flop = 4.0 * fused.nnz * D * B * H
    r = {"pattern": name, "spec": spec, "L": L, "D": D, "B": B, "H": H, "nnz": fused.nnz,
         "density": fused.nnz / (L * L), "plan_ms": fused.plan_ms, "kernel": fwd_kernel,
         "bwd_kernel": fused.last_backward_kernel(),
         "perm_d": [int(x) for x in re.findall(r"perm_d (\d+)", fused.explain)],  # the forward's tile plans
         "fwd_ms": fwd_ms[0], "flex_fwd_ms": fwd_ms[1], "bwd_ms": bwd_ms[0], "flex_bwd_ms": bwd_ms[1],
         "cudnn_dense_fwd_ms": cudnn_ms}
    r["fwd_tflops"] = flop / r["fwd_ms"] / 1e9
    r["bwd_tflops"] = 2.5 * flop / r["bwd_ms"] / 1e9
    r["flex_fwd_tflops"] = flop / r["flex_fwd_ms"] / 1e9
    r["flex_bwd_tflops"] = 2.5 * flop / r["flex_bwd_ms"] / 1e9
    r["cudnn_dense_fwd_tflops"] = 4.0 * L * L * D * B * H / cudnn_ms / 1e9
    r["fwd_frac_of_cudnn"] = r["fwd_tflops"] / r["cudnn_dense_fwd_tflops"]
    r["fwd_ratio_vs_flex"] = r["flex_fwd_ms"] / r["fwd_ms"]
    r["bwd_ratio_vs_flex"] = r["flex_bwd_ms"] / r["bwd_ms"]
    r["bwd_over_fwd"] = r["bwd_tflops"] / r["fwd_tflops"]
    r["fwd_err"] = fwd_err
    r["bwd_diff_vs_flex"] = diff
    r["bar"] = {key: r[key] >= mark for key, mark in BAR.items()}
    r.update(baseline.strided_roofline(r, hbm))
    r["frac_of_roofline"] = r["fwd_tflops"] / min(r["roofline_tflops"], r["cudnn_dense_fwd_tflops"])
    r["bwd_frac_of_roofline"] = r["bwd_tflops"] / r["bwd_roofline_tflops"]
    r["bar_reachable"] = BAR["fwd_frac_of_cudnn"] * r["cudnn_dense_fwd_tflops"] <= r["roofline_tflops"]
    if ab:
        r["env_ab"] = ab
    del q, k, v, do, o, dq, dk, dv, lse, qf, kf, vf, of, bm, fused, ref
    torch.cuda.empty_cache()
    return r


def line(r):
    below = [k for k, ok in r["bar"].items() if not ok]
    return (f"{r['pattern']:10s} L={r['L']:5d} D={r['D']:3d} fwd {r['fwd_tflops']:6.1f} TF/s ({r['fwd_frac_of_cudnn']:.2f} "
            f"of cuDNN's {r['cudnn_dense_fwd_tflops']:.0f}, {r['fwd_ratio_vs_flex']:.2f}x Flex) bwd {r['bwd_tflops']:6.1f} "
            f"TF/s ({r['bwd_ratio_vs_flex']:.2f}x Flex, bwd/fwd {r['bwd_over_fwd']:.2f}) err {r['fwd_err']:.1e} diff "
            f"{r['bwd_diff_vs_flex']:.1e} roofline {r['roofline_tflops']:.0f} TF/s ({r['frac_of_roofline']:.2f} of "
            f"min(it, cuDNN)) [{r['kernel']} / {r['bwd_kernel']}, perm_d {r['perm_d']}]"
            + (f"  below the bar: {', '.join(below)}" if below else "")
            + (f"\n    {r['env_ab']['env']}: fwd {r['env_ab']['fwd_ms_default']:.4f} ms default / "
               f"{r['env_ab']['fwd_ms_env']:.4f} ms env (default {r['env_ab']['default_speed_over_env']:.3f}x), env err "
               f"{r['env_ab']['fwd_err_env']:.1e} [{r['env_ab']['kernel_env']}, perm_d {r['env_ab']['perm_d_env']}]; bwd "
               f"{r['env_ab']['bwd_ms_default']:.4f} ms default / {r['env_ab']['bwd_ms_env']:.4f} ms env (default "
               f"{r['env_ab']['default_bwd_speed_over_env']:.3f}x), env grads within "
               f"{r['env_ab']['bwd_diff_env_vs_default']:.1e} of the default's [{r['env_ab']['bwd_kernel_env']}]"
               if "env_ab" in r else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=os.path.join(os.environ.get("SPATTN_BUILD", "build"), "libspattn.so"))
    ap.add_argument("--lengths", default="16384,65536")
    ap.add_argument("--dims", default="64,128")
    ap.add_argument("--patterns", default=",".join(STRIDED), help="comma list of STRIDED's names")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--budget-s", type=float, default=1e9, help="start no case after this many seconds")
    ap.add_argument("--json", default="")
    ap.add_argument("--baseline", default="", metavar="NAME", help="also write bench/baselines/NAME.{json,png}")
    ap.add_argument("--env-ab", default="", metavar="VAR=VALUE[,VAR=VALUE]",
                    help="also each case's forward and backward under VAR=VALUE (a plan made so) against VAR unset")
    ap.add_argument("--hbm-tbs", type=float, default=0.0,
                    help="the HBM rate (TB/s) of the memory roofline; 0: a timed 1 GiB device copy")
    ap.add_argument("--resume", default="", metavar="JSON",
                    help="an earlier run's JSON: its rows kept (first) and its cases not measured again")
    args = ap.parse_args()
    assert args.reps >= 20, "docs/BENCHMARKS.md: median of at least 20"
    t_start = time.time()
    lib = Lib(args.lib)
    import torch._dynamo as dynamo  # noqa: PLC0415
    from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention  # noqa: PLC0415
    dynamo.config.cache_size_limit = 1000
    dynamo.config.recompile_limit = 1000
    flex = torch.compile(flex_attention, dynamic=False)
    B, H = args.batch, args.heads
    gpu_bench.PROBLEM.update(batch=B, heads=H)
    dev = torch.cuda.get_device_name()
    command = "python3 bench/strided_bench.py " + " ".join(sys.argv[1:])
    outs = ([args.json] if args.json else []) + (
        [os.path.join(baseline.BASELINES, args.baseline + ".json")] if args.baseline else [])
    machine = {"gpu": dev, "torch": torch.__version__, "cuda": torch.version.cuda, "command": command,
               "date": datetime.datetime.now().isoformat(timespec="seconds"),
               "hbm_tbs": args.hbm_tbs or hbm_tbs()}
    rows, dense = (json.loads(Path(args.resume).read_text())["rows"] if args.resume else []), {}
    done = {(r["pattern"], r["L"], r["D"]) for r in rows}

    def cudnn_time(L, D, q, k, v):
        if (L, D) not in dense:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                dense[(L, D)] = time_ms(lambda: F.scaled_dot_product_attention(q, k, v), args.reps)
        return dense[(L, D)]

    wanted = args.patterns.split(",")
    print(f"# {dev}, torch {torch.__version__}, B={B} H={H} bf16, HBM {machine['hbm_tbs']:.2f} TB/s (roofline)",
          flush=True)

    def write():
        doc = {"kind": "strided", "meta": baseline.meta(args.baseline or None, command), "machine": machine,
               "bar": BAR, "rows": rows}
        for out in outs:
            os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
            Path(out).write_text(json.dumps(doc, indent=1))
        return doc

    for L in (int(x) for x in args.lengths.split(",")):
        cases = {c[0]: c for c in suite(L)}
        for name in wanted:
            _, spec, mask_mod, _dims = cases[name]
            for D in (int(x) for x in args.dims.split(",")):
                if (name, L, D) in done:
                    continue
                if time.time() - t_start > args.budget_s:
                    print(f"# budget reached, skipping {name} L={L} D={D}", flush=True)
                    continue
                r = measure(lib, flex, create_block_mask, cudnn_time, name, spec, mask_mod, L, D, args.reps,
                            dict(x.split("=", 1) for x in args.env_ab.split(",") if x) or None, machine["hbm_tbs"])
                rows.append(r)
                write()
                print(line(r), flush=True)
    doc = write()
    met = sum(all(r["bar"].values()) for r in rows)
    print(f"# {met} of {len(rows)} cases meet the bar (fwd >= {BAR['fwd_frac_of_cudnn']} of dense cuDNN per kept score, "
          f">= {BAR['fwd_ratio_vs_flex']}x Flex; bwd >= {BAR['bwd_over_fwd']}x the forward's rate); "
          f"results: {', '.join(outs) or '(no file)'}")
    if args.baseline and rows:
        baseline.plot(doc, os.path.join(baseline.BASELINES, args.baseline + ".png"))
    if any(not math.isfinite(e) or e > 2e-2 for r in rows for e in [r["fwd_err"]] + (
            [r["env_ab"]["fwd_err_env"]] if "env_ab" in r else [])):
        print("# forward error above 2e-2", file=sys.stderr)
        return 1
    if any(not math.isfinite(e) or e > 2e-2 for r in rows if "env_ab" in r
           for e in [r["env_ab"].get("bwd_diff_env_vs_default", 0.0)]):
        print("# the variant's gradients differ from the default's by more than 2e-2", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
