"""What a new user meets at the Python entry points: a scale of 0 is a scale (uniform attention), not the default;
bad arguments are refused with a clear error naming them."""
from __future__ import annotations

import time

import numpy as np
import pytest

import spattn

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import spattn.torch as st  # noqa: E402

CUDA = torch.cuda.is_available() and spattn.build_info()["gpus"] > 0
SPEC = "local(3) | global(0)"


def sdpa(q, k, v, spec, scale):
    """SDPA ([B, L, H, D] in and out) with the pattern's boolean mask."""
    m = torch.from_numpy(spattn.mask(spec, q.shape[1], k.shape[1])).to(q.device)
    o = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), attn_mask=m, scale=scale)
    return o.transpose(1, 2)


def qkv(dtype=torch.float32, device="cpu", D=16):
    g = torch.Generator().manual_seed(0)
    return [torch.randn((2, 40, 2, D), generator=g, dtype=torch.float64).to(dtype=dtype, device=device)
            for _ in range(3)]


@pytest.mark.parametrize("engine", ["auto", "reference"])
def test_scale_zero_is_uniform_attention(engine):
    """scale=0.0 against SDPA's scale=0.0 (each row the mean of its keys' V); it meant 1/sqrt(D) (max abs
    difference 1.5-3.0)."""
    q, k, v = qkv()
    want = sdpa(q, k, v, SPEC, 0.0)
    o = st.sparse_attention(q, k, v, SPEC, scale=0.0, engine=engine)
    torch.testing.assert_close(o, want, rtol=1e-5, atol=2e-6)
    o = spattn.attention(q.numpy(), k.numpy(), v.numpy(), SPEC, scale=0.0, engine=engine)
    torch.testing.assert_close(torch.from_numpy(np.asarray(o)), want, rtol=1e-5, atol=2e-6)
    # The default is still 1/sqrt(D), and the plan reports the scale it runs.
    torch.testing.assert_close(st.sparse_attention(q, k, v, SPEC), sdpa(q, k, v, SPEC, None), rtol=1e-5, atol=2e-6)
    assert spattn.plan(SPEC, 40, 40, 2, 2, 16, scale=0.0).scale == 0.0
    assert spattn.plan(SPEC, 40, 40, 2, 2, 16).scale == pytest.approx(0.25)


def test_scale_zero_gradients():
    q, k, v = (x.requires_grad_(True) for x in qkv())
    st.sparse_attention(q, k, v, SPEC, scale=0.0).square().sum().backward()
    got = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    sdpa(q, k, v, SPEC, 0.0).square().sum().backward()
    for a, b in zip(got, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not CUDA, reason="no CUDA device")
@pytest.mark.parametrize("engine", ["cuda_fused", "cuda_unfused"])
def test_cuda_scale_zero_is_uniform_attention(engine):
    q, k, v = (x.requires_grad_(True) for x in qkv(torch.bfloat16, "cuda", D=64))
    o = st.sparse_attention(q, k, v, SPEC, scale=0.0, engine=engine)
    want = sdpa(q.float(), k.float(), v.float(), SPEC, 0.0)
    torch.testing.assert_close(o.float(), want, rtol=2e-2, atol=2e-2)
    o.float().square().sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))


def test_plan_past_memory_is_refused_at_once(monkeypatch):
    """A plan whose memory floor exceeds the host's limit is refused before it is built, with both figures (the
    documented maximum length was killed by the OOM killer after 79 s at 24 GB)."""
    monkeypatch.setenv("SPATTN_MEMORY_LIMIT", "1G")
    t0 = time.perf_counter()
    with pytest.raises(spattn.Error, match=r"needs at least 3\.0 GiB of host memory .* the limit is 1\.0 GiB"):
        spattn.plan("local(2)", 2**27, 2**27, 1, 1, 64)
    monkeypatch.setenv("SPATTN_MEMORY_LIMIT", "16G")
    with pytest.raises(spattn.Error, match=r"needs at least 48\.0 GiB"):
        spattn.plan("local(2)", 2**31 - 1, 2**31 - 1, 1, 1, 64)
    assert time.perf_counter() - t0 < 10
    spattn.plan("local(2)", 2**16, 2**16, 1, 1, 64)  # far below: planned
    monkeypatch.setenv("SPATTN_MEMORY_LIMIT", "lots")
    with pytest.raises(spattn.Error, match="SPATTN_MEMORY_LIMIT='lots': expected a positive number of bytes"):
        spattn.plan("local(2)", 64, 64, 1, 1, 64)


def test_lengths_must_be_integers():
    """A float length is refused, not truncated (mask(..., 3.7) used 3); numpy integers are fine."""
    with pytest.raises(TypeError, match=r"q_len must be an integer, got 3\.7"):
        spattn.mask("local(1)", 3.7)
    with pytest.raises(TypeError, match=r"k_len must be an integer, got 4\.0"):
        spattn.plan("local(1)", 4, 4.0)
    with pytest.raises(TypeError, match=r"head_dim must be an integer"):
        spattn.plan("local(1)", 4, head_dim=64.5)
    assert spattn.mask("local(1)", np.int64(3)).shape == (3, 3)


def test_a_list_input_is_a_clear_type_error():
    """A nested list is refused naming what is expected (it failed with an AttributeError on __dlpack_device__)."""
    with pytest.raises(TypeError, match=r"expected an array .* got list"):
        spattn.attention([[[[1.0]]]], [[[[1.0]]]], [[[[1.0]]]], "dense")


def test_namespaces_list_public_names_only():
    import spattn.distributed
    import spattn.tsvd

    for mod, imports in ((spattn, {"Any", "np", "Optional", "operator", "OrderedDict"}),
                         (st, {"Any", "torch", "Tensor", "Callable"}), (spattn.tsvd, {"Any", "np"}),
                         (spattn.distributed, {"Any", "torch", "dist"})):
        assert not imports & set(dir(mod)), (mod.__name__, sorted(imports & set(dir(mod))))
        assert set(mod.__all__) <= set(dir(mod))


def test_tsvd_bad_options_say_what_is_wrong():
    """rank=0 / ratio=0 said "0 given"; rank 1000 silently stored twice W's floats; a NaN weight gave LAPACK's
    "info -4"."""
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    for kw, want in ((dict(rank=0), "rank=0: the rank must be at least 1"),
                     (dict(ratio=0), "ratio=0: the ratio must be at least 1"),
                     (dict(rank=1000), r"rank 1000 stores more floats than W.*at most rank 16"),
                     (dict(rank=17), "at most rank 16")):
        with pytest.raises(spattn.Error, match=want):
            spattn.tsvd_compress(w, 32, **kw)
    w[3, 7] = np.nan
    with pytest.raises(spattn.Error, match=r"W\[3, 7\] is nan: W must be finite"):
        spattn.tsvd_compress(w, 32, rank=4)
