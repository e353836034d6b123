"""TSVD: tiled SVD compression of a weight matrix and the matmul through its factors (thesis chapter 4).

    f = spattn.tsvd_compress(W, tile=256, ratio=4)    # W: K x N; per tile (i, j) A = U_r S_r, B = V_r^T
    Y = f.matmul(X)                                   # X: M x K -> Y: M x N = X * TSVD(W), float32, CPU
    total, per_tile = f.error(W)                      # relative Frobenius errors
    f.save("w.tsvd"); g = spattn.tsvd_load("w.tsvd")  # the .tsvd file of `spattn tsvd` (include/spattn/tsvd.hpp)

Inputs are anything numpy converts to a 2-D array; they are copied to float32 C order when they are not.
"""
from __future__ import annotations

from typing import Any, List, Optional, Tuple, Union

import numpy as np

from . import _core

__all__ = ["TsvdFactors", "tsvd_compress", "tsvd_load"]


def _matrix(a: Any, name: str) -> np.ndarray:
    m = np.ascontiguousarray(a, dtype=np.float32)
    if m.ndim != 2:
        raise _core.Error(f"{name} has {m.ndim} dimensions, expected 2")
    return m


class TsvdFactors:
    """The factors of one compressed K x N matrix (tiles row-major; ragged edge tiles allowed)."""

    def __init__(self, core: Any):
        self._f = core

    k = property(lambda self: self._f.k)
    n = property(lambda self: self._f.n)
    tile = property(lambda self: (self._f.tile_k, self._f.tile_n), doc="(tile_k, tile_n)")
    tiles = property(lambda self: (self._f.tile_rows, self._f.tile_cols), doc="(tile rows, tile columns)")
    common = property(lambda self: self._f.common, doc="0: plain TSVD; else the number of shared A (TSVD-common)")
    ranks = property(lambda self: list(self._f.ranks), doc="per tile row-major (per group with TSVD-common)")
    stored = property(lambda self: self._f.stored, doc="floats kept")
    compression = property(lambda self: self._f.compression, doc="K N / stored floats")

    def rank(self, i: int, j: int) -> int:
        return self._f.rank(i, j)

    def a(self, i: int, j: int) -> np.ndarray:
        """A of tile (i, j) = U_r S_r, tile_k x r (a copy)."""
        return self._f.a(i, j)

    def b(self, i: int, j: int) -> np.ndarray:
        """B of tile (i, j) = V_r^T, r x tile_n (a copy)."""
        return self._f.b(i, j)

    def matmul(self, x: Any, threads: int = 0) -> np.ndarray:
        """Y = X * TSVD(W) on the CPU: X is M x K (any dtype numpy converts), Y float32 M x N."""
        return self._f.matmul(_matrix(x, "X"), threads)

    def reconstruct(self) -> np.ndarray:
        """W as the factors give it back, float32 K x N."""
        return self._f.reconstruct()

    def error(self, w: Any) -> Tuple[float, List[float]]:
        """(total, per tile) relative Frobenius errors ||W - TSVD(W)|| / ||W||."""
        return self._f.error(_matrix(w, "W"))

    def save(self, path: str) -> None:
        self._f.save(str(path))

    def __repr__(self) -> str:
        return repr(self._f)


def tsvd_compress(w: Any, tile: Union[int, Tuple[int, int]] = 256, *, ratio: Optional[float] = None,
                  rank: Optional[int] = None, error: Optional[float] = None, common: int = 0,
                  threads: int = 0) -> TsvdFactors:
    """Compresses W (K x N) tile by tile; give exactly one of ratio (stored floats = K N / ratio), rank, or error
    (a total relative Frobenius error target; ranks per tile). common=G: TSVD-common with G shared A factors."""
    tk, tn = (tile, tile) if isinstance(tile, int) else tile
    for name, value, least in (("rank", rank, "at least 1"), ("ratio", ratio, "at least 1"), ("error", error, "in (0, 1)")):
        if value is not None and value == 0:  # (it read "give exactly one of rank, ratio and error (0 given)")
            raise _core.Error(f"TSVD: {name}=0: the {name} must be {least}")
    m = _matrix(w, "W")
    return TsvdFactors(_core.tsvd_compress(m, int(tk), int(tn), int(rank or 0), float(ratio or 0), float(error or 0),
                                           int(common), int(threads)))


def tsvd_load(path: str) -> TsvdFactors:
    """Reads a .tsvd file (raises spattn.Error naming a bad field)."""
    return TsvdFactors(_core.tsvd_load(str(path)))


def __dir__() -> list:
    """The public names, not the imports (Any, np, ...)."""
    return sorted(__all__)
