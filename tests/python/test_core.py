"""spattn on numpy arrays: patterns, masks, plans, forward/backward, errors (no torch needed)."""
from __future__ import annotations

import numpy as np
import pytest

import spattn
from conftest import need_backward, oracle, oracle_grads, patterns_oracle

SPECS = [
    "local(3)",
    "causal",
    "longformer(4, 2)",
    "dilated(2, 3) | global(0)",
    "stride(5) & causal",
    "bigbird(4, 1, 1, 2, seed=3)",
    "random(3, seed=7)",
    "blocked(8, causal)",
    "neighborhood(dims=(6, 8), kernel=3)",
    "global_rows(0:2)",  # rows 2.. keep nothing: O = 0, LSE = -inf
]


def rand(*shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def test_version_and_build_info():
    info = spattn.build_info()
    assert spattn.__version__ == info["version"]
    assert isinstance(info["cuda"], bool) and info["gpus"] >= 0
    from importlib import metadata

    try:
        installed = metadata.version("spattn")
    except metadata.PackageNotFoundError:
        pytest.skip("spattn is not installed (run from a build tree)")
    assert installed == spattn.__version__  # the wheel's version comes from CMakeLists.txt too


@pytest.mark.parametrize("spec", SPECS)
def test_mask_matches_the_oracle(spec):
    m = spattn.mask(spec, 48)
    assert m.dtype == np.bool_ and m.shape == (48, 48)
    np.testing.assert_array_equal(m, patterns_oracle.mask(spec, 48, 48))
    p = spattn.Pattern(spec)
    assert p.nnz(48, 48) == int(m.sum())
    assert p.row(5, 48, 48) == list(np.nonzero(m[5])[0])


def test_mask_cross_lengths():
    np.testing.assert_array_equal(spattn.mask("local(2) | global_cols(0)", 5, 9),
                                  patterns_oracle.mask("local(2) | global_cols(0)", 5, 9))


def test_pattern_errors_name_the_column():
    with pytest.raises(spattn.Error, match="column 7") as e:
        spattn.Pattern("local(")
    assert isinstance(e.value, ValueError)
    with pytest.raises(ValueError, match="unknown"):
        spattn.Pattern("lokal(3)")
    with pytest.raises(spattn.Error):
        spattn.mask("global(100)", 10)  # index out of range for the length


def test_pattern_object():
    p = spattn.Pattern("longformer(256, 32)")
    assert p.spec == "longformer(256, 32)" and str(p) == p.spec
    assert repr(p) == "spattn.Pattern('longformer(256, 32)')"
    assert p == spattn.Pattern("longformer(256, 32)") and hash(p) == hash(spattn.Pattern("longformer(256, 32)"))


@pytest.mark.parametrize("spec", SPECS)
def test_attention_matches_the_oracle(spec):
    B, L, H, HK, D = 2, 48, 4, 2, 16
    q, k, v = rand(B, L, H, D, seed=1), rand(B, L, HK, D, seed=2), rand(B, L, HK, D, seed=3)
    o, lse = spattn.attention(q, k, v, spec, return_lse=True)
    ro, rl = oracle(q, k, v, spec)
    assert o.dtype == np.float32 and o.shape == (B, L, H, D) and lse.shape == (B, H, L)
    np.testing.assert_allclose(o, ro, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(lse, rl, rtol=1e-5, atol=2e-6)  # -inf where a row keeps nothing


def test_plan_forward_and_properties():
    spec = "local(8) | global(0)"
    p = spattn.plan(spec, 128, 128, 4, 2, 32)
    assert (p.batch, p.heads, p.kv_heads, p.q_len, p.k_len, p.head_dim, p.value_dim) == (1, 4, 2, 128, 128, 32, 32)
    assert p.device == "cpu" and p.engine == "cpu" and p.dtype == "float32" and p.out_dtype == "float32"
    assert p.scale == pytest.approx(32 ** -0.5)
    assert p.nnz() == 4 * int(spattn.mask(spec, 128).sum())
    assert p.kernel().startswith("cpu_fused") and p.last_kernel() == ""
    assert "engine cpu" in p.explain() and spec in p.explain()
    q, k, v = rand(1, 128, 4, 32), rand(1, 128, 2, 32, seed=1), rand(1, 128, 2, 32, seed=2)
    o = p.forward(q, k, v)
    assert p.last_kernel() == p.kernel()
    np.testing.assert_allclose(o, oracle(q, k, v, spec)[0], rtol=1e-5, atol=2e-6)
    out = np.full_like(o, np.nan)
    lse = np.empty((1, 4, 128), np.float32)
    assert p.forward(q, k, v, out=out, lse=lse, return_lse=True)[0] is out
    np.testing.assert_array_equal(out, o)
    assert "Plan('local(8) | global(0)'" in repr(p)


def test_strided_views_and_layouts():
    """[B, H, L, D] storage through layout='bhld' and through transposed views; sliced (non-contiguous) inputs."""
    B, L, H, D = 2, 40, 3, 8
    spec = "local(5) | global(1)"
    qb, kb, vb = rand(B, H, L, D), rand(B, H, L, D, seed=1), rand(B, H, L, 2 * D, seed=2)[..., ::2]
    ref, rl = oracle(qb.transpose(0, 2, 1, 3), kb.transpose(0, 2, 1, 3), vb.transpose(0, 2, 1, 3), spec)
    o1, l1 = spattn.attention(qb, kb, vb, spec, layout="bhld", return_lse=True)
    assert o1.shape == (B, H, L, D)
    np.testing.assert_allclose(o1.transpose(0, 2, 1, 3), ref, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(l1, rl, rtol=1e-5, atol=2e-6)
    o2 = spattn.attention(qb.transpose(0, 2, 1, 3), kb.transpose(0, 2, 1, 3), vb.transpose(0, 2, 1, 3), spec)
    np.testing.assert_allclose(o2, ref, rtol=1e-5, atol=2e-6)


class DLPackOnly:
    """An array that offers nothing but the DLPack protocol (the path of cupy, jax, ... on the CPU)."""

    def __init__(self, a):
        self.a = a
        self.shape, self.dtype = a.shape, a.dtype

    def __dlpack__(self, **kw):
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


def test_any_dlpack_array():
    q, k, v = rand(1, 32, 2, 16), rand(1, 32, 2, 16, seed=1), rand(1, 32, 2, 16, seed=2)
    o = spattn.attention(DLPackOnly(q), DLPackOnly(k), DLPackOnly(v), "local(3)")
    assert isinstance(o, np.ndarray)
    np.testing.assert_allclose(o, oracle(q, k, v, "local(3)")[0], rtol=1e-5, atol=2e-6)
    out = np.empty_like(q)
    spattn.plan("local(3)", 32, 32, 2, 2, 16).forward(DLPackOnly(q), k, v, out=DLPackOnly(out))
    np.testing.assert_array_equal(out, o)


def test_float16_in_float32_out_and_readonly_inputs():
    q, k, v = (rand(1, 32, 2, 16, seed=s).astype(np.float16) for s in range(3))
    for x in (q, k, v):
        x.flags.writeable = False
    o = spattn.attention(q, k, v, "causal")
    assert o.dtype == np.float32
    np.testing.assert_allclose(o, oracle(q, k, v, "causal")[0], rtol=1e-5, atol=2e-6)


def test_float64_runs_on_the_reference_engine():
    q, k, v = (rand(1, 24, 2, 8, dtype=np.float64, seed=s) for s in range(3))
    p = spattn.plan("local(3)", 24, 24, 2, 2, 8, dtype="float64")
    assert p.engine == "reference" and p.out_dtype == "float64" and p.lse_dtype == "float64"
    o, lse = p.forward(q, k, v, return_lse=True)
    ro, rl = oracle(q, k, v, "local(3)")
    np.testing.assert_allclose(o, ro, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(lse, rl, rtol=1e-12, atol=1e-13)


def test_per_head_patterns_and_masks():
    B, L, H, D = 1, 32, 2, 8
    q, k, v = rand(B, L, H, D), rand(B, L, H, D, seed=1), rand(B, L, H, D, seed=2)
    specs = ["local(2)", "causal"]
    o = spattn.plan(specs, L, L, H, H, D).forward(q, k, v)
    for h, s in enumerate(specs):
        np.testing.assert_allclose(o[:, :, h:h + 1], oracle(q[:, :, h:h + 1], k[:, :, h:h + 1], v[:, :, h:h + 1], s)[0],
                                   rtol=1e-5, atol=2e-6)
    m = np.random.default_rng(4).random((L, L)) < 0.3
    om = spattn.attention(q, k, v, m)
    ro, _ = patterns_oracle.attention(q, k, v, m)
    np.testing.assert_allclose(om, ro, rtol=1e-5, atol=2e-6)
    with pytest.raises(spattn.Error, match="mask is 3 x 3"):
        spattn.plan(np.ones((3, 3), bool), L, L, H, H, D)


def test_errors_name_the_array_and_value():
    p = spattn.plan("local(2)", 16, 16, 2, 2, 8)
    q = rand(1, 16, 2, 8)
    with pytest.raises(spattn.Error, match=r"q: dimension 1 is 8, expected 16"):
        p.forward(q[:, :8], q, q)
    with pytest.raises(spattn.Error, match="k has 3 dimensions"):
        p.forward(q, q[0], q)
    with pytest.raises(spattn.Error, match="v has dtype int32"):
        p.forward(q, q, q.astype(np.int32))
    with pytest.raises(spattn.Error, match="heads .* multiple of kv heads"):
        spattn.plan("local(2)", 16, 16, 3, 2, 8)
    with pytest.raises(spattn.Error, match="engine 'fast'"):
        spattn.plan("local(2)", 16, 16, 2, 2, 8, engine="fast")
    with pytest.raises(spattn.Error, match="dtype"):
        spattn.plan("local(2)", 16, 16, 2, 2, 8, dtype="int8")
    with pytest.raises(TypeError, match="writable"):
        p.forward(q, q, q, out=[1, 2, 3])
    if not spattn.build_info()["gpus"]:
        with pytest.raises(spattn.Error, match="cuda:0 does not exist"):
            spattn.plan("local(2)", 16, 16, 2, 2, 8, device="cuda")


def test_tile_map_option():
    """spattn.plan(..., tile_map=): multi-dimensional tiles of neighborhood patterns on the fused GPU engine (-1 chosen,
    0 never, 1 boxes, 2 key strips); other engines take and ignore it, and a value outside those is refused on every
    engine."""
    spec, L, H, D = "neighborhood(dims=(12, 16), kernel=5)", 192, 2, 64
    q, k, v = rand(1, L, H, D), rand(1, L, H, D, seed=1), rand(1, L, H, D, seed=2)
    ro, _ = oracle(q, k, v, spec)
    for tm in (-1, 0, 1, 2):
        np.testing.assert_allclose(spattn.plan(spec, L, L, H, H, D, tile_map=tm).forward(q, k, v), ro, rtol=1e-5, atol=2e-6)
    with pytest.raises(spattn.Error,
                       match=r"tile_map must be -1 \(chosen\), 0 \(never\), 1 \(always\) or 2 \(key strips\), got 3"):
        spattn.plan(spec, L, L, H, H, D, tile_map=3)
    if not spattn.build_info()["gpus"]:
        return
    # On a GPU: tile_map=1 maps the tiles (explain says so), 0 does not; both compute the pattern.
    torch = pytest.importorskip("torch")

    tq, tk, tv = (torch.from_numpy(x).to("cuda", torch.bfloat16) for x in (q, k, v))
    for tm, mapped in ((1, True), (0, False)):
        p = spattn.plan(spec, L, L, H, H, D, device="cuda", dtype="bfloat16", tile_map=tm)
        assert ("tile map: query tiles" in p.explain()) == mapped, p.explain()
        o = p.forward(tq, tk, tv).float().cpu().numpy()
        np.testing.assert_allclose(o, ro, rtol=3e-2, atol=3e-2)
    with pytest.raises(spattn.Error, match="has no neighborhood grid"):
        spattn.plan("local(5)", L, L, H, H, D, device="cuda", dtype="bfloat16", tile_map=1)


def test_cached_attention_plans_are_reused():
    q = rand(1, 16, 1, 8)
    spattn.attention(q, q, q, "local(1)")
    n = len(spattn._PLANS)
    spattn.attention(q, q, q, "local(1)")
    assert len(spattn._PLANS) == n
    spattn.attention(q, q, q, "local(2)")
    assert len(spattn._PLANS) == n + 1


@pytest.mark.parametrize("spec", ["local(3) | global(0)", "causal", "random(3, seed=1)", "global_rows(0:2)"])
def test_backward_matches_the_definition(spec):
    need_backward()
    B, L, H, HK, D = 1, 24, 4, 2, 8
    q, k, v, do = rand(B, L, H, D), rand(B, L, HK, D, seed=1), rand(B, L, HK, D, seed=2), rand(B, L, H, D, seed=3)
    p = spattn.plan(spec, L, L, H, HK, D)
    o, lse = p.forward(q, k, v, return_lse=True)
    dq, dk, dv = p.backward(q, k, v, o, lse, do)
    rq, rk, rv = oracle_grads(q, k, v, spec, do)
    for got, want in ((dq, rq), (dk, rk), (dv, rv)):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
