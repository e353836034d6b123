#!/usr/bin/env python3
"""Trains a tiny transformer language model for a few steps on the CPU with spattn attention, and checks that
every step's loss and gradients match the same model run with dense SDPA and the pattern's boolean mask.

    pip install .  torch          # then
    python examples/train_tiny.py [--steps 10] [--compile] [--pattern SPEC]

Two copies of one model (same initial weights, same batches, same AdamW) differ only in their attention:
spattn.torch.sparse_attention(q, k, v, SPEC) against F.scaled_dot_product_attention(q, k, v,
attn_mask=spattn.mask(SPEC, L)). Exits 0 when every step matches (loss to 1e-5 relative, each gradient to 1e-3
of its largest entry), 1 otherwise.
"""
from __future__ import annotations

import argparse
import copy
import sys
import time

import torch
import torch.nn.functional as F

import spattn
import spattn.torch as st


class Block(torch.nn.Module):
    """Pre-norm transformer block; grouped-query attention (kv_heads < heads) through `attend`."""

    def __init__(self, d: int, heads: int, kv_heads: int, attend) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, d // heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.q = torch.nn.Linear(d, d)
        self.kv = torch.nn.Linear(d, 2 * kv_heads * self.hd)
        self.proj = torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))
        self.attend = attend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, L, d = x.shape
        h = self.norm1(x)
        q = self.q(h).view(B, L, self.heads, self.hd)                      # [B, L, H, D]
        k, v = self.kv(h).view(B, L, 2, self.kv_heads, self.hd).unbind(2)  # [B, L, Hkv, D] each
        x = x + self.proj(self.attend(q, k, v).reshape(B, L, d))
        return x + self.mlp(self.norm2(x))


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int, L: int, d: int, heads: int, kv_heads: int, layers: int, attend) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Parameter(torch.randn(L, d) * 0.02)
        self.blocks = torch.nn.ModuleList(Block(d, heads, kv_heads, attend) for _ in range(layers))
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens) + self.pos
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--pattern", default="causal & (local(8) | global(0:2))")
    ap.add_argument("--len", type=int, default=64)
    ap.add_argument("--compile", action="store_true", help="torch.compile both models (fullgraph)")
    ap.add_argument("--threads", type=int, default=0, help="spattn's CPU worker threads (0: all cores)")
    args = ap.parse_args()

    torch.manual_seed(0)
    vocab, L, B = 32, args.len, 8
    spec = args.pattern
    mask = torch.from_numpy(spattn.mask(spec, L))
    if not mask.diagonal().all():
        print(f"pattern {spec!r}: every query must see itself (SDPA gives NaN on empty rows)")
        return 2

    def sparse(q, k, v):  # [B, L, H, D] in, [B, L, H, D] out
        return st.sparse_attention(q, k, v, spec, threads=args.threads)

    def dense(q, k, v):  # the same with SDPA ([B, H, L, D]) and the boolean mask; GQA by repeating K/V heads
        g = q.shape[2] // k.shape[2]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(g, 1), v.transpose(1, 2).repeat_interleave(g, 1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)

    model = TinyLM(vocab, L, d=64, heads=4, kv_heads=2, layers=2, attend=sparse)
    ref = copy.deepcopy(model)
    for blk in ref.blocks:
        blk.attend = dense
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=3e-3)
    run, run_ref = model, ref
    if args.compile:
        run, run_ref = torch.compile(model, fullgraph=True), torch.compile(ref, fullgraph=True)

    # Data: sequences with a period-5 structure, so that a local window can learn to predict the next token.
    gen = torch.Generator().manual_seed(1)
    ok = True
    t_sparse = t_dense = 0.0
    print(f"pattern {spec!r}, L={L}, {int(mask.sum())} of {L * L} pairs kept; "
          f"model {sum(p.numel() for p in model.parameters())} parameters")
    for step in range(args.steps):
        base = torch.randint(0, vocab, (B, 5), generator=gen)
        seq = base.repeat(1, (L + 1) // 5 + 1)[:, : L + 1]
        noise = torch.rand(seq.shape, generator=gen) < 0.1
        seq = torch.where(noise, torch.randint(0, vocab, seq.shape, generator=gen), seq)
        x, y = seq[:, :-1], seq[:, 1:]

        t0 = time.perf_counter()
        loss = F.cross_entropy(run(x).reshape(-1, vocab), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        t1 = time.perf_counter()
        loss_ref = F.cross_entropy(run_ref(x).reshape(-1, vocab), y.reshape(-1))
        opt_ref.zero_grad()
        loss_ref.backward()
        t2 = time.perf_counter()
        if step > 0:  # the first step includes planning (and compiling)
            t_sparse += t1 - t0
            t_dense += t2 - t1

        loss_err = abs(loss.item() - loss_ref.item()) / abs(loss_ref.item())
        grad_err = 0.0
        for (name, p), p_ref in zip(model.named_parameters(), ref.parameters()):
            scale = p_ref.grad.abs().max().item() or 1.0
            grad_err = max(grad_err, (p.grad - p_ref.grad).abs().max().item() / scale)
        good = loss_err <= 1e-5 and grad_err <= 1e-3
        ok &= good
        print(f"step {step}: loss {loss.item():.6f} (sdpa {loss_ref.item():.6f}, rel diff {loss_err:.1e}), "
              f"max gradient diff {grad_err:.1e} of the largest entry {'ok' if good else 'MISMATCH'}")
        opt.step()
        opt_ref.step()

    if args.steps > 1:
        n = args.steps - 1
        print(f"time a step (forward + backward): spattn {t_sparse / n * 1e3:.1f} ms, dense SDPA {t_dense / n * 1e3:.1f} ms")
    print("loss and gradients match dense SDPA with the same mask" if ok else "MISMATCH against dense SDPA")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
