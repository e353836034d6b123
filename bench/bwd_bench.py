#!/usr/bin/env python3
"""The backward pass against FlexAttention's on the GPU (both timed in one process, the same inputs).

    python3 bench/bwd_bench.py --lib build/libspattn.so [--lengths 4096] [--patterns local,causal]

Ours: spattn_plan_backward (C API) after one forward (o, lse). Flex: torch.autograd.grad through the compiled
flex_attention with the block mask of the same pattern (its forward is not timed: the graph's backward only, via
retain_graph). Medians of CUDA-event timings of the calls (no graph capture: Flex's backward is not captured).
Effective TFLOP/s of a backward count 2.5x the forward's kept-score FLOPs (4 * nnz * D * B * H * 2.5).
"""
import argparse
import ctypes
import statistics

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

i64, vp = ctypes.c_int64, ctypes.c_void_p
P64 = ctypes.POINTER(i64)


def strides(t):  # [B, H, L, D] tensor as [B, L, H, D]
    s = t.stride()
    return (i64 * 4)(s[0], s[2], s[1], s[3])


def time_ms(fn, reps=20, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev)


MASKS = {
    "local": ("local(256)", lambda b, h, q, k: (q - k).abs() <= 256),
    "causal": ("causal", lambda b, h, q, k: k <= q),
    "longformer": ("longformer(256, 32)", lambda b, h, q, k: ((q - k).abs() <= 256) | (q < 32) | (k < 32)),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True)
    ap.add_argument("--lengths", default="4096")
    ap.add_argument("--patterns", default="local,causal,longformer")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=16)
    args = ap.parse_args()
    L_ = ctypes.CDLL(args.lib)
    L_.spattn_last_error.restype = ctypes.c_char_p
    L_.spattn_plan_create.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, i64, i64, i64, i64, i64, i64,
                                      ctypes.c_double, ctypes.c_char_p, ctypes.POINTER(vp)]
    L_.spattn_plan_forward.argtypes = [vp] + [vp, P64] * 4 + [vp, vp]
    L_.spattn_plan_backward.argtypes = [vp] + [vp, P64] * 4 + [vp] + [vp, P64] * 4 + [vp]
    L_.spattn_pattern_nnz.argtypes = [ctypes.c_char_p, i64, i64, P64]

    def ok(rc, what):
        if rc:
            raise RuntimeError(f"{what}: {L_.spattn_last_error().decode()}")

    B, H, D = args.batch, args.heads, 64
    flex = torch.compile(flex_attention)
    print(f"# {torch.cuda.get_device_name()}  B={B} H={H} D={D} bf16", flush=True)
    for L in (int(x) for x in args.lengths.split(",")):
        for name in args.patterns.split(","):
            spec, mod = MASKS[name]
            torch.manual_seed(0)
            q, k, v, do = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            o, dq, dk, dv = (torch.empty_like(q) for _ in range(4))
            lse = torch.empty(B, H, L, device="cuda", dtype=torch.float32)
            h = vp()
            ok(L_.spattn_plan_create(spec.encode(), 0, 0, B, H, H, L, L, D, 0.0, b"", ctypes.byref(h)), spec)
            st = lambda: vp(torch.cuda.current_stream().cuda_stream)  # noqa: E731
            ok(L_.spattn_plan_forward(h, q.data_ptr(), strides(q), k.data_ptr(), strides(k), v.data_ptr(), strides(v),
                                      o.data_ptr(), strides(o), lse.data_ptr(), st()), "forward")

            def ours():
                ok(L_.spattn_plan_backward(h, q.data_ptr(), strides(q), k.data_ptr(), strides(k), v.data_ptr(),
                                           strides(v), o.data_ptr(), strides(o), lse.data_ptr(), do.data_ptr(),
                                           strides(do), dq.data_ptr(), strides(dq), dk.data_ptr(), strides(dk),
                                           dv.data_ptr(), strides(dv), st()), "backward")
            t_ours = time_ms(ours)
            bm = create_block_mask(mod, None, None, L, L)
            qf, kf, vf = (t.detach().clone().requires_grad_() for t in (q, k, v))
            of = flex(qf, kf, vf, block_mask=bm)
            t_flex = time_ms(lambda: torch.autograd.grad(of, (qf, kf, vf), do, retain_graph=True))
            gq, gk, gv = torch.autograd.grad(of, (qf, kf, vf), do, retain_graph=True)
            err = max(((a.float() - b.float()).norm() / b.float().norm()).item() for a, b in ((dq, gq), (dk, gk), (dv, gv)))
            nnz = i64()
            ok(L_.spattn_pattern_nnz(spec.encode(), L, L, ctypes.byref(nnz)), "nnz")
            fl = 4 * nnz.value * D * B * H * 2.5
            print(f"{name:10s} L={L:5d}  ours {t_ours:8.3f} ms ({fl / t_ours / 1e9:6.1f} TF/s)  flex {t_flex:8.3f} ms "
                  f"({fl / t_flex / 1e9:6.1f} TF/s)  flex/ours {t_flex / t_ours:5.3f}  rel diff vs flex {err:.2e}",
                  flush=True)


if __name__ == "__main__":
    main()
