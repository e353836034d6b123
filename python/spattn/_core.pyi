# Generated from the built module by: python -m nanobind.stubgen -m spattn._core (after changing python/src/module.cpp)
"""spattn's compiled core (use the `spattn` package, not this module)"""

from collections.abc import Sequence
from typing import Annotated

import numpy
from numpy.typing import NDArray


class Error(ValueError):
    pass

class TsvdFactors:
    @property
    def k(self) -> int: ...

    @property
    def n(self) -> int: ...

    @property
    def tile_k(self) -> int: ...

    @property
    def tile_n(self) -> int: ...

    @property
    def common(self) -> int: ...

    @property
    def ranks(self) -> list[int]:
        """Per tile, row-major (per group with TSVD-common)."""

    @property
    def tile_rows(self) -> int: ...

    @property
    def tile_cols(self) -> int: ...

    @property
    def stored(self) -> int:
        """Floats kept."""

    @property
    def compression(self) -> float:
        """K N / stored floats."""

    def rank(self, i: int, j: int) -> int: ...

    def a(self, i: int, j: int) -> Annotated[NDArray[numpy.float32], dict(shape=(None, None))]:
        """
        A of tile (i, j) = U_r S_r (a copy; TSVD-common: the group's shared A, tile_k rows).
        """

    def b(self, i: int, j: int) -> Annotated[NDArray[numpy.float32], dict(shape=(None, None))]:
        """B of tile (i, j) = V_r^T (a copy)."""

    def matmul(self, x: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], threads: int = 0) -> Annotated[NDArray[numpy.float32], dict(shape=(None, None))]:
        """Y = X * TSVD(W) on the CPU (X: M x K float32), float32 M x N."""

    def reconstruct(self) -> Annotated[NDArray[numpy.float32], dict(shape=(None, None))]:
        """W as the factors give it back (K x N)."""

    def error(self, w: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)]) -> tuple:
        """
        (total, per-tile list): relative Frobenius errors of the factors against W.
        """

    def save(self, path: str) -> None: ...

    def __repr__(self) -> str: ...

def tsvd_compress(w: Annotated[NDArray[numpy.float32], dict(shape=(None, None), order='C', device='cpu', writable=False)], tile_k: int, tile_n: int, rank: int, ratio: float, error: float, common: int, threads: int) -> TsvdFactors: ...

def tsvd_load(path: str) -> TsvdFactors:
    """Reads a .tsvd file; raises spattn.Error naming a bad field."""

def build_info() -> dict:
    """
    Version and build options of this spattn build, and how many GPUs it sees.
    """

class Pattern:
    def __init__(self, spec: str) -> None:
        """
        Parses a pattern spec (docs/PATTERNS.md); raises spattn.Error naming the column of a syntax error.
        """

    @property
    def spec(self) -> str: ...

    def __repr__(self) -> str: ...

    def __str__(self) -> str: ...

    def __eq__(self, arg: object, /) -> bool: ...

    def __hash__(self) -> int: ...

    def nnz(self, q_len: int, k_len: int) -> int:
        """Kept (q, k) pairs at these lengths."""

    def row(self, q: int, q_len: int, k_len: int) -> list[int]:
        """The keys of query row q, increasing."""

    def mask(self, q_len: int, k_len: int) -> Annotated[NDArray[numpy.bool_], dict(shape=(None, None))]:
        """The [q_len, k_len] boolean mask (True: kept)."""

class Plan:
    @property
    def batch(self) -> int: ...

    @property
    def heads(self) -> int: ...

    @property
    def kv_heads(self) -> int: ...

    @property
    def q_len(self) -> int: ...

    @property
    def k_len(self) -> int: ...

    @property
    def head_dim(self) -> int: ...

    @property
    def value_dim(self) -> int: ...

    @property
    def dtype(self) -> str: ...

    @property
    def scale(self) -> float: ...

    @property
    def device(self) -> str: ...

    @property
    def engine(self) -> str: ...

    @property
    def out_dtype(self) -> str: ...

    @property
    def lse_dtype(self) -> str: ...

    @property
    def grad_dtype(self) -> str: ...

    @property
    def spec(self) -> str: ...

    @property
    def plan_ms(self) -> float: ...

    def nnz(self) -> int: ...

    def kernel(self) -> str: ...

    def last_kernel(self) -> str: ...

    def last_backward_kernel(self) -> str: ...

    @property
    def mask(self) -> str: ...

    def forward_mask(self, q: object, k: object, v: object, o: object, lse: object | None, mask: Sequence[object | None], check: bool = False, stream: object | None = None, layout: str = 'blhd', no_host: bool = False) -> None: ...

    def backward_mask(self, q: object, k: object, v: object, o: object | None, lse: object | None, dout: object, dq: object, dk: object, dv: object, mask: Sequence[object | None], check: bool = False, stream: object | None = None, layout: str = 'blhd', no_host: bool = False) -> None: ...

    def explain(self) -> str: ...

    def forward(self, q: object, k: object, v: object, o: object, lse: object | None, stream: object | None = None, layout: str = 'blhd') -> None: ...

    def backward(self, q: object, k: object, v: object, o: object | None, lse: object | None, dout: object, dq: object, dk: object, dv: object, stream: object | None = None, layout: str = 'blhd') -> None: ...

    def time_forward(self, q: object, k: object, v: object, o: object, lse: object | None, iters: int, layout: str = 'blhd') -> float: ...

def make_plan(patterns: Sequence[Pattern], batch: int, heads: int, kv_heads: int, q_len: int, k_len: int, head_dim: int, value_dim: int, dtype: str, scale: float | None, device: str, engine: str, kernel: str, threads: int, block_m: int, block_n: int, perm_d: int, persistent: int, split: int, compound: int, tile_map: int) -> Plan: ...

def make_masked_plan(mask: str, batch: int, heads: int, kv_heads: int, q_len: int, k_len: int, head_dim: int, value_dim: int, dtype: str, scale: float | None, device: str, engine: str, kernel: str, threads: int) -> Plan:
    """A plan whose mask comes at every call (spattn/runtime_mask.hpp): `mask` is the layout's text (blocks:QBxKB[:SPEC], documents[:SPEC], topk:K[:SPEC])."""

def make_plan_csr(row_offsets: Annotated[NDArray[numpy.int64], dict(shape=(None,), order='C', device='cpu', writable=False)], col_indices: Annotated[NDArray[numpy.int32], dict(shape=(None,), order='C', device='cpu', writable=False)], batch: int, heads: int, kv_heads: int, q_len: int, k_len: int, head_dim: int, value_dim: int, dtype: str, scale: float | None, device: str, engine: str, kernel: str, threads: int, block_m: int, block_n: int, perm_d: int, persistent: int, split: int, compound: int, tile_map: int) -> Plan: ...

def dist_schedule(patterns: Sequence[Pattern], len: int, world: int, layout: str, batch: int, heads: int, kv_heads: int, head_dim: int, value_dim: int, dtype: str, key_block: int, distribute_rows: bool) -> tuple:
    """The distributed plan's exchange schedule (spattn/distributed.hpp): (explain, one dict per rank)."""

def make_window_plan(patterns: Sequence[Pattern], len: int, rows: Sequence[tuple[int, int]], keys: Sequence[tuple[int, int]], skip: Sequence[tuple[int, int]], batch: int, heads: int, kv_heads: int, head_dim: int, value_dim: int, dtype: str, scale: float | None, device: str, engine: str, threads: int) -> Plan:
    """A plan over a window of the patterns bound to (len, len) (BoundPattern::window)."""

def merge_into(o: object, lse: object, o2: object, lse2: object) -> None:
    """(o, lse) <- the LSE merge of (o, lse) and (o2, lse2) (o [B, L, H, D], lse [B, H, L]; CPU)."""
