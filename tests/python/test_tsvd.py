"""spattn.tsvd_compress / TsvdFactors against numpy: each tile's truncated SVD from np.linalg.svd (LAPACK's gesdd
through numpy, not the C++ path), the error, the matmul, the file."""
from __future__ import annotations

import numpy as np
import pytest

import spattn


def _lapack_missing() -> str:
    try:
        spattn.tsvd_compress(np.ones((2, 2), np.float32), 2, rank=1)
    except spattn.Error as e:
        if "LAPACK" in str(e):
            return str(e)
        raise
    return ""


pytestmark = pytest.mark.skipif(bool(_lapack_missing()), reason=_lapack_missing() or "LAPACK present")


def _matrix(k: int, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = sum(0.7**t * np.outer(rng.standard_normal(k), rng.standard_normal(n)) for t in range(10))
    return (w + 0.05 * rng.standard_normal((k, n))).astype(np.float32)


def _numpy_tsvd(w: np.ndarray, tk: int, tn: int, rank_of) -> np.ndarray:
    """The tiled truncation in float64, ranks from rank_of(i, j)."""
    w = w.astype(np.float64)
    out = np.zeros_like(w)
    for i in range(0, w.shape[0], tk):
        for j in range(0, w.shape[1], tn):
            u, s, vt = np.linalg.svd(w[i:i + tk, j:j + tn], full_matrices=False)
            r = rank_of(i // tk, j // tn)
            out[i:i + tk, j:j + tn] = (u[:, :r] * s[:r]) @ vt[:r]
    return out


# Ragged edges (100 x 75 with 32 x 24 tiles), a ratio, a rank, float64 input (converted).
@pytest.mark.parametrize("tile,kw", [((32, 24), {"ratio": 2}), (16, {"rank": 3}), (64, {"ratio": 8})])
def test_tiles_match_numpy_svd(tile, kw):
    w = _matrix(100, 75, 1)
    f = spattn.tsvd_compress(w.astype(np.float64), tile, **kw)
    tk, tn = f.tile
    ref = _numpy_tsvd(w, tk, tn, f.rank)
    rec = f.reconstruct()
    assert np.abs(rec - ref).max() <= 2e-6 * np.abs(ref).max()
    total, per_tile = f.error(w)
    expect = np.linalg.norm(w - ref) / np.linalg.norm(w)
    assert total == pytest.approx(expect, rel=1e-6)
    assert len(per_tile) == f.tiles[0] * f.tiles[1]
    assert total > 1e-3  # the truncation drops something


def test_ratio_rank_formula():
    f = spattn.tsvd_compress(_matrix(256, 256, 2), 64, ratio=4)
    assert set(f.ranks) == {64 * 64 // (4 * 128)}
    assert f.compression == pytest.approx(4.0)


def test_factors_are_u_s_and_vt():
    w = _matrix(64, 64, 3)
    f = spattn.tsvd_compress(w, 32, rank=4)
    u, s, vt = np.linalg.svd(w[32:, :32].astype(np.float64), full_matrices=False)
    a, b = f.a(1, 0), f.b(1, 0)
    assert a.shape == (32, 4) and b.shape == (4, 32)
    np.testing.assert_allclose(a @ b, (u[:, :4] * s[:4]) @ vt[:4], atol=1e-5)
    # B's rows are orthonormal (V_r^T), A's columns carry the singular values
    np.testing.assert_allclose(b @ b.T, np.eye(4), atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(a, axis=0), s[:4], rtol=1e-5)


@pytest.mark.parametrize("m", [1, 37])
def test_matmul_matches_x_times_reconstruction(m):
    w = _matrix(100, 75, 4)
    f = spattn.tsvd_compress(w, (32, 24), ratio=3)
    x = np.random.default_rng(m).standard_normal((m, 100))
    y = f.matmul(x)
    ref = x @ f.reconstruct().astype(np.float64)
    assert y.dtype == np.float32 and y.shape == (m, 75)
    assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max()


def test_common_and_error_target():
    w = _matrix(96, 64, 5)
    f = spattn.tsvd_compress(w, 32, rank=5, common=1)
    assert f.common == 1 and f.a(0, 0).shape == (32, 5)
    np.testing.assert_allclose(f.a(0, 0), f.a(2, 1))  # one A for every tile (the thesis's U1)
    g = spattn.tsvd_compress(w, 32, error=0.05)
    assert g.error(w)[0] <= 0.05 * (1 + 1e-6)


def test_save_load_and_errors(tmp_path):
    w = _matrix(64, 96, 6)
    f = spattn.tsvd_compress(w, 32, ratio=2)
    p = tmp_path / "w.tsvd"
    f.save(str(p))
    g = spattn.tsvd_load(str(p))
    assert g.ranks == f.ranks
    np.testing.assert_array_equal(g.reconstruct(), f.reconstruct())
    data = bytearray(p.read_bytes())
    data[16] = 7  # dtype
    p.write_bytes(bytes(data))
    with pytest.raises(spattn.Error, match="dtype 7"):
        spattn.tsvd_load(str(p))
    with pytest.raises(spattn.Error, match="exactly one of rank, ratio and error"):
        spattn.tsvd_compress(w, 32, ratio=2, rank=3)
    with pytest.raises(spattn.Error, match="X has 5 columns"):
        f.matmul(np.ones((2, 5)))
    with pytest.raises(spattn.Error, match="3 dimensions"):
        spattn.tsvd_compress(np.ones((2, 2, 2)), 2, rank=1)
