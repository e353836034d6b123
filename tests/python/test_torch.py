"""spattn.torch: the custom op against SDPA with the same boolean mask, opcheck, gradcheck, torch.compile."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import spattn  # noqa: E402
import spattn.torch as st  # noqa: E402
from conftest import backward_missing, need_backward  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CUDA = torch.cuda.is_available() and spattn.build_info()["gpus"] > 0


def sdpa(q, k, v, spec, layout="blhd", scale=None):
    """Dense SDPA with the pattern's boolean mask (GQA by repeating K/V heads); returns q's layout.

    Rows that keep no key are zeroed (SDPA gives NaN there; spattn defines O = 0)."""
    if layout == "blhd":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    m = torch.from_numpy(spattn.mask(spec, q.shape[2], k.shape[2])).to(q.device)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=scale)
    o = torch.where(m.any(1)[:, None], o, torch.zeros((), dtype=o.dtype, device=o.device))
    return o.transpose(1, 2) if layout == "blhd" else o


def qkv(B=2, L=40, H=4, HK=2, D=16, layout="blhd", dtype=torch.float32, device="cpu", grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (lambda h: (B, L, h, D)) if layout == "blhd" else (lambda h: (B, h, L, D))
    out = [torch.randn(shape(h), generator=g, dtype=torch.float64).to(dtype=dtype, device=device) for h in (H, HK, HK)]
    return [x.requires_grad_(grad) for x in out]


@pytest.mark.parametrize("layout", ["blhd", "bhld"])
@pytest.mark.parametrize("spec", ["local(4) | global(0)", "causal", "bigbird(4, 1, 1, 2, seed=1)", "global_rows(0:3)"])
def test_forward_matches_sdpa(spec, layout):
    q, k, v = qkv(layout=layout)
    o, lse = st.sparse_attention(q, k, v, spec, layout=layout, return_lse=True)
    assert o.shape == q.shape and o.dtype == q.dtype and o.is_contiguous()
    assert lse.shape == (2, 4, 40) and lse.dtype == torch.float32 and not lse.requires_grad
    torch.testing.assert_close(o, sdpa(q, k, v, spec, layout), rtol=1e-5, atol=2e-6)


def test_bhld_is_read_in_place():
    """A [B, H, L, D] tensor and its [B, L, H, D] transposed view give the same result, without copies."""
    q, k, v = qkv(layout="bhld")
    a = st.sparse_attention(q, k, v, "local(3)", layout="bhld")
    b = st.sparse_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), "local(3)")
    torch.testing.assert_close(a.transpose(1, 2), b, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_dtypes(dtype):
    q, k, v = qkv(dtype=dtype)
    o = st.sparse_attention(q, k, v, "local(4)", scale=0.3)
    assert o.dtype == dtype
    ref = sdpa(q.double(), k.double(), v.double(), "local(4)", scale=0.3)
    tol = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float64: 1e-12}[dtype]
    torch.testing.assert_close(o.double(), ref, rtol=tol, atol=tol)


def test_tile_map_in_the_options_string():
    """tile_map goes through the op's options string to spattn.plan (the CPU engine ignores it; -1 is left out)."""
    assert st._options(tile_map=1) == "tile_map=1" and st._options(tile_map=-1) == ""
    assert st._parse_options("layout=bhld,tile_map=0")["tile_map"] == 0
    spec = "neighborhood(dims=(5, 8), kernel=3)"
    q, k, v = qkv()
    torch.testing.assert_close(st.sparse_attention(q, k, v, spec, tile_map=1), sdpa(q, k, v, spec), rtol=1e-5, atol=2e-6)
    assert "tile_map=0" in repr(st.SparseAttention(spec, tile_map=0))
    with pytest.raises(spattn.Error, match="tile_map must be"):
        st.sparse_attention(q, k, v, spec, tile_map=3)


def test_module_is_an_sdpa_drop_in():
    q, k, v = qkv(layout="bhld", HK=4)
    attn = st.SparseAttention("causal & local(6)", layout="bhld")
    assert "causal & local(6)" in repr(attn)
    torch.testing.assert_close(attn(q, k, v), sdpa(q, k, v, "causal & local(6)", "bhld"), rtol=1e-5, atol=2e-6)


def test_module_and_function_share_the_default_layout():
    """SparseAttention and sparse_attention read the same tensors the same way by default ([B, L, H, D])."""
    q, k, v = qkv(HK=4)
    torch.testing.assert_close(st.SparseAttention("causal & local(6)")(q, k, v),
                               st.sparse_attention(q, k, v, "causal & local(6)"), rtol=0, atol=0)
    torch.testing.assert_close(st.SparseAttention("causal")(q, k, v), sdpa(q, k, v, "causal"), rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
@pytest.mark.parametrize("cast", [torch.bfloat16, torch.float16])
def test_autocast_returns_what_sdpa_returns(dtype, cast):
    """Under torch.autocast spattn runs in the autocast dtype, as SDPA does (float64 is left alone)."""
    q, k, v = (x.to(dtype) for x in qkv(layout="bhld", HK=4))
    with torch.autocast("cpu", dtype=cast):
        want = F.scaled_dot_product_attention(q, k, v).dtype
        got = [st.sparse_attention(q, k, v, "dense", layout="bhld"),
               st.SparseAttention("dense", layout="bhld")(q, k, v),
               st.neighborhood_attention(*(x.transpose(1, 2).unflatten(1, (5, 8)) for x in (q, k, v)), 3)]
    assert [o.dtype for o in got] == [want] * 3
    ref = F.scaled_dot_product_attention(*(x.to(want) for x in (q, k, v))).float()
    torch.testing.assert_close(got[0].float(), ref, rtol=2e-2, atol=2e-2)


def test_batch_zero_as_sdpa():
    """Batch 0 gives empty outputs and gradients with SDPA's shapes (no plan is built)."""
    q, k, v = (x[:0].clone().requires_grad_() for x in qkv(layout="bhld", HK=2))
    o = st.sparse_attention(q, k, v, "causal", layout="bhld")
    assert o.shape == F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)).shape
    o.sum().backward()
    assert q.grad.shape == q.shape and k.grad.shape == k.shape and v.grad.shape == v.shape
    with torch.no_grad():
        o, lse = st.sparse_attention(q, k, v, "causal", layout="bhld", return_lse=True)
    assert o.shape == (0, 4, 40, 16) and lse.shape == (0, 4, 40)


def test_one_plan_cache_for_the_package():
    """spattn.attention and spattn.torch share one cache: clear_cache empties both, cached_plans lists both."""
    st.clear_cache()
    q, k, v = qkv()
    spattn.attention(q, k, v, "local(3)")
    st.sparse_attention(q, k, v, "local(3)")
    assert len(st.cached_plans()) == 2 and all(isinstance(p, spattn.Plan) for p in st.cached_plans())
    st.clear_cache()
    assert st.cached_plans() == []


def test_plan_and_attention_on_torch_tensors():
    """The plain (non-operator) API on torch tensors: outputs are torch tensors on the inputs' device."""
    q, k, v = qkv()
    o, lse = spattn.attention(q, k, v, "local(4)", return_lse=True)
    assert isinstance(o, torch.Tensor) and o.dtype == torch.float32 and lse.shape == (2, 4, 40)
    torch.testing.assert_close(o, sdpa(q, k, v, "local(4)"), rtol=1e-5, atol=2e-6)
    p = spattn.plan("local(4)", 40, 40, 4, 2, 16, batch=2)
    if not backward_missing():  # the CPU engines recompute the softmax: o and lse may be None
        dq, dk, dv = p.backward(q, k, v, None, None, torch.ones_like(o))
        assert dq.shape == q.shape and dk.shape == k.shape and dv.dtype == torch.float32


def test_per_head_patterns():
    q, k, v = qkv(H=2, HK=2)
    o = st.sparse_attention(q, k, v, ["local(2)", spattn.Pattern("causal")])
    torch.testing.assert_close(o[:, :, :1], sdpa(q[:, :, :1], k[:, :, :1], v[:, :, :1], "local(2)"))
    torch.testing.assert_close(o[:, :, 1:], sdpa(q[:, :, 1:], k[:, :, 1:], v[:, :, 1:], "causal"))


def test_plans_are_cached():
    st.clear_cache()
    q, k, v = qkv()
    st.sparse_attention(q, k, v, "local(2)")
    st.sparse_attention(q + 1, k, v, "local(2)")
    assert len(st.cached_plans()) == 1
    st.sparse_attention(q[:, :20], k, v, "local(2)")
    assert len(st.cached_plans()) == 2
    assert st.cached_plans()[0].kernel().startswith("cpu_fused")


def test_errors_carry_the_cpp_message():
    q, k, v = qkv()
    with pytest.raises(spattn.Error, match="column"):
        st.sparse_attention(q, k, v, "local(")
    with pytest.raises(spattn.Error, match="layout 'lbhd'"):
        st.sparse_attention(q, k, v, "local(1)", layout="lbhd")
    with pytest.raises(spattn.Error, match="heads .* multiple of kv heads"):
        st.sparse_attention(q[:, :, :3], k, v, "local(1)")


def test_opcheck_forward():
    q, k, v = qkv(B=1, L=16, H=2, HK=1, D=8)
    for layout in ("blhd", "bhld"):
        args = (q, k, v, "local(2) | global(0)", st._options(layout=layout, scale=0.5))
        torch.library.opcheck(torch.ops.spattn.sparse_attention.default, args)


def test_nograd_operator_serves_calls_without_gradients():
    """Calls that need no gradient run spattn::sparse_attention_nograd (no custom_op wrapper), with the same result;
    calls that need one run the autograd operator."""
    q, k, v = qkv(B=1, L=16, H=2, HK=1, D=8)
    torch.library.opcheck(torch.ops.spattn.sparse_attention_nograd.default, (q, k, v, "local(2)", ""))
    seen = []

    class Spy(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with Spy():
        o = st.sparse_attention(q, k, v, "local(2)")
    assert any("sparse_attention_nograd" in f for f in seen), seen
    seen.clear()
    qg = q.clone().requires_grad_()
    with Spy():
        og = st.sparse_attention(qg, k, v, "local(2)")
    assert not any("sparse_attention_nograd" in f for f in seen), seen
    torch.testing.assert_close(o, og.detach())
    with torch.no_grad():
        seen.clear()
        with Spy():
            st.SparseAttention("local(2)", layout="blhd")(qg, k, v)
        assert any("sparse_attention_nograd" in f for f in seen), seen


def test_opcheck_with_autograd():
    need_backward()
    q, k, v = qkv(B=1, L=16, H=2, HK=1, D=8, grad=True)
    torch.library.opcheck(torch.ops.spattn.sparse_attention.default, (q, k, v, "local(2) | global(0)", ""))
    qb, kb, vb = qkv(B=1, L=16, H=2, HK=1, D=8, grad=True, layout="bhld")
    torch.library.opcheck(torch.ops.spattn.sparse_attention.default, (qb, kb, vb, "causal", "layout=bhld"))


@pytest.mark.parametrize("layout", ["blhd", "bhld"])
def test_gradcheck_fp64(layout):
    need_backward()
    q, k, v = qkv(B=1, L=12, H=2, HK=1, D=4, dtype=torch.float64, grad=True, layout=layout)
    f = lambda q, k, v: st.sparse_attention(q, k, v, "local(2) | global(0)", layout=layout)  # noqa: E731
    assert torch.autograd.gradcheck(f, (q, k, v))


@pytest.mark.parametrize("spec", ["local(4) | global(0)", "causal", "global_rows(0:3)"])
def test_gradients_match_sdpa(spec):
    need_backward()
    q, k, v = qkv(grad=True)
    q2, k2, v2 = (x.detach().clone().requires_grad_() for x in (q, k, v))
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(9))
    st.sparse_attention(q, k, v, spec).backward(dout)
    sdpa(q2, k2, v2, spec).backward(dout)
    for a, b in ((q, q2), (k, k2), (v, v2)):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5)


def test_backward_with_broadcast_dout_and_half_precision():
    """o.sum() hands backward a stride-0 dout; bf16 / fp16 inputs get gradients in their dtype."""
    need_backward()
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        q, k, v = qkv(dtype=dtype, grad=True)
        o, lse = st.sparse_attention(q, k, v, "local(3) | global(1)", return_lse=True)
        assert not lse.requires_grad
        o.sum().backward()
        q2, k2, v2 = (x.detach().double().requires_grad_() for x in (q, k, v))
        sdpa(q2, k2, v2, "local(3) | global(1)").sum().backward()
        tol = 1e-5 if dtype == torch.float32 else 3e-2
        for a, b in ((q, q2), (k, k2), (v, v2)):
            assert a.grad.dtype == dtype
            torch.testing.assert_close(a.grad.double(), b.grad, rtol=tol, atol=tol)


class TinyBlock(torch.nn.Module):
    def __init__(self, d=16, heads=2, spec="causal & local(5)"):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.out = torch.nn.Linear(d, d)
        self.attn = st.SparseAttention(spec, layout="blhd")

    def forward(self, x):
        B, L, d = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.heads, d // self.heads).unbind(2)
        return self.out(self.attn(q, k, v).reshape(B, L, d)) + x


def test_compile_fullgraph_forward():
    torch._dynamo.reset()
    m = TinyBlock()
    x = torch.randn(2, 24, 16)
    explain = torch._dynamo.explain(m)(x)
    assert explain.graph_break_count == 0 and explain.graph_count == 1
    c = torch.compile(m, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(c(x), m(x), rtol=1e-5, atol=1e-5)


def test_compile_fullgraph_backward():
    need_backward()
    torch._dynamo.reset()
    m = TinyBlock()
    x = torch.randn(2, 24, 16)
    c = torch.compile(m, fullgraph=True)
    c(x).square().mean().backward()
    grads = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    m(x).square().mean().backward()
    for a, b in zip(grads, (p.grad for p in m.parameters())):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_train_tiny_example():
    need_backward()
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "train_tiny.py"), "--steps", "3"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "match" in r.stdout


# ---- CUDA (skipped without a GPU and a CUDA build) -----------------------------------------------------
cuda = pytest.mark.skipif(not CUDA, reason="needs a GPU and a spattn build with CUDA")


@cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("layout", ["blhd", "bhld"])
def test_cuda_forward_matches_sdpa(dtype, layout):
    q, k, v = qkv(B=2, L=256, H=4, HK=2, D=64, dtype=dtype, device="cuda", layout=layout)
    o = st.sparse_attention(q, k, v, "longformer(32, 4)", layout=layout)
    assert o.dtype == dtype and o.device == q.device
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(o.float(), sdpa(q.float(), k.float(), v.float(), "longformer(32, 4)", layout),
                               rtol=tol, atol=tol)


@cuda
@pytest.mark.parametrize("tile_map", [1, 0])
def test_cuda_neighborhood_tile_map(tile_map):
    """A 2-D neighborhood in multi-dimensional tiles (tile_map=1) or row-major ones (0), forward and backward."""
    spec = "neighborhood(dims=(16, 24), kernel=(5, 7))"
    st.clear_cache()
    q, k, v = qkv(B=1, L=384, H=2, HK=2, D=64, dtype=torch.bfloat16, device="cuda", grad=True)
    o = st.sparse_attention(q, k, v, spec, tile_map=tile_map)
    torch.testing.assert_close(o.float(), sdpa(q.float(), k.float(), v.float(), spec), rtol=2e-2, atol=2e-2)
    explain = [p.explain() for p in st.cached_plans() if "neighborhood" in p.explain()]
    assert explain and all(("tile map: query tiles" in e) == (tile_map == 1) for e in explain), explain
    if not backward_missing("cuda:0"):
        o.float().sum().backward()
        assert all(torch.isfinite(x.grad).all() for x in (q, k, v))


@cuda
def test_cuda_runs_on_the_current_stream():
    """Captured into a CUDA graph on a side stream: a launch on any other stream would fail the capture."""
    q, k, v = qkv(B=1, L=256, H=4, HK=4, D=64, dtype=torch.bfloat16, device="cuda")
    ref = st.sparse_attention(q, k, v, "local(16)")
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = st.sparse_attention(q, k, v, "local(16)")
    q.copy_(q * 0.5)
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, st.sparse_attention(q, k, v, "local(16)"))
    assert not torch.equal(out, ref)


@cuda
def test_cuda_opcheck_and_compile():
    q, k, v = qkv(B=1, L=128, H=2, HK=1, D=64, dtype=torch.bfloat16, device="cuda")
    torch.library.opcheck(torch.ops.spattn.sparse_attention.default, (q, k, v, "causal", ""))
    torch._dynamo.reset()
    m = TinyBlock(d=128, heads=2).cuda().bfloat16()
    x = torch.randn(1, 128, 128, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(m, fullgraph=True)(x), m(x), rtol=2e-2, atol=2e-2)


@cuda
def test_cuda_gradients_match_sdpa():
    need_backward("cuda:0")
    q, k, v = qkv(B=1, L=128, H=2, HK=2, D=64, dtype=torch.bfloat16, device="cuda", grad=True)
    q2, k2, v2 = (x.detach().float().requires_grad_() for x in (q, k, v))
    st.sparse_attention(q, k, v, "local(16) | global(0)").float().square().sum().backward()
    sdpa(q2, k2, v2, "local(16) | global(0)").square().sum().backward()
    for a, b in ((q, q2), (k, k2), (v, v2)):
        torch.testing.assert_close(a.grad.float(), b.grad, rtol=5e-2, atol=5e-2)
