"""spattn.distributed: context-parallel attention over torch.distributed, 2 CPU processes on gloo against one
process's spattn.torch result (forward and gradients); the exchange schedule."""
from __future__ import annotations

import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():
    pytest.skip("torch.distributed is not available in this torch build", allow_module_level=True)

import spattn  # noqa: E402
import spattn.distributed as sd  # noqa: E402
import spattn.torch as st  # noqa: E402

# (spec, layout, Hq, Hkv, halo): halo mode (one plan a range of rows, no merge) and local + remote parts merged.
CASES = [("local(7)", "contiguous", 2, 2, True), ("local(7)", "contiguous", 2, 2, False), ("causal", "zigzag", 2, 2, True),
         ("longformer(5, 3) | random(2, seed=4)", "contiguous", 4, 2, True)]


def _inputs(L, hq, hkv, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(2, L, h, 16, generator=g) for h in (hq, hkv, hkv, hq))
    return q, k, v, do


def _worker(rank, world, init, spec, layout, L, hq, hkv, halo, out_dir):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        q, k, v, do = _inputs(L, hq, hkv)
        _, ranks = sd.schedule(spec, L, world, layout=layout)
        owned = [tuple(x) for x in ranks[rank]["owned"]]
        qs, ks, vs = (sd.shard(x, owned).requires_grad_() for x in (q, k, v))
        o = sd.context_parallel_attention(qs, ks, vs, spec, layout=layout, halo=halo)
        o.backward(sd.shard(do, owned))
        torch.save({"owned": owned, "o": o.detach(), "dq": qs.grad, "dk": ks.grad, "dv": vs.grad},
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("spec,layout,hq,hkv,halo", CASES)
def test_two_gloo_processes_match_one(spec, layout, hq, hkv, halo):
    L, world = 203, 2
    with tempfile.TemporaryDirectory() as tmp:
        init = "file://" + os.path.join(tmp, "rendezvous")
        torch.multiprocessing.spawn(_worker, args=(world, init, spec, layout, L, hq, hkv, halo, tmp), nprocs=world, join=True)
        parts = [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(world)]
    owned = [p["owned"] for p in parts]
    got = {n: sd.unshard([p[n] for p in parts], owned, L) for n in ("o", "dq", "dk", "dv")}
    q, k, v, do = _inputs(L, hq, hkv)
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    o = st.sparse_attention(q, k, v, spec)
    o.backward(do)
    for name, want in (("o", o.detach()), ("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
        torch.testing.assert_close(got[name], want, rtol=2e-5, atol=2e-5, msg=lambda m: f"{spec} {name}: {m}")


def test_schedule_local_halo():
    text, ranks = sd.schedule("local(16)", 1000, 4, heads=2, head_dim=32)
    assert ranks[1]["fetched"] == [(234, 250), (500, 516)]
    assert ranks[1]["kv_recv_bytes"] == ranks[1]["boundary_bytes"] == 32 * 2 * 64 * 4
    assert "ratio 1.000" in text
    with pytest.raises(spattn.Error, match="W = 5 needs L >= 5"):
        sd.schedule("local(2)", 4, 5)
