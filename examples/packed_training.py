#!/usr/bin/env python3
"""Trains a tiny language model on packed batches: every step packs documents of random lengths into one sequence,
and attention stays inside each document (causal, optionally a window) through spattn's run-time documents mask
(FlashAttention's cu_seqlens), with one plan for every step whatever the boundaries.

    pip install .  torch          # then
    python examples/packed_training.py [--steps 8] [--len 256] [--docs 6] [--window W] [--device cpu|cuda]

Checks every step against the same model (same weights, same batches, same AdamW) run with dense SDPA over the
block-diagonal mask of that step's documents; exits 0 when the losses agree to 1e-5 (relative) and every gradient to
1e-3 of its largest entry, 1 otherwise.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import time

import torch
import torch.nn.functional as F

import spattn.torch as st

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_tiny import TinyLM  # noqa: E402  (the model of examples/train_tiny.py)


def documents(L: int, n: int, gen: torch.Generator) -> torch.Tensor:
    """cu_seqlens (int32 [n + 1]) of n non-empty documents of random lengths summing to L."""
    cuts = torch.randperm(L - 1, generator=gen)[: n - 1] + 1
    return torch.cat([torch.zeros(1, dtype=torch.long), cuts.sort().values, torch.full((1,), L)]).int()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--len", type=int, default=256)
    ap.add_argument("--docs", type=int, default=6)
    ap.add_argument("--window", type=int, default=0, help="attend to at most W earlier tokens of the document (0: all)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.manual_seed(0)
    vocab, L, dev = 32, args.len, args.device
    spec = f"local(left={args.window}, right=0)" if args.window else "causal"
    state = {}  # the step's boundaries (device tensor) and dense mask

    def packed(q, k, v):  # [1, L, H, D]: attention inside each document of this step
        return st.sparse_attention(q, k, v, spec, cu_seqlens=state["cu"])

    def dense(q, k, v):
        g = q.shape[2] // k.shape[2]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(g, 1), v.transpose(1, 2).repeat_interleave(g, 1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=state["mask"]).transpose(1, 2)

    model = TinyLM(vocab, L, d=64, heads=4, kv_heads=2, layers=2, attend=packed).to(dev)
    ref = copy.deepcopy(model)
    for blk in ref.blocks:
        blk.attend = dense
    opt, opt_ref = torch.optim.AdamW(model.parameters(), lr=3e-3), torch.optim.AdamW(ref.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(1)
    ok = True
    pos = torch.arange(L)
    for step in range(args.steps):
        cu = documents(L, args.docs, gen)
        doc = torch.bucketize(pos, cu[1:], right=True)  # the document of each token
        rel = pos[:, None] - pos[None, :]
        state["mask"] = ((doc[:, None] == doc[None, :]) & (rel >= 0) & ((rel <= args.window) if args.window else True)).to(dev)
        state["cu"] = cu.to(dev)
        # Each document: a period-5 sequence of its own, so that attention inside the document predicts it.
        base = torch.randint(0, vocab, (args.docs, 5), generator=gen)
        seq = torch.cat([base[i].repeat(L // 5 + 2)[: int(cu[i + 1] - cu[i])] for i in range(args.docs)])
        seq = torch.cat([seq, seq[-1:]])[None].to(dev)
        x, y = seq[:, :-1], seq[:, 1:]
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        t1 = time.perf_counter()
        loss_ref = F.cross_entropy(ref(x).reshape(-1, vocab), y.reshape(-1))
        opt_ref.zero_grad()
        loss_ref.backward()
        loss_err = abs(loss.item() - loss_ref.item()) / abs(loss_ref.item())
        grad_err = max((p.grad - r.grad).abs().max().item() / (r.grad.abs().max().item() or 1.0)
                       for p, r in zip(model.parameters(), ref.parameters()))
        good = loss_err <= 1e-5 and grad_err <= 1e-3
        ok &= good
        lengths = (cu[1:] - cu[:-1]).tolist()
        print(f"step {step}: documents {lengths}, loss {loss.item():.5f} (sdpa {loss_ref.item():.5f}), "
              f"gradient diff {grad_err:.1e}, {1e3 * (t1 - t0):.1f} ms {'ok' if good else 'MISMATCH'}")
        opt.step()
        opt_ref.step()
    print(f"{len(st.cached_plans())} plan(s) for {args.steps} steps of new boundaries; "
          + ("loss and gradients match dense SDPA" if ok else "MISMATCH against dense SDPA"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
