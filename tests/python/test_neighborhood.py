"""spattn.torch.neighborhood_attention (issue 23): [B, *spatial, H, D] activations, NATTEN's conventions.

The reference is dense attention in fp64 with a mask built here from the window definition of docs/PATTERNS.md
(per axis, combined over the row-major grid), independent of the spec text the API builds."""
from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import spattn  # noqa: E402
import spattn.torch as st  # noqa: E402
from conftest import backward_missing, need_backward  # noqa: E402

CUDA = torch.cuda.is_available() and spattn.build_info()["gpus"] > 0


def axis_mask(n, K, d, causal):
    """[n, n] bool: key coordinate j in query coordinate i's window on one axis (docs/PATTERNS.md)."""
    m = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        g, p = i % d, i // d
        ng = (n - 1 - g) // d + 1
        if causal:
            ts = range(max(0, p - K + 1), p + 1)
        else:
            s = min(max(p - K // 2, 0), ng - K)
            ts = range(s, s + K)
        for t in ts:
            m[i, g + t * d] = True
    return m


def grid_mask(spatial, kernel, dilation, causal):
    """[L, L] bool over the row-major grid: (q, k) kept when every axis keeps it."""
    m = torch.ones(1, 1, dtype=torch.bool)
    for n, K, d, c in zip(spatial, kernel, dilation, causal):
        a = axis_mask(n, K, d, c)
        m = (m[:, None, :, None] & a[None, :, None, :]).reshape(m.shape[0] * n, m.shape[1] * n)
    return m


def per_axis(x, naxes):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,) * naxes


def dense_na(q, k, v, kernel, dilation=1, causal=False, scale=None):
    """(O [B, *spatial, H, Dv], LSE [B, *spatial, H]) in fp64 by dense masked attention (GQA by repeating K/V heads)."""
    B, spatial, (H, D) = q.shape[0], tuple(q.shape[1:-2]), q.shape[-2:]
    n = len(spatial)
    L = math.prod(spatial)
    m = grid_mask(spatial, per_axis(kernel, n), per_axis(dilation, n), per_axis(causal, n)).to(q.device)
    qf, kf, vf = (x.reshape(B, L, x.shape[-2], x.shape[-1]).double().transpose(1, 2) for x in (q, k, v))
    g = H // kf.shape[1]
    kf, vf = kf.repeat_interleave(g, 1), vf.repeat_interleave(g, 1)
    s = (qf @ kf.transpose(-1, -2)) * (D ** -0.5 if scale is None else scale)
    s = s.masked_fill(~m, float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.softmax(s, -1) @ vf
    return o.transpose(1, 2).reshape(B, *spatial, H, vf.shape[-1]), lse.transpose(1, 2).reshape(B, *spatial, H)


def qkv(spatial, H=2, HK=2, D=8, B=2, dtype=torch.float64, device="cpu", grad=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = [torch.randn((B, *spatial, h, D), generator=g, dtype=torch.float64).to(dtype=dtype, device=device)
           for h in (H, HK, HK)]
    return [x.requires_grad_(grad) for x in out]


def test_axis_windows_by_hand():
    """The reference's windows on small cases, written out: shifted at the borders, K keys each (non-causal)."""
    rows = lambda m: [torch.nonzero(r).flatten().tolist() for r in m]  # noqa: E731
    assert rows(axis_mask(6, 3, 1, False)) == [[0, 1, 2], [0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 5], [3, 4, 5]]
    assert rows(axis_mask(6, 4, 1, False))[3] == [1, 2, 3, 4]  # even: one more key before the query
    assert rows(axis_mask(7, 2, 2, False)) == [[0, 2], [1, 3], [0, 2], [1, 3], [2, 4], [3, 5], [4, 6]]
    assert rows(axis_mask(5, 3, 1, True)) == [[0], [0, 1], [0, 1, 2], [1, 2, 3], [2, 3, 4]]


CASES = {  # name: (spatial, kernel_size, dilation, is_causal, H, HK)
    "1d": ((24,), 5, 1, False, 2, 2),
    "1d_even_dilated_causal": ((21,), 4, 3, True, 2, 1),
    "2d_dilated_nonsquare": ((6, 10), (3, 5), (2, 1), False, 2, 2),
    "2d_gqa": ((5, 7), 3, 1, (False, True), 4, 2),
    "3d_causal_first_axis": ((4, 5, 6), (2, 3, 3), (1, 1, 2), (True, False, False), 2, 2),
    "3d_mqa": ((3, 4, 5), 3, 1, False, 4, 1),
}


@pytest.mark.parametrize("case", list(CASES))
def test_matches_dense_fp64(case):
    spatial, K, d, c, H, HK = CASES[case]
    q, k, v = qkv(spatial, H=H, HK=HK)
    n = len(spatial)
    # the spec the API builds is the grid's mask
    spec = spattn.neighborhood_spec(spatial, K, d, c)
    assert np.array_equal(spattn.mask(spec, math.prod(spatial)),
                          grid_mask(spatial, per_axis(K, n), per_axis(d, n), per_axis(c, n)).numpy())
    o, lse = st.neighborhood_attention(q, k, v, K, dilation=d, is_causal=c, return_lse=True)
    ro, rlse = dense_na(q, k, v, K, d, c)
    assert o.shape == q.shape and o.dtype == torch.float64 and lse.shape == q.shape[:-1]
    torch.testing.assert_close(o, ro, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, rlse, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", ["1d", "2d_dilated_nonsquare", "3d_causal_first_axis", "2d_gqa"])
def test_fp32_cpu_engine(case):
    """float32 runs the CPU fused engine (the fp64 cases run the reference engine)."""
    spatial, K, d, c, H, HK = CASES[case]
    q, k, v = qkv(spatial, H=H, HK=HK, D=16, dtype=torch.float32)
    o = st.neighborhood_attention(q, k, v, K, dilation=d, is_causal=c, scale=0.3)
    assert o.dtype == torch.float32
    torch.testing.assert_close(o.double(), dense_na(q, k, v, K, d, c, scale=0.3)[0], rtol=1e-5, atol=2e-6)


@pytest.mark.parametrize("case", ["1d_even_dilated_causal", "2d_gqa", "3d_causal_first_axis"])
def test_gradients_match_dense_fp64(case):
    need_backward()
    spatial, K, d, c, H, HK = CASES[case]
    q, k, v = qkv(spatial, H=H, HK=HK, grad=True)
    q2, k2, v2 = (x.detach().clone().requires_grad_() for x in (q, k, v))
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    st.neighborhood_attention(q, k, v, K, dilation=d, is_causal=c).backward(dout)
    dense_na(q2, k2, v2, K, d, c)[0].backward(dout)
    for a, b in ((q, q2), (k, k2), (v, v2)):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-10)


def test_gradcheck_2d():
    need_backward()
    q, k, v = qkv((3, 6), H=2, HK=1, D=3, B=1, grad=True)
    assert torch.autograd.gradcheck(lambda q, k, v: st.na2d(q, k, v, (2, 3), dilation=(1, 2)), (q, k, v))


class Spy(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the ops run and the data pointers of the tensors the spattn op received."""

    def __init__(self):
        super().__init__()
        self.ops, self.ptrs = [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        if "spattn" in str(func):
            self.ptrs.append([a.data_ptr() for a in args[:3]])
        return func(*args, **(kwargs or {}))


def copies(ops):
    return [f for f in ops if any(w in f for w in ("clone", "copy", "contiguous"))]


def test_contiguous_input_is_a_view():
    """Contiguous [B, X, Y, H, D] tensors, and slices of a fused qkv projection, reach the op in place."""
    q, k, v = qkv((6, 8), H=2, HK=2, D=8, dtype=torch.float32)
    with Spy() as spy:
        o = st.neighborhood_attention(q, k, v, 3)
    assert spy.ptrs == [[q.data_ptr(), k.data_ptr(), v.data_ptr()]], spy.ptrs
    assert not copies(spy.ops), spy.ops
    assert o.is_contiguous()
    fused = torch.randn(2, 6, 8, 3, 2, 8)  # [B, X, Y, (q, k, v), H, D]: strided but row-major over X, Y
    qs, ks, vs = fused.unbind(3)
    with Spy() as spy:
        o2 = st.neighborhood_attention(qs, ks, vs, 3)
    assert spy.ptrs == [[qs.data_ptr(), ks.data_ptr(), vs.data_ptr()]] and not copies(spy.ops), spy.ops
    torch.testing.assert_close(o2.double(), dense_na(qs, ks, vs, 3)[0], rtol=1e-5, atol=2e-6)


def test_non_row_major_input_is_copied_and_correct():
    """A grid whose spatial axes are transposed in memory cannot be flattened in place: reshape copies."""
    q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in qkv((5, 7)))
    assert not q.is_contiguous()
    with Spy() as spy:
        o = st.neighborhood_attention(q, k, v, (3, 5), dilation=(1, 1))
    assert spy.ptrs and spy.ptrs[0][0] != q.data_ptr()
    torch.testing.assert_close(o, dense_na(q, k, v, (3, 5))[0], rtol=1e-12, atol=1e-12)


def test_plans_are_cached_per_spec_and_shape():
    st.clear_cache()
    q, k, v = qkv((6, 8), dtype=torch.float32)
    st.neighborhood_attention(q, k, v, 3)
    st.na2d(q + 1, k, v, [3, 3])  # same spec and shapes: the same plan
    assert len(st.cached_plans()) == 1
    st.neighborhood_attention(q, k, v, 3, dilation=2)
    assert len(st.cached_plans()) == 2
    assert "neighborhood(dims=(6, 8), kernel=3, dilation=2)" in repr(st.cached_plans()[1])


def test_natten_signature_and_aliases():
    """stride, dilation and is_causal positionally in NATTEN's order; None for their defaults; na1d/na2d/na3d."""
    q, k, v = qkv((6, 8))
    ref = dense_na(q, k, v, (3, 5), (2, 1), (True, False))[0]
    torch.testing.assert_close(st.neighborhood_attention(q, k, v, (3, 5), 1, (2, 1), (True, False)), ref)
    torch.testing.assert_close(st.na2d(q, k, v, kernel_size=(3, 5), stride=None, dilation=[2, 1], is_causal=[True, False]), ref)
    torch.testing.assert_close(st.na2d(q, k, v, 3, None, None, None), dense_na(q, k, v, 3)[0])
    q1, k1, v1 = qkv((12,))
    torch.testing.assert_close(st.na1d(q1, k1, v1, 5, scale=0.5), dense_na(q1, k1, v1, 5, scale=0.5)[0])
    q3, k3, v3 = qkv((3, 3, 4))
    o, lse = st.na3d(q3, k3, v3, 3, return_lse=True)
    torch.testing.assert_close(lse, dense_na(q3, k3, v3, 3)[1])
    with pytest.raises(spattn.Error, match=r"na3d: query has shape \(2, 6, 8, 2, 8\), expected 6 dimensions"):
        st.na3d(q, k, v, 3)


def test_neighborhood_spec_text():
    assert spattn.neighborhood_spec(64, 7) == "neighborhood(dims=64, kernel=7)"
    assert spattn.neighborhood_spec((16, 32), 7, (1, 2)) == "neighborhood(dims=(16, 32), kernel=7, dilation=(1, 2))"
    assert (spattn.neighborhood_spec((4, 8, 8), (3, 5, 5), is_causal=(True, False, False))
            == "neighborhood(dims=(4, 8, 8), kernel=(3, 5, 5), causal=(1, 0, 0))")


@pytest.mark.parametrize("call, message", [
    (lambda q, k, v: st.neighborhood_attention(q[0, 0], k[0, 0], v[0, 0], 3), r"q has shape \(8, 2, 8\).*1 to 3 spatial axes"),
    (lambda q, k, v: st.neighborhood_attention(*(x[:, :, :, None, None] for x in (q, k, v)), 1),
     r"q has shape \(2, 6, 8, 1, 1, 2, 8\).*got 7 dimensions"),
    (lambda q, k, v: st.neighborhood_attention(q, k, v, (3, 9)),
     r"kernel_size 9 with dilation 1 does not fit spatial axis 1 of size 8 \(spatial shape \(6, 8\)\)"),
    (lambda q, k, v: st.neighborhood_attention(q, k, v, 4, dilation=2),
     r"kernel_size 4 with dilation 2 does not fit spatial axis 0 of size 6"),
    (lambda q, k, v: st.neighborhood_attention(q, k, v, 7, is_causal=True), r"kernel_size 7 with dilation 1 does not fit"),
    (lambda q, k, v: st.neighborhood_attention(q, k, v, 0), r"kernel_size 0: expected an int >= 1"),
    (lambda q, k, v: st.neighborhood_attention(q, k, v, (3, 3, 3)), r"kernel_size \(3, 3, 3\) has 3 values for 2 spatial axes"),
    (lambda q, k, v: st.neighborhood_attention(q, k, v, 3.0), r"kernel_size 3.0: expected an int"),
    (lambda q, k, v: st.neighborhood_attention(q, k, v, 3, dilation=(1, 0)), r"dilation \(1, 0\): expected an int >= 1"),
    (lambda q, k, v: st.neighborhood_attention(q, k, v, 3, is_causal=2), r"is_causal 2: expected a bool"),
    (lambda q, k, v: st.neighborhood_attention(q, k, v, 3, stride=2), r"stride 2: only stride 1 is supported"),
    (lambda q, k, v: st.neighborhood_attention(q, k[:, :, :7], v[:, :, :7], 3), r"shapes \(2, 6, 8, 2, 8\), \(2, 6, 7, 2, 8\)"),
    (lambda q, k, v: st.neighborhood_attention(q, k, v[:, :, :, :1], 3), r"k and v with the same heads"),
    (lambda q, k, v: st.neighborhood_attention(q, k[..., :4], v, 3), r"head dims differ: q 8 and k 4"),
    (lambda q, k, v: st.neighborhood_attention(q[:, :, :, :1].expand(-1, -1, -1, 3, -1), k, v, 3),
     r"heads .* multiple of kv heads"),
])
def test_errors_name_the_value(call, message):
    q, k, v = qkv((6, 8))
    with pytest.raises(spattn.Error, match=message):
        call(q, k, v)


def test_compile_fullgraph():
    torch._dynamo.reset()

    def f(q, k, v):
        return st.na2d(q, k, v, (3, 5), dilation=(2, 1)) * 2

    q, k, v = qkv((6, 8), dtype=torch.float32)
    explain = torch._dynamo.explain(f)(q, k, v)
    assert explain.graph_break_count == 0 and explain.graph_count == 1
    torch.testing.assert_close(torch.compile(f, fullgraph=True)(q, k, v), f(q, k, v))


# ---- CUDA (skipped without a GPU and a CUDA build) -----------------------------------------------------
cuda = pytest.mark.skipif(not CUDA, reason="needs a GPU and a spattn build with CUDA")


@cuda
@pytest.mark.parametrize("spatial, K, d, c, H, HK, D, dtype", [
    ((256,), 33, 1, False, 4, 2, 128, torch.float16),
    ((16, 24), (5, 7), (2, 1), False, 4, 2, 64, torch.bfloat16),
    ((6, 16, 16), (3, 5, 5), (1, 1, 2), (True, False, False), 2, 2, 64, torch.bfloat16),
    ((12, 20), 5, 1, (False, True), 2, 1, 32, torch.float32),
])
def test_cuda_matches_dense(spatial, K, d, c, H, HK, D, dtype):
    q, k, v = qkv(spatial, H=H, HK=HK, D=D, dtype=dtype, device="cuda", grad=True)
    with Spy() as spy:
        o, lse = st.neighborhood_attention(q, k, v, K, dilation=d, is_causal=c, return_lse=True)
    assert spy.ptrs[0] == [q.data_ptr(), k.data_ptr(), v.data_ptr()] and not copies(spy.ops), spy.ops
    assert o.dtype == dtype and o.device == q.device and o.shape == q.shape
    ro, rlse = dense_na(q.detach(), k.detach(), v.detach(), K, d, c)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(o.double(), ro, rtol=tol, atol=tol)
    torch.testing.assert_close(lse.double(), rlse, rtol=tol, atol=tol)
    if backward_missing("cuda:0"):
        return
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    o.backward(dout.to(device=q.device, dtype=dtype))
    q2, k2, v2 = (x.detach().double().requires_grad_() for x in (q, k, v))
    dense_na(q2, k2, v2, K, d, c)[0].backward(dout.to(q.device))
    for a, b in ((q, q2), (k, k2), (v, v2)):  # relative to the gradient's norm: bf16 / fp16 P and dS
        assert ((a.grad.double() - b.grad).norm() / b.grad.norm()).item() < (1e-4 if dtype == torch.float32 else 3e-2)
