"""Neighborhood or window attention over a vision model's token grid, in place of its dense attention.

    import spattn.vision as sv
    sv.swap_timm_vit(vit, kernel_size=7)                                  # timm ViT: 2-D neighborhoods, cls global
    sv.swap_diffusers(dit_block, grid=(8, 16, 16), kernel_size=(8, 8, 8), mode="window")   # video DiT: 3-D windows
    sv.restore(vit)                                                       # back to dense attention

The weights are the model's own, untouched (the state dict does not change): the swapped attention modules run
their own forward, in which the dense ``F.scaled_dot_product_attention`` call over the grid's tokens is replaced by
spattn (a TorchFunctionMode entered for that module's forward only). Calls whose keys are not the same tokens
(cross-attention: text keys of a DiT block) pass through to SDPA unchanged.

Tokens are the grid's, row-major ((T,) H, W), after ``prefix_tokens`` global tokens (a ViT's class and register
tokens; a joint-attention DiT's text tokens placed first): those attend to every token and every token attends to
them (``global`` in the pattern language), the grid tokens to each other by the pattern:
  mode="neighborhood"  ``spattn.neighborhood_spec(grid, kernel_size, dilation, is_causal)`` (NATTEN's windows,
                       shifted at the borders: every query sees kernel_size tokens per axis);
  mode="window"        non-overlapping windows of kernel_size per axis (Swin's, unshifted; the grid must divide
                       into them): tokens are gathered window by window and attend within their window
                       (``block_diag``).
With prefix tokens the grid queries' softmax runs over the pattern's keys and the prefix keys together, exactly
(spattn's part and a small dense part merged through their log-sum-exps, one autograd function).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode

from . import Error, neighborhood_spec
from .torch import _autocast, _options, sparse_attention

__all__ = ["GridSpec", "grid_attention", "grid_mask", "swap_attention", "swap_timm_vit", "swap_diffusers", "restore",
           "masked_sdpa", "check"]

IntOrTuple = Union[int, Sequence[int]]


@dataclass(frozen=True)
class GridSpec:
    """The pattern over a token grid: `prefix_tokens` global tokens, then prod(grid) tokens, row-major."""

    grid: Tuple[int, ...]
    kernel_size: Tuple[int, ...]
    mode: str = "neighborhood"
    dilation: Tuple[int, ...] = ()
    is_causal: Tuple[bool, ...] = ()
    prefix_tokens: int = 0

    @staticmethod
    def make(grid: IntOrTuple, kernel_size: IntOrTuple, mode: str = "neighborhood", dilation: IntOrTuple = 1,
             is_causal: Union[bool, Sequence[bool]] = False, prefix_tokens: int = 0) -> "GridSpec":
        grid = (int(grid),) if isinstance(grid, int) else tuple(int(g) for g in grid)
        n = len(grid)
        per = lambda x: tuple(x) if isinstance(x, (list, tuple)) else (x,) * n  # noqa: E731
        kernel, dil, causal = per(kernel_size), per(dilation), per(is_causal)
        if mode not in ("neighborhood", "window"):
            raise Error(f"mode '{mode}': expected 'neighborhood' or 'window'")
        if len(kernel) != n or len(dil) != n or len(causal) != n:
            raise Error(f"grid {grid}: kernel_size {kernel_size}, dilation {dilation} and is_causal {is_causal} "
                        f"need one value or {n}")
        if prefix_tokens < 0:
            raise Error(f"prefix_tokens {prefix_tokens}: expected >= 0")
        if mode == "window":
            if any(g % k for g, k in zip(grid, kernel)):
                raise Error(f"window {kernel} does not divide grid {grid}: window attention needs whole windows")
            if any(d != 1 for d in dil) or any(causal):
                raise Error("window attention takes no dilation and no is_causal (use mode='neighborhood')")
        spec = GridSpec(grid, tuple(int(k) for k in kernel), mode, tuple(int(d) for d in dil),
                        tuple(bool(c) for c in causal), int(prefix_tokens))
        spec.spec()  # bad sizes fail here, naming the value
        return spec

    @property
    def tokens(self) -> int:
        return self.prefix_tokens + math.prod(self.grid)

    def spec(self) -> str:
        """The spec over the grid's tokens in the order spattn runs them (windows gathered in window mode)."""
        if self.mode == "window":
            return f"block_diag({math.prod(self.kernel_size)})"
        return neighborhood_spec(self.grid, self.kernel_size, self.dilation, self.is_causal)

    # window mode: [B, N, H, D] grid tokens <-> window by window
    def gather(self, x: Tensor) -> Tensor:
        if self.mode != "window":
            return x
        n = len(self.grid)
        shape = [s for g, k in zip(self.grid, self.kernel_size) for s in (g // k, k)]
        x = x.reshape(x.shape[0], *shape, *x.shape[2:])
        order = [0] + [1 + 2 * i for i in range(n)] + [2 + 2 * i for i in range(n)] + [2 * n + 1, 2 * n + 2]
        return x.permute(order).reshape(x.shape[0], -1, *x.shape[-2:])

    def scatter(self, x: Tensor) -> Tensor:
        if self.mode != "window":
            return x
        n = len(self.grid)
        counts = [g // k for g, k in zip(self.grid, self.kernel_size)]
        x = x.reshape(x.shape[0], *counts, *self.kernel_size, *x.shape[2:])
        order = [0] + [v for i in range(n) for v in (1 + i, 1 + n + i)] + [2 * n + 1, 2 * n + 2]
        return x.permute(order).reshape(x.shape[0], -1, *x.shape[-2:])


def grid_mask(g: GridSpec) -> Tensor:
    """The pattern as a boolean [N, N] mask in the model's token order (prefix first): SDPA's attn_mask for checks."""
    import spattn

    n = math.prod(g.grid)
    inner = torch.from_numpy(spattn.mask(g.spec(), n))
    if g.mode == "window":  # the mask of gathered tokens, back in grid order
        idx = g.gather(torch.arange(n).reshape(1, n, 1, 1)).flatten()
        pos = torch.empty_like(idx)
        pos[idx] = torch.arange(n)
        inner = inner[pos][:, pos]
    m = torch.ones(g.tokens, g.tokens, dtype=torch.bool)
    m[g.prefix_tokens:, g.prefix_tokens:] = inner
    return m


class _GridWithGlobalKeys(torch.autograd.Function):
    """Grid queries over the pattern's grid keys (spattn) and all P prefix keys (dense), one softmax.

    Forward: O = w O1 + P2 Vp, w = exp(lse1 - lse), P2 = exp(S2 - lse), lse = logaddexp(lse1, logsumexp(S2)).
    Backward: the op's backward fed the combined O and lse (its P is then P' = exp(S - lse), the grid keys' share of
    the joint softmax) gives dq1, dk, dv; the dense part's gradient is the softmax's, by hand."""

    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, kp: Tensor, vp: Tensor, spec: str, scale: float) -> Tensor:
        options = _options("blhd", scale)
        o1, lse1 = torch.ops.spattn.sparse_attention.default(q, k, v, spec, options)
        g = q.shape[2] // k.shape[2]
        kpf, vpf = (x.float().repeat_interleave(g, 2) for x in (kp, vp))        # [B, P, H, D]
        s2 = torch.einsum("blhd,bphd->bhlp", q.float(), kpf) * scale             # [B, H, L, P]
        lse = torch.logaddexp(lse1.float(), torch.logsumexp(s2, -1))             # [B, H, L]
        w = torch.exp(lse1.float() - lse).transpose(1, 2)[..., None]             # [B, L, H, 1]
        p2 = torch.exp(s2 - lse[..., None])
        o = (w * o1.float() + torch.einsum("bhlp,bphd->blhd", p2, vpf)).to(q.dtype)
        ctx.save_for_backward(q, k, v, kp, vp, o, lse.to(lse1.dtype), p2)
        ctx.args = (spec, options, scale, g)
        return o

    @staticmethod
    def backward(ctx: Any, dout: Tensor) -> Tuple[Any, ...]:
        q, k, v, kp, vp, o, lse, p2 = ctx.saved_tensors
        spec, options, scale, g = ctx.args
        dq, dk, dv = torch.ops.spattn.sparse_attention_backward.default(q, k, v, o, lse, dout, spec, options)
        d = dout.float()
        delta = (d * o.float()).sum(-1).transpose(1, 2)                          # [B, H, L]
        kpf, vpf = (x.float().repeat_interleave(g, 2) for x in (kp, vp))
        ds2 = p2 * (torch.einsum("blhd,bphd->bhlp", d, vpf) - delta[..., None])
        dq = (dq.float() + scale * torch.einsum("bhlp,bphd->blhd", ds2, kpf)).to(q.dtype)
        fold = lambda x: x.unflatten(2, (kp.shape[2], g)).sum(3)  # noqa: E731  (GQA: sum a group's heads)
        dkp = fold(scale * torch.einsum("bhlp,blhd->bphd", ds2, q.float())).to(kp.dtype)
        dvp = fold(torch.einsum("bhlp,blhd->bphd", p2, d)).to(vp.dtype)
        return dq, dk, dv, dkp, dvp, None, None


def grid_attention(q: Tensor, k: Tensor, v: Tensor, grid: GridSpec, *, scale: Optional[float] = None,
                   layout: str = "blhd") -> Tensor:
    """Attention over `grid`'s pattern for q [B, N, Hq, D], k and v [B, N, Hkv, D] (``layout="bhld"``: [B, H, N, D]),
    N = grid.tokens. Differentiable in q, k and v; returns O in q's layout."""
    if layout == "bhld":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    elif layout != "blhd":
        raise Error(f"layout '{layout}': expected 'blhd' or 'bhld'")
    N = q.shape[1]
    if N != grid.tokens or k.shape[1] != N:
        raise Error(f"the grid {grid.grid} with {grid.prefix_tokens} prefix tokens has {grid.tokens} tokens; q has "
                    f"{N}, k {k.shape[1]}")
    q, k, v = _autocast(q, k, v)
    P, spec = grid.prefix_tokens, grid.spec()
    sc = q.shape[-1] ** -0.5 if scale is None else float(scale)
    if P == 0:
        o = grid.scatter(sparse_attention(grid.gather(q), grid.gather(k), grid.gather(v), spec, scale=scale))
    else:
        qg, kg, vg = (grid.gather(x[:, P:]) for x in (q, k, v))
        og = grid.scatter(_GridWithGlobalKeys.apply(qg, kg, vg, k[:, :P], v[:, :P], spec, sc))
        hq, hk = q.shape[2], k.shape[2]
        op = F.scaled_dot_product_attention(q[:, :P].transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=sc,
                                            enable_gqa=hq != hk).transpose(1, 2)
        o = torch.cat([op, og], 1)
    return o.transpose(1, 2) if layout == "bhld" else o


# ---- swapping a model's attention ---------------------------------------------------------------------------
def _sdpa_args(args: tuple, kwargs: dict) -> dict:
    """An F.scaled_dot_product_attention call's arguments by name (callers pass them either way)."""
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    return dict(zip(names, args), **kwargs)


class _SDPAOnGrid(TorchFunctionMode):
    """Inside a swapped module's forward: SDPA over the grid's tokens runs grid_attention; other calls pass."""

    def __init__(self, grid: GridSpec) -> None:
        super().__init__()
        self.grid = grid

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        a = _sdpa_args(args, kwargs)
        q, k = a["query"], a["key"]
        if k.shape[-2] != q.shape[-2] or q.dim() != 4:  # cross-attention (or another shape): untouched
            return func(*args, **kwargs)
        if q.shape[-2] != self.grid.tokens:
            raise Error(f"a swapped attention got {q.shape[-2]} tokens, its grid {self.grid.grid} with "
                        f"{self.grid.prefix_tokens} prefix tokens has {self.grid.tokens}: swap it again for this size")
        if a.get("attn_mask") is not None or a.get("is_causal") or a.get("dropout_p"):
            raise Error("a swapped attention got an attn_mask, is_causal or dropout_p: not supported on the grid")
        return grid_attention(q, k, a["value"], self.grid, scale=a.get("scale"), layout="bhld")


def swap_attention(modules: Iterable[torch.nn.Module], grid: IntOrTuple, kernel_size: IntOrTuple, *,
                   mode: str = "neighborhood", dilation: IntOrTuple = 1, is_causal: Union[bool, Sequence[bool]] = False,
                   prefix_tokens: int = 0) -> List[torch.nn.Module]:
    """Makes each module's SDPA self-attention over the grid run grid_attention (see the module's doc); returns
    the modules. Any module whose forward calls F.scaled_dot_product_attention on [B, H, N, D] works."""
    g = GridSpec.make(grid, kernel_size, mode, dilation, is_causal, prefix_tokens)
    out = []
    for m in modules:
        restore(m)
        m.forward = _on_grid(m.forward, g)
        m._spattn_grid = g
        out.append(m)
    return out


def _on_grid(forward: Any, g: GridSpec) -> Any:
    def on_grid(*args: Any, **kwargs: Any) -> Any:
        with _SDPAOnGrid(g):
            return forward(*args, **kwargs)

    return on_grid


def restore(model: torch.nn.Module) -> int:
    """Undoes swap_attention on `model` and its submodules; returns how many modules it restored."""
    n = 0
    for m in model.modules():
        if "_spattn_grid" in m.__dict__:
            del m.forward, m._spattn_grid
            n += 1
    return n


def swap_timm_vit(model: torch.nn.Module, kernel_size: IntOrTuple, *, mode: str = "neighborhood",
                  dilation: IntOrTuple = 1, grid: Optional[IntOrTuple] = None) -> List[torch.nn.Module]:
    """timm VisionTransformer (and its relatives with ``blocks[i].attn``): every block's attention over the patch
    grid (``model.patch_embed.grid_size`` unless `grid` is given), class and register tokens
    (``model.num_prefix_tokens``) global. Sets the attentions' ``fused_attn`` (they call SDPA)."""
    grid = tuple(grid) if grid is not None else tuple(model.patch_embed.grid_size)
    attns = [blk.attn for blk in model.blocks]
    for a in attns:
        if hasattr(a, "fused_attn"):
            a.fused_attn = True
    return swap_attention(attns, grid, kernel_size, mode=mode, dilation=dilation,
                          prefix_tokens=int(getattr(model, "num_prefix_tokens", 0)))


def swap_diffusers(model: torch.nn.Module, grid: IntOrTuple, kernel_size: IntOrTuple, *, mode: str = "neighborhood",
                   dilation: IntOrTuple = 1, prefix_tokens: int = 0) -> List[torch.nn.Module]:
    """diffusers: every self-attention module in `model` (a block or a whole transformer) over the grid: modules
    with a processor (``Attention``, and the ``AttentionModuleMixin`` ones such as Wan's and Flux's) whose
    ``is_cross_attention`` is not set. The processor must reach F.scaled_dot_product_attention (AttnProcessor2_0,
    and the "native" backend of diffusers' attention dispatch, do). `prefix_tokens`: text tokens placed before the
    grid's in a joint-attention block."""
    mods = [m for m in model.modules() if hasattr(m, "processor") and hasattr(m, "set_processor")
            and not getattr(m, "is_cross_attention", False)]
    if not mods:
        raise Error(f"no diffusers self-attention module in {type(model).__name__}")
    return swap_attention(mods, grid, kernel_size, mode=mode, dilation=dilation, prefix_tokens=prefix_tokens)


# ---- checking a swapped model against dense SDPA with the same mask ----------------------------------------
class masked_sdpa(TorchFunctionMode):
    """``with masked_sdpa({N: mask}):`` every SDPA self-attention call over N tokens gets that boolean [N, N] mask
    (the dense reference of a swapped model; other calls are untouched)."""

    def __init__(self, masks: Dict[int, Tensor]) -> None:
        super().__init__()
        self.masks = masks

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            a = _sdpa_args(args, kwargs)
            n = a["query"].shape[-2]
            if a["key"].shape[-2] == n and n in self.masks:
                return func(**{**a, "attn_mask": self.masks[n].to(a["query"].device)})
        return func(*args, **kwargs)


def check(model: torch.nn.Module, run: Callable[[], Tuple[Tensor, Tensor]]) -> Dict[str, float]:
    """Runs ``run()`` (it calls the model and returns (output, loss)) on the swapped model, then on the same model
    with dense SDPA given each swapped module's grid_mask; returns the relative differences (Frobenius) of the
    output and of the parameters' gradients (the largest), and both runs' times in ms (forward + backward)."""
    swapped = {m: m._spattn_grid for m in model.modules() if "_spattn_grid" in m.__dict__}
    if not swapped:
        raise Error(f"no swapped attention in {type(model).__name__}: swap_attention first")

    def once() -> Tuple[Tensor, List[Tensor], float]:
        model.zero_grad(set_to_none=True)
        t = time.perf_counter()
        out, loss = run()
        loss.backward()
        ms = (time.perf_counter() - t) * 1e3
        return out.detach().float(), [p.grad.float() for p in model.parameters() if p.grad is not None], ms

    out, grads, ms = once()
    restore(model)
    try:
        with masked_sdpa({g.tokens: grid_mask(g) for g in swapped.values()}):
            ref, ref_grads, ref_ms = once()
    finally:
        for m, g in swapped.items():
            m.forward = _on_grid(m.forward, g)
            m._spattn_grid = g
    rel = lambda a, b: ((a - b).norm() / b.norm().clamp_min(1e-30)).item()  # noqa: E731
    return {"output": rel(out, ref), "gradient": max(rel(a, b) for a, b in zip(grads, ref_grads)), "ms": ms,
            "sdpa_ms": ref_ms}
