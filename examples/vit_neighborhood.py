#!/usr/bin/env python3
"""A timm ViT-B/16 (random weights, nothing downloaded) with 2-D neighborhood attention over its patch grid,
checked against the same model whose SDPA gets the same mask, then trained a few steps.

    pip install . timm                # then
    python examples/vit_neighborhood.py [--kernel 7] [--img 224] [--steps 2] [--model vit_base_patch16_224]

spattn.vision.swap_timm_vit makes every block's attention a 7x7 neighborhood over the 14x14 patch grid; the class
token (and register tokens, if the model has them) stays global: it attends to every patch and every patch to it.
The weights do not change. Prints the largest output difference against masked SDPA (fp32) and each step's loss;
exits 0 when outputs and gradients agree within 1e-5 relative.
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

import spattn.vision as sv


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="vit_base_patch16_224")
    ap.add_argument("--img", type=int, default=224)
    ap.add_argument("--kernel", type=int, default=7)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args()
    import timm

    torch.manual_seed(0)
    vit = timm.create_model(args.model, pretrained=False, img_size=args.img, num_classes=100)
    x, y = torch.randn(args.batch, 3, args.img, args.img), torch.randint(0, 100, (args.batch,))
    attns = sv.swap_timm_vit(vit, kernel_size=args.kernel)
    g = attns[0]._spattn_grid
    mask = sv.grid_mask(g)
    print(f"{args.model}: {len(attns)} blocks, {sum(p.numel() for p in vit.parameters()) / 1e6:.0f}M parameters; "
          f"grid {g.grid}, {g.prefix_tokens} global token(s), {args.kernel}x{args.kernel} neighborhoods: "
          f"{int(mask.sum())} of {mask.numel()} pairs ({100 * mask.float().mean():.0f}%)")
    def run():
        out = vit(x)
        return out, F.cross_entropy(out, y)

    r = sv.check(vit, run)
    ok = r["output"] <= 1e-5 and r["gradient"] <= 1e-5
    print(f"against masked SDPA: output {r['output']:.1e}, largest gradient {r['gradient']:.1e} relative: "
          f"{'ok' if ok else 'MISMATCH'} (forward + backward {r['ms']:.0f} ms, masked SDPA {r['sdpa_ms']:.0f} ms)")
    opt = torch.optim.AdamW(vit.parameters(), lr=1e-4)
    for step in range(args.steps):
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(vit(x), y)
        loss.backward()
        opt.step()
        print(f"step {step}: loss {loss.item():.4f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
