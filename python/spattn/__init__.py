"""spattn: multi-head attention over sparse patterns, on CPUs and NVIDIA GPUs.

    import numpy as np, spattn
    q = k = v = np.random.randn(1, 1024, 4, 64).astype(np.float32)      # [B, L, H, D]
    o = spattn.attention(q, k, v, "longformer(128, 16)")                  # [B, L, H, D] float32

    p = spattn.plan("longformer(128, 16)", 1024, 1024, heads=4, head_dim=64)   # plan once
    o, lse = p.forward(q, k, v, return_lse=True)                                # run many times
    print(p.explain())

Arrays are numpy arrays, torch tensors (CPU and CUDA) or anything else with ``__dlpack__``; they are read in
place (any strides), never copied. The pattern language is docs/PATTERNS.md; ``spattn.mask`` gives a
pattern's boolean mask. The PyTorch operator (autograd, torch.compile) is ``spattn.torch``.

Outputs: the CPU engine writes O and LSE in float32 whatever the input dtype (float32, float16, bfloat16);
float64 inputs run on the reference engine (fp64 throughout, O(Lq * Lk): for checking) and give float64; the
GPU engines write O in the input dtype. LSE is ``[B, H, Lq]``, natural log; a query row with no key gives
O = 0 and LSE = -inf. Errors of the C++ library raise ``spattn.Error`` (a ``ValueError``) with its message.
"""
from __future__ import annotations

import operator
from collections import OrderedDict
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import numpy as np

from . import _core
from ._core import Error, Pattern
from .tsvd import TsvdFactors, tsvd_compress, tsvd_load

__all__ = ["Error", "Pattern", "Plan", "plan", "masked_plan", "attention", "mask", "neighborhood_spec", "build_info", "TsvdFactors",
           "tsvd_compress", "tsvd_load", "__version__"]

__version__: str = _core.build_info()["version"]

PatternLike = Union[str, Pattern, Sequence[Union[str, Pattern]], np.ndarray]
"""A spec, a Pattern, one per query head (a list), or a boolean mask [q_len, k_len] (numpy or torch)."""

_DTYPE_ALIASES = {
    "float32": "float32", "fp32": "float32", "f32": "float32", "float": "float32",
    "float16": "float16", "fp16": "float16", "f16": "float16", "half": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float64": "float64", "fp64": "float64", "f64": "float64", "double": "float64",
}


def _dtype_name(dtype: Any) -> str:
    """'float32' | 'float16' | 'bfloat16' | 'float64' from a string, numpy dtype or torch dtype."""
    if isinstance(dtype, str):
        name = dtype
    else:
        text = str(dtype)
        if text.startswith("torch."):
            name = text[6:]
        else:
            try:
                name = np.dtype(dtype).name
            except TypeError:
                name = getattr(dtype, "name", text)
    try:
        return _DTYPE_ALIASES[name]
    except KeyError:
        raise Error(f"dtype {dtype!r}: expected float32, float16, bfloat16 or float64") from None


def _device_name(device: Any) -> str:
    text = str(device)
    return "cuda:0" if text in ("cuda", "gpu") else text


def build_info() -> dict:
    """Version, whether this build has the CUDA kernels (and for which architectures), GPUs visible."""
    return dict(_core.build_info())


def _int(name: str, value: Any) -> int:
    """`value` as an int: any integer type (numpy's, a 0-d tensor's), never a float silently truncated (3.7 was 3)."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r} ({type(value).__name__})") from None


def mask(spec: Union[str, Pattern], q_len: int, k_len: Optional[int] = None) -> np.ndarray:
    """The pattern's boolean mask, a numpy array [q_len, k_len] (True: the pair (q, k) is kept)."""
    pattern = spec if isinstance(spec, Pattern) else Pattern(spec)
    return pattern.mask(_int("q_len", q_len), _int("k_len", q_len if k_len is None else k_len))


AxisArg = Union[int, Sequence[int]]
"""One value for every axis, or one per axis (NATTEN's kernel_size / stride / dilation convention)."""
CausalArg = Union[bool, Sequence[bool]]


def _per_axis(name: str, value: Any, naxes: int, lowest: int = 1) -> Tuple[int, ...]:
    """`value` as `naxes` ints >= `lowest` (bools for is_causal): one value for every axis, or exactly `naxes`."""
    values = tuple(value) if isinstance(value, (list, tuple)) else (value,) * naxes
    if len(values) != naxes:
        raise Error(f"{name} {value!r} has {len(values)} values for {naxes} spatial axes")
    try:
        if name != "is_causal" and any(isinstance(x, (bool, np.bool_)) for x in values):
            raise TypeError
        out = tuple(operator.index(x) for x in values)
    except TypeError:
        out = ()
    if len(out) != naxes or any(x < lowest or (name == "is_causal" and x > 1) for x in out):
        what = "a bool or one bool" if name == "is_causal" else f"an int >= {lowest} or one such int"
        raise Error(f"{name} {value!r}: expected {what} per spatial axis")
    return out


def _spec_values(v: Tuple[int, ...]) -> str:
    return str(v[0]) if len(set(v)) == 1 else "(" + ", ".join(map(str, v)) + ")"


def neighborhood_spec(dims: AxisArg, kernel_size: AxisArg, dilation: Optional[AxisArg] = 1,
                      is_causal: Optional[CausalArg] = False, *, stride: Optional[AxisArg] = 1) -> str:
    """The spec of NATTEN-style neighborhood attention over a row-major token grid of shape `dims` (1 to 3 axes).

    kernel_size, dilation: an int for every axis or one per axis; is_causal: a bool or one per axis (NATTEN's
    conventions; None for dilation, is_causal or stride is their default). Windows are docs/PATTERNS.md's (shifted at the borders: every query sees kernel_size keys per
    axis; even sizes keep one more key before the query than after). Raises spattn.Error, naming the value, where
    an axis is too short: kernel_size * dilation must be at most its size (NATTEN's rule, causal axes too), or
    where stride is not 1 (strided neighborhoods are not in the pattern language).
    ``neighborhood_spec((16, 32), 7, dilation=(1, 2))`` -> 'neighborhood(dims=(16, 32), kernel=7, dilation=(1, 2))'.
    """
    dilation, is_causal, stride = (1 if dilation is None else dilation, False if is_causal is None else is_causal,
                                   1 if stride is None else stride)
    grid = _per_axis("dims", dims, len(dims) if isinstance(dims, (list, tuple)) else 1)
    naxes = len(grid)
    if not 1 <= naxes <= 3:
        raise Error(f"dims {dims!r}: neighborhood attention takes 1 to 3 spatial axes, got {naxes}")
    kernel = _per_axis("kernel_size", kernel_size, naxes)
    dil = _per_axis("dilation", dilation, naxes)
    causal = _per_axis("is_causal", is_causal, naxes, lowest=0)
    if any(s != 1 for s in _per_axis("stride", stride, naxes)):
        raise Error(f"stride {stride!r}: only stride 1 is supported (spattn's neighborhood() has no stride)")
    for ax, (n, K, d) in enumerate(zip(grid, kernel, dil)):
        if K * d > n:
            raise Error(f"kernel_size {K} with dilation {d} does not fit spatial axis {ax} of size {n} (spatial shape "
                        f"{grid}): kernel_size * dilation must be at most the axis size")
    parts = ["dims=" + (str(grid[0]) if naxes == 1 else "(" + ", ".join(map(str, grid)) + ")"), f"kernel={_spec_values(kernel)}"]
    if any(d != 1 for d in dil):
        parts.append(f"dilation={_spec_values(dil)}")
    if any(causal):
        parts.append(f"causal={_spec_values(causal)}")
    return "neighborhood(" + ", ".join(parts) + ")"


def _patterns(pattern: PatternLike) -> list:
    if isinstance(pattern, Pattern):
        return [pattern]
    if isinstance(pattern, str):
        return [Pattern(pattern)]
    if isinstance(pattern, (list, tuple)):
        if not pattern:
            raise Error("expected a pattern, got an empty list")
        return [p if isinstance(p, Pattern) else Pattern(str(p)) for p in pattern]
    raise TypeError(f"pattern: expected a spec, a spattn.Pattern, a list of them or a boolean mask, got {type(pattern).__name__}")


def _bool_mask(pattern: Any) -> Optional[np.ndarray]:
    """The pattern as a 2-D numpy bool array when it is a mask (numpy or anything with __dlpack__), else None."""
    if isinstance(pattern, (str, Pattern, list, tuple)):
        return None
    if type(pattern).__module__.startswith("torch"):
        pattern = pattern.detach().cpu().numpy()
    arr = np.asarray(pattern)
    if arr.dtype != np.bool_ or arr.ndim != 2:
        raise Error(f"a mask must be a 2-D boolean array [q_len, k_len], got {arr.dtype} with shape {arr.shape}")
    return arr


class Plan:
    """A planned attention problem (spattn::Plan): build with ``spattn.plan``, run ``forward`` many times.

    The pattern was analysed once, the engine and kernel chosen (``explain()`` says what and why). ``forward``
    checks every array against the problem and raises spattn.Error naming the array, dimension and values.
    """

    __slots__ = ("_p",)

    def __init__(self, core: "_core.Plan") -> None:
        self._p = core

    # ---- what it is ----
    batch = property(lambda self: self._p.batch)
    heads = property(lambda self: self._p.heads)
    kv_heads = property(lambda self: self._p.kv_heads)
    q_len = property(lambda self: self._p.q_len)
    k_len = property(lambda self: self._p.k_len)
    head_dim = property(lambda self: self._p.head_dim)
    value_dim = property(lambda self: self._p.value_dim)
    dtype = property(lambda self: self._p.dtype, doc="the input dtype the plan was built for")
    out_dtype = property(lambda self: self._p.out_dtype, doc="the dtype forward writes O in")
    lse_dtype = property(lambda self: self._p.lse_dtype, doc="the dtype forward writes LSE in")
    grad_dtype = property(lambda self: self._p.grad_dtype, doc="the dtype backward writes dQ, dK, dV in")
    scale = property(lambda self: self._p.scale, doc="the softmax scale (1/sqrt(head_dim) by default)")
    device = property(lambda self: self._p.device)
    engine = property(lambda self: self._p.engine)
    plan_ms = property(lambda self: self._p.plan_ms, doc="make_plan's time in ms")

    def nnz(self) -> int:
        """Kept (q, k) pairs over all query heads (per batch element)."""
        return self._p.nnz()

    def kernel(self) -> str:
        """The kernel-table row the plan chose."""
        return self._p.kernel()

    def last_kernel(self) -> str:
        """The row the last forward ran ('' before the first)."""
        return self._p.last_kernel()

    def last_backward_kernel(self) -> str:
        """What the last backward ran ('' before the first)."""
        return self._p.last_backward_kernel()

    def explain(self) -> str:
        """The pattern analysis, the engine and kernel chosen and why, the predicted cost, the plan time."""
        return self._p.explain()

    def __repr__(self) -> str:
        return (f"spattn.Plan('{self._p.spec}', batch={self.batch}, heads={self.heads}, kv_heads={self.kv_heads}, "
                f"q_len={self.q_len}, k_len={self.k_len}, head_dim={self.head_dim}, dtype={self.dtype}, "
                f"device={self.device}, engine={self.engine}, kernel={self.kernel()})")

    # ---- running it ----
    def _shape(self, b: int, l: int, h: int, d: int, layout: str) -> Tuple[int, int, int, int]:
        return (b, h, l, d) if layout in ("bhld", "bhsd") else (b, l, h, d)

    def forward(self, q: Any, k: Any, v: Any, *, out: Any = None, lse: Any = None, return_lse: bool = False,
                layout: str = "blhd", stream: Optional[int] = None) -> Any:
        """O = softmax(scale * Q K^T restricted to the pattern) V, and the LSE if asked.

        q [B, Lq, Hq, D], k [B, Lk, Hkv, D], v [B, Lk, Hkv, Dv] (``layout="bhld"``: [B, H, L, D]), any strides.
        ``out`` / ``lse`` are written when given (O in ``out_dtype``, LSE ``[B, Hq, Lq]`` in ``lse_dtype``),
        else allocated like ``q`` (numpy for numpy and other CPU arrays, torch for torch tensors). ``stream``:
        a cudaStream_t as an int; by default the stream the arrays' framework calls current
        (torch.cuda.current_stream()), else the legacy default stream. Returns O, or (O, LSE).
        """
        shape = self._shape(self.batch, self.q_len, self.heads, self.value_dim, layout)
        if out is None:
            out = _empty_like(q, shape, self.out_dtype)
        if lse is None and return_lse:
            lse = _empty_like(q, (self.batch, self.heads, self.q_len), self.lse_dtype)
        self._p.forward(q, k, v, out, lse, stream, layout)
        return (out, lse) if return_lse else out

    def backward(self, q: Any, k: Any, v: Any, o: Any, lse: Any, dout: Any, *, dq: Any = None, dk: Any = None,
                 dv: Any = None, layout: str = "blhd", stream: Optional[int] = None) -> Tuple[Any, Any, Any]:
        """dQ, dK, dV from dout (the gradient of O), for the forward's O and LSE (same layouts as forward).

        On the CPU o and lse may be None: the fused engine then runs the forward first (its backward accumulates in
        fp32, from the LSE), the reference engine recomputes the softmax in fp64 from q and k. dq/dk/dv are
        written when given, else allocated like ``q`` in ``grad_dtype`` (float32 on the CPU, float64 for float64
        problems). Returns (dq, dk, dv).
        """
        gdt = self.grad_dtype
        if dq is None:
            dq = _empty_like(q, self._shape(self.batch, self.q_len, self.heads, self.head_dim, layout), gdt)
        if dk is None:
            dk = _empty_like(q, self._shape(self.batch, self.k_len, self.kv_heads, self.head_dim, layout), gdt)
        if dv is None:
            dv = _empty_like(q, self._shape(self.batch, self.k_len, self.kv_heads, self.value_dim, layout), gdt)
        self._p.backward(q, k, v, o, lse, dout, dq, dk, dv, stream, layout)
        return dq, dk, dv


def _empty_like(x: Any, shape: Tuple[int, ...], dtype: str) -> Any:
    """An uninitialised array of `shape` and `dtype` in x's framework and on x's device."""
    if isinstance(x, np.ndarray):
        return np.empty(shape, dtype=dtype)
    if type(x).__module__.startswith("torch"):
        import torch

        return torch.empty(shape, dtype=getattr(torch, dtype), device=x.device)
    dev = getattr(x, "__dlpack_device__", None)
    if dev is None or dev()[0] in (1, 3):  # kDLCPU, kDLCUDAHost
        return np.empty(shape, dtype=dtype)
    raise Error(f"cannot allocate outputs for a {type(x).__name__} on a GPU: pass out= (and lse=, dq=, ...)")


def plan(pattern: PatternLike, q_len: int, k_len: Optional[int] = None, heads: int = 1, kv_heads: Optional[int] = None,
         head_dim: int = 64, device: Any = "cpu", *, batch: int = 1, dtype: Any = "float32",
         scale: Optional[float] = None, value_dim: Optional[int] = None, engine: str = "auto", kernel: str = "",
         threads: int = 0, block_m: int = 0, block_n: int = 0, perm_d: int = -1, persistent: int = -1,
         split: int = -1, compound: int = -1, tile_map: int = -1) -> Plan:
    """Plans attention over `pattern` for one problem (spattn::make_plan).

    pattern: a spec (``"longformer(256, 32)"``), a spattn.Pattern, one per query head (a list), or a boolean
    mask [q_len, k_len]. device: "cpu", "cuda", "cuda:N" (or a torch.device). dtype: the inputs' dtype
    (float32, float16, bfloat16; float64 runs on the reference engine unless ``engine`` says otherwise).
    scale: None for 1/sqrt(head_dim). engine: auto, cpu, cuda_fused, cuda_unfused, reference. kernel: force a
    row of the kernel table by name or kind (avx512, avx2, generic, sm80, sm90_tma, ...). threads: CPU worker
    threads (0: all). block_m, block_n, perm_d, persistent, split: fused GPU tiling (tests and benchmarks).
    compound: -1 the planner splits the pattern into parts where that pays (explain() lists them; the GPU only),
    0 never, 1 every column, row and scattered term (the CPU too).
    tile_map: neighborhood patterns on the fused GPU engine, query and key tiles as boxes of the token grid (8x16,
    4x4x8, ...; explain() says "tile map: query tiles ..."): -1 where the planner predicts they pay (2-D and 3-D
    grids; on 2-D grids key strips too), 0 never (row-major tiles), 1 boxes always (an Error for a pattern without a
    neighborhood grid), 2 key strips (64x64 tiles whose key tiles are strips of each query box's window union; an
    Error, saying why, where they do not fit). Other engines ignore it.
    """
    dt = _dtype_name(dtype)
    dev = _device_name(device)
    k_len = q_len if k_len is None else k_len
    kv_heads = heads if kv_heads is None else kv_heads
    if engine in ("auto", "") and dt == "float64" and dev == "cpu":
        engine = "reference"  # the CPU kernels compute in fp32; the reference keeps fp64 end to end
    args: Dict[str, Any] = dict(batch=_int("batch", batch), heads=_int("heads", heads), kv_heads=_int("kv_heads", kv_heads),
                q_len=_int("q_len", q_len), k_len=_int("k_len", k_len), head_dim=_int("head_dim", head_dim),
                value_dim=_int("value_dim", value_dim or 0), dtype=dt,
                scale=None if scale is None else float(scale), device=dev, engine=engine or "auto", kernel=kernel or "",
                threads=int(threads), block_m=int(block_m), block_n=int(block_n), perm_d=int(perm_d),
                persistent=int(persistent), split=int(split), compound=int(compound), tile_map=int(tile_map))
    m = _bool_mask(pattern)
    if m is not None:
        if m.shape != (args["q_len"], args["k_len"]):
            raise Error(f"mask is {m.shape[0]} x {m.shape[1]}, the problem is {args['q_len']} x {args['k_len']} (q_len x k_len)")
        offsets = np.zeros(m.shape[0] + 1, dtype=np.int64)
        np.cumsum(m.sum(axis=1), out=offsets[1:])
        cols = np.ascontiguousarray(np.nonzero(m)[1].astype(np.int32))
        return Plan(_core.make_plan_csr(offsets, cols, **args))
    return Plan(_core.make_plan(_patterns(pattern), **args))


def masked_plan(mask: str, q_len: int, k_len: Optional[int] = None, heads: int = 1, kv_heads: Optional[int] = None,
                head_dim: int = 64, device: Any = "cpu", *, batch: int = 1, dtype: Any = "float32",
                scale: Optional[float] = None, value_dim: Optional[int] = None, engine: str = "auto", kernel: str = "",
                threads: int = 0) -> Plan:
    """A plan whose mask comes from integer tensors at every call (spattn/runtime_mask.hpp; docs/RUNTIME_MASKS.md).

    mask: the layout's text, ``"blocks:128x128"`` / ``"blocks:128x128:causal"`` (FlexAttention's BlockMask, the spec
    evaluated inside partial blocks), ``"documents:causal"`` (FlashAttention's cu_seqlens, the spec within each
    document), ``"topk:2048:local(left=64, right=0)"`` (K keys a query, -1 padded, united with the spec). The other
    arguments as ``plan``. Run it with ``Plan.forward_mask`` (or ``spattn.torch.sparse_attention``).
    """
    dt = _dtype_name(dtype)
    dev = _device_name(device)
    if engine in ("auto", "") and dt == "float64" and dev == "cpu":
        engine = "reference"
    return Plan(_core.make_masked_plan(str(mask), int(batch), int(heads), int(heads if kv_heads is None else kv_heads),
                                       int(q_len), int(q_len if k_len is None else k_len), int(head_dim),
                                       int(value_dim or 0), dt, None if scale is None else float(scale), dev,
                                       engine or "auto", kernel or "", int(threads)))


# ---- the plan cache: one for the package (spattn.attention's plans and spattn.torch's) ---------------------
class _PlanCache:
    """Plans by key, the oldest dropped past `limit` (they hold GPU memory for their tile plans). Keys start with
    their user's tag ("attention", "torch"); values are a Plan or an object with the core plan as ``.plan``."""

    __slots__ = ("entries", "limit")

    def __init__(self, limit: int) -> None:
        self.entries: "OrderedDict[tuple, Any]" = OrderedDict()
        self.limit = limit

    def get(self, key: tuple, make: Any) -> Any:
        e = self.entries.get(key)
        if e is None:
            e = self.entries[key] = make()
            if len(self.entries) > self.limit:
                self.entries.popitem(last=False)
        return e

    def clear(self) -> None:
        self.entries.clear()

    def __len__(self) -> int:
        return len(self.entries)

    def plans(self) -> list:
        """The cached plans as spattn.Plan objects, oldest first."""
        return [e if isinstance(e, Plan) else Plan(e.plan) for e in self.entries.values()]


_PLANS = _PlanCache(64)


# ---- one call: plan (cached) and run --------------------------------------------------------------------
def _array_meta(x: Any) -> Tuple[Tuple[int, ...], str, str]:
    """(shape, dtype name, device) of a numpy array, a torch tensor or a DLPack array."""
    if isinstance(x, np.ndarray):
        return x.shape, x.dtype.name, "cpu"
    if type(x).__module__.startswith("torch"):
        d = x.device
        return tuple(x.shape), str(x.dtype)[6:], "cpu" if d.type == "cpu" else f"{d.type}:{d.index or 0}"
    if not hasattr(x, "__dlpack_device__"):
        raise TypeError(f"expected an array (numpy, torch or any __dlpack__ array) of shape [B, L, H, D], got "
                        f"{type(x).__name__}: wrap it in np.asarray(..., dtype=np.float32) first")
    dev_type, dev_id = x.__dlpack_device__()
    device = "cpu" if dev_type in (1, 3) else f"cuda:{dev_id}" if dev_type in (2, 13) else f"dlpack device {dev_type}"
    return tuple(x.shape), _dtype_name(getattr(x.dtype, "name", x.dtype)), device


def _cached_plan(pattern: PatternLike, q: Any, k: Any, v: Any, scale: Optional[float], layout: str,
                 options: dict) -> Plan:
    qs, dt, dev = _array_meta(q)
    ks, _, _ = _array_meta(k)
    vs, _, _ = _array_meta(v)
    if len(qs) != 4 or len(ks) != 4 or len(vs) != 4:
        raise Error(f"q, k and v must be 4-D ([B, L, H, D]), got shapes {qs}, {ks}, {vs}")
    if layout in ("bhld", "bhsd"):
        qs, ks, vs = [(s[0], s[2], s[1], s[3]) for s in (qs, ks, vs)]
    if isinstance(pattern, (str, Pattern, list, tuple)):
        pkey: Any = tuple(str(p) for p in pattern) if isinstance(pattern, (list, tuple)) else str(pattern)
    else:
        pkey = None  # masks are not cached
    key = ("attention", pkey, qs, ks[1], ks[2], vs[3], dt, dev, scale, tuple(sorted(options.items())))
    make = lambda: plan(pattern, qs[1], ks[1], qs[2], ks[2], qs[3], dev, batch=qs[0], dtype=dt,  # noqa: E731
                        scale=scale, value_dim=vs[3], **options)
    return _PLANS.get(key, make) if pkey is not None else make()


def attention(q: Any, k: Any, v: Any, pattern: PatternLike, *, scale: Optional[float] = None,
              return_lse: bool = False, layout: str = "blhd", engine: str = "auto", kernel: str = "",
              threads: int = 0) -> Any:
    """Sparse attention in one call: plans (cached by pattern, shapes, dtype, device) and runs forward.

    q [B, Lq, Hq, D], k [B, Lk, Hkv, D], v [B, Lk, Hkv, Dv] (``layout="bhld"``: [B, H, L, D]); numpy arrays,
    torch tensors or DLPack arrays. Returns O (``Plan.out_dtype``: float32 on the CPU), or (O, LSE [B, Hq, Lq]).
    For autograd and torch.compile use ``spattn.torch.sparse_attention``.
    """
    p = _cached_plan(pattern, q, k, v, scale, layout, {"engine": engine, "kernel": kernel, "threads": threads})
    return p.forward(q, k, v, return_lse=return_lse, layout=layout)


def __dir__() -> list:
    """The public names, the type aliases of the signatures and the submodules; not the imports (Any, np, ...)."""
    return sorted(set(__all__) | {"AxisArg", "CausalArg", "PatternLike", "torch", "tsvd", "distributed"})
