#!/usr/bin/env python3
"""Same-process A/B of two builds of libspattn.so on the fused GPU suite.

    python3 bench/ab.py --a old/libspattn.so --b new/libspattn.so [--lengths 4096,16384] [--rounds 3] [--json F]

Each library is loaded with ctypes (RTLD_LOCAL: the two do not see each other's symbols) through whichever C API
it has: the Plan API (spattn_plan_*, this tree) or the earlier FusedAttention API (spattn_fused_*, up to 65ae312).
Every case is planned by both, run once and compared (max |A - B|), then both are captured as CUDA graphs and
timed in alternation (a replay of each, in turn, `reps` times a round), so both run in the same GPU state; the
figure is the median of each round, and B/A is given per round and for the median of the rounds.
"""
import argparse
import ctypes
import json
import math
import statistics

import torch

i64, vp, cp = ctypes.c_int64, ctypes.c_void_p, ctypes.c_char_p


class Build:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
        L = self.lib
        L.spattn_last_error.restype = cp
        self.plan_api = hasattr(L, "spattn_plan_create")
        self.has_backward = False
        if self.plan_api:
            L.spattn_plan_create.argtypes = [cp, ctypes.c_int, ctypes.c_int, i64, i64, i64, i64, i64, i64,
                                             ctypes.c_double, cp, ctypes.POINTER(vp)]
            L.spattn_plan_forward.argtypes = [vp] + [vp, ctypes.POINTER(i64)] * 4 + [vp, vp]
            L.spattn_plan_kernel.argtypes = [vp]
            L.spattn_plan_kernel.restype = cp
            self.has_backward = hasattr(L, "spattn_plan_backward")
            if self.has_backward:
                L.spattn_plan_backward.argtypes = [vp] + [vp, ctypes.POINTER(i64)] * 4 + [vp] + \
                    [vp, ctypes.POINTER(i64)] * 4 + [vp]
        else:
            L.spattn_fused_create.argtypes = [cp, i64, i64, i64, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                              ctypes.c_int, ctypes.POINTER(vp)]
            L.spattn_fused_forward.argtypes = [vp, ctypes.c_int, i64, i64, i64, i64, i64, i64] + \
                [vp, ctypes.POINTER(i64)] * 4 + [vp, ctypes.c_double, vp]
            L.spattn_fused_explain.argtypes = [vp]
            L.spattn_fused_explain.restype = cp

    def check(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"{what}: {self.lib.spattn_last_error().decode()}")

    def plan(self, spec, B, H, L, D):
        h = vp()
        if self.plan_api:
            # The scale given explicitly: builds before the optional scale read 0 as the default, later ones NaN.
            self.check(self.lib.spattn_plan_create(spec.encode(), 0, 0, B, H, H, L, L, D, 1 / math.sqrt(D), b"",
                                                   ctypes.byref(h)),
                       spec)
            name = self.lib.spattn_plan_kernel(h).decode()
        else:
            self.check(self.lib.spattn_fused_create(spec.encode(), L, L, D, 0, 0, -1, 0, ctypes.byref(h)), spec)
            name = self.lib.spattn_fused_explain(h).decode()[:60]
        return h, name

    def forward(self, h, q, k, v, o):
        stream = vp(torch.cuda.current_stream().cuda_stream)
        B, H, L, D = q.shape
        if self.plan_api:
            s = [(i64 * 4)(t.stride(0), t.stride(2), t.stride(1), t.stride(3)) for t in (q, k, v, o)]
            rc = self.lib.spattn_plan_forward(h, q.data_ptr(), s[0], k.data_ptr(), s[1], v.data_ptr(), s[2],
                                              o.data_ptr(), s[3], None, stream)
        else:
            s = [(i64 * 3)(t.stride(0), t.stride(2), t.stride(1)) for t in (q, k, v, o)]
            rc = self.lib.spattn_fused_forward(h, 0, B, H, H, L, L, D, q.data_ptr(), s[0], k.data_ptr(), s[1],
                                               v.data_ptr(), s[2], o.data_ptr(), s[3], None, 0.0, stream)
        self.check(rc, "forward")

    def forward_lse(self, h, q, k, v, o, lse):
        stream = vp(torch.cuda.current_stream().cuda_stream)
        s = [_strides(t) for t in (q, k, v, o)]
        self.check(self.lib.spattn_plan_forward(h, q.data_ptr(), s[0], k.data_ptr(), s[1], v.data_ptr(), s[2],
                                                o.data_ptr(), s[3], lse.data_ptr(), stream), "forward")

    def backward(self, h, q, k, v, o, lse, do, dq, dk, dv):
        stream = vp(torch.cuda.current_stream().cuda_stream)
        t = (q, k, v, o)
        g = (do, dq, dk, dv)
        args = [h]
        for x in t:
            args += [x.data_ptr(), _strides(x)]
        args.append(lse.data_ptr())
        for x in g:
            args += [x.data_ptr(), _strides(x)]
        args.append(stream)
        self.check(self.lib.spattn_plan_backward(*args), "backward")


def _strides(t):  # a [B, H, L, D] tensor as the C API's [B, L, H, D] strides
    return (i64 * 4)(t.stride(0), t.stride(2), t.stride(1), t.stride(3))


def suite(L):
    n = math.isqrt(L)
    r = 205 if L <= 4096 else 820
    return [("local", "local(256)", 64), ("longformer", "longformer(256, 32)", 64),
            ("bigbird", "bigbird(64, 1, 2, 3, seed=0)", 64), ("dilated", "dilated(256, 2)", 64),
            ("causal", "causal", 64), ("causal", "causal", 128), ("dense", "dense", 64), ("dense", "dense", 128),
            ("fixed", "sparse_fixed(128)", 64), ("random", f"random({r}, seed=0)", 64),
            ("na2d", f"neighborhood(dims=({n},{n}), kernel=13)", 64),
            ("na2d", f"neighborhood(dims=({n},{n}), kernel=13)", 128),
            # the other neighborhood cases of gpu_bench.py's suite (issue 23)
            ("na2d_dil", f"neighborhood(dims=({n},{n}), kernel=7, dilation=2)", 64),
            ("na2d_dil", f"neighborhood(dims=({n},{n}), kernel=7, dilation=2)", 128),
            ("na3d", f"neighborhood(dims=({max(1, L // 1024)},32,32), kernel=7, causal=(1,0,0))", 64),
            ("na3d", f"neighborhood(dims=({max(1, L // 1024)},32,32), kernel=7, causal=(1,0,0))", 128),
            ("na1d", "neighborhood(kernel=257)", 128),
            ("bigbird", "bigbird(64, 1, 2, 3, seed=0)", 128), ("fixed", "sparse_fixed(128)", 128),
            # band rows with a key prefix (the band kernel's prefix chunks)
            ("lfcols", "local(256) | global_cols(0:32)", 64), ("sinks", "local(left=1024, right=0) | global_cols(0:4)", 64),
            # band rows at head dim 128 (the band kernel's 128-row items)
            ("local", "local(256)", 128), ("longformer", "longformer(256, 32)", 128),
            ("lfcols", "local(256) | global_cols(0:32)", 128), ("sinks", "local(left=1024, right=0) | global_cols(0:4)", 128)]


def graph(fn):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    return g


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True)
    ap.add_argument("--b", required=True)
    ap.add_argument("--lengths", default="4096,16384")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--patterns", default="", help="comma list of case names (default: all)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--backward", action="store_true",
                    help="also time the backward (spattn_plan_backward) of both builds in alternation")
    args = ap.parse_args()
    A, Bb = Build(args.a), Build(args.b)
    B, H = args.batch, args.heads
    rows = []
    print(f"# {torch.cuda.get_device_name()}  A={args.a} ({'plan' if A.plan_api else 'fused'} API)  "
          f"B={args.b} ({'plan' if Bb.plan_api else 'fused'} API)", flush=True)
    for L in (int(x) for x in args.lengths.split(",")):
        for name, spec, D in suite(L):
            if args.patterns and name not in args.patterns.split(","):
                continue
            torch.manual_seed(0)
            q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            oa, ob = torch.empty_like(q), torch.empty_like(q)
            ha, ka = A.plan(spec, B, H, L, D)
            hb, kb = Bb.plan(spec, B, H, L, D)
            ga = graph(lambda: A.forward(ha, q, k, v, oa))
            gb = graph(lambda: Bb.forward(hb, q, k, v, ob))
            diff = (oa.float() - ob.float()).abs().max().item()
            ta, tb = [], []
            for _ in range(args.rounds):
                ev = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                       for _ in range(args.reps)] for _ in range(2)]
                for _ in range(5):
                    ga.replay()
                    gb.replay()
                for i in range(args.reps):
                    for j, g in enumerate((ga, gb)):
                        ev[j][i][0].record()
                        g.replay()
                        ev[j][i][1].record()
                torch.cuda.synchronize()
                ta.append(statistics.median(s.elapsed_time(e) for s, e in ev[0]))
                tb.append(statistics.median(s.elapsed_time(e) for s, e in ev[1]))
            ma, mb = statistics.median(ta), statistics.median(tb)
            row = {"case": name, "spec": spec, "L": L, "D": D, "ms_a": ma, "ms_b": mb, "ratio_b_over_a": ma / mb,
                   "rounds_a": ta, "rounds_b": tb, "max_abs_diff": diff, "kernel_b": kb}
            rows.append(row)
            print(f"{name:10s} L={L:5d} D={D:3d}  A {ma:8.4f} ms  B {mb:8.4f} ms  speed B/A {ma / mb:6.3f} "
                  f"(rounds {' '.join(f'{a / b:.3f}' for a, b in zip(ta, tb))})  max|A-B| {diff:.1e}  B: {kb}",
                  flush=True)
            del ga, gb
            if args.backward and A.plan_api and A.has_backward and Bb.has_backward:
                lse = torch.empty(B, H, L, device="cuda", dtype=torch.float32)
                do = torch.randn_like(q)
                A.forward_lse(ha, q, k, v, oa, lse)
                ga_ = [torch.empty_like(q) for _ in range(3)]
                gb_ = [torch.empty_like(q) for _ in range(3)]
                fa = lambda: A.backward(ha, q, k, v, oa, lse, do, *ga_)  # noqa: E731
                fb = lambda: Bb.backward(hb, q, k, v, oa, lse, do, *gb_)  # noqa: E731
                fa()
                fb()
                torch.cuda.synchronize()
                bdiff = max((x.float() - y.float()).abs().max().item() for x, y in zip(ga_, gb_))
                ba, bb = [], []
                for _ in range(args.rounds):
                    ev = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                           for _ in range(args.reps)] for _ in range(2)]
                    for _ in range(3):
                        fa()
                        fb()
                    for i in range(args.reps):
                        for j, f in enumerate((fa, fb)):
                            ev[j][i][0].record()
                            f()
                            ev[j][i][1].record()
                    torch.cuda.synchronize()
                    ba.append(statistics.median(s_.elapsed_time(e) for s_, e in ev[0]))
                    bb.append(statistics.median(s_.elapsed_time(e) for s_, e in ev[1]))
                mba, mbb = statistics.median(ba), statistics.median(bb)
                row.update({"bwd_ms_a": mba, "bwd_ms_b": mbb, "bwd_ratio_b_over_a": mba / mbb,
                            "bwd_max_abs_diff": bdiff})
                print(f"{'  bwd':10s} L={L:5d} D={D:3d}  A {mba:8.4f} ms  B {mbb:8.4f} ms  speed B/A "
                      f"{mba / mbb:6.3f} (rounds {' '.join(f'{a / b:.3f}' for a, b in zip(ba, bb))})  "
                      f"max|A-B| {bdiff:.1e}", flush=True)
    worst = min(r["ratio_b_over_a"] for r in rows)
    print(f"# worst B/A speed {worst:.3f}; geomean {math.exp(statistics.mean(math.log(r['ratio_b_over_a']) for r in rows)):.4f}")
    bw = [r["bwd_ratio_b_over_a"] for r in rows if "bwd_ratio_b_over_a" in r]
    if bw:
        print(f"# backward: worst B/A speed {min(bw):.3f}; geomean {math.exp(statistics.mean(map(math.log, bw))):.4f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "a": args.a, "b": args.b, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
