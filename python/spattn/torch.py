"""spattn as a PyTorch operator: trainable (autograd through Plan.backward) and torch.compile-able.

    import torch, spattn.torch
    o = spattn.torch.sparse_attention(q, k, v, "longformer(256, 32)")            # q [B, L, H, D]
    o = spattn.torch.sparse_attention(q, k, v, "causal", layout="bhld")          # q [B, H, L, D] (SDPA's)
    attn = spattn.torch.SparseAttention("local(64) | global(0:4)")               # the same as a module
    o = spattn.torch.neighborhood_attention(q, k, v, kernel_size=7, dilation=2)  # q [B, X, Y, H, D] (NATTEN's)

The operators are ``torch.ops.spattn.sparse_attention`` and ``torch.ops.spattn.sparse_attention_backward``
(torch.library.custom_op, with fake implementations and a registered autograd formula): torch.compile keeps them
as single nodes without graph breaks. Eager calls that need no gradient go to ``sparse_attention_nograd``, the same
forward registered without custom_op's wrapper (less host time a call). Plans are built on first use and cached by (pattern, shapes, dtype,
device, scale, layout, options). Tensors are read in place through DLPack whatever their strides (a [B, H, L, D]
tensor is passed as a strided [B, L, H, D] view, no copy); on CUDA the op runs on the current stream.

Outputs are in the input dtype: the CPU engine computes O in float32, so for float16/bfloat16 inputs on the CPU
O is converted back. float64 inputs on the CPU run on the fp64 reference engine (for gradcheck). LSE is
``[B, Hq, Lq]`` float32 (float64 for float64 inputs) and carries no gradient.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from . import _PLANS, AxisArg, CausalArg, Error, Pattern, _core, neighborhood_spec, plan as _make_plan
from . import masked_plan as _make_masked_plan

__all__ = ["sparse_attention", "SparseAttention", "neighborhood_attention", "na1d", "na2d", "na3d", "clear_cache",
           "cached_plans"]


def clear_cache() -> None:
    """Drops every cached plan, spattn.attention's too (one cache for the package; plans hold GPU memory)."""
    _PLANS.clear()


def cached_plans() -> list:
    """The cached plans, oldest first (spattn.Plan objects: explain(), kernel(), ...)."""
    return _PLANS.plans()


def _spec(pattern: Union[str, Pattern, Sequence[Union[str, Pattern]]]) -> str:
    """One string for the op's schema: a spec, or per-head specs joined by ';' (not in the pattern grammar)."""
    if isinstance(pattern, str):
        return pattern
    if isinstance(pattern, (list, tuple)):
        return ";".join(p if isinstance(p, str) else p.spec for p in pattern)
    if isinstance(pattern, Pattern):
        return pattern.spec
    raise TypeError(f"pattern: expected a spec, a spattn.Pattern or a list of them, got {type(pattern).__name__}")


def _options(layout: str = "blhd", scale: Optional[float] = None, engine: Optional[str] = None,
             kernel: Optional[str] = None, threads: Optional[int] = None, tile_map: Optional[int] = None) -> str:
    """The op's `options` string: what is not a tensor or the pattern, as "key=value,..." (defaults left out)."""
    parts = []
    if layout != "blhd":
        parts.append(f"layout={layout}")
    if scale is not None:
        parts.append(f"scale={float(scale)!r}")
    if engine and engine != "auto":
        parts.append(f"engine={engine}")
    if kernel:
        parts.append(f"kernel={kernel}")
    if threads:
        parts.append(f"threads={int(threads)}")
    if tile_map is not None and int(tile_map) != -1:
        parts.append(f"tile_map={int(tile_map)}")
    return ",".join(parts)


def _parse_options(options: str) -> dict:
    out: dict = {"layout": "blhd", "scale": None}
    for item in filter(None, options.split(",")):
        name, eq, value = item.partition("=")
        if not eq or name not in ("layout", "scale", "engine", "kernel", "threads", "tile_map"):
            raise Error(f"option '{item}': expected layout=, scale=, engine=, kernel=, threads= or tile_map=")
        out[name] = float(value) if name == "scale" else int(value) if name in ("threads", "tile_map") else value
    return out


def _layout(options: str) -> str:
    """The layout an options string names (the fake implementations' only need)."""
    i = options.find("layout=")
    return "blhd" if i < 0 else options[i + 7:].split(",", 1)[0]


def _dims(q: Tensor, k: Tensor, v: Tensor, layout: str) -> Tuple[int, int, int, int, int, int, int, int]:
    """(B, Lq, Lk, Hq, Hkv, D, Dv, bhld) of the op's inputs."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise Error(f"q, k and v must be 4-D, got {q.dim()}, {k.dim()} and {v.dim()} dimensions")
    if layout == "blhd":
        B, Lq, Hq, D = q.shape
        return B, Lq, k.shape[1], Hq, k.shape[2], D, v.shape[3], 0
    if layout == "bhld":
        B, Hq, Lq, D = q.shape
        return B, Lq, k.shape[2], Hq, k.shape[1], D, v.shape[3], 1
    raise Error(f"layout '{layout}': expected 'blhd' ([B, L, H, D]) or 'bhld' ([B, H, L, D])")


class _Entry:
    """A cached plan with what one call needs: the layout, output shapes and dtypes."""

    __slots__ = ("plan", "layout", "o_shape", "lse_shape", "o_dtype", "lse_dtype", "out_dtype", "dq_shape",
                 "dk_shape", "dv_shape", "grad_dtype")

    def __init__(self, pattern: str, q: Tensor, k: Tensor, v: Tensor, options: str, mask: str = "") -> None:
        kw = _parse_options(options)
        self.layout = layout = kw.pop("layout")
        B, Lq, Lk, Hq, Hkv, D, Dv, bhld = _dims(q, k, v, layout)
        dev = q.device
        device = "cpu" if dev.type == "cpu" else f"cuda:{dev.index if dev.index is not None else torch.cuda.current_device()}"
        specs = pattern.split(";") if ";" in pattern else pattern
        if mask:  # a run-time mask's layout (spattn.masked_plan): the pattern is its text
            kw.pop("tile_map", None)
            self.plan = _make_masked_plan(mask, Lq, Lk, Hq, Hkv, D, device, batch=B, dtype=q.dtype, value_dim=Dv, **kw)._p
        else:
            self.plan = _make_plan(specs, Lq, Lk, Hq, Hkv, D, device, batch=B, dtype=q.dtype, value_dim=Dv, **kw)._p
        self.o_shape = _o_shape(B, Lq, Hq, Dv, bhld)
        self.lse_shape = (B, Hq, Lq)
        self.o_dtype = getattr(torch, self.plan.out_dtype)  # what the engine writes
        self.lse_dtype = getattr(torch, self.plan.lse_dtype)
        self.out_dtype = q.dtype  # what the op returns
        self.dq_shape = _o_shape(B, Lq, Hq, D, bhld)
        self.dk_shape = _o_shape(B, Lk, Hkv, D, bhld)
        self.dv_shape = _o_shape(B, Lk, Hkv, Dv, bhld)
        self.grad_dtype = getattr(torch, self.plan.grad_dtype)


def _entry(pattern: str, q: Tensor, k: Tensor, v: Tensor, options: str, mask: str = "") -> _Entry:
    key = ("torch", pattern, q.shape, k.shape, v.shape, q.dtype, q.device, options, mask)
    e = _PLANS.entries.get(key)  # the hit without a call: this is on every op's path
    return e if e is not None else _PLANS.get(key, lambda: _Entry(pattern, q, k, v, options, mask))


# On CUDA the op runs on the caller's current stream: the C++ side asks torch for it through the DLPack exchange
# API (torch >= 2.9); older torch has no such API, and the stream is passed from here.
_STREAM_FROM_DLPACK = hasattr(torch.Tensor, "__dlpack_c_exchange_api__")


def _stream(t: Tensor) -> Optional[int]:
    if _STREAM_FROM_DLPACK or not t.is_cuda:
        return None
    return torch.cuda.current_stream(t.device).cuda_stream


def _o_shape(B: int, L: int, H: int, D: int, bhld: int) -> Tuple[int, int, int, int]:
    return (B, H, L, D) if bhld else (B, L, H, D)


def _lse_dtype(q: Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


# ---- the operators --------------------------------------------------------------------------------------
# Few arguments on purpose: torch's custom-op autograd wrapper walks the schema once per argument per call
# (torch/_library/utils.py fill_defaults), so every argument costs host time; `options` carries the rest.
def _forward_impl(q: Tensor, k: Tensor, v: Tensor, pattern: str, options: str) -> Tuple[Tensor, Tensor]:
    if q.shape[0] == 0:  # batch 0, as SDPA takes it: empty outputs, nothing planned
        return _sparse_attention_fake(q, k, v, pattern, options)
    e = _entry(pattern, q, k, v, options)
    dev = q.device
    o = torch.empty(e.o_shape, dtype=e.o_dtype, device=dev)
    lse = torch.empty(e.lse_shape, dtype=e.lse_dtype, device=dev)
    e.plan.forward(q, k, v, o, lse, _stream(q), e.layout)
    if e.o_dtype != e.out_dtype:  # the CPU engine writes fp32 O: back to fp16 / bf16
        o = o.to(e.out_dtype)
        if e.lse_dtype != _lse_dtype(q):
            lse = lse.to(_lse_dtype(q))
    return o, lse


@torch.library.custom_op("spattn::sparse_attention", mutates_args=())
def _sparse_attention(q: Tensor, k: Tensor, v: Tensor, pattern: str, options: str) -> Tuple[Tensor, Tensor]:
    return _forward_impl(q, k, v, pattern, options)


@_sparse_attention.register_fake
def _sparse_attention_fake(q: Tensor, k: Tensor, v: Tensor, pattern: str, options: str) -> Tuple[Tensor, Tensor]:
    B, Lq, _, Hq, _, _, Dv, bhld = _dims(q, k, v, _layout(options))
    return q.new_empty(_o_shape(B, Lq, Hq, Dv, bhld)), q.new_empty((B, Hq, Lq), dtype=_lse_dtype(q))


@torch.library.custom_op("spattn::sparse_attention_backward", mutates_args=())
def _sparse_attention_backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, dout: Tensor, pattern: str,
                               options: str) -> Tuple[Tensor, Tensor, Tensor]:
    if q.shape[0] == 0:
        return _sparse_attention_backward_fake(q, k, v, o, lse, dout, pattern, options)
    e = _entry(pattern, q, k, v, options)
    dev = q.device
    if dout.is_cuda:  # the GPU backward reads dout with its head dim contiguous (o.sum() hands a stride-0 one)
        dout = dout.contiguous()
    dq = torch.empty(e.dq_shape, dtype=e.grad_dtype, device=dev)
    dk = torch.empty(e.dk_shape, dtype=e.grad_dtype, device=dev)
    dv = torch.empty(e.dv_shape, dtype=e.grad_dtype, device=dev)
    e.plan.backward(q, k, v, o, lse, dout, dq, dk, dv, _stream(q), e.layout)
    if e.grad_dtype != q.dtype:
        dq, dk, dv = dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype)
    return dq, dk, dv


@_sparse_attention_backward.register_fake
def _sparse_attention_backward_fake(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, dout: Tensor,
                                    pattern: str, options: str) -> Tuple[Tensor, Tensor, Tensor]:
    B, Lq, Lk, Hq, Hkv, D, Dv, bhld = _dims(q, k, v, _layout(options))
    return (q.new_empty(_o_shape(B, Lq, Hq, D, bhld)), k.new_empty(_o_shape(B, Lk, Hkv, D, bhld)),
            v.new_empty(_o_shape(B, Lk, Hkv, Dv, bhld)))


def _setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tuple[Tensor, Tensor]) -> None:
    q, k, v, pattern, options = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.args = (pattern, options)
    ctx.mark_non_differentiable(lse)


def _backward(ctx: Any, dout: Tensor, dlse: Optional[Tensor]) -> Tuple[Any, ...]:
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.spattn.sparse_attention_backward.default(q, k, v, o, lse, dout, *ctx.args)
    return dq, dk, dv, None, None


_sparse_attention.register_autograd(_backward, setup_context=_setup_context)

_op = torch.ops.spattn.sparse_attention.default

# The same forward without autograd, for calls that need no gradient (inference; eager only): an operator whose CPU
# and CUDA kernels are plain Python functions behind the C++ dispatcher, without custom_op's Python wrapper (its
# argument binding and autograd plumbing took most of a call's host time: bench/python_overhead.py, bench/LOG.md).
# A real operator all the same: dispatch modes, fake tensors and torch.compile see it (it has a fake kernel).
_LIB = torch.library.Library("spattn", "FRAGMENT")
_LIB.define("sparse_attention_nograd(Tensor q, Tensor k, Tensor v, str pattern, str options) -> (Tensor, Tensor)")
for _key in ("CPU", "CUDA"):
    _LIB.impl("sparse_attention_nograd", _forward_impl, _key)
torch.library.register_fake("spattn::sparse_attention_nograd")(_sparse_attention_fake)
_op_nograd = torch.ops.spattn.sparse_attention_nograd.default


def _forward_op(q: Tensor, k: Tensor, v: Tensor) -> Any:
    """The autograd operator where a gradient may be needed (or torch.compile traces), else the no-grad one."""
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return _op if needs_grad or torch.compiler.is_compiling() else _op_nograd


_AUTOCAST_CASTS = (torch.float32, torch.float16, torch.bfloat16)


def _autocast(q: Tensor, k: Tensor, v: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    """SDPA's autocast rule: under torch.autocast for q's device, float32/16 and bfloat16 inputs run in the
    autocast dtype (so O comes back in it); float64 is left alone. Outside autocast, q, k and v as they are."""
    dev = q.device.type
    if not torch.is_autocast_enabled(dev):
        return q, k, v
    dt = torch.get_autocast_dtype(dev)
    return tuple(x.to(dt) if x.dtype in _AUTOCAST_CASTS and x.dtype != dt else x for x in (q, k, v))  # type: ignore


# ---- the public entry points ----------------------------------------------------------------------------
def sparse_attention(q: Tensor, k: Tensor, v: Tensor, pattern: Any = None, *,
                     scale: Optional[float] = None, return_lse: bool = False, layout: str = "blhd",
                     engine: Optional[str] = None, kernel: Optional[str] = None,
                     threads: Optional[int] = None, tile_map: Optional[int] = None,
                     cu_seqlens: Optional[Tensor] = None, cu_seqlens_k: Optional[Tensor] = None,
                     topk_indices: Optional[Tensor] = None, spec: Optional[str] = None,
                     check: bool = False) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """softmax(scale * Q K^T over the pattern's pairs) V, differentiable in q, k and v.

    q [B, Lq, Hq, D], k [B, Lk, Hkv, D], v [B, Lk, Hkv, Dv] with ``layout="blhd"`` (the default), or
    [B, H, L, D] with ``layout="bhld"`` (F.scaled_dot_product_attention's); Hq % Hkv == 0 (GQA). pattern: a
    spec, a spattn.Pattern or one per query head. scale: None for 1/sqrt(D). engine / kernel / threads / tile_map:
    plan options (spattn.plan). Returns O in q's layout and dtype, or (O, LSE [B, Hq, Lq]); LSE has no gradient.
    SDPA's conventions: under torch.autocast the inputs run in the autocast dtype (float64 excepted); batch 0
    gives empty outputs.

    Masks chosen at run time (no replanning when their contents change; docs/RUNTIME_MASKS.md): pattern a
    FlexAttention ``BlockMask`` (its block structure; ``spec=`` the static spec of its mask_mod, evaluated inside
    the partial blocks); ``cu_seqlens=`` (and ``cu_seqlens_k=``: FlashAttention's varlen boundaries, int32 [n + 1])
    with pattern the spec applied within each document (None: whole documents); ``topk_indices=`` (int32/int64
    [B, Lq, K] or [B, Lq, H, K], -1 padded) united with pattern's keys (None: the listed keys alone). ``check=True``
    validates the mask first (raises spattn.Error naming a bad index, count or shape; on a GPU it waits for it).
    On a GPU these run without host synchronisation except the cases the plan's explain() lists (the host path);
    under ``torch.cuda.set_sync_debug_mode("error")`` such a call raises spattn.Error naming the case instead.
    """
    q, k, v = _autocast(q, k, v)
    if cu_seqlens is not None or topk_indices is not None or _is_block_mask(pattern):
        return _masked(q, k, v, pattern, cu_seqlens, cu_seqlens_k, topk_indices, spec, check, return_lse,
                       _options(layout, scale, engine, kernel, threads, None))
    o, lse = _forward_op(q, k, v)(q, k, v, _spec(pattern), _options(layout, scale, engine, kernel, threads, tile_map))
    return (o, lse) if return_lse else o


class SparseAttention(torch.nn.Module):
    """``sparse_attention`` as a module: ``F.scaled_dot_product_attention(q, k, v, attn_mask=mask)`` with the mask
    as a pattern.

    ``SparseAttention("causal & local(128)")(q, k, v)`` with q [B, Lq, H, D], k and v [B, Lk, Hkv, D], the same
    default layout as ``sparse_attention``; ``layout="bhld"`` for SDPA's [B, H, L, D]. No parameters; plans are
    cached per shape; autocast and batch 0 as ``sparse_attention``.
    """

    def __init__(self, pattern: Union[str, Pattern, Sequence[Union[str, Pattern]]], *, scale: Optional[float] = None,
                 layout: str = "blhd", engine: Optional[str] = None, kernel: Optional[str] = None,
                 threads: Optional[int] = None, tile_map: Optional[int] = None) -> None:
        super().__init__()
        self.pattern = _spec(pattern)
        self.options = _options(layout, scale, engine, kernel, threads, tile_map)
        _parse_options(self.options)

    def forward(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        q, k, v = _autocast(q, k, v)
        o, _ = _forward_op(q, k, v)(q, k, v, self.pattern, self.options)
        return o

    def extra_repr(self) -> str:
        return f"pattern='{self.pattern}'" + (f", options='{self.options}'" if self.options else "")


# ---- neighborhood attention on [B, *spatial, H, D] (NATTEN's layout) ------------------------------------
_NA_SPECS: dict = {}  # neighborhood_spec's text by its arguments and their types (uncached it adds half a call's host time)


def _na_spec(spatial: Tuple[int, ...], kernel_size: Any, stride: Any, dilation: Any, is_causal: Any) -> str:
    if torch.compiler.is_compiling():  # traced once: no cache to mutate in the graph
        return neighborhood_spec(spatial, kernel_size, dilation, is_causal, stride=stride)
    typed = lambda x: tuple((type(e), e) for e in x) if isinstance(x, (tuple, list)) else (type(x), x)  # noqa: E731
    key = (spatial, typed(kernel_size), typed(stride), typed(dilation), typed(is_causal))
    spec = _NA_SPECS.get(key)
    if spec is None:
        spec = neighborhood_spec(spatial, kernel_size, dilation, is_causal, stride=stride)
        if len(_NA_SPECS) >= 256:
            _NA_SPECS.clear()
        _NA_SPECS[key] = spec
    return spec


def neighborhood_attention(q: Tensor, k: Tensor, v: Tensor, kernel_size: AxisArg, stride: Optional[AxisArg] = 1,
                           dilation: Optional[AxisArg] = 1, is_causal: Optional[CausalArg] = False,
                           scale: Optional[float] = None, *,
                           return_lse: bool = False, engine: Optional[str] = None, kernel: Optional[str] = None,
                           threads: Optional[int] = None,
                           tile_map: Optional[int] = None) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Neighborhood attention over a 1-D, 2-D or 3-D token grid, in NATTEN's layout and argument conventions.

    q [B, *spatial, Hq, D], k [B, *spatial, Hkv, D], v [B, *spatial, Hkv, Dv] with 1 to 3 spatial axes (the rank
    of q says how many); Hq % Hkv == 0 (GQA). kernel_size, stride, dilation: an int for every axis or one per
    axis; is_causal: a bool or one per axis; stride must be 1. Runs ``sparse_attention`` with
    ``spattn.neighborhood_spec(spatial, kernel_size, dilation, is_causal)`` on q, k and v viewed as
    [B, X*Y*Z, H, D]: a view, no copy, wherever the spatial axes are row-major among themselves (contiguous
    tensors, slices of a fused qkv projection); otherwise reshape copies. Differentiable in q, k and v; plans are
    cached per (spec, shapes, dtype, device, options). Returns O [B, *spatial, Hq, Dv] in q's dtype, or
    (O, LSE) with LSE [B, *spatial, Hq] (NATTEN's heads-last layout, a view of the op's [B, Hq, L]; no gradient).
    Bad arguments raise spattn.Error (a ValueError) naming the value.
    """
    naxes = q.dim() - 3
    if not 1 <= naxes <= 3:
        raise Error(f"q has shape {tuple(q.shape)}: expected [B, *spatial, H, D] with 1 to 3 spatial axes (4 to 6 "
                    f"dimensions), got {q.dim()} dimensions")
    if k.dim() != q.dim() or v.dim() != q.dim() or k.shape[:-2] != q.shape[:-2] or v.shape[:-1] != k.shape[:-1]:
        raise Error(f"q, k and v have shapes {tuple(q.shape)}, {tuple(k.shape)} and {tuple(v.shape)}: expected "
                    "[B, *spatial, H, D] with the same batch and spatial shape, k and v with the same heads")
    if k.shape[-1] != q.shape[-1]:
        raise Error(f"head dims differ: q {q.shape[-1]} and k {k.shape[-1]}")
    spatial = tuple(q.shape[1:-2])
    spec = _na_spec(spatial, kernel_size, stride, dilation, is_causal)
    qf, kf, vf = _autocast(*(x.flatten(1, naxes) for x in (q, k, v)))  # a view where the spatial axes allow it
    o, lse = _forward_op(qf, kf, vf)(qf, kf, vf, spec, _options("blhd", scale, engine, kernel, threads, tile_map))
    o = o.unflatten(1, spatial)
    return (o, lse.unflatten(2, spatial).movedim(1, -1)) if return_lse else o


def _na_fixed_rank(naxes: int) -> Callable[..., Union[Tensor, Tuple[Tensor, Tensor]]]:
    def na(query: Tensor, key: Tensor, value: Tensor, kernel_size: AxisArg, stride: Optional[AxisArg] = 1,
           dilation: Optional[AxisArg] = 1, is_causal: Optional[CausalArg] = False, scale: Optional[float] = None,
           **kwargs: Any) -> Union[Tensor, Tuple[Tensor, Tensor]]:
        if query.dim() != naxes + 3:
            raise Error(f"na{naxes}d: query has shape {tuple(query.shape)}, expected {naxes + 3} dimensions "
                        f"[B, {', '.join('XYZ'[:naxes])}, H, D]")
        return neighborhood_attention(query, key, value, kernel_size, stride, dilation, is_causal, scale, **kwargs)

    na.__name__ = na.__qualname__ = f"na{naxes}d"
    na.__doc__ = (f"{naxes}-D neighborhood attention, NATTEN's ``na{naxes}d`` signature: ``neighborhood_attention`` "
                  f"for query [B, {', '.join('XYZ'[:naxes])}, H, D] (the keyword options too: return_lse, engine, ...).")
    return na


na1d = _na_fixed_rank(1)
na2d = _na_fixed_rank(2)
na3d = _na_fixed_rank(3)


# ---- masks chosen at run time: BlockMask, cu_seqlens, topk_indices (spattn/runtime_mask.hpp) ----------------
# One operator pair whose mask tensors are op inputs (Tensor?[]: kv_num_blocks, kv_indices, full_kv_num_blocks,
# full_kv_indices, cu_seqlens_q, cu_seqlens_k, topk_indices), so torch.compile sees them as graph inputs and a new
# mask is a new input, never a recompile; `mask` is the plan's layout text (spattn.masked_plan), the plan cache's key
# with the shapes. `options` may hold check=1 (the checking mode, done at run time by the C++ side).
def _is_block_mask(x: Any) -> bool:
    return type(x).__name__ == "BlockMask" and hasattr(x, "kv_num_blocks") and hasattr(x, "BLOCK_SIZE")


def _no_host(q: Tensor) -> bool:
    """Whether a masked call must not take the host path (docs/RUNTIME_MASKS.md): under
    torch.cuda.set_sync_debug_mode("error") the C++ side raises where it would copy the mask to the host."""
    return q.is_cuda and torch.cuda.get_sync_debug_mode() == 2


def _mask_options(options: str) -> Tuple[str, bool]:
    """(the plan's options, check) of a masked op's options string."""
    parts = options.split(",") if options else []
    check = "check=1" in parts
    return ",".join(p for p in parts if p != "check=1"), check


def _masked_forward_impl(q: Tensor, k: Tensor, v: Tensor, mask: List[Optional[Tensor]], layout_mask: str,
                         options: str) -> Tuple[Tensor, Tensor]:
    opts, check = _mask_options(options)
    e = _entry("", q, k, v, opts, layout_mask)
    dev = q.device
    o = torch.empty(e.o_shape, dtype=e.o_dtype, device=dev)
    lse = torch.empty(e.lse_shape, dtype=e.lse_dtype, device=dev)
    e.plan.forward_mask(q, k, v, o, lse, list(mask), check, _stream(q), e.layout, _no_host(q))
    if e.o_dtype != e.out_dtype:
        o = o.to(e.out_dtype)
        if e.lse_dtype != _lse_dtype(q):
            lse = lse.to(_lse_dtype(q))
    return o, lse


@torch.library.custom_op("spattn::masked_attention", mutates_args=())
def _masked_attention(q: Tensor, k: Tensor, v: Tensor, mask: List[Optional[Tensor]], layout_mask: str,
                      options: str) -> Tuple[Tensor, Tensor]:
    return _masked_forward_impl(q, k, v, mask, layout_mask, options)


@_masked_attention.register_fake
def _masked_attention_fake(q: Tensor, k: Tensor, v: Tensor, mask: List[Optional[Tensor]], layout_mask: str,
                           options: str) -> Tuple[Tensor, Tensor]:
    return _sparse_attention_fake(q, k, v, layout_mask, options)


@torch.library.custom_op("spattn::masked_attention_backward", mutates_args=())
def _masked_attention_backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, dout: Tensor,
                               mask: List[Optional[Tensor]], layout_mask: str,
                               options: str) -> Tuple[Tensor, Tensor, Tensor]:
    opts, check = _mask_options(options)
    e = _entry("", q, k, v, opts, layout_mask)
    dev = q.device
    if dout.is_cuda:
        dout = dout.contiguous()
    dq = torch.empty(e.dq_shape, dtype=e.grad_dtype, device=dev)
    dk = torch.empty(e.dk_shape, dtype=e.grad_dtype, device=dev)
    dv = torch.empty(e.dv_shape, dtype=e.grad_dtype, device=dev)
    e.plan.backward_mask(q, k, v, o, lse, dout, dq, dk, dv, list(mask), check, _stream(q), e.layout, _no_host(q))
    if e.grad_dtype != q.dtype:
        dq, dk, dv = dq.to(q.dtype), dk.to(q.dtype), dv.to(q.dtype)
    return dq, dk, dv


@_masked_attention_backward.register_fake
def _masked_attention_backward_fake(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, dout: Tensor,
                                    mask: List[Optional[Tensor]], layout_mask: str,
                                    options: str) -> Tuple[Tensor, Tensor, Tensor]:
    return _sparse_attention_backward_fake(q, k, v, o, lse, dout, layout_mask, options)


def _masked_setup_context(ctx: Any, inputs: Tuple[Any, ...], output: Tuple[Tensor, Tensor]) -> None:
    q, k, v, mask, layout_mask, options = inputs
    o, lse = output
    present = [i for i, t in enumerate(mask) if t is not None]
    ctx.save_for_backward(q, k, v, o, lse, *[mask[i] for i in present])
    ctx.args = (len(mask), present, layout_mask, options)
    ctx.mark_non_differentiable(lse)


def _masked_backward(ctx: Any, dout: Tensor, dlse: Optional[Tensor]) -> Tuple[Any, ...]:
    q, k, v, o, lse, *saved = ctx.saved_tensors
    n, present, layout_mask, options = ctx.args
    mask: List[Optional[Tensor]] = [None] * n
    for i, t in zip(present, saved):
        mask[i] = t
    dq, dk, dv = torch.ops.spattn.masked_attention_backward.default(q, k, v, o, lse, dout, mask, layout_mask, options)
    return dq, dk, dv, None, None, None


_masked_attention.register_autograd(_masked_backward, setup_context=_masked_setup_context)

# The same forward without autograd's wrapper, for calls that need no gradient (eager; as sparse_attention_nograd).
_LIB.define("masked_attention_nograd(Tensor q, Tensor k, Tensor v, Tensor?[] mask, str layout_mask, str options) -> "
            "(Tensor, Tensor)")
for _key in ("CPU", "CUDA"):
    _LIB.impl("masked_attention_nograd", _masked_forward_impl, _key)
torch.library.register_fake("spattn::masked_attention_nograd")(_masked_attention_fake)
_masked_nograd = torch.ops.spattn.masked_attention_nograd.default


def _block_mask_parts(bm: Any, spec: Optional[str]) -> Tuple[str, List[Optional[Tensor]]]:
    """The layout text and mask slots of a FlexAttention BlockMask."""
    from torch.nn.attention.flex_attention import noop_mask

    qb, kb = (bm.BLOCK_SIZE, bm.BLOCK_SIZE) if isinstance(bm.BLOCK_SIZE, int) else bm.BLOCK_SIZE
    if spec is None and bm.mask_mod is not noop_mask:
        name = getattr(bm.mask_mod, "__name__", type(bm.mask_mod).__name__)
        raise Error(f"the BlockMask's partial blocks are masked by its mask_mod '{name}', which spattn cannot run: give "
                    "its pairs as a spec, spec='causal' (evaluated inside the partial blocks; full blocks are kept whole)")
    text = f"blocks:{int(qb)}x{int(kb)}" + (f":{spec}" if spec else "")
    return text, [bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices, None, None, None]


def _masked(q: Tensor, k: Tensor, v: Tensor, pattern: Any, cu_seqlens: Optional[Tensor],
            cu_seqlens_k: Optional[Tensor], topk_indices: Optional[Tensor], spec: Optional[str], check: bool,
            return_lse: bool, options: str) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    kinds = (cu_seqlens is not None) + (topk_indices is not None) + _is_block_mask(pattern)
    if kinds != 1:
        raise Error("give one run-time mask: a BlockMask as the pattern, cu_seqlens= or topk_indices=")
    if cu_seqlens_k is not None and cu_seqlens is None:
        raise Error("cu_seqlens_k= needs cu_seqlens= (the queries' boundaries)")
    if _is_block_mask(pattern):
        text, mask = _block_mask_parts(pattern, spec)
    else:
        if spec is not None:
            raise Error("spec= is the static spec of a BlockMask; with cu_seqlens= or topk_indices= pass it as the pattern")
        static = "" if pattern is None else _spec(pattern)
        if ";" in static:
            raise Error("run-time masks take one static spec for every head, not one per head")
        if cu_seqlens is not None:
            text = "documents" + (f":{static}" if static else "")
            mask = [None, None, None, None, cu_seqlens, cu_seqlens_k, None]
        else:
            text = f"topk:{int(topk_indices.shape[-1])}" + (f":{static}" if static else "")
            mask = [None, None, None, None, None, None, topk_indices]
    if check:
        options = options + ("," if options else "") + "check=1"
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    op = _masked_attention if needs_grad or torch.compiler.is_compiling() else _masked_nograd
    o, lse = op(q, k, v, mask, text, options)
    return (o, lse) if return_lse else o


def __dir__() -> list:
    """The public names, not the imports (Any, torch, Tensor, ...)."""
    return sorted(__all__)
