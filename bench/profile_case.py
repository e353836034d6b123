#!/usr/bin/env python3
"""One window or causal case's forward and backward through `spattn.torch.sparse_attention`, then FlashAttention-4's
(`flash_attn.cute`, where it imports) on the same tensors: the target process for a profiler
(scripts/profile/windows.sh runs it under Nsight Compute). Two warm-up calls of each before the profiled ones, so
plans and FA4's compiled kernels are cached; nothing is timed here.

  python3 bench/profile_case.py causal --dim 128 --batch 2 --len 8192 --heads 16
  python3 bench/profile_case.py blocked --dim 128 --batch 1 --len 32768 --heads 16    # no FA4 counterpart
"""
import argparse

import torch

import spattn.torch as st

# name: (spattn spec, FA4 keyword arguments or None)
CASES = {
    "local": ("local(256)", {"window_size": (256, 256)}),
    "local1024": ("local(1024)", {"window_size": (1024, 1024)}),
    "causal": ("causal", {"causal": True}),
    "left4096": ("local(left=4096, right=0)", {"window_size": (4096, 0)}),
    "blocked": ("blocked(128, random(8) | local(0)) & causal", None),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("case", choices=sorted(CASES))
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--len", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=0, help="default: --heads")
    a = ap.parse_args()
    spec, fa4_kw = CASES[a.case]
    hk = a.kv_heads or a.heads
    torch.manual_seed(0)
    q = torch.randn(a.batch, a.len, a.heads, a.dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(a.batch, a.len, hk, a.dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(2))
    o = st.sparse_attention(q, k, v, spec)
    do = torch.randn_like(o)
    for _ in range(3):  # warm-up, then the profiled call (a profiler's --launch-skip picks it)
        torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
        st.sparse_attention(q, k, v, spec)
    torch.cuda.synchronize()
    if fa4_kw is None:
        return 0
    try:
        from flash_attn.cute import flash_attn_func  # noqa: PLC0415
    except ImportError as ex:
        print(f"# no FA4 ({ex}): spattn only")
        return 0
    of = flash_attn_func(q, k, v, **fa4_kw)
    of = of[0] if isinstance(of, tuple) else of
    for _ in range(3):
        torch.autograd.grad(of, (q, k, v), do, retain_graph=True)
        flash_attn_func(q, k, v, **fa4_kw)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
