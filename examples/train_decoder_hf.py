#!/usr/bin/env python3
"""Trains a transformers decoder with mixed sliding-window and full layers for a few steps with
attn_implementation="spattn", beside the same model (same weights, same batches, same AdamW) with "sdpa".

    pip install . transformers        # then
    python examples/train_decoder_hf.py [--steps 3] [--len 1024] [--layers 2] [--tiny]

The layers are of a real model's size (width 2048, GQA 16 query / 4 key-value heads of dim 128, SwiGLU 5632: a Qwen2
config, random weights, nothing downloaded); --layers and --len keep a CPU run short. Layers alternate sliding
window (--window, causal) and full causal attention (config.layer_types). A batch's second row packs two documents
(position_ids restart), so spattn runs document(...) & window there, as transformers masks it for SDPA.
Each step prints both losses and the largest relative gradient difference; exits 0 when every step's loss and
gradients agree within 1e-5 relative in fp32 (2e-2 in bf16 on the GPU), and the spattn model never fell back to SDPA.
"""
from __future__ import annotations

import argparse
import copy
import sys
import time

import torch

import spattn.hf as sh  # registers attn_implementation="spattn"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--len", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--tiny", action="store_true", help="width 128, 4/2 heads of 32: seconds on a CPU")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    from transformers import Qwen2Config, Qwen2ForCausalLM

    size = dict(hidden_size=2048, intermediate_size=5632, num_attention_heads=16, num_key_value_heads=4)
    if args.tiny:
        size = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
    cfg = Qwen2Config(vocab_size=8192, num_hidden_layers=args.layers, use_sliding_window=True, max_window_layers=0,
                      sliding_window=args.window, max_position_embeddings=max(4096, args.len),
                      layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(args.layers)],
                      attention_dropout=0.0, **size)
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.manual_seed(0)
    with dev:
        ref = Qwen2ForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation="sdpa", dtype=dtype)
        model = Qwen2ForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation="spattn", dtype=dtype)
    model.load_state_dict(ref.state_dict())
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-4) for m in (model, ref)]
    nparams = sum(p.numel() for p in model.parameters())
    print(f"Qwen2 decoder, {args.layers} layers of width {cfg.hidden_size} (GQA {cfg.num_attention_heads}/"
          f"{cfg.num_key_value_heads}, head dim {cfg.hidden_size // cfg.num_attention_heads}), {nparams / 1e6:.0f}M "
          f"parameters, layer types {cfg.layer_types}, window {args.window}, L={args.len}, {str(dtype)[6:]} on {dev}")
    gen = torch.Generator().manual_seed(1)
    L, ok, times = args.len, True, {"spattn": 0.0, "sdpa": 0.0}
    half = L // 3
    pos = torch.stack([torch.arange(L), torch.cat([torch.arange(half), torch.arange(L - half)])]).to(dev)
    before = sh.fallbacks()
    for step in range(args.steps):
        ids = torch.randint(0, cfg.vocab_size, (2, L), generator=gen).to(dev)
        out = {}
        for name, m, opt in (("spattn", model, opts[0]), ("sdpa", ref, opts[1])):
            t = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            loss = m(input_ids=ids, labels=ids, position_ids=pos, use_cache=False).loss
            loss.backward()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            if step:
                times[name] += time.perf_counter() - t
            out[name] = (loss.item(), [p.grad.float() for p in m.parameters()])
        (l1, g1), (l2, g2) = out["spattn"], out["sdpa"]
        lerr = abs(l1 - l2) / abs(l2)
        gerr = max(((a - b).norm() / b.norm().clamp_min(1e-30)).item() for a, b in zip(g1, g2))
        good = lerr <= tol and gerr <= tol
        ok &= good
        print(f"step {step}: loss {l1:.6f} (sdpa {l2:.6f}, rel diff {lerr:.1e}); largest gradient diff {gerr:.1e} "
              f"relative: {'ok' if good else 'MISMATCH'}", flush=True)
        for o in opts:
            o.step()
    if args.steps > 1:
        n = args.steps - 1
        print(f"time a step (forward + backward): spattn {times['spattn'] / n * 1e3:.0f} ms, "
              f"sdpa {times['sdpa'] / n * 1e3:.0f} ms")
    if sh.fallbacks() != before:
        print(f"spattn fell back to SDPA: {sh.fallbacks()}")
        ok = False
    print("loss and gradients match SDPA" if ok else "MISMATCH against SDPA")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
