#!/usr/bin/env python3
"""Masks chosen at run time (docs/RUNTIME_MASKS.md) on the GPU: issue 44's bar cases, against the static plan of the
same pairs and FlexAttention with the same BlockMask (bf16, forward and backward), each case in a process of its own.

  blocks     L=32768, B=1, H=16, D=128, blocks of 128, 8 key blocks per query block, causal: spattn's run-time BlockMask
             (full blocks below the diagonal, the diagonal block partial with spec "causal") against the static plan of
             `blocked(128, random(8, seed=1) | local(0)) & causal` (the same pairs) and flex_attention (compiled, Triton;
             also its FLASH backend where this torch has it) with the same BlockMask and a causal mask_mod.
  documents  L=65536, B=1, H=16, D=128: 16 documents of random lengths, causal with a 4096 window inside each; the
             boundaries change at every run-time call (a new cu_seqlens of the same length), against the static
             `document(n1, ..., n16) & local(left=4096, right=0)` plan of one of them (planned once; its plan time is
             reported: what replanning a call would cost) and flex_attention with a document block mask. Host time a call:
             the Python call's wall time without waiting for the GPU, run-time vs static.
  topk       L=32768, 2048 keys per query (shared by the heads, -1 free), GQA 32/8, D=128: against its gather floor
             (below), forward and backward; the bar is fraction_of_floor >= 0.5.
  topk_kv    the same with a list per kv head ([B, L, 8, K]); not in the default --cases.

The top-k gather floor, a lower bound on the time of a kernel that gathers each query's rows (the bar's model):
  gathered   the K and V rows each (query, kv head) reads: B Lq Hkv K' x 2 x D x 2 bytes (K' its listed keys, -1s not
             counted), at the L2 read rate where one (batch, kv head)'s K and V (Lk x 2 x D x 2 bytes, the set its
             gathers come from) fit in half the L2, else at the HBM rate;
  unique     the bytes any kernel moves to or from HBM once: forward Q, K, V, O, the indices; backward Q, K, V, O, dO,
             LSE, dQ, dK, dV, the indices; at the HBM rate;
  floor      the larger of the two (both can overlap, so their sum would not be a bound), fwd and bwd apart.
Rates are measured here, each the highest of a few runs: L2 by a Triton kernel re-reading a buffer of a quarter of the
L2 with loads that bypass L1 (without Triton, an in-L2 device copy in a CUDA graph, read and write bytes counted), HBM
by a 1 GiB device-to-device copy (read and write bytes counted). fraction_of_floor = floor / measured time: at most 1
for a kernel that gathers per (query, kv head); a tile kernel that shares gathered rows between queries in shared
memory reads fewer bytes than `gathered` and may go past 1 (the row's floor_note says so where it does).

Each timing is the median of --reps calls (down to one once a case is past its share of --budget-s, default 150 s),
CUDA events around each (host work inside a call is in the time). Before
timing, outputs are checked: run-time against static (same pairs, max abs difference), top-k against an fp32 gather on
sampled rows. Rows (JSON, one per case): *_fwd_ms / *_bwd_ms, effective TFLOP/s (4 D kept a head forward, 2.5x that
backward), runtime_over_static_{fwd,bwd} (static ms / run-time ms: >= 0.8 is the bar for blocks, 0.95 for documents),
ratio_vs_flex_{fwd,bwd} (flex ms / run-time ms), fraction_of_floor_{fwd,bwd} (top-k: floor / time), the device path the run-time
plan took (last_kernel: "runtime_device: ..." or "runtime_rows: ..." for the host-materialised path), errors.

  python3 bench/runtime_bench.py --json out/runtime.json            # needs spattn importable with CUDA (pip install .)
  python3 bench/runtime_bench.py --baseline h200-runtime              # bench/baselines/h200-runtime.json (~4 min)
  python3 bench/runtime_bench.py --quick                              # small sizes: a smoke run in seconds
  python3 bench/runtime_bench.py --cases blocks --ab-lists            # + the one-CTA list builds (cta_over_grid_*)
  python3 bench/runtime_bench.py --cases blocks --ab-lists --profile  # + each one's kernels (row key profile)
  python3 bench/runtime_bench.py --env-ab SPATTN_HEAD_SECTION=0       # block mask fwd / bwd, variable unset vs set
  SPATTN_BASELINES=$OUT/baselines python3 bench/runtime_bench.py --baseline h200-runtime  # written there instead
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_bench import set_env  # noqa: E402


def timed(fn, reps, deadline):
    """Median ms of fn() over reps calls (CUDA events around each); fewer reps once past `deadline` (time.time())."""
    return timed_alternating([fn], reps, deadline)[0]


def grad_fn(f, q, k, v, do):
    """A callable running f's backward over a retained forward graph."""
    qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))
    o = f(qg, kg, vg)
    return lambda: torch.autograd.grad(o, (qg, kg, vg), do, retain_graph=True)


def host_us(fn, reps=20):
    """Mean microseconds of fn()'s host time (no wait for the GPU), after a synchronised warm call."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / reps * 1e6


def flex_fns(flex_attention, bm, gqa):
    """flex_attention on [B, L, H, D] tensors with `bm`: Triton, and FLASH where this torch has that backend."""
    compiled = torch.compile(flex_attention, dynamic=False)
    out = {}
    for name, opts in (("flex", None), ("flex_flash", {"BACKEND": "FLASH"})):
        def f(q, k, v, opts=opts):
            return compiled(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=bm, enable_gqa=gqa,
                            kernel_options=opts).transpose(1, 2)
        out[name] = f
    return out


def run_impls(row, impls, q, k, v, flop, reps, deadline, skip_bwd=()):
    """Times each implementation's forward and backward into row[name_fwd_ms, ...]; errors into row[name_error]."""
    do = torch.randn_like(q)
    for name, f in impls.items():
        try:
            row[f"{name}_fwd_ms"] = timed(lambda f=f: f(q, k, v), reps, deadline)
            row[f"{name}_fwd_tflops"] = flop / row[f"{name}_fwd_ms"] / 1e9
            if name not in skip_bwd:
                row[f"{name}_bwd_ms"] = timed(grad_fn(f, q, k, v, do), reps, deadline)
                row[f"{name}_bwd_tflops"] = 2.5 * flop / row[f"{name}_bwd_ms"] / 1e9
        except Exception as e:  # noqa: BLE001 (an unavailable backend is reported, not fatal)
            row[f"{name}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"


def ratios(row, base, others):
    for p in ("fwd", "bwd"):
        rt = row.get(f"runtime_{p}_ms")
        for other, key in others:
            om = row.get(f"{other}_{p}_ms")
            row[f"{key}_{p}"] = om / rt if (om and rt) else None
    return row


def kernel_profile(fn, reps=3):
    """The device work of one fn() call by torch.profiler: total kernel (and memset / memcpy) microseconds a call and
    the heaviest entries by name, to account a gap between two implementations kernel by kernel."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None)
        us = e.cuda_time_total if us is None else us
        if us:
            rows.append({"name": e.key[:120], "us_per_call": round(us / reps, 2), "count_per_call": e.count / reps})
    rows.sort(key=lambda r: -r["us_per_call"])
    return {"device_us_per_call": round(sum(r["us_per_call"] for r in rows), 1), "top": rows[:12]}


def lists_env(f, value):
    """f with SPATTN_RT_KEY_LISTS (read by spattn at every call) set to `value` ("" unset) at each call; run_impls
    times an implementation's backward right after its forward, so the backward runs under the same value."""
    def g(q, k, v):
        if value:
            os.environ["SPATTN_RT_KEY_LISTS"] = value
        else:
            os.environ.pop("SPATTN_RT_KEY_LISTS", None)
        return f(q, k, v)
    return g


def timed_alternating(fns, reps, deadline):
    """Median ms of each of fns, called in alternation (one of each a round, CUDA events around each): an A/B in one
    process whose drift (clocks, heat) falls on both alike. Fewer rounds once past `deadline`."""
    for f in fns:
        f()  # warm: plans, compiles
    torch.cuda.synchronize()
    ms = [[] for _ in fns]
    for _ in range(reps):
        for f, m in zip(fns, ms):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            f()
            b.record()
            b.synchronize()
            m.append(a.elapsed_time(b))
        if time.time() > deadline:
            break
    return [statistics.median(m) for m in ms]


def block_mask_tensors(n, R, device, seed=1):
    """The bar's block mask over n x n blocks: random(R, seed) | local(0) with causal, as FlexAttention's tensors
    (partial: the diagonal block; full: the listed blocks below it, listed first) and the kept block grid."""
    import spattn
    grid = torch.from_numpy(spattn.mask(f"random({R}, seed={seed}) | local(0)", n, n)).to(device)
    i = torch.arange(n, device=device)
    full = grid & (i[None, :] < i[:, None])  # below the diagonal: every pair kept (causal)
    full_num = full.sum(1).int().view(1, 1, n)
    full_idx = torch.argsort(~full, dim=1, stable=True).int().view(1, 1, n, n)  # listed blocks first
    part_num = torch.ones(1, 1, n, dtype=torch.int32, device=device)
    # kv_indices as wide as the key blocks (torch 2.11's from_kv_blocks indexes a dense [n, C + 1] by them)
    part_idx = i.view(1, 1, n, 1).expand(1, 1, n, n).int().contiguous()
    return part_num, part_idx, full_num, full_idx, full


def env_ab_check(var, value, reps_note=None):
    """--env-ab's correctness check: the run-time block mask's forward and backward (bf16, L = 2048, H = 2, D = 128,
    blocks of 128, the bar's mask at that size) with var unset and set, each against an fp64 CPU reference of the same
    pairs; returns {unset: {o, dq, dk, dv}, set: {...}}, each the max abs error over the max abs reference."""
    import spattn.torch as st
    from torch.nn.attention.flex_attention import BlockMask
    B, H, D, QB, L = 1, 2, 128, 128, 2048
    n = L // QB
    part_num, part_idx, full_num, full_idx, full = block_mask_tensors(n, 8, "cuda")
    bm = BlockMask.from_kv_blocks(part_num, part_idx, full_num, full_idx, BLOCK_SIZE=QB,
                                  mask_mod=lambda b, h, q, k: q >= k, seq_lengths=(L, L))
    g = torch.Generator(device="cuda").manual_seed(3)
    q, k, v, do = (torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    # the reference: every pair of a full block, and the causal pairs of the diagonal block
    keep = full.cpu().repeat_interleave(QB, 0).repeat_interleave(QB, 1)
    keep |= torch.ones(L, L, dtype=torch.bool).tril() & torch.eye(n, dtype=torch.bool).repeat_interleave(QB, 0) \
        .repeat_interleave(QB, 1)
    qr, kr, vr = (x.detach().cpu().double().requires_grad_() for x in (q, k, v))
    s = torch.einsum("blhd,bkhd->bhlk", qr, kr) / D ** 0.5
    o_ref = torch.einsum("bhlk,bkhd->blhd", s.masked_fill(~keep, float("-inf")).softmax(-1), vr)
    ref = dict(zip(("dq", "dk", "dv"), torch.autograd.grad(o_ref, (qr, kr, vr), do.cpu().double())))
    ref["o"] = o_ref.detach()
    out = {}
    for label, val in (("unset", None), ("set", value)):
        set_env(var, val)
        qg, kg, vg = (x.detach().clone().requires_grad_() for x in (q, k, v))
        o = st.sparse_attention(qg, kg, vg, bm, spec="causal")
        got = dict(zip(("dq", "dk", "dv"), torch.autograd.grad(o, (qg, kg, vg), do)))
        got["o"] = o.detach()
        out[label] = {name: (got[name].double().cpu() - r).abs().max().item() / max(r.abs().max().item(), 1e-30)
                      for name, r in ref.items()}
    set_env(var, None)
    return out


def env_ab(row, args, impl, q, k, v, deadline):
    """--env-ab VAR=VALUE: the run-time block mask's forward and backward with VAR unset and set, alternated in this
    process (rows runtime_{fwd,bwd}_ms_unset / _set, set_over_unset_* = unset ms / set ms: > 1 where VALUE is faster),
    and the correctness check (env_ab_check) of both."""
    var, _, value = args.env_ab.partition("=")
    row["env_ab"] = args.env_ab
    row["env_ab_check"] = env_ab_check(var, value)
    row["env_ab_ok"] = all(e < 2e-2 for side in row["env_ab_check"].values() for e in side.values())
    do = torch.randn_like(q)

    def under(val, f):
        def g():
            set_env(var, val)
            return f()
        return g
    sides = (("unset", None), ("set", value))
    fwd = timed_alternating([under(val, lambda: impl(q, k, v)) for _, val in sides], args.reps, deadline)
    grads = []
    for _, val in sides:
        set_env(var, val)
        grads.append(under(val, grad_fn(impl, q, k, v, do)))
    bwd = timed_alternating(grads, args.reps, deadline)
    set_env(var, None)
    for (label, _), f_ms, b_ms in zip(sides, fwd, bwd):
        row[f"runtime_fwd_ms_{label}"], row[f"runtime_bwd_ms_{label}"] = f_ms, b_ms
    row["set_over_unset_fwd"], row["set_over_unset_bwd"] = fwd[0] / fwd[1], bwd[0] / bwd[1]


def case_blocks(args, deadline):
    import spattn
    import spattn.torch as st
    from torch.nn.attention.flex_attention import BlockMask, flex_attention

    B, H, D, QB, R = 1, 16, 128, 128, 8
    L = 4096 if args.quick else 32768
    n = L // QB
    part_num, part_idx, full_num, full_idx, full = block_mask_tensors(n, R, "cuda")

    def causal(b, h, q, k):
        return q >= k
    bm = BlockMask.from_kv_blocks(part_num, part_idx, full_num, full_idx, BLOCK_SIZE=QB, mask_mod=causal,
                                  seq_lengths=(L, L))
    kept = int(full.sum()) * QB * QB + n * QB * (QB + 1) // 2
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    spec = f"blocked({QB}, random({R}, seed=1) | local(0)) & causal"
    impls = {"runtime": lambda q, k, v: st.sparse_attention(q, k, v, bm, spec="causal"),
             "static": lambda q, k, v: st.sparse_attention(q, k, v, spec)}
    impls.update(flex_fns(flex_attention, bm, False))
    if args.ab_lists:  # the A/B of issue 44: the grid list builds (default) against the one-CTA ones
        impls["runtime"] = lists_env(impls["runtime"], "")
        for name, value in (("runtime_cta", "cta"), ("runtime_ctafwd", "fwd"), ("runtime_ctabwd", "bwd")):
            impls[name] = lists_env(lambda q, k, v: st.sparse_attention(q, k, v, bm, spec="causal"), value)
    row = {"case": "blocks", "B": B, "L": L, "H": H, "D": D, "block": QB, "key_blocks": R, "kept": kept * B * H}
    if args.env_ab:  # the A/B alone: the run-time plan with the variable unset and set, alternated, and checked
        env_ab(row, args, impls["runtime"], q, k, v, deadline)
        flop = 4.0 * D * kept * B * H
        for side in ("unset", "set"):
            row[f"runtime_fwd_tflops_{side}"] = flop / row[f"runtime_fwd_ms_{side}"] / 1e9
            row[f"runtime_bwd_tflops_{side}"] = 2.5 * flop / row[f"runtime_bwd_ms_{side}"] / 1e9
        return row
    o_rt, o_st = impls["runtime"](q, k, v), impls["static"](q, k, v)
    row["runtime_vs_static_max_abs"] = (o_rt.float() - o_st.float()).abs().max().item()
    run_impls(row, impls, q, k, v, 4.0 * D * kept * B * H, args.reps, deadline)
    row["runtime_last_kernel"] = next((p.last_kernel() for p in st.cached_plans() if "blocks:" in (p._p.mask or "")), None)
    if args.profile:  # kernel by kernel, forward and backward (the accounting of issue 44's gap)
        do = torch.randn_like(q)
        row["profile"] = {}
        for name in [n for n in impls if n.startswith("runtime") or n == "static"]:
            f = impls[name]
            try:
                row["profile"][name] = {"fwd": kernel_profile(lambda f=f: f(q, k, v)),
                                        "bwd": kernel_profile(grad_fn(f, q, k, v, do))}
            except Exception as e:  # noqa: BLE001
                row["profile"][name] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    os.environ.pop("SPATTN_RT_KEY_LISTS", None)
    return ratios(row, "runtime", [("static", "runtime_over_static"), ("flex", "ratio_vs_flex"),
                                   ("flex_flash", "ratio_vs_flex_flash")] +
                  ([("runtime_cta", "cta_over_grid")] if args.ab_lists else []))


def random_lengths(L, n, g):
    cuts = torch.randperm(L - 1, generator=g)[: n - 1] + 1
    cu = torch.cat([torch.zeros(1, dtype=torch.long), cuts.sort().values, torch.full((1,), L)])
    return cu.int()


def case_documents(args, deadline):
    import spattn
    import spattn.torch as st
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    B, H, D, N, W = 1, 16, 128, 16, 4096
    L = 8192 if args.quick else 65536
    g = torch.Generator().manual_seed(0)
    cus = [random_lengths(L, N, g) for _ in range(8)]
    lengths = (cus[0][1:] - cus[0][:-1]).tolist()
    spec_in = f"local(left={W}, right=0)"
    static_spec = "document(" + ", ".join(map(str, lengths)) + f") & {spec_in}"
    dev_cus = [c.cuda() for c in cus]
    it = [0]

    def runtime(q, k, v):  # new boundaries every call
        it[0] += 1
        return st.sparse_attention(q, k, v, spec_in, cu_seqlens=dev_cus[it[0] % len(dev_cus)])

    gq = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16, generator=gq) for _ in range(3))
    row = {"case": "documents", "B": B, "L": L, "H": H, "D": D, "documents": N, "window": W}
    kept = sum(sum(min(i, W) + 1 for i in range(n)) for n in lengths)
    row["kept"] = kept * B * H
    # check: the run-time plan on the static plan's boundaries against the static plan
    o_rt = st.sparse_attention(q, k, v, spec_in, cu_seqlens=dev_cus[0])
    o_st = st.sparse_attention(q, k, v, static_spec)
    row["runtime_vs_static_max_abs"] = (o_rt.float() - o_st.float()).abs().max().item()
    t0 = time.perf_counter()
    sp = spattn.plan(static_spec, L, L, H, H, D, "cuda", dtype="bfloat16")
    row["static_plan_ms"] = (time.perf_counter() - t0) * 1e3
    del sp
    doc = torch.repeat_interleave(torch.arange(N, device="cuda"), torch.tensor(lengths, device="cuda"))

    def doc_mask(b, h, qi, ki):
        return (doc[qi] == doc[ki]) & (qi >= ki) & (qi - ki <= W)
    t0 = time.perf_counter()
    bm = create_block_mask(doc_mask, None, None, L, L, device="cuda")
    torch.cuda.synchronize()
    row["flex_create_block_mask_ms"] = (time.perf_counter() - t0) * 1e3
    impls = {"runtime": runtime, "static": lambda q, k, v: st.sparse_attention(q, k, v, static_spec)}
    impls.update(flex_fns(flex_attention, bm, False))
    run_impls(row, impls, q, k, v, 4.0 * D * kept * B * H, args.reps, deadline)
    row["runtime_host_us"] = host_us(lambda: runtime(q, k, v))
    row["static_host_us"] = host_us(lambda: impls["static"](q, k, v))
    row["host_us_over_static"] = row["runtime_host_us"] - row["static_host_us"]
    row["runtime_last_kernel"] = next((p.last_kernel() for p in st.cached_plans() if "documents" in (p._p.mask or "")), None)
    return ratios(row, "runtime", [("static", "runtime_over_static"), ("flex", "ratio_vs_flex"),
                                   ("flex_flash", "ratio_vs_flex_flash")])


try:  # the L2 read kernel of l2_rate_gbs (Triton: where it is importable)
    import triton
    import triton.language as tl

    @triton.jit
    def _l2_read(x, out, n_blocks, reps, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        nprog = tl.num_programs(0)
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for r in range(reps):
            b = (pid + r * nprog) % n_blocks
            acc += tl.load(x + b * BLOCK + tl.arange(0, BLOCK), cache_modifier=".cg")
        tl.store(out + pid * BLOCK + tl.arange(0, BLOCK), acc)
except ImportError:
    _l2_read = None


def copy_rate_gbs():
    """Device-to-device copy rate (GB/s, read + write) of a 1 GiB buffer: the HBM rate of the top-k floor."""
    x = torch.empty(1 << 29, dtype=torch.int16, device="cuda")
    y = torch.empty_like(x)
    ms = min(timed(lambda: y.copy_(x), 10, time.time() + 60) for _ in range(3))
    return 2 * x.numel() * 2 / ms / 1e6


def l2_rate_gbs():
    """The L2 read rate (GB/s): a Triton kernel re-reading a quarter of the L2 (loads that bypass L1, .cg), GBs in one
    launch; without Triton, an in-L2 device copy, 100 of them in a CUDA graph, read + write bytes counted. The best of
    3 runs (a bound wants the highest rate)."""
    l2 = torch.cuda.get_device_properties(0).L2_cache_size or (50 << 20)
    n = max(1 << 16, l2 // 4 // 4)  # fp32 elements in a quarter of the L2
    if _l2_read is not None:
        BLOCK, reps = 2048, 256
        n_blocks = n // BLOCK
        x = torch.ones(n_blocks * BLOCK, device="cuda")
        progs = torch.cuda.get_device_properties(0).multi_processor_count * 8
        out = torch.empty(progs * BLOCK, device="cuda")
        run = lambda: _l2_read[(progs,)](x, out, n_blocks, reps, BLOCK=BLOCK)  # noqa: E731
        ms = min(timed(run, 10, time.time() + 30) for _ in range(3))
        return progs * reps * BLOCK * 4 / ms / 1e6
    else:
        a = torch.empty(n // 2, device="cuda")
        b = torch.empty_like(a)
        graph = torch.cuda.CUDAGraph()
        b.copy_(a)
        with torch.cuda.graph(graph):
            for _ in range(100):
                b.copy_(a)
        ms = min(timed(graph.replay, 10, time.time() + 30) for _ in range(3))
        return 100 * 2 * a.numel() * 4 / ms / 1e6


def topk_floor(row, B, L, Hq, Hkv, D, listed, idx_bytes):
    """The gather floor of a top-k row (the module's docstring): fills row's rates, bytes and floor_{fwd,bwd}_ms.
    `listed`: the listed keys (not -1) over every (batch, query, kv head); idx_bytes: the indices' size."""
    hbm, l2 = copy_rate_gbs(), l2_rate_gbs()
    e = 2  # bf16
    gathered = listed * 2 * D * e
    in_l2 = L * 2 * D * e <= torch.cuda.get_device_properties(0).L2_cache_size / 2
    q_bytes, kv_bytes = B * L * Hq * D * e, B * L * Hkv * D * e
    unique_fwd = 2 * q_bytes + 2 * kv_bytes + idx_bytes  # Q, O; K, V
    unique_bwd = 4 * q_bytes + 4 * kv_bytes + B * Hq * L * 4 + idx_bytes  # Q, O, dO, dQ; K, V, dK, dV; LSE
    gather_ms = gathered / (l2 if in_l2 else hbm) / 1e6
    row.update({"hbm_rate_gbs": hbm, "l2_rate_gbs": l2, "gathered_bytes": gathered, "gather_from_l2": in_l2,
                "gather_ms": gather_ms, "unique_fwd_ms": unique_fwd / hbm / 1e6, "unique_bwd_ms": unique_bwd / hbm / 1e6})
    row["floor_fwd_ms"] = max(gather_ms, row["unique_fwd_ms"])
    row["floor_bwd_ms"] = max(gather_ms, row["unique_bwd_ms"])
    notes = []
    for p in ("fwd", "bwd"):
        m = row.get(f"runtime_{p}_ms")
        row[f"fraction_of_floor_{p}"] = row[f"floor_{p}_ms"] / m if m else None
        if m and m < row[f"floor_{p}_ms"]:
            notes.append(f"{p} is past the gather floor: its kernel reads fewer bytes than a gather per (query, kv "
                         "head), sharing rows between queries")
    row["floor_note"] = "; ".join(notes) or None
    return row


def case_topk(args, deadline, per_kv_head=False):
    """Top-k keys shared by the heads ([B, L, K]), or (per_kv_head: case topk_kv) one list per kv head."""
    import spattn.torch as st

    B, Hq, Hkv, D, K = 1, 32, 8, 128, 2048
    L = 4096 if args.quick else 32768
    th = Hkv if per_kv_head else 1
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, L, Hq, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(B, L, Hkv, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    # per query (and kv head): K distinct keys (quick sizes: the top K of random scores at or before it, ties past the
    # diagonal; else a random start and a stride of 13, without an L x L score matrix)
    if L <= 8192:
        idx = torch.rand(B, th, L, L, device="cuda", generator=g).tril().topk(K, -1).indices.transpose(1, 2)
    else:  # sampled without the dense score matrix: K distinct keys per row by a random offset walk
        base = torch.randint(0, L, (B, L, th, 1), device="cuda", generator=g)
        idx = (base + torch.arange(K, device="cuda") * 13) % L
    idx = idx.int()  # [B, L, th, K]
    row = {"case": "topk_kv" if per_kv_head else "topk", "B": B, "L": L, "Hq": Hq, "Hkv": Hkv, "D": D, "K": K,
           "index_heads": th, "kept": B * Hq * L * K}
    arg = (idx if per_kv_head else idx[:, :, 0]).contiguous()
    f = lambda q, k, v: st.sparse_attention(q, k, v, None, topk_indices=arg)  # noqa: E731
    # check: sampled rows against an fp32 gather
    o = f(q, k, v)
    rows = torch.tensor([0, 1, L // 2, L - 1], device="cuda")
    ks = idx[0, rows].long()  # [r, th, K]
    kg = torch.stack([k[0, ks[:, h % th], h] for h in range(Hkv)], 2).float().repeat_interleave(Hq // Hkv, 2)
    vg = torch.stack([v[0, ks[:, h % th], h] for h in range(Hkv)], 2).float().repeat_interleave(Hq // Hkv, 2)
    s = torch.einsum("rhd,rkhd->rhk", q[0, rows].float(), kg) / D ** 0.5  # kg: [r, K, Hq, D]
    ref = torch.einsum("rhk,rkhd->rhd", s.softmax(-1), vg)
    row["max_abs_err_sampled"] = (o[0, rows].float() - ref).abs().max().item()
    run_impls(row, {"runtime": f}, q, k, v, 4.0 * D * row["kept"], args.reps, deadline)
    listed = int((idx >= 0).sum()) * (Hkv // th)  # rows gathered over every (batch, query, kv head)
    topk_floor(row, B, L, Hq, Hkv, D, listed, idx.numel() * 4)
    row["runtime_over_static_fwd"] = row["runtime_over_static_bwd"] = None  # no static plan of the same pairs
    row["ratio_vs_flex_fwd"] = row["ratio_vs_flex_bwd"] = None
    row["runtime_last_kernel"] = next((p.last_kernel() for p in st.cached_plans() if "topk" in (p._p.mask or "")), None)
    return row


ROW_MARK = "runtime_bench row: "


def run_case(name, args, deadline, timeout):
    """Runs one case in a child process (a device-side assert or a crash there leaves the other cases' CUDA context
    alone) and returns its row; a child that fails gives a row with its error and the tail of its output."""
    cmd = [sys.executable, os.path.abspath(__file__), "--one-case", name, "--deadline", repr(deadline),
           "--reps", str(args.reps)]
    cmd += [flag for flag, on in (("--quick", args.quick), ("--ab-lists", args.ab_lists), ("--profile", args.profile))
            if on]
    cmd += ["--env-ab", args.env_ab] if args.env_ab else []
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"case": name, "error": f"timed out after {timeout:.0f} s"}
    sys.stderr.write(r.stderr[-4000:])
    for line in reversed(r.stdout.splitlines()):
        if line.startswith(ROW_MARK):
            return json.loads(line[len(ROW_MARK):])
    tail = (r.stdout + r.stderr).strip().splitlines()[-3:]
    return {"case": name, "error": f"child exited {r.returncode} without a row: " + " | ".join(tail)[:600]}


def output_path(json_path, baseline):
    """Where the rows go: --json's path, else --baseline NAME's $SPATTN_BASELINES/NAME.json where that is set
    (bench/baseline.py's variable: a tree that does not come back from the GPU machine), else
    bench/baselines/NAME.json; None without either."""
    if json_path:
        return json_path
    if not baseline:
        return None
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "baselines")
    return os.path.join(os.environ.get("SPATTN_BASELINES") or here, baseline + ".json")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--baseline", help="write bench/baselines/NAME.json")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="small lengths (a smoke run)")
    ap.add_argument("--cases", default="blocks,documents,topk")
    ap.add_argument("--budget-s", type=float, default=150,
                    help="stop taking more reps past this many seconds (shared by the cases in turn)")
    ap.add_argument("--ab-lists", action="store_true",
                    help="blocks: also time the one-CTA list builds (SPATTN_RT_KEY_LISTS=cta, fwd, bwd) in the same "
                         "process, rows runtime_cta_*, runtime_ctafwd_*, runtime_ctabwd_*")
    ap.add_argument("--profile", action="store_true",
                    help="blocks: each run-time build's and the static plan's kernels by torch.profiler, forward and "
                         "backward (row key profile: device microseconds a call and the heaviest kernels)")
    ap.add_argument("--env-ab", default="", metavar="VAR=VALUE",
                    help="blocks only: the run-time block mask's forward and backward with VAR unset and set (read by "
                         "spattn at each call), alternated in one process, each checked against an fp64 CPU reference "
                         "at L = 2048 (rows runtime_*_ms_unset / _set, set_over_unset_*, env_ab_check, env_ab_ok); "
                         "e.g. SPATTN_HEAD_SECTION=0")
    ap.add_argument("--one-case", help=argparse.SUPPRESS)  # internal: run this case here, print its row
    ap.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("runtime_bench: no CUDA device (this bench runs on a GPU)")
        return 0
    if args.env_ab and "=" not in args.env_ab:
        raise SystemExit(f"runtime_bench: --env-ab wants VAR=VALUE, got '{args.env_ab}'")
    if args.env_ab and args.cases == ap.get_default("cases"):
        args.cases = "blocks"  # the A/B is the block mask's
    import spattn
    if not spattn.build_info()["cuda"]:
        print("runtime_bench: this spattn build has no CUDA")
        return 0
    cases = {"blocks": case_blocks, "documents": case_documents, "topk": case_topk,
             "topk_kv": lambda a, d: case_topk(a, d, per_kv_head=True)}
    if args.one_case:  # a child: one case, its row as the last line of stdout
        try:
            row = cases[args.one_case](args, args.deadline)
        except Exception as e:  # noqa: BLE001
            row = {"case": args.one_case, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
        print(ROW_MARK + json.dumps(row), flush=True)
        return 0
    start = time.time()
    rows = []
    names = [c for c in args.cases.split(",") if c]
    for i, name in enumerate(names):
        if name not in cases:
            raise SystemExit(f"runtime_bench: unknown case '{name}' (cases: {', '.join(cases)})")
        left = args.budget_s - (time.time() - start)
        share = max(5.0, left / (len(names) - i))
        row = run_case(name, args, time.time() + share, timeout=share + 180)  # + plans, compiles, checks
        row["device"] = torch.cuda.get_device_name()
        row["seconds"] = round(time.time() - start, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
    except OSError:
        commit = None
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "spattn": spattn.__version__, "quick": args.quick, "commit": os.environ.get("SPATTN_COMMIT") or commit,
            "command": "python3 bench/runtime_bench.py " + " ".join(sys.argv[1:]), "seconds": round(time.time() - start, 1)}
    out = {"kind": "runtime", "meta": meta, "rows": rows}
    path = output_path(args.json, args.baseline)
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as fh:
            json.dump(out, fh, indent=1)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
