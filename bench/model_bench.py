#!/usr/bin/env python3
"""A decoder's training step with spattn against FlexAttention, dense causal SDPA and FlashAttention-4, on the GPU.

    python3 bench/model_bench.py --json out/model.json [--plot out/model.png] [--baseline h200-model]
    python3 bench/model_bench.py --smoke --json /tmp/m.json          # CPU, tiny sizes: checks the script runs

The model is plain PyTorch (no downloads, random weights): 16 pre-norm layers of width 2048, GQA 16 query / 4 key-value
heads of dim 128, RoPE, RMSNorm, SwiGLU 5632, vocabulary 32000, bf16 parameters and AdamW; batch 1. Every layer's
attention is sliding-window causal (--window 4096: query q keeps keys q-4095..q) in all backends but SDPA's:
  spattn           spattn.torch.sparse_attention(q, k, v, "causal & local(left=4095, right=0)")  (GQA in place)
  flex_attention   torch.compile(flex_attention) with create_block_mask of the same mask, enable_gqa=True
  sdpa_causal      F.scaled_dot_product_attention(is_causal=True, enable_gqa=True): dense causal, the reference cost
  fa4              flash_attn.cute.flash_attn_func(q, k, v, causal=True, window_size=(4095, 0)) where it imports
For each length (--lengths, default 4K..64K): the step (forward, backward, AdamW step; median of --reps after
--warmup, CUDA events) per backend, and the attention op alone (forward + backward of one layer's q, k, v),
whose share of the step is layers * attn_ms / step_ms. One model serves all backends (its attention function is
swapped), so weights and memory are shared. step_ratio_vs_flex[b] = step_ms[flex_attention] / step_ms[b] (above 1:
faster than FlexAttention). --budget-s stops starting new measurements past that many seconds (rows left are
marked "skipped: budget"; 32K, the issue's bar, is measured first): the default run fits in 8 minutes on an H200.

Before timing, a correctness check (--check-len, --check-window, 2 layers of the same width): bf16 loss and every
parameter's gradient with spattn (and, for comparison, FlexAttention and FA4: GPU only) against SDPA with the same
boolean mask, relative (|a - b| / |b|, Frobenius); the bar is 2e-2. Its result is in the JSON ("check") and printed; exit status 1 when
spattn misses it.

--stack hf: the same model as transformers' Mistral (random weights), each backend as its attn_implementation
("spattn" via spattn.hf, "flex_attention", "sdpa" with transformers' dense sliding-window mask; no FA4).

The JSON has "kind": "model" (bench/baseline.py plots it: spattn's step speedup over each backend against the
sequence length); --plot PNG draws it there, --baseline NAME writes bench/baselines/NAME.{json,png}.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import baseline  # noqa: E402  (bench/baseline.py: meta block, plots)

import spattn  # noqa: E402
import spattn.torch as st  # noqa: E402

BACKENDS = ("spattn", "flex_attention", "sdpa_causal", "fa4")


# ---- the model ----------------------------------------------------------------------------------------------
def rope_tables(L: int, D: int, device, base: float = 10000.0):
    inv = 1.0 / base ** (torch.arange(0, D, 2, device=device, dtype=torch.float32) / D)
    ang = torch.arange(L, device=device, dtype=torch.float32)[:, None] * inv[None]
    return ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]  # [1, L, 1, D/2]


def rope(x, cos, sin):
    """Rotary embedding in x's dtype (cos and sin need no gradient: autograd saves nothing of x's size)."""
    a, b = x.chunk(2, -1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)


class Layer(torch.nn.Module):
    def __init__(self, d, hq, hkv, hd, ffn):
        super().__init__()
        lin = lambda i, o: torch.nn.Linear(i, o, bias=False)  # noqa: E731
        self.hq, self.hkv, self.hd = hq, hkv, hd
        self.n1, self.n2 = torch.nn.RMSNorm(d), torch.nn.RMSNorm(d)
        self.wq, self.wk, self.wv, self.wo = lin(d, hq * hd), lin(d, hkv * hd), lin(d, hkv * hd), lin(hq * hd, d)
        self.w1, self.w3, self.w2 = lin(d, ffn), lin(d, ffn), lin(ffn, d)

    def forward(self, x, cos, sin, attend):
        B, L, _ = x.shape
        h = self.n1(x)
        q = rope(self.wq(h).view(B, L, self.hq, self.hd), cos, sin)   # [B, L, H, D]
        k = rope(self.wk(h).view(B, L, self.hkv, self.hd), cos, sin)
        v = self.wv(h).view(B, L, self.hkv, self.hd)
        x = x + self.wo(attend(q, k, v).reshape(B, L, -1))
        h = self.n2(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Decoder(torch.nn.Module):
    def __init__(self, layers, d, hq, hkv, hd, ffn, vocab):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.layers = torch.nn.ModuleList(Layer(d, hq, hkv, hd, ffn) for _ in range(layers))
        self.norm = torch.nn.RMSNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        self.attend = None
        self._rope = {}

    def forward(self, tokens):
        L = tokens.shape[1]
        if L not in self._rope:
            self._rope = {L: rope_tables(L, self.layers[0].hd, tokens.device)}
        cos, sin = self._rope[L]
        x = self.emb(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin, self.attend)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())


class HFDecoder(torch.nn.Module):
    """--stack hf: transformers' Mistral of the same shape (sliding_window in every layer), random weights; the
    backend is its attn_implementation ("spattn" through spattn.hf, "flex_attention", "sdpa" with the dense
    sliding-window mask transformers builds)."""

    IMPL = {"spattn": "spattn", "flex_attention": "flex_attention", "sdpa_causal": "sdpa"}

    def __init__(self, args, layers, dtype):
        super().__init__()
        import spattn.hf  # noqa: F401  (registers "spattn")
        from transformers import MistralConfig, MistralForCausalLM

        cfg = MistralConfig(vocab_size=args.vocab, hidden_size=args.width, intermediate_size=args.ffn,
                            num_hidden_layers=layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                            head_dim=args.head_dim, sliding_window=args.window, attention_dropout=0.0,
                            max_position_embeddings=max(int(x) for x in args.lengths.split(",")))
        self.m = MistralForCausalLM._from_config(cfg, attn_implementation="spattn", dtype=dtype)

    def use(self, name):
        self.m.set_attn_implementation(self.IMPL[name])

    def forward(self, tokens):
        return self.m(input_ids=tokens, labels=tokens, use_cache=False).loss


def new_model(args, layers, dtype):
    if args.stack == "hf":
        return HFDecoder(args, layers, dtype)
    return Decoder(layers, args.width, args.heads, args.kv_heads, args.head_dim, args.ffn, args.vocab).to(dtype)


def use_backend(model, name, attend):
    if isinstance(model, HFDecoder):
        model.use(name)
    else:
        model.attend = attend


# ---- the attention backends: q, k, v [B, L, H, D] -> [B, L, Hq, D] --------------------------------------------
def make_backends(args, device):
    """name -> (factory(L) -> attend function, or the reason it is not available)."""
    W = args.window
    spec = f"causal & local(left={W - 1}, right=0)"
    out = {}

    out["spattn"] = lambda L: (lambda q, k, v: st.sparse_attention(q, k, v, spec))

    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        flex = torch.compile(flex_attention, dynamic=False) if args.compile else flex_attention

        def flex_factory(L):
            def mask_mod(b, h, q, k):
                return (k <= q) & (q - k < W)

            bm = create_block_mask(mask_mod, None, None, L, L, device=device, _compile=args.compile)
            return lambda q, k, v: flex(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=bm,
                                        enable_gqa=True).transpose(1, 2)

        out["flex_attention"] = flex_factory
    except ImportError as e:
        out["flex_attention"] = f"no FlexAttention: {e}"

    out["sdpa_causal"] = lambda L: (lambda q, k, v: F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True).transpose(1, 2))

    try:
        if device.type != "cuda":
            raise ImportError("CUDA only")
        from flash_attn.cute import flash_attn_func

        def fa4(q, k, v):
            o = flash_attn_func(q, k, v, causal=True, window_size=(W - 1, 0))
            return o[0] if isinstance(o, tuple) else o

        out["fa4"] = lambda L: fa4
    except Exception as e:  # noqa: BLE001 -- any import failure: not available here
        out["fa4"] = f"no FlashAttention-4 (from flash_attn.cute import flash_attn_func): {type(e).__name__}: {e}"
    return {b: out[b] for b in args.backends}


# ---- timing -------------------------------------------------------------------------------------------------
def timed(fn, device, reps, warmup):
    """Median ms of fn() over reps calls after warmup calls (CUDA events on the GPU, perf_counter on the CPU)."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            ts.append(a.elapsed_time(b))
        else:
            t = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def check(args, device, dtype, backends):
    """bf16 loss and gradients of a 2-layer model: spattn (and Flex) against SDPA with the same boolean mask."""
    L, W = args.check_len, args.check_window
    sub = argparse.Namespace(**{**vars(args), "window": W})
    torch.manual_seed(0)
    with torch.device(device):  # initialised where it runs (the CPU would take seconds for the full model)
        model = new_model(sub, 2, dtype)
    tokens = torch.randint(0, args.vocab, (1, L), device=device)
    q_i = torch.arange(L, device=device)
    mask = (q_i[None] <= q_i[:, None]) & (q_i[:, None] - q_i[None] < W)
    fns = {"sdpa_masked": lambda q, k, v: F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, enable_gqa=True).transpose(1, 2)}
    for name, f in make_backends(sub, device).items():
        on_gpu = device.type == "cuda" and (name == "flex_attention" or (name == "fa4" and args.stack == "plain"))
        if callable(f) and (name == "spattn" or on_gpu):
            fns[name] = f(L)
    res = {}
    for name, attend in fns.items():
        if isinstance(model, HFDecoder) and name == "sdpa_masked":
            model.use("sdpa_causal")  # transformers' "sdpa": its dense mask of the same window
        else:
            use_backend(model, name, attend)
        model.zero_grad(set_to_none=True)
        loss = model(tokens)
        loss.backward()
        res[name] = (loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()})
    ref_loss, ref_grads = res.pop("sdpa_masked")
    out = {"seq_len": L, "window": W, "layers": 2, "dtype": str(dtype)[6:], "bar": 2e-2}
    for name, (loss, grads) in res.items():
        out[name] = {"loss_rel": rel(loss, ref_loss), "grad_rel_max": max(rel(grads[n], ref_grads[n]) for n in grads)}
        out[name]["ok"] = out[name]["loss_rel"] <= 2e-2 and out[name]["grad_rel_max"] <= 2e-2
        print(f"# check {name} vs SDPA with the mask (L={L}, window {W}, {out['dtype']}): loss {out[name]['loss_rel']:.2e}, "
              f"largest gradient {out[name]['grad_rel_max']:.2e} relative (bar 2e-2): "
              f"{'ok' if out[name]['ok'] else 'FAIL'}", flush=True)
    del model
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--plot", default=None, help="draw the speedup plot into this PNG (needs matplotlib)")
    ap.add_argument("--baseline", default=None, metavar="NAME", help="also write bench/baselines/NAME.{json,png}")
    ap.add_argument("--stack", choices=["plain", "hf"], default="plain",
                    help="plain: the PyTorch decoder above; hf: transformers' Mistral of the same shape, the backend "
                         "as its attn_implementation (sdpa_causal is then transformers' sdpa with its dense "
                         "sliding-window mask; no fa4)")
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny sizes, no compile: checks that the script runs")
    ap.add_argument("--lengths", default=None, help="default 4096,8192,16384,32768,65536 (--smoke: 256,512)")
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--ffn", type=int, default=5632)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--window", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--attn-reps", type=int, default=10)
    ap.add_argument("--check-len", type=int, default=4096)
    ap.add_argument("--check-window", type=int, default=1024)
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--no-compile", dest="compile", action="store_false", help="FlexAttention uncompiled")
    ap.add_argument("--budget-s", type=float, default=390.0, help="start no measurement past this many seconds")
    args = ap.parse_args()
    if args.smoke:
        args.lengths = args.lengths or "256,512"
        args.layers, args.width, args.heads, args.kv_heads, args.head_dim = 2, 128, 4, 2, 32
        args.ffn, args.vocab, args.window, args.reps, args.warmup, args.attn_reps = 256, 256, 128, 2, 1, 2
        args.check_len, args.check_window, args.compile = 256, 64, False
    args.lengths = args.lengths or "4096,8192,16384,32768,65536"
    args.backends = [b for b in args.backends.split(",") if b]
    unknown = set(args.backends) - set(BACKENDS)
    if unknown:
        ap.error(f"--backends: unknown {sorted(unknown)}; expected some of {','.join(BACKENDS)}")
    t0 = time.time()
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    command = " ".join(sys.argv)
    machine = {"gpu": gpu, "device": device.type, "torch": torch.__version__, "spattn": spattn.__version__,
               "date": datetime.datetime.now().isoformat(timespec="seconds"), "command": command}
    config = {k: getattr(args, k) for k in ("layers", "width", "heads", "kv_heads", "head_dim", "ffn", "vocab", "window",
                                            "reps", "warmup", "attn_reps", "compile")}
    config.update(stack=args.stack, dtype=str(dtype)[6:], batch=1, optimizer="AdamW",
                  pattern=f"causal & local(left={args.window - 1}, right=0)")
    print(f"# {gpu}, torch {torch.__version__}, spattn {spattn.__version__}; {json.dumps(config)}", flush=True)

    chk = None if args.no_check else check(args, device, dtype, args.backends)
    backends = make_backends(args, device)
    torch.manual_seed(0)
    with torch.device(device):
        model = new_model(args, args.layers, dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    rows = []
    lengths = sorted((int(x) for x in args.lengths.split(",")), key=lambda L: (L != 32768, L))  # the bar's first
    rows_first = lengths[0]
    for L in lengths:
        row = {"seq_len": L, "step_ms": {}, "attn_ms": {}, "attn_share": {}, "step_ratio_vs_flex": {}, "notes": {}}
        tokens = torch.randint(0, args.vocab, (1, L), device=device)
        for name, factory in backends.items():
            if isinstance(factory, str):
                row["notes"][name] = factory
                if L == rows_first:
                    print(f"# {name}: {factory}", flush=True)
                continue
            if time.time() - t0 > args.budget_s:
                row["notes"][name] = "skipped: budget"
                continue
            try:
                if args.stack == "hf" and name not in HFDecoder.IMPL:
                    raise NotImplementedError(f"not in --stack hf (its backends: {', '.join(HFDecoder.IMPL)})")
                attend = factory(L)
                use_backend(model, name, attend)

                def step():
                    opt.zero_grad(set_to_none=True)
                    model(tokens).backward()
                    opt.step()

                row["step_ms"][name] = timed(step, device, args.reps, args.warmup)
                opt.zero_grad(set_to_none=True)
                g = torch.Generator(device=device).manual_seed(L)
                mk = lambda h: torch.randn(1, L, h, args.head_dim, device=device, dtype=dtype, generator=g,  # noqa: E731
                                           requires_grad=True)
                q, k, v = mk(args.heads), mk(args.kv_heads), mk(args.kv_heads)
                dout = torch.randn(1, L, args.heads, args.head_dim, device=device, dtype=dtype, generator=g)

                def attn():
                    torch.autograd.backward(attend(q, k, v), dout)

                row["attn_ms"][name] = timed(attn, device, args.attn_reps, args.warmup)
                row["attn_share"][name] = args.layers * row["attn_ms"][name] / row["step_ms"][name]
                q = k = v = dout = None  # the attention inputs freed before the next backend
            except Exception as e:  # noqa: BLE001 -- one backend's failure (out of memory, no kernel) is a row note
                row["notes"][name] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
                opt.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            print(f"L={L:6d} {name:15s} " + (f"step {row['step_ms'][name]:9.2f} ms  attention fwd+bwd "
                  f"{row['attn_ms'][name]:8.3f} ms/layer ({100 * row['attn_share'][name]:4.1f}% of the step)"
                  if name in row["step_ms"] else row["notes"].get(name, "")), flush=True)
        flex = row["step_ms"].get("flex_attention")
        row["step_ratio_vs_flex"] = {b: flex / ms for b, ms in row["step_ms"].items()} if flex else {}
        rows.append(row)
    rows.sort(key=lambda r: r["seq_len"])

    doc = {"kind": "model", "machine": machine, "config": config, "check": chk, "rows": rows}
    print(f"\n# step ms (batch 1, {config['dtype']}, {args.layers} layers); x flex = flex step / this step")
    print(f"{'L':>6s} " + " ".join(f"{b:>15s}" for b in args.backends) + "  spattn x flex  attn share (spattn)")
    for r in rows:
        cells = [f"{r['step_ms'][b]:15.2f}" if b in r["step_ms"] else f"{'-':>15s}" for b in args.backends]
        x = r["step_ratio_vs_flex"].get("spattn")
        sh = r["attn_share"].get("spattn")
        print(f"{r['seq_len']:6d} " + " ".join(cells) + f"  {(f'{x:.2f}x' if x else '-'):>13s}  "
              f"{(f'{100 * sh:.1f}%' if sh else '-'):>8s}")
    outs = [args.json] if args.json else []
    if args.baseline:
        doc["meta"] = baseline.meta(args.baseline, command)
        outs.append(os.path.join(baseline.BASELINES, args.baseline + ".json"))
    for out in outs:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {out}")
    pngs = ([args.plot] if args.plot else []) + ([os.path.join(baseline.BASELINES, args.baseline + ".png")]
                                                  if args.baseline else [])
    for png in pngs:
        if baseline.plot(doc, png):
            print(f"wrote {png}")
    print(f"# {time.time() - t0:.0f} s in all")
    if chk is not None and not chk.get("spattn", {}).get("ok", True):
        sys.exit(1)


if __name__ == "__main__":
    main()
