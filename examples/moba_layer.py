#!/usr/bin/env python3
"""A MoBA-style attention layer: each query block picks its top-k key blocks by the mean-pooled keys, at run time,
and attends to them (causally) through spattn with a FlexAttention-layout block mask; no replanning per call.

    pip install .  torch          # then
    python examples/moba_layer.py [--len 512] [--block 64] [--topk 3] [--device cpu|cuda] [--compile]

Per (batch, head, query block i): scores s_j = q_mean(i) . k_mean(j) for key blocks j < i, the top (topk - 1) of
them, plus block i itself (the diagonal, causal inside); the block mask's partial blocks are the diagonal ones (spec
"causal" inside them), its full blocks the chosen earlier ones. The layer checks itself against dense SDPA with the
same boolean mask (forward and gradients) and exits 0 when they agree, 1 otherwise.
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask

import spattn.torch as st


def moba_block_mask(q: torch.Tensor, k: torch.Tensor, block: int, topk: int) -> BlockMask:
    """q [B, L, H, D], k [B, L, Hkv, D] -> a BlockMask over (L / block) query and key blocks, all on q's device."""
    B, L, H, D = q.shape
    g = H // k.shape[2]
    n = L // block
    with torch.no_grad():
        qm = q.view(B, n, block, H, D).mean(2).permute(0, 2, 1, 3)                      # [B, H, n, D]
        km = k.view(B, n, block, -1, D).mean(2).permute(0, 2, 1, 3).repeat_interleave(g, 1)
        s = qm @ km.transpose(-1, -2)                                                  # [B, H, n, n]
        i = torch.arange(n, device=q.device)
        s = s.masked_fill(i[None, :] >= i[:, None], float("-inf"))                      # earlier blocks only
        kk = max(0, min(topk - 1, n - 1))
        top = s.topk(kk, -1) if kk else None
        # Index lists as wide as the key blocks (n): FlexAttention's own constructors make them so, and torch 2.11's
        # from_kv_blocks indexes a dense [n, C + 1] by them (a narrower C fails there); entries past a count are unread.
        full_idx = torch.zeros(B, H, n, n, dtype=torch.int32, device=q.device)
        full_num = torch.zeros(B, H, n, dtype=torch.int32, device=q.device)
        if top is not None:
            # topk sorts largest first: the -inf (later-block) entries of rows near the start come last, past the count
            full_num = (top.values > float("-inf")).sum(-1).int()
            full_idx[..., :kk] = top.indices.int()
        part_num = torch.ones(B, H, n, dtype=torch.int32, device=q.device)              # the diagonal block
        part_idx = i.view(1, 1, n, 1).expand(B, H, n, n).int().contiguous()
    return BlockMask.from_kv_blocks(part_num, part_idx, full_num, full_idx, BLOCK_SIZE=block, seq_lengths=(L, L))


def dense_mask(bm: BlockMask, L: int, block: int) -> torch.Tensor:
    """The BlockMask's pairs as a boolean [B, H, L, L] (diagonal blocks causal): the check's oracle."""
    B, H, n = bm.kv_num_blocks.shape
    blocks = torch.zeros(B, H, n, n, dtype=torch.int32, device=bm.kv_indices.device)
    for num, idx in ((bm.full_kv_num_blocks, bm.full_kv_indices), (bm.kv_num_blocks, bm.kv_indices)):
        listed = torch.arange(idx.shape[-1], device=idx.device) < num[..., None]
        blocks.scatter_add_(3, idx.long(), listed.int())  # padding past the count may repeat a listed index: add
    m = (blocks > 0).repeat_interleave(block, 2).repeat_interleave(block, 3)
    return m & ~(torch.ones(L, L, dtype=torch.bool, device=m.device).triu(1) & (
        torch.arange(L, device=m.device)[:, None] // block == torch.arange(L, device=m.device)[None, :] // block))


class MobaAttention(torch.nn.Module):
    def __init__(self, d: int, heads: int, kv_heads: int, block: int, topk: int) -> None:
        super().__init__()
        self.h, self.hk, self.hd, self.block, self.topk = heads, kv_heads, d // heads, block, topk
        self.q = torch.nn.Linear(d, d)
        self.kv = torch.nn.Linear(d, 2 * kv_heads * self.hd)
        self.o = torch.nn.Linear(d, d)

    def qkv(self, x: torch.Tensor):
        B, L, _ = x.shape
        q = self.q(x).view(B, L, self.h, self.hd)
        k, v = self.kv(x).view(B, L, 2, self.hk, self.hd).unbind(2)
        return q, k, v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x)
        bm = moba_block_mask(q, k, self.block, self.topk)
        o = st.sparse_attention(q, k, v, bm, spec="causal")                             # [B, L, H, D]
        return self.o(o.flatten(2))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--len", type=int, default=512)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--topk", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()
    torch.manual_seed(0)
    dtype = torch.float32 if a.device == "cpu" else torch.bfloat16
    layer = MobaAttention(256, 4, 2, a.block, a.topk).to(a.device, dtype)
    x = torch.randn(2, a.len, 256, device=a.device, dtype=dtype, requires_grad=True)
    run = torch.compile(layer, fullgraph=True) if a.compile else layer
    y = run(x)
    y.square().mean().backward()
    gx = x.grad.clone()
    # The same layer with dense SDPA over the same pairs.
    x.grad = None
    q, k, v = layer.qkv(x)
    m = dense_mask(moba_block_mask(q, k, a.block, a.topk), a.len, a.block)
    g = layer.h // layer.hk
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2).repeat_interleave(g, 1),
                                       v.transpose(1, 2).repeat_interleave(g, 1), attn_mask=m)
    y_ref = layer.o(o.transpose(1, 2).flatten(2))
    y_ref.square().mean().backward()
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    err_y = ((y - y_ref).abs().max() / y_ref.abs().max()).item()
    err_g = ((gx - x.grad).abs().max() / x.grad.abs().max()).item()
    kept = m.float().mean().item()
    print(f"MoBA layer: L={a.len}, block {a.block}, top-{a.topk} blocks ({kept:.1%} of pairs kept); "
          f"output error {err_y:.2e}, input-gradient error {err_g:.2e} (relative to the largest entry)")
    return 0 if err_y < tol and err_g < tol else 1


if __name__ == "__main__":
    sys.exit(main())
