"""Masks chosen at run time through spattn.torch.sparse_attention: a FlexAttention BlockMask, cu_seqlens (packed
documents) and topk_indices, against a dense fp64 attention over the boolean mask this file builds from the
semantics' words; autograd; torch.compile(fullgraph=True) with fresh mask contents every call; check=True's errors.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
flex = pytest.importorskip("torch.nn.attention.flex_attention")

import spattn  # noqa: E402
import spattn.torch as st  # noqa: E402

CUDA = torch.cuda.is_available() and spattn.build_info()["gpus"] > 0
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])


def dense(q, k, v, mask):
    """fp64 attention of [B, L, H, D] tensors over a boolean mask [B, H, Lq, Lk] (GQA: K/V heads repeated); rows
    without keys give 0."""
    q, k, v = (x.double().transpose(1, 2) for x in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return (p @ v).transpose(1, 2)


def qkv(B, Lq, Lk, H, HK, D=16, dtype=torch.float64, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    out = [torch.randn(s, generator=g, dtype=torch.float64) for s in ((B, Lq, H, D), (B, Lk, HK, D), (B, Lk, HK, D))]
    return [x.to(dtype=dtype, device=device).requires_grad_(True) for x in out]


def random_block_mask(B, H, Lq, Lk, QB, KB, seed, full=True):
    """A BlockMask of random key blocks per query block (some full), noop mask_mod; and its element mask for `spec`."""
    g = torch.Generator().manual_seed(seed)
    nq, nk = -(-Lq // QB), -(-Lk // KB)
    perm = torch.stack([torch.randperm(nk, generator=g) for _ in range(B * H * nq)]).view(B, H, nq, nk)
    n = torch.randint(0, nk + 1, (B, H, nq), generator=g)
    f = (torch.rand((B, H, nq), generator=g) * (n + 1)).long().clamp(max=n) if full else torch.zeros_like(n)
    j = torch.arange(nk)
    full_idx = perm.clone()  # full blocks: perm[0 : f]; partial: perm[f : n], moved to the front
    part_idx = torch.stack([torch.roll(perm[b, h, i], -int(f[b, h, i])) for b in range(B) for h in range(H)
                            for i in range(nq)]).view(B, H, nq, nk)
    bm = flex.BlockMask.from_kv_blocks((n - f).int(), part_idx.int(), f.int() if full else None,
                                       full_idx.int() if full else None, BLOCK_SIZE=(QB, KB), seq_lengths=(Lq, Lk))
    listed = lambda idx, cnt: (j[None, None, None, :] < cnt[..., None])  # noqa: E731
    part = torch.zeros(B, H, nq, nk, dtype=torch.bool).scatter_(3, part_idx, listed(part_idx, n - f))
    fullb = torch.zeros(B, H, nq, nk, dtype=torch.bool).scatter_(3, full_idx, listed(full_idx, f)) if full else \
        torch.zeros_like(part)
    up = lambda m: m.repeat_interleave(QB, 2)[:, :, :Lq].repeat_interleave(KB, 3)[..., :Lk]  # noqa: E731
    return bm, up(part), up(fullb)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec", [None, "causal", "local(20)"])
def test_block_mask_forward_backward(device, spec):
    B, H, HK, Lq, Lk, QB, KB = 2, 4, 2, 200, 170, 64, 32
    if device == "cuda":
        QB = KB = 64
    bm, part, fullb = random_block_mask(B, H, Lq, Lk, QB, KB, seed=3)
    dtype = torch.float64 if device == "cpu" else torch.bfloat16
    q, k, v = qkv(B, Lq, Lk, H, HK, dtype=dtype, device=device)
    static = torch.from_numpy(spattn.mask(spec, Lq, Lk)) if spec else torch.ones(Lq, Lk, dtype=torch.bool)
    mask = fullb | (part & static)
    if device == "cuda":
        bm = bm.to(device)
    o = st.sparse_attention(q, k, v, bm, spec=spec, check=True)
    ref = dense(q.cpu(), k.cpu(), v.cpu(), mask)
    tol = 1e-10 if device == "cpu" else 3e-2
    assert (o.cpu().double() - ref).abs().max() < tol
    dout = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), dout)
    qr, kr, vr = (x.detach().cpu().double().requires_grad_(True) for x in (q, k, v))
    ref_grads = torch.autograd.grad(dense(qr, kr, vr, mask), (qr, kr, vr), dout.cpu().double())
    for a, b in zip(grads, ref_grads):
        assert (a.cpu().double() - b).abs().max() < (1e-9 if device == "cpu" else 5e-2)


def test_block_mask_from_create_block_mask_needs_its_spec():
    def causal(b, h, q, k):
        return q >= k
    bm = flex.create_block_mask(causal, 1, 2, 300, 300, device="cpu", BLOCK_SIZE=64)
    q, k, v = qkv(1, 300, 300, 2, 2)
    with pytest.raises(spattn.Error, match="mask_mod 'causal'.*spec='causal'"):
        st.sparse_attention(q, k, v, bm)
    o = st.sparse_attention(q, k, v, bm, spec="causal")
    mask = torch.ones(300, 300, dtype=torch.bool).tril()
    assert (o - dense(q, k, v, mask)).abs().max() < 1e-10


def random_documents(L, n, g, gaps=False):
    cu = torch.sort(torch.randint(0, L + 1, (n + 1,), generator=g)).values
    if not gaps:
        cu[0], cu[-1] = 0, L
    return cu.int()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec", [None, "causal", "local(left=6, right=0)"])
def test_documents(device, spec):
    g = torch.Generator().manual_seed(5)
    B, H, HK, L = 1, 4, 1, 257
    dtype = torch.float64 if device == "cpu" else torch.bfloat16
    q, k, v = qkv(B, L, L, H, HK, dtype=dtype, device=device)
    for trial in range(3):  # new boundaries every call, one plan
        cu = random_documents(L, 7, g, gaps=trial == 2)
        mask = torch.zeros(L, L, dtype=torch.bool)
        for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
            n = b - a
            m = torch.ones(n, n, dtype=torch.bool)
            if spec == "causal":
                m = m.tril()
            elif spec:
                m = m.tril() & ~m.tril(-7)
            mask[a:b, a:b] = m
        o = st.sparse_attention(q, k, v, spec, cu_seqlens=cu.to(device), check=True)
        ref = dense(q.cpu(), k.cpu(), v.cpu(), mask)
        assert (o.cpu().double() - ref).abs().max() < (1e-10 if device == "cpu" else 3e-2)
        dq, = torch.autograd.grad(o.sum(), (q,))
        qr = q.detach().cpu().double().requires_grad_(True)
        dqr, = torch.autograd.grad(dense(qr, k.detach().cpu(), v.detach().cpu(), mask).sum(), (qr,))
        assert (dq.cpu().double() - dqr).abs().max() < (1e-9 if device == "cpu" else 5e-2)


def test_documents_cross_lengths():
    g = torch.Generator().manual_seed(9)
    q, k, v = qkv(1, 90, 130, 2, 2)
    cq, ck = random_documents(90, 4, g), random_documents(130, 4, g)
    o = st.sparse_attention(q, k, v, None, cu_seqlens=cq, cu_seqlens_k=ck)
    mask = torch.zeros(90, 130, dtype=torch.bool)
    for i in range(4):
        mask[cq[i]:cq[i + 1], ck[i]:ck[i + 1]] = True
    assert (o - dense(q, k, v, mask)).abs().max() < 1e-10
    with torch.no_grad():  # the operator without autograd's wrapper (masked_attention_nograd): the same O
        assert torch.equal(st.sparse_attention(q, k, v, None, cu_seqlens=cq, cu_seqlens_k=ck), o.detach())


@pytest.mark.parametrize("heads", [0, 2, 4])  # [B, Lq, K]; per kv head; per query head
@pytest.mark.parametrize("spec", [None, "local(left=3, right=0)"])
def test_topk(heads, spec):
    g = torch.Generator().manual_seed(heads)
    B, H, HK, Lq, Lk, K = 2, 4, 2, 70, 110, 6
    q, k, v = qkv(B, Lq, Lk, H, HK)
    th = heads or 1
    idx = torch.rand(B, Lq, th, Lk, generator=g).topk(K, -1).indices
    idx = idx.masked_fill(torch.rand(idx.shape, generator=g) < 0.3, -1)  # -1 padding anywhere
    mask = torch.zeros(B, Lq, th, Lk + 1, dtype=torch.bool).scatter_(3, idx % (Lk + 1), True)[..., :Lk]
    mask = mask.permute(0, 2, 1, 3)  # [B, th, Lq, Lk]
    mask = mask.repeat_interleave(H // th, 1)
    if spec:
        mask = mask | torch.from_numpy(spattn.mask(spec, Lq, Lk))
    o = st.sparse_attention(q, k, v, spec, topk_indices=idx if heads else idx[:, :, 0], check=True)
    assert (o - dense(q, k, v, mask)).abs().max() < 1e-10
    gq, gk = torch.autograd.grad(o.sum(), (q, k))
    qr, kr = (x.detach().requires_grad_(True) for x in (q, k))
    rq, rk = torch.autograd.grad(dense(qr, kr, v.detach(), mask).sum(), (qr, kr))
    assert (gq - rq).abs().max() < 1e-9 and (gk - rk).abs().max() < 1e-9


def test_compile_fullgraph_new_masks_every_call():
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(1)
    B, H, L, K = 1, 2, 96, 5
    q, k, v = qkv(B, L, L, H, H, dtype=torch.float32)

    @torch.compile(fullgraph=True)
    def step(q, k, v, cu, idx, bm):
        a = st.sparse_attention(q, k, v, "causal", cu_seqlens=cu)
        b = st.sparse_attention(q, k, v, None, topk_indices=idx)
        c = st.sparse_attention(q, k, v, bm, spec="causal")
        return (a + b + c).sum()

    for trial in range(3):
        cu = random_documents(L, 4, g)  # same count, new boundaries: no recompile
        idx = torch.rand(B, L, L, generator=g).topk(K, -1).indices
        bm, part, fullb = random_block_mask(B, H, L, L, 32, 32, seed=10 + trial)
        loss = step(q, k, v, cu, idx, bm)
        grads = torch.autograd.grad(loss, (q, k, v))
        ref = (st.sparse_attention(q, k, v, "causal", cu_seqlens=cu) + st.sparse_attention(q, k, v, None, topk_indices=idx)
               + st.sparse_attention(q, k, v, bm, spec="causal")).sum()
        ref_grads = torch.autograd.grad(ref, (q, k, v))
        assert abs(loss.item() - ref.item()) < 1e-3
        for a, b in zip(grads, ref_grads):
            assert (a - b).abs().max() < 1e-4


def test_check_mode_errors():
    q, k, v = qkv(1, 64, 64, 2, 2)
    with pytest.raises(spattn.Error, match=r"cu_seqlens_q is not non-decreasing: \[1\] is 40, \[2\] is 30"):
        st.sparse_attention(q, k, v, None, cu_seqlens=torch.tensor([0, 40, 30, 64], dtype=torch.int32), check=True)
    idx = torch.zeros(1, 64, 3, dtype=torch.int64)
    with pytest.raises(spattn.Error, match=r"topk_indices\[0, 0, 1\] repeats key 0"):
        st.sparse_attention(q, k, v, None, topk_indices=idx, check=True)
    idx[:, :, 1:] = -1
    idx[0, 5, 2] = 64
    with pytest.raises(spattn.Error, match=r"topk_indices\[0, 5, 2\] is 64, outside \[0, 64\)"):
        st.sparse_attention(q, k, v, None, topk_indices=idx, check=True)
    with pytest.raises(spattn.Error, match="int32 or int64"):
        st.sparse_attention(q, k, v, None, topk_indices=idx.float(), check=True)
    with pytest.raises(spattn.Error, match="give one run-time mask"):
        st.sparse_attention(q, k, v, None, cu_seqlens=torch.tensor([0, 64], dtype=torch.int32), topk_indices=idx)
    bm, _, _ = random_block_mask(1, 2, 64, 64, 32, 32, seed=0)
    bm.kv_indices[0, 0, 0, 0] = 7
    bm.kv_num_blocks[0, 0, 0] = 1
    with pytest.raises(spattn.Error, match=r"kv_indices\[0, 0, 0, 0\] is 7, outside \[0, 2\)"):
        st.sparse_attention(q, k, v, bm, check=True)
    # shapes that disagree (checked at every call, check mode or not)
    with pytest.raises(spattn.Error, match=r"topk_indices has shape \[1, 32, 3\], expected \[1, 64, 3\]"):
        st.sparse_attention(q, k, v, None, topk_indices=idx[:, :32].contiguous())
    cq, ck = torch.tensor([0, 32, 64], dtype=torch.int32), torch.tensor([0, 64], dtype=torch.int32)
    with pytest.raises(spattn.Error, match="cu_seqlens_k has 2 boundaries, cu_seqlens_q 3"):
        st.sparse_attention(q, k, v, None, cu_seqlens=cq, cu_seqlens_k=ck)
    with pytest.raises(spattn.Error, match=r"cu_seqlens_k\[1\] is 65, outside \[0, 64\]"):
        st.sparse_attention(q, k, v, None, cu_seqlens=cq, cu_seqlens_k=torch.tensor([0, 65, 64], dtype=torch.int32),
                            check=True)
    bm, _, _ = random_block_mask(1, 2, 64, 64, 32, 32, seed=0)
    bm.kv_num_blocks[0, 0, 0] = 2
    bm.kv_indices[0, 0, 0, :2] = 1  # listed twice
    with pytest.raises(spattn.Error, match=r"lists key block 1 twice"):
        st.sparse_attention(q, k, v, bm, check=True)


@pytest.mark.parametrize("script, args", [("moba_layer.py", ["--len", "256"]),
                                          ("packed_training.py", ["--steps", "2", "--len", "128"])])
def test_examples(script, args):
    import os
    import subprocess
    import sys
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    r = subprocess.run([sys.executable, os.path.join(root, "examples", script), *args], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr


def test_moba_block_mask_lists_as_wide_as_key_blocks():
    """torch 2.11's BlockMask.from_kv_blocks indexes a dense [blocks, C + 1] by kv_indices: lists narrower than the
    key blocks (the example's one-entry diagonal list) raised IndexError there; they are padded to the key blocks."""
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "moba_layer.py")
    spec = importlib.util.spec_from_file_location("moba_layer", path)
    moba = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(moba)
    for topk in (1, 3):
        bm = moba.moba_block_mask(torch.randn(1, 256, 4, 16), torch.randn(1, 256, 2, 16), 64, topk)
        assert bm.kv_indices.shape[-1] == 4 and bm.full_kv_indices.shape[-1] == 4


def test_runtime_bench_baseline_honours_spattn_baselines(tmp_path, monkeypatch):
    """bench/runtime_bench.py --baseline NAME wrote bench/baselines/NAME.json whatever $SPATTN_BASELINES said (the
    variable bench/baseline.py documents: on the GPU machine the tree does not come back); it goes there now."""
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "runtime_bench.py")
    spec = importlib.util.spec_from_file_location("runtime_bench", path)
    rb = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rb)
    monkeypatch.setenv("SPATTN_BASELINES", str(tmp_path))
    assert rb.output_path(None, "h200-runtime") == os.path.join(str(tmp_path), "h200-runtime.json")
    assert rb.output_path("out/rows.json", "h200-runtime") == "out/rows.json"
    monkeypatch.delenv("SPATTN_BASELINES")
    here = os.path.join(os.path.dirname(os.path.abspath(path)), "baselines", "h200-runtime.json")
    assert rb.output_path(None, "h200-runtime") == here
    assert rb.output_path(None, None) is None


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device and a CUDA build of spattn")
def test_gpu_device_path_no_sync_and_graph_replay():
    """Documents, 128-blocks and top-k keys on the device path: forward and backward without host synchronisation
    (torch's sync debug mode), the path named by last_kernel, and CUDA graphs replayed with new mask contents
    (written in place) matching fresh eager calls."""
    st.clear_cache()  # other tests' plans (CPU ones, host-path ones) out of cached_plans()
    g = torch.Generator().manual_seed(2)
    B, H, L, K = 1, 4, 1024, 40
    q, k, v = (x.detach().requires_grad_(True) for x in qkv(B, L, L, H, H, D=64, dtype=torch.bfloat16, device="cuda"))
    cu = random_documents(L, 5, g).cuda()
    bm = random_block_mask(B, H, L, L, 128, 128, seed=4)[0].to("cuda")
    idx = torch.rand(B, L, L, generator=g).topk(K, -1).indices.int().cuda()
    calls = {
        "documents": lambda: st.sparse_attention(q, k, v, "causal", cu_seqlens=cu),
        "blocks": lambda: st.sparse_attention(q, k, v, bm, spec="causal"),
        "topk": lambda: st.sparse_attention(q, k, v, "local(left=16, right=0)", topk_indices=idx),
    }
    for f in calls.values():  # plans and first launches outside the checked region
        f().float().sum().backward()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for f in calls.values():
            f().float().sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    plans = [p for p in st.cached_plans() if p._p.mask]
    assert sorted(p._p.mask.split(":")[0] for p in plans) == ["blocks", "documents", "topk"], \
        [p._p.mask for p in plans]
    why = "\n".join(f"{p._p.mask}: {p.last_kernel()!r} / {p.last_backward_kernel()!r}\n{p.explain()}" for p in plans)
    assert all(p.last_kernel().startswith("runtime_device: ") for p in plans), why
    assert all(p.last_backward_kernel().startswith("runtime_device: ") for p in plans), why
    def new_blocks(new):  # every tensor of the mask in place (a block stays either full or partial)
        for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"):
            getattr(bm, name).copy_(getattr(new, name).cuda())

    new_contents = {
        "documents": lambda: cu.copy_(random_documents(L, 5, g).cuda()),
        "blocks": lambda: new_blocks(random_block_mask(B, H, L, L, 128, 128, seed=int(torch.randint(99, (1,),
                                                                                                   generator=g)))[0]),
        "topk": lambda: idx.copy_(torch.rand(B, L, L, generator=g).topk(K, -1).indices.int().cuda()),
    }
    with torch.no_grad():
        for name, f in calls.items():
            graph = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                f()
                with torch.cuda.graph(graph, stream=s):
                    out = f()
            torch.cuda.current_stream().wait_stream(s)
            for _ in range(3):
                new_contents[name]()
                graph.replay()
                torch.cuda.synchronize()
                assert (out.float() - f().float()).abs().max() < 1e-2, name


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device and a CUDA build of spattn")
def test_gpu_device_path_per_head_and_key_boundaries():
    """The cases that left the host path (issue 44): top-k per kv head and per query head under GQA, a BlockMask per
    query head under GQA (backward through per-head dK / dV partials), cu_seqlens with cu_seqlens_k (queries and keys
    of different lengths); each forward and backward under torch's sync debug mode "error", on the device path
    (last_kernel), against fp64 attention over the mask's pairs on the CPU."""
    st.clear_cache()
    g = torch.Generator().manual_seed(5)
    B, H, HK, Lq, Lk, K = 2, 4, 2, 640, 896, 32
    q, k, v = qkv(B, Lq, Lk, H, HK, D=64, dtype=torch.bfloat16, device="cuda", seed=3)
    cases = []
    for th in (HK, H):  # per kv head, per query head
        idx = torch.rand(B, Lq, th, Lk, generator=g).topk(K, -1).indices
        idx = idx.masked_fill(torch.rand(idx.shape, generator=g) < 0.2, -1)
        mask = torch.zeros(B, Lq, th, Lk + 1, dtype=torch.bool).scatter_(3, idx % (Lk + 1), True)[..., :Lk]
        mask = mask.permute(0, 2, 1, 3).repeat_interleave(H // th, 1)
        idx = idx.int().cuda()
        cases.append((f"topk per {th} heads", lambda idx=idx: st.sparse_attention(q, k, v, None, topk_indices=idx), mask))
    bm, part, full = random_block_mask(B, H, Lq, Lk, 128, 128, seed=6)
    causal = torch.from_numpy(spattn.mask("causal", Lq, Lk))
    bm = bm.to("cuda")
    cases.append(("blocks per head", lambda: st.sparse_attention(q, k, v, bm, spec="causal"), full | (part & causal)))
    cq, ck = random_documents(Lq, 5, g), random_documents(Lk, 5, g)
    mask = torch.zeros(Lq, Lk, dtype=torch.bool)
    for i in range(5):
        n, m = int(cq[i + 1] - cq[i]), int(ck[i + 1] - ck[i])
        mask[cq[i]:cq[i + 1], ck[i]:ck[i + 1]] = torch.ones(n, m, dtype=torch.bool).tril()  # causal, top left
    cqd, ckd = cq.cuda(), ck.cuda()
    cases.append(("documents with key boundaries",
                  lambda: st.sparse_attention(q, k, v, "causal", cu_seqlens=cqd, cu_seqlens_k=ckd), mask))
    do = torch.randn(B, Lq, H, 64, generator=g).to(torch.bfloat16).cuda()
    for name, f, mask in cases:
        f()  # plans built and first launches outside the checked region
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            o = f()
            grads = torch.autograd.grad(o, (q, k, v), do)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        plan = next(p for p in st.cached_plans() if p._p.mask and p.last_kernel())
        assert plan.last_kernel().startswith("runtime_device: "), (name, plan.last_kernel(), plan.explain())
        assert plan.last_backward_kernel().startswith("runtime_device: "), (name, plan.last_backward_kernel())
        st.clear_cache()
        qr, kr, vr = (x.detach().cpu().double().requires_grad_(True) for x in (q, k, v))
        m = mask.expand(B, H, Lq, Lk) if mask.dim() == 2 else mask
        ref = dense(qr, kr, vr, m)
        refs = torch.autograd.grad(ref, (qr, kr, vr), do.cpu().double())
        assert (o.cpu().double() - ref).abs().max() < 2e-2, name
        for got, want in zip(grads, refs):
            assert (got.cpu().double() - want).abs().max() < 5e-2 * max(1.0, want.abs().max().item()), name


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device and a CUDA build of spattn")
def test_gpu_host_path_raises_under_sync_debug_error():
    """The backward of 64 x 64 blocks at head dim 128 still takes the host path on the GPU (docs/RUNTIME_MASKS.md):
    under torch.cuda.set_sync_debug_mode("error") it raises naming the case instead of synchronising; without, it
    runs."""
    st.clear_cache()
    q, k, v = qkv(1, 256, 256, 2, 2, D=128, dtype=torch.bfloat16, device="cuda")
    bm = random_block_mask(1, 2, 256, 256, 64, 64, seed=8)[0].to("cuda")
    st.sparse_attention(q, k, v, bm, spec="causal").float().sum().backward()  # allowed: the host path
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        o = st.sparse_attention(q, k, v, bm, spec="causal")  # the forward: the device path
        with pytest.raises(Exception, match="would run on the host path .*64 x 64 blocks"):
            o.float().sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
