"""Context-parallel sparse attention over torch.distributed (spattn/distributed.hpp in C++).

The sequence is sharded over the ranks of a process group; each rank holds its tokens' q, k, v ([B, n, H, D]) and
fetches from the others only the key/value ranges its rows' pattern reaches (a halo for ``local(w)``), through
point-to-point sends (gloo on the CPU, NCCL on GPUs). Its result is the LSE merge of its local part (own keys) and
its remote part (fetched keys), both ordinary spattn plans over windows of the pattern. Backward: dQ on the rank,
dK/dV of fetched keys sent back and added at their owners.

    import torch.distributed as dist, spattn.distributed as sd
    o = sd.context_parallel_attention(q, k, v, "local(4096)")    # q, k, v: this rank's shard

Halo mode (a rank's own and fetched keys make one range: a band over contiguous shards, causal over zig-zag shards):
the keys in global order and one plan per own range of rows, no merge: CPU or CUDA tensors (gloo or NCCL). Otherwise
the parts merge through the C++ merge primitive on CPU memory (a CUDA tensor raises spattn.Error). Rows of
``global_rows`` terms fetch every key here (the C++ DistRank ships their queries instead).
"""
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
from torch import Tensor

from . import Error, Pattern, _core

Ranges = List[Tuple[int, int]]

__all__ = ["schedule", "shard", "unshard", "context_parallel_attention"]


def _patterns(pattern: Union[str, Pattern, Sequence[Union[str, Pattern]]]) -> List[Any]:
    if isinstance(pattern, (str, Pattern)):
        pattern = [pattern]
    return [p if isinstance(p, _core.Pattern) else _core.Pattern(str(p)) for p in pattern]


def schedule(pattern: Union[str, Pattern, Sequence[Union[str, Pattern]]], seq_len: int, world: int, *,
             layout: str = "contiguous", batch: int = 1, heads: int = 1, kv_heads: Optional[int] = None,
             head_dim: int = 64, value_dim: int = 0, dtype: str = "float32", key_block: int = 1,
             distribute_rows: bool = True) -> Tuple[str, List[Dict[str, Any]]]:
    """The exchange schedule: (explain text, per rank a dict of its tokens ``owned``, ``fetched`` keys,
    ``recv_keys`` / ``send_keys`` per peer (lists of (begin, end)), and bytes against the boundary volume)."""
    return _core.dist_schedule(_patterns(pattern), seq_len, world, layout, batch, heads, kv_heads or heads, head_dim,
                               value_dim, dtype, key_block, distribute_rows)


def _index(ranges: Ranges) -> Tensor:
    return torch.cat([torch.arange(b, e) for b, e in ranges]) if ranges else torch.zeros(0, dtype=torch.long)


def shard(x: Tensor, owned: Ranges, dim: int = 1) -> Tensor:
    """The tokens ``owned`` (a rank's ranges, in order) of a full-sequence tensor."""
    return x.index_select(dim, _index(owned).to(x.device))


def unshard(parts: Sequence[Tensor], owned: Sequence[Ranges], seq_len: int, dim: int = 1) -> Tensor:
    """The full-sequence tensor from every rank's shard (``owned[r]``: rank r's ranges)."""
    shape = list(parts[0].shape)
    shape[dim] = seq_len
    out = parts[0].new_empty(shape)
    for p, r in zip(parts, owned):
        out.index_copy_(dim, _index(r).to(out.device), p)
    return out


def _local_index(owned: Ranges, ranges: Ranges) -> Tensor:
    """The indices in a rank's tensors (its ranges ``owned``, in order) of the global tokens of ``ranges``."""
    g = _index(ranges)
    out = torch.full_like(g, -1)
    off = 0
    for b, e in owned:
        m = (g >= b) & (g < e)
        out[m] = g[m] - b + off
        off += e - b
    if (out < 0).any():
        raise Error(f"tokens {ranges} are not all among the rank's {owned}")
    return out


class _State:
    """A rank's plans and index lists for one (pattern, shapes, group) — built once, reused by forward and backward.

    Halo mode (the rank's own and fetched keys make one range: a band over contiguous shards, causal over zig-zag):
    the keys in global order in one tensor and one plan per own range of rows against it, no merge (CPU or GPU).
    Otherwise a local part (own keys) and a remote part (fetched keys) merged through the LSE (CPU)."""

    def __init__(self, pats: List[Any], q: Tensor, k: Tensor, v: Tensor, seq_len: int, rank: int, world: int,
                 layout: str, scale: Optional[float], key_block: int, halo: bool, group: Any) -> None:
        B, n, Hq, D = q.shape
        Hkv, Dv = k.shape[2], v.shape[3]
        dt = str(q.dtype).replace("torch.", "")
        self.explain, ranks = _core.dist_schedule(pats, seq_len, world, layout, B, Hq, Hkv, D, Dv, dt, key_block, False)
        me = ranks[rank]
        self.rank, self.world, self.group = rank, world, group
        owned = [tuple(x) for x in me["owned"] if x[1] > x[0]]
        if sum(e - b for b, e in owned) != n:
            raise Error(f"rank {rank}: q has {n} tokens, the {layout} layout gives it {sum(e - b for b, e in owned)}")
        dev = q.device
        self.send_idx = [_local_index(owned, [tuple(x) for x in me["send_keys"][s]]).to(dev) for s in range(world)]
        self.recv_n = [sum(e - b for b, e in me["recv_keys"][s]) for s in range(world)]
        fetched = [tuple(x) for x in me["fetched"]]
        device = "cpu" if dev.type == "cpu" else f"cuda:{dev.index if dev.index is not None else torch.cuda.current_device()}"
        args = (B, Hq, Hkv, D, Dv, dt, None if scale is None else float(scale), device, "auto", 0)
        # The keys this rank holds after the exchange: its own (local order), then the fetched (by source).
        held = _index(owned + fetched)
        span = (int(held.min()), int(held.max()) + 1) if len(held) else (0, 0)
        self.halo = halo and bool(fetched) and len(held) == span[1] - span[0]
        self.parts, self.local, self.remote = [], None, None
        if self.halo:
            self.order = torch.argsort(held).to(dev)  # held[order] is span, in global order
            li = 0
            for b, e in owned:
                self.parts.append((li, e - b, _core.make_window_plan(pats, seq_len, [(b, e)], [span], [], *args)))
                li += e - b
        else:
            if dev.type != "cpu":
                raise Error(f"rank {rank}: its keys ({owned} and fetched {fetched}) are not one range, so its parts "
                            "merge through the LSE, which spattn.distributed runs on CPU tensors only for now")
            self.local = _core.make_window_plan(pats, seq_len, owned, owned, [], *args)
            self.remote = _core.make_window_plan(pats, seq_len, owned, fetched, [], *args) if fetched else None
        plan = self.parts[0][2] if self.parts else self.local
        self.out_dtype = getattr(torch, plan.out_dtype)
        self.grad_dtype = getattr(torch, plan.grad_dtype)

    def exchange(self, tensors: List[Tensor], counts: List[int], idx: Optional[List[Tensor]]) -> List[List[Tensor]]:
        """Sends tensors[:, idx[s]] (or, without idx, consecutive slices of counts[s] tokens) to every peer s; returns,
        per tensor, the pieces received from each peer in rank order."""
        ops, got = [], [[] for _ in tensors]
        start = 0
        for s in range(self.world):
            if s == self.rank:
                continue
            for t, g in zip(tensors, got):
                n_in = self.recv_n[s] if idx is not None else len(self.send_idx[s])
                buf = t.new_empty((t.shape[0], n_in) + tuple(t.shape[2:]))
                g.append(buf)
                if idx is not None:
                    out = t.index_select(1, idx[s]).contiguous()
                else:
                    out = t[:, start:start + counts[s]].contiguous()
                if out.shape[1]:
                    ops.append(dist.isend(out, self.group_rank(s), group=self.group))
                if n_in:
                    ops.append(dist.irecv(buf, self.group_rank(s), group=self.group))
            if idx is None:
                start += counts[s]
        for op in ops:
            op.wait()
        return got

    def group_rank(self, r: int) -> int:
        return r if self.group is None else dist.get_global_rank(self.group, r)


class _ContextParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, q: Tensor, k: Tensor, v: Tensor, st: _State) -> Tensor:
        kf, vf = _fetch(st, k, v)
        B, n, Hq, _ = q.shape
        o = torch.empty((B, n, Hq, v.shape[3]), dtype=st.out_dtype, device=q.device)
        lse = torch.empty((B, Hq, n), dtype=torch.float32, device=q.device)
        if st.halo:  # every key in global order, each own range of rows against them: no merge
            kk, vv = (torch.cat((x, y), 1).index_select(1, st.order).contiguous() for x, y in ((k, kf), (v, vf)))
            for li, ln, plan in st.parts:
                plan.forward(q[:, li:li + ln], kk, vv, o[:, li:li + ln], lse[:, :, li:li + ln])
        else:
            st.local.forward(q, k, v, o, lse)  # (the exchange above is done: gloo has no stream to overlap on)
            if st.remote is not None:
                o2, lse2 = torch.empty_like(o), torch.empty_like(lse)
                st.remote.forward(q, kf, vf, o2, lse2)
                _core.merge_into(o, lse, o2, lse2)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.st = st
        return o.to(q.dtype)

    @staticmethod
    def backward(ctx: Any, dout: Tensor) -> Tuple[Any, ...]:
        q, k, v, o, lse = ctx.saved_tensors
        st: _State = ctx.st
        dout = dout.contiguous().to(q.dtype)
        kf, vf = _fetch(st, k, v)  # fetched again: nothing kept between the passes
        n = k.shape[1]
        dq = torch.empty(q.shape, dtype=st.grad_dtype, device=q.device)
        if st.halo:
            kk, vv = (torch.cat((x, y), 1).index_select(1, st.order).contiguous() for x, y in ((k, kf), (v, vf)))
            dkk, dvv = torch.zeros(kk.shape, dtype=st.grad_dtype, device=q.device), torch.zeros(vv.shape, dtype=st.grad_dtype, device=q.device)
            for li, ln, plan in st.parts:
                g_k, g_v = torch.empty_like(dkk), torch.empty_like(dvv)
                plan.backward(q[:, li:li + ln], kk, vv, o[:, li:li + ln], lse[:, :, li:li + ln], dout[:, li:li + ln],
                              dq[:, li:li + ln], g_k, g_v)
                dkk += g_k
                dvv += g_v
            held_k, held_v = torch.empty_like(dkk), torch.empty_like(dvv)  # back to held order: own, then fetched
            held_k.index_copy_(1, st.order, dkk)
            held_v.index_copy_(1, st.order, dvv)
            dk, dv = held_k[:, :n].contiguous(), held_v[:, :n].contiguous()
            dkf, dvf = held_k[:, n:].contiguous(), held_v[:, n:].contiguous()
        else:
            dk = torch.empty(k.shape, dtype=st.grad_dtype)
            dv = torch.empty(v.shape, dtype=st.grad_dtype)
            st.local.backward(q, k, v, o, lse, dout, dq, dk, dv)
            dkf, dvf = kf.new_zeros(kf.shape, dtype=st.grad_dtype), vf.new_zeros(vf.shape, dtype=st.grad_dtype)
            if st.remote is not None:
                dq2 = torch.empty_like(dq)
                st.remote.backward(q, kf, vf, o, lse, dout, dq2, dkf, dvf)
                dq += dq2
        # The gradients of borrowed keys go back to their owners, who add them.
        gk, gv = st.exchange([dkf, dvf], st.recv_n, None)
        peers = [s for s in range(st.world) if s != st.rank]
        for s, a, b in zip(peers, gk, gv):
            dk.index_add_(1, st.send_idx[s], a)
            dv.index_add_(1, st.send_idx[s], b)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


def _fetch(st: _State, k: Tensor, v: Tensor) -> Tuple[Tensor, Tensor]:
    gk, gv = st.exchange([k, v], st.recv_n, st.send_idx)
    if not gk:
        return k[:, :0], v[:, :0]
    return torch.cat(gk, 1), torch.cat(gv, 1)


_STATES: Dict[Any, _State] = {}


def context_parallel_attention(q: Tensor, k: Tensor, v: Tensor,
                               pattern: Union[str, Pattern, Sequence[Union[str, Pattern]]], *,
                               group: Any = None, layout: str = "contiguous", seq_len: Optional[int] = None,
                               scale: Optional[float] = None, key_block: int = 1, halo: bool = True) -> Tensor:
    """Sparse attention of this rank's shard against the whole sharded sequence; differentiable in q, k and v.

    q [B, n, Hq, D], k [B, n, Hkv, D], v [B, n, Hkv, Dv]: the rank's tokens in the order of ``layout``
    ("contiguous", or "zigzag" for causal patterns: chunks r and 2W-1-r), as :func:`shard` cuts them. seq_len: the
    whole sequence's length (None: the sum of every rank's n, one all-reduce). Returns O of the shard in q's dtype.
    """
    if not dist.is_initialized():
        raise Error("context_parallel_attention needs torch.distributed initialised (dist.init_process_group)")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if seq_len is None:
        t = torch.tensor([q.shape[1]], dtype=torch.long, device=q.device)
        dist.all_reduce(t, group=group)
        seq_len = int(t.item())
    pats = _patterns(pattern)
    key = (tuple(p.spec for p in pats), q.shape, k.shape, v.shape, q.dtype, q.device, seq_len, rank, world, layout,
           scale, key_block, halo, id(group))
    st = _STATES.get(key)
    if st is None:
        st = _STATES[key] = _State(pats, q, k, v, seq_len, rank, world, layout, scale, key_block, halo, group)
    return _ContextParallel.apply(q, k, v, st)


def __dir__() -> list:
    """The public names, not the imports (Any, torch, dist, ...)."""
    return sorted(__all__)
