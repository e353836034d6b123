#!/usr/bin/env python3
"""A video DiT block (diffusers' BasicTransformerBlock, as in Latte / PixArt; random weights) with 3-D window
attention over a latent video's token grid, checked against the same block whose SDPA gets the same mask.

    pip install . diffusers           # then
    python examples/video_dit_block.py [--grid 8,16,16] [--window 4,8,8] [--mode window|neighborhood] [--steps 2]

The block is of a real model's size (width 1152, 16 heads of 72, text cross-attention of width 4096, as PixArt's);
its self-attention over the 8 x 16 x 16 = 2048 video tokens becomes non-overlapping 4 x 8 x 8 windows (or 3-D
neighborhoods with --mode neighborhood) through spattn.vision.swap_diffusers; the cross-attention to the 120 text
tokens stays dense. Without diffusers installed, a plain PyTorch block of the same shape is used instead (any module
that calls F.scaled_dot_product_attention can be swapped). Exits 0 when output and gradients agree with masked
SDPA within 1e-5 relative (fp32).
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

import spattn.vision as sv


class PlainBlock(torch.nn.Module):
    """Self-attention, cross-attention to text, MLP; pre-norm; SDPA inside (the fallback when diffusers is absent)."""

    def __init__(self, dim, heads, text_dim):
        super().__init__()
        self.heads = heads
        self.n1, self.n2, self.n3 = (torch.nn.LayerNorm(dim) for _ in range(3))
        self.qkv, self.o1 = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.q2, self.kv2, self.o2 = torch.nn.Linear(dim, dim), torch.nn.Linear(text_dim, 2 * dim), torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

    def split(self, x):
        return x.unflatten(-1, (self.heads, -1)).transpose(1, 2)

    def forward(self, x, encoder_hidden_states):
        q, k, v = map(self.split, self.qkv(self.n1(x)).chunk(3, -1))
        x = x + self.o1(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(2))
        k, v = map(self.split, self.kv2(encoder_hidden_states).chunk(2, -1))
        x = x + self.o2(F.scaled_dot_product_attention(self.split(self.q2(self.n2(x))), k, v).transpose(1, 2).flatten(2))
        return x + self.mlp(self.n3(x))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", default="8,16,16")
    ap.add_argument("--window", default="4,8,8")
    ap.add_argument("--mode", default="window", choices=["window", "neighborhood"])
    ap.add_argument("--dim", type=int, default=1152)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--text", type=int, default=120, help="text tokens (cross-attention keys)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args()
    grid, window = tuple(map(int, args.grid.split(","))), tuple(map(int, args.window.split(",")))
    torch.manual_seed(0)
    try:
        from diffusers.models.attention import BasicTransformerBlock

        blk = BasicTransformerBlock(args.dim, args.heads, args.dim // args.heads, cross_attention_dim=4096)
        swap = lambda: sv.swap_diffusers(blk, grid, window, mode=args.mode)  # noqa: E731
        kind = "diffusers BasicTransformerBlock"
    except ImportError:
        blk = PlainBlock(args.dim, args.heads, 4096)
        swap = lambda: sv.swap_attention([blk], grid, window, mode=args.mode)  # noqa: E731
        kind = "plain PyTorch block (diffusers not installed)"
    N = 1
    for n in grid:
        N *= n
    x, text = torch.randn(args.batch, N, args.dim), torch.randn(args.batch, args.text, 4096)
    g = swap()[0]._spattn_grid
    mask = sv.grid_mask(g)
    print(f"{kind}: width {args.dim}, {args.heads} heads; video grid {grid} ({N} tokens), {args.mode} {window}: "
          f"{int(mask.sum())} of {mask.numel()} pairs ({100 * mask.float().mean():.1f}%)")

    def run():
        out = blk(x, encoder_hidden_states=text)
        return out, (out ** 2).mean()

    r = sv.check(blk, run)
    ok = r["output"] <= 1e-5 and r["gradient"] <= 1e-5
    print(f"against masked SDPA: output {r['output']:.1e}, largest gradient {r['gradient']:.1e} relative: "
          f"{'ok' if ok else 'MISMATCH'} (forward + backward {r['ms']:.0f} ms, masked SDPA {r['sdpa_ms']:.0f} ms)")
    opt = torch.optim.AdamW(blk.parameters(), lr=1e-4)
    target = torch.randn_like(x)
    for step in range(args.steps):
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(blk(x, encoder_hidden_states=text), target)
        loss.backward()
        opt.step()
        print(f"step {step}: loss {loss.item():.4f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
