"""spattn.vision: grid attention against SDPA with the same mask, and timm / diffusers models swapped to it
against the same model (same weights) whose SDPA gets that mask: outputs and gradients within 1e-5 (fp32, CPU)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402

import spattn  # noqa: E402
import spattn.vision as sv  # noqa: E402


class MaskedSDPA(TorchFunctionMode):
    """The reference: every self-attention SDPA call over `mask`'s tokens gets `mask` (and nothing else changes)."""

    def __init__(self, mask):
        super().__init__()
        self.mask = mask

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            a = dict(zip(("query", "key", "value"), args), **kwargs)
            if a["query"].shape[-2] == a["key"].shape[-2] == self.mask.shape[0]:
                return func(**{**a, "attn_mask": self.mask})
        return func(*args, **kwargs)


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def same_step(model, swapped_fn, ref_fn, x, rtol=1e-5):
    """Output and every parameter's gradient of swapped_fn() against ref_fn() on the same model."""
    res = []
    for fn in (swapped_fn, ref_fn):
        model.zero_grad()
        out = fn(x)
        (out.float() ** 2).mean().backward()
        res.append((out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (o1, g1), (o2, g2) = res
    assert rel(o1, o2) <= rtol, rel(o1, o2)
    assert g1.keys() == g2.keys() and g1
    for n in g1:
        assert rel(g1[n], g2[n]) <= rtol, (n, rel(g1[n], g2[n]))


@pytest.mark.parametrize("grid,kernel,mode,prefix,heads", [
    ((6, 8), 3, "neighborhood", 0, (4, 4)),
    ((6, 8), (3, 5), "neighborhood", 2, (4, 2)),
    ((4, 6, 4), (2, 3, 2), "window", 1, (4, 4)),
    ((4, 6, 4), 3, "neighborhood", 3, (4, 1)),
])
def test_grid_attention_matches_masked_sdpa(grid, kernel, mode, prefix, heads):
    g = sv.GridSpec.make(grid, kernel, mode, prefix_tokens=prefix)
    N = g.tokens
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, N, 16, generator=gen, dtype=torch.float64).float().requires_grad_()
               for h in (heads[0], heads[1], heads[1]))
    dout = torch.randn(2, heads[0], N, 16, generator=gen)
    o = sv.grid_attention(q, k, v, g, layout="bhld")
    grads = torch.autograd.grad(o, (q, k, v), dout)
    m = sv.grid_mask(g)
    r = F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)
    rgrads = torch.autograd.grad(r, (q, k, v), dout)
    assert rel(o, r) <= 1e-5
    for a, b in zip(grads, rgrads):
        assert rel(a, b) <= 1e-5


def test_grid_mask_is_the_pattern():
    g = sv.GridSpec.make((4, 4), 2, "window", prefix_tokens=1)
    m = sv.grid_mask(g)
    assert m[0].all() and m[:, 0].all()
    y, x = torch.meshgrid(torch.arange(4), torch.arange(4), indexing="ij")
    win = (y // 2 * 2 + x // 2).flatten()
    assert torch.equal(m[1:, 1:], win[:, None] == win[None, :])
    with pytest.raises(spattn.Error, match="does not divide"):
        sv.GridSpec.make((4, 6), 4, "window")
    with pytest.raises(spattn.Error, match="does not fit"):
        sv.GridSpec.make((4, 6), 5)


def test_timm_vit_swapped_matches_masked_sdpa_and_restores():
    timm = pytest.importorskip("timm", reason="the timm helper needs timm (pip install timm)")
    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=(96, 128), patch_size=16, depth=2,
                            reg_tokens=2, num_classes=10)
    x = torch.randn(2, 3, 96, 128)
    dense = vit(x).detach()
    swapped = sv.swap_timm_vit(vit, kernel_size=3)
    assert len(swapped) == 2 and swapped[0]._spattn_grid.prefix_tokens == 3
    mask = sv.grid_mask(swapped[0]._spattn_grid)

    def ref(inp):
        n = sv.restore(vit)
        try:
            with MaskedSDPA(mask):
                return vit(inp)
        finally:
            if n:
                sv.swap_timm_vit(vit, kernel_size=3)

    same_step(vit, vit, ref, x)
    assert sv.restore(vit) == 2
    torch.testing.assert_close(vit(x), dense, rtol=0, atol=0)


def test_diffusers_video_block_3d_windows():
    pytest.importorskip("diffusers", reason="the diffusers helper needs diffusers (pip install diffusers)")
    from diffusers.models.attention import BasicTransformerBlock

    torch.manual_seed(0)
    blk = BasicTransformerBlock(64, 4, 16, cross_attention_dim=32)
    grid = (4, 4, 6)
    x, text = torch.randn(2, 96, 64), torch.randn(2, 5, 32)
    swapped = sv.swap_diffusers(blk, grid, (2, 2, 3), mode="window")
    assert len(swapped) == 1  # attn1 only: attn2 is cross-attention
    mask = sv.grid_mask(swapped[0]._spattn_grid)

    def ref(inp):
        sv.restore(blk)
        try:
            with MaskedSDPA(mask):
                return blk(inp, encoder_hidden_states=text)
        finally:
            sv.swap_diffusers(blk, grid, (2, 2, 3), mode="window")

    same_step(blk, lambda inp: blk(inp, encoder_hidden_states=text), ref, x)
    with pytest.raises(spattn.Error, match="got 95 tokens"):
        blk(x[:, :95], encoder_hidden_states=text)
    r = sv.check(blk, lambda: (lambda o: (o, (o ** 2).mean()))(blk(x, encoder_hidden_states=text)))
    assert r["output"] <= 1e-5 and r["gradient"] <= 1e-5 and blk.attn1._spattn_grid.grid == grid
    sv.restore(blk)
    with pytest.raises(spattn.Error, match="no swapped attention"):
        sv.check(blk, lambda: None)


def test_diffusers_wan_video_transformer_3d_windows():
    """A whole video DiT (Wan 2.1's architecture, tiny): its attention modules reach SDPA through diffusers'
    attention dispatch with keyword arguments; self-attention swapped, cross-attention to text left dense."""
    pytest.importorskip("diffusers", reason="the diffusers helper needs diffusers (pip install diffusers)")
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    m = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4,
                              out_channels=4, text_dim=32, freq_dim=32, ffn_dim=64, num_layers=2, rope_max_seq_len=64)
    x, t, text = torch.randn(1, 4, 4, 8, 12), torch.tensor([10]), torch.randn(1, 7, 32)
    grid = (4, 4, 6)  # frames x (8 / 2) x (12 / 2) patches
    swapped = sv.swap_diffusers(m, grid, (2, 2, 3), mode="window")
    assert len(swapped) == 2 and all(not s.is_cross_attention for s in swapped)
    mask = sv.grid_mask(swapped[0]._spattn_grid)

    def ref(inp):
        sv.restore(m)
        try:
            with MaskedSDPA(mask):
                return m(inp, t, text, return_dict=False)[0]
        finally:
            sv.swap_diffusers(m, grid, (2, 2, 3), mode="window")

    same_step(m, lambda inp: m(inp, t, text, return_dict=False)[0], ref, x)


@pytest.mark.parametrize("example,args,needs", [
    ("vit_neighborhood.py", ["--model", "vit_tiny_patch16_224", "--img", "64", "--kernel", "3", "--steps", "1"], "timm"),
    ("video_dit_block.py", ["--grid", "4,4,4", "--window", "2,2,2", "--dim", "64", "--heads", "4", "--text", "5",
                            "--steps", "1"], None),
    ("video_dit_block.py", ["--grid", "4,4,4", "--window", "3,3,3", "--mode", "neighborhood", "--dim", "64",
                            "--heads", "4", "--text", "5", "--steps", "1"], None),
])
def test_examples_run(example, args, needs):
    """The vision examples at small sizes: they exit 0 only when they match masked SDPA."""
    import os
    import subprocess
    import sys

    if needs:
        pytest.importorskip(needs, reason=f"{example} needs {needs}")
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    r = subprocess.run([sys.executable, os.path.join(root, "examples", example), *args], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert ": ok" in r.stdout


@pytest.mark.skipif(not (torch.cuda.is_available() and spattn.build_info()["gpus"] > 0),
                    reason="needs a CUDA GPU and spattn built with its kernels")
@pytest.mark.parametrize("prefix", [0, 1])
def test_gpu_bf16_grid_attention(prefix):
    """bf16 on the GPU: 2-D neighborhoods with and without a global token, against masked SDPA within 2e-2."""
    g = sv.GridSpec.make((32, 32), 7, prefix_tokens=prefix)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 8, g.tokens, 64, device="cuda", dtype=torch.bfloat16, generator=gen).requires_grad_()
               for _ in range(3))
    dout = torch.randn(2, 8, g.tokens, 64, device="cuda", dtype=torch.bfloat16, generator=gen)
    o = sv.grid_attention(q, k, v, g, layout="bhld")
    grads = torch.autograd.grad(o, (q, k, v), dout)
    r = F.scaled_dot_product_attention(q, k, v, attn_mask=sv.grid_mask(g).cuda())
    rgrads = torch.autograd.grad(r, (q, k, v), dout)
    assert rel(o.float(), r.float()) <= 2e-2
    for a, b in zip(grads, rgrads):
        assert rel(a.float(), b.float()) <= 2e-2
