"""Context-parallel sparse attention under torchrun: each process holds a shard of the sequence.

    torchrun --nproc-per-node=2 examples/torchrun_dist.py --len 4096 --pattern 'local(256)'            # gloo, CPU
    torchrun --nproc-per-node=4 examples/torchrun_dist.py --device cuda --len 65536 --pattern 'local(4096)' --dtype bfloat16

CPU tensors go over gloo; --device cuda puts rank r on GPU r and uses nccl (there, spattn.distributed takes patterns
whose rank-local keys make one range, halo mode: local(w) over contiguous shards, causal over zig-zag ones; NOT RUN on
GPUs where this was written). Each rank checks its shard of O and of the gradients against the single-process result
(every rank computes it too: small L only).
"""
import argparse
import os

import torch
import torch.distributed as dist

import spattn.distributed as sd
import spattn.torch as st


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--len", type=int, default=4096)
    ap.add_argument("--pattern", default="local(256)")
    ap.add_argument("--layout", default="contiguous", choices=["contiguous", "zigzag"])
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    a = ap.parse_args()
    dist.init_process_group("nccl" if a.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dev = torch.device(f"cuda:{rank}") if a.device == "cuda" else torch.device("cpu")
    if a.device == "cuda":
        torch.cuda.set_device(dev)
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, a.len, a.heads, a.dim, generator=g).to(dev, getattr(torch, a.dtype)) for _ in range(4))
    text, ranks = sd.schedule(a.pattern, a.len, world, layout=a.layout, heads=a.heads, head_dim=a.dim, dtype=a.dtype)
    if rank == 0:
        print(text)
    owned = [tuple(x) for x in ranks[rank]["owned"]]
    qs, ks, vs = (sd.shard(x, owned).requires_grad_() for x in (q, k, v))
    o = sd.context_parallel_attention(qs, ks, vs, a.pattern, layout=a.layout)
    o.backward(sd.shard(do, owned))
    # The single-process result, sharded the same way.
    q1, k1, v1 = (x.clone().requires_grad_() for x in (q, k, v))
    o1 = st.sparse_attention(q1, k1, v1, a.pattern)
    o1.backward(do)
    err = max((x.float() - sd.shard(y, owned).float()).abs().max().item()
              for x, y in ((o.detach(), o1.detach()), (qs.grad, q1.grad), (ks.grad, k1.grad), (vs.grad, v1.grad)))
    print(f"rank {rank}/{world}: tokens {owned}, fetched {ranks[rank]['fetched']}, "
          f"K/V bytes {ranks[rank]['kv_recv_bytes']} (boundary {ranks[rank]['boundary_bytes']}), max abs err {err:.2e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
