#!/usr/bin/env python3
"""GPU benchmark of spattn's fused block-sparse attention against FlexAttention and SDPA, in one process.

For each suite case of docs/BENCHMARKS.md (bf16, B=2, H=16, D=64; dense and causal also D=128) and each length it times
  spattn            our fused kernel (libspattn.so through ctypes, on torch tensors' device pointers)
  flex_attention    torch.compile(flex_attention) with create_block_mask of the same pattern
  sdpa_flash        dense SDPA, flash backend   (the dense anchors, timed once per (L, D))
  sdpa_cudnn        dense SDPA, cuDNN backend
with CUDA events around each call (a CUDA-graph replay of it), after a warm-up, median of --reps (>= 20); ours
and Flex's calls alternate (time_paired), so that both run in the same GPU state. Our output (poisoned before the
timed runs) and Flex's are checked against an fp32 torch reference on sampled query rows of two heads, with the
mask taken from the library's own row enumeration (spattn_pattern_mask), so a wrong mask_mod shows up too.

Writes {"meta": ..., "machine": ..., "command": ..., "rows": [...]} (fields of docs/BENCHMARKS.md; meta: commit, date,
command) and a PNG plot beside it if matplotlib is there (bench/baseline.py draws it), and prints one table: our
eff TFLOP/s, Flex's, ratio, dense cuDNN's. --baseline NAME writes them as bench/baselines/NAME.{json,png} (the
the tables of docs/RESULTS.md and README.md come from there: bench/tables.py), besides --out if that is given too.

  python3 bench/gpu_bench.py --lib build/libspattn.so --out out/h100.json
  python3 bench/gpu_bench.py --lib build/libspattn.so --baseline h100-fused     # see bench/README.md
"""
import argparse
import ctypes
import datetime
import json
import math
import re
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

import baseline  # bench/baseline.py (this file's folder is on sys.path when it runs as a script)

# ---------------------------------------------------------------------------------------------------- the library


class Lib:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        L = self.lib
        i64, vp = ctypes.c_int64, ctypes.c_void_p
        L.spattn_last_error.restype = ctypes.c_char_p
        cp = ctypes.c_char_p
        L.spattn_plan_create.argtypes = [cp, ctypes.c_int, ctypes.c_int, i64, i64, i64, i64, i64, i64, ctypes.c_double,
                                         cp, ctypes.POINTER(vp)]
        L.spattn_plan_destroy.argtypes = [vp]
        L.spattn_plan_info.argtypes = [vp, ctypes.POINTER(i64)]
        for f in ("spattn_plan_explain", "spattn_plan_kernel", "spattn_plan_last_kernel"):
            getattr(L, f).argtypes = [vp]
            getattr(L, f).restype = cp
        p64 = ctypes.POINTER(i64)
        L.spattn_plan_forward.argtypes = [vp, vp, p64, vp, p64, vp, p64, vp, p64, vp, vp]
        L.spattn_plan_backward.argtypes = [vp] + [vp, p64] * 4 + [vp] + [vp, p64] * 4 + [vp]
        L.spattn_plan_last_backward_kernel.argtypes = [vp]
        L.spattn_plan_last_backward_kernel.restype = cp
        L.spattn_pattern_mask.argtypes = [ctypes.c_char_p, i64, i64, i64, i64, vp]
        L.spattn_pattern_nnz.argtypes = [ctypes.c_char_p, i64, i64, p64]

    def check(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"{what}: {self.lib.spattn_last_error().decode()}")

    def mask_rows(self, spec, L, rows):
        """Dense uint8 mask of the given query rows (a sorted list of (begin, end) ranges) -> bool tensor."""
        parts = []
        for a, b in rows:
            buf = torch.empty((b - a, L), dtype=torch.uint8)
            self.check(self.lib.spattn_pattern_mask(spec.encode(), L, L, a, b, ctypes.c_void_p(buf.data_ptr())),
                       "spattn_pattern_mask")
            parts.append(buf)
        return torch.cat(parts).bool()


# bench shape variants (SHAPE:VARIANT) -> spattn::PlanOptions: cp cp.async kernels, p / np persistent or one item a
# CTA, b / nb band kernel or not, ns / s3 / ss never split the band kernel's last items, 3 parts each over the keys,
# or as single slabs, nc one tile list (no compound plan), nm / m neighborhoods without / with a tile map (issue 23)
VARIANTS = {"": "", "cp": "kernel=sm90_cp", "p": "persistent=1", "np": "persistent=0", "b": "kernel=sm90_band",
            "nb": "kernel=sm90_tma", "ns": "kernel=sm90_band,split=0", "s3": "kernel=sm90_band,split=3",
            "ss": "kernel=sm90_band,split=1", "nc": "compound=0", "nm": "tile_map=0", "m": "tile_map=1"}
PROBLEM = {"batch": 2, "heads": 16}  # main() sets them from --batch / --heads
# Affine terms at any stride (issue 42): the Sparse Transformer's strided pattern, a wide dilation, a causal stride.
STRIDED = ["strided128", "strided256", "strided512", "dil64_32", "stride64c"]
# suite cases run only when --patterns names them (not in the baselines' suite); --patterns strided names STRIDED
OPT_IN = {"lfcols", "sinks", *STRIDED}
GROUPS = {"strided": STRIDED}


class Fused:
    """One spattn::Plan (pattern, [B, H, L, D] bf16 problem on CUDA device 0) and forward calls on [B, H, L, D]-
    contiguous tensors (passed as [B, L, H, D] views: no copies)."""

    def __init__(self, lib, spec, L, D, block=0, force_sm80=False, block_n=None, variant="", dtype=torch.bfloat16):
        self.lib = lib
        B, H = PROBLEM["batch"], PROBLEM["heads"]
        opts = [VARIANTS[variant]] if VARIANTS[variant] else []
        if force_sm80:
            opts.append("kernel=sm80")
        if block:
            opts += [f"block_m={block}", f"block_n={block if block_n is None else block_n}"]
        h = ctypes.c_void_p()
        t0 = time.perf_counter()
        lib.check(lib.lib.spattn_plan_create(spec.encode(), 0, 0 if dtype == torch.bfloat16 else 1, B, H, H, L, L, D,
                                             float("nan"), ",".join(opts).encode(), ctypes.byref(h)), f"plan {spec}")
        self.plan_ms = (time.perf_counter() - t0) * 1e3
        self.h = h
        info = (ctypes.c_int64 * 4)()
        lib.check(lib.lib.spattn_plan_info(h, info), "info")
        self.nnz = info[0] // H  # per head
        self.explain = lib.lib.spattn_plan_explain(h).decode()
        self.kernel = lib.lib.spattn_plan_kernel(h).decode()
        m = re.search(r"block (\d+)x(\d+), perm_d (\d+)", self.explain)
        self.block_m, self.block_n, self.perm_d = (int(x) for x in m.groups()) if m else (0, 0, 0)

    def __del__(self):
        if getattr(self, "h", None):
            self.lib.lib.spattn_plan_destroy(self.h)

    def forward(self, q, k, v, o, lse=None):
        stream = torch.cuda.current_stream().cuda_stream
        rc = self.lib.lib.spattn_plan_forward(
            self.h, q.data_ptr(), bhld_strides(q), k.data_ptr(), bhld_strides(k), v.data_ptr(), bhld_strides(v),
            o.data_ptr(), bhld_strides(o), lse.data_ptr() if lse is not None else None, ctypes.c_void_p(stream))
        self.lib.check(rc, "spattn_plan_forward")

    def backward(self, q, k, v, o, lse, do, dq, dk, dv):
        """spattn_plan_backward on [B, H, L, D]-contiguous tensors (o, lse from forward)."""
        ts = (q, k, v, o)
        gs = (do, dq, dk, dv)
        args = [x for t in ts for x in (t.data_ptr(), bhld_strides(t))] + [lse.data_ptr()]
        args += [x for t in gs for x in (t.data_ptr(), bhld_strides(t))]
        rc = self.lib.lib.spattn_plan_backward(self.h, *args, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        self.lib.check(rc, "spattn_plan_backward")

    def last_kernel(self):
        return self.lib.lib.spattn_plan_last_kernel(self.h).decode()

    def last_backward_kernel(self):
        return self.lib.lib.spattn_plan_last_backward_kernel(self.h).decode()


def bhld_strides(t):
    """(batch, seq, head, dim) strides of a [B, H, L, D] tensor viewed as [B, L, H, D]."""
    s = t.stride()
    return (ctypes.c_int64 * 4)(s[0], s[2], s[1], s[3])


# ---------------------------------------------------------------------------------------------------- the suite


def neighborhood_mask(dims, kernel, dilation=None, causal=None):
    """FlexAttention mask_mod of neighborhood(dims=, kernel=, dilation=, causal=), written from PATTERNS.md
    ("Neighborhood attention"): on every axis the key's coordinate lies in the query's window."""
    na = len(dims)
    dilation = dilation or (1,) * na
    causal = causal or (0,) * na

    def axis_in(i, j, n, K, d, c):
        g, p, t = i % d, i // d, j // d
        same = (j % d) == g
        if c:
            return same & (t <= p) & (t > p - K)
        ng = (n - 1 - g) // d + 1
        s = torch.minimum(torch.clamp(p - K // 2, min=0), ng - K)
        return same & (t >= s) & (t < s + K)

    def coords(x):
        cs = []
        for n in reversed(dims):
            cs.append(x % n)
            x = x // n
        return cs[::-1]

    def mask_mod(b, h, q, k):
        qc, kc = coords(q), coords(k)
        m = axis_in(qc[0], kc[0], dims[0], kernel[0], dilation[0], causal[0])
        for a in range(1, na):
            m = m & axis_in(qc[a], kc[a], dims[a], kernel[a], dilation[a], causal[a])
        return m

    return mask_mod


def suite(L):
    """(name, spec, mask_mod or None (None: precomputed boolean tensor from the library), head dims)."""
    w = 256
    n = int(math.isqrt(L))
    K = 13
    d3 = (max(1, L // 1024), 32, 32)  # na3d: 16 x 32 x 32 at L = 16384

    def local(b, h, q, k):
        return (q - k).abs() <= w

    def longformer(b, h, q, k):
        return ((q - k).abs() <= w) | (q < 32) | (k < 32)

    def lfcols(b, h, q, k):
        return ((q - k).abs() <= w) | (k < 32)

    def sinks(b, h, q, k):
        return ((q - k <= 1024) & (q >= k)) | (k < 4)

    def dilated(b, h, q, k):
        d = q - k
        return (d.abs() <= w * 2) & (d % 2 == 0)

    def fixed(b, h, q, k):
        return ((q // 128) == (k // 128)) | (k % 128 >= 127)

    def causal(b, h, q, k):
        return q >= k

    def sparse_strided(s):  # local(left=s-1, right=0) | (stride(s) & causal)
        def mask_mod(b, h, q, k):
            d = q - k
            return (d >= 0) & ((d < s) | (d % s == 0))

        return mask_mod

    def dil64_32(b, h, q, k):
        d = q - k
        return (d.abs() <= 64 * 32) & (d % 32 == 0)

    def stride64c(b, h, q, k):
        d = q - k
        return (d >= 0) & (d % 64 == 0)

    def dense(b, h, q, k):
        return q >= 0

    r = 205 if L <= 4096 else 820
    r_sparse = L // 200  # 0.5%: tens of keys a row
    return [
        ("local", "local(256)", local, (64,)),
        ("longformer", "longformer(256, 32)", longformer, (64,)),
        # band rows with a key prefix (the band kernel's prefix chunks): longformer without its global rows, and a
        # causal window with 4 attention sinks (StreamingLLM)
        ("lfcols", "local(256) | global_cols(0:32)", lfcols, (64,)),
        ("sinks", "local(left=1024, right=0) | global_cols(0:4)", sinks, (64,)),
        ("bigbird", "bigbird(64, 1, 2, 3, seed=0)", None, (64,)),
        ("dilated", "dilated(256, 2)", dilated, (64,)),
        ("causal", "causal", causal, (64, 128)),
        ("dense", "dense", dense, (128, 64)),
        ("fixed", "sparse_fixed(128)", fixed, (64,)),
        ("random", f"random({r}, seed=0)", None, (64,)),
        ("na2d", f"neighborhood(dims=({n},{n}), kernel={K})", neighborhood_mask((n, n), (K, K)), (64,)),
        # compound plans (issue 24): a band with a few scattered keys a row, and sparse random rows
        ("bandrand", "local(256) | random(4, seed=1)", None, (64,)),
        ("sprandom", f"random({r_sparse}, seed=0)", None, (64,)),
        # neighborhoods (issue 23): 1-D, 2-D dilated (64 x 64 at L = 4096), 3-D with a causal first axis; 2-D and 3-D
        # run in multi-dimensional tiles through a tile map (variant :nm, the row-major plan in the same process)
        ("na2d_dil", f"neighborhood(dims=({n},{n}), kernel=7, dilation=2)", neighborhood_mask((n, n), (7, 7), (2, 2)), (64,)),
        ("na3d", f"neighborhood(dims=({d3[0]},{d3[1]},{d3[2]}), kernel=7, causal=(1,0,0))",
         neighborhood_mask(d3, (7, 7, 7), None, (1, 0, 0)), (64,)),
        ("na1d", "neighborhood(kernel=257)", neighborhood_mask((L,), (257,)), (64,)),
        # affine terms at any stride (issue 42; opt-in: --patterns strided): the strided term split from the band and
        # grouped by residue, dilated and causal strides grouped past 16
        ("strided128", "sparse_strided(128)", sparse_strided(128), (64, 128)),
        ("strided256", "sparse_strided(256)", sparse_strided(256), (64, 128)),
        ("strided512", "sparse_strided(512)", sparse_strided(512), (64, 128)),
        ("dil64_32", "dilated(64, 32)", dil64_32, (64, 128)),
        ("stride64c", "stride(64) & causal", stride64c, (64, 128)),
    ]


# ---------------------------------------------------------------------------------------------------- timing


USE_GRAPHS = True   # --no-graph: time the calls themselves (host launch cost included when the GPU starves)
LAST_TIMING = ["eager"]  # how the last time_ms call timed ("graph": CUDA-graph replays, "eager": the calls)


def _graph_or_call(fn):
    """fn captured once in a CUDA graph (its replay), or fn itself where capture fails; and how it is timed."""
    if USE_GRAPHS:
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            g.replay()
            torch.cuda.synchronize()
            return g.replay, "graph"
        except Exception as e:  # noqa: BLE001
            print(f"# graph capture failed ({str(e)[:100]}), timing the calls", flush=True)
            torch.cuda.synchronize()
    return fn, "eager"


def set_env(var, value):
    """var=value in this process's environment (the library reads its A/B switches at each call); value None: unset."""
    if value is None:
        os.environ.pop(var, None)
    else:
        os.environ[var] = value


def with_env(fn, env):
    """fn with the environment variables of env ({name: value}; None: unset) set around each call and restored after
    (the library reads its A/B switches at each call, at make_plan or where the backward's plans are built); fn itself
    where env is empty."""
    if not env:
        return fn

    def call():
        old = {var: os.environ.get(var) for var in env}
        try:
            for var, value in env.items():
                set_env(var, value)
            return fn()
        finally:
            for var, value in old.items():
                set_env(var, value)
    return call


def time_ms(fn, reps, warmup=5):
    """Median GPU time of fn over reps calls. Each call is captured once in a CUDA graph and the replays are
    timed, so that every implementation is timed on the GPU alone: a caller whose host cost per call exceeds
    the kernel's time (torch.compile guards, Python) would otherwise starve the GPU and be timed at its host
    speed (FlexAttention's local(256) at L=4096 measured 75-185 TFLOP/s from run to run that way). Falls back
    to timing the calls where capture fails."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    call, how = _graph_or_call(fn)
    LAST_TIMING[0] = how
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        call()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def time_paired(fns, reps, warmup=5):
    """Median GPU times of several implementations of one case, timed in alternation (a call of each, in turn,
    reps times), so that all of them run in the same GPU state: timed one after the other, the first one
    inherits the clocks and temperature left by whatever ran before it (the dense anchors at L=16384 cost the
    next case ~8%), and the second ones do not. Graph replays as in time_ms. -> ([ms...], [timing...])"""
    for _ in range(warmup):
        for fn in fns:
            fn()
    torch.cuda.synchronize()
    calls = [_graph_or_call(fn) for fn in fns]
    for _ in range(warmup):
        for call, _how in calls:
            call()
    ev = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
          for _ in fns]
    for i in range(reps):
        for j, (call, _how) in enumerate(calls):
            ev[j][i][0].record()
            call()
            ev[j][i][1].record()
    torch.cuda.synchronize()
    return ([statistics.median(a.elapsed_time(b) for a, b in e) for e in ev], [how for _call, how in calls])


def time_pair(fns, reps=20, warmup=3):
    """Median GPU times (ms) of eager calls of several functions, called in turn reps times (as time_paired, without
    graphs: for autograd calls, whose graph capture is not what users run), warmup calls of each first."""
    for f in fns:
        for _ in range(warmup):
            f()
    torch.cuda.synchronize()
    ts = [[] for _ in fns]
    for _ in range(reps):
        for i, f in enumerate(fns):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            f()
            b.record()
            ts[i].append((a, b))
    torch.cuda.synchronize()
    return [statistics.median(a.elapsed_time(b) for a, b in t) for t in ts]


def sample_rows(L):
    m = min(256, L // 4)
    mid = L // 2
    return [(0, m), (mid - m // 2, mid + m // 2), (L - m, L)]


def reference(q, k, v, mask_rows, rows, heads=(0, 1)):
    """fp32 masked attention of batch 0, the given heads, on the sampled query rows -> [len(heads), R, D]."""
    idx = torch.cat([torch.arange(a, b) for a, b in rows]).to(q.device)
    out = []
    m = mask_rows.to(q.device)
    for h in heads:
        qs = q[0, h, idx].float()
        s = (qs @ k[0, h].float().T) / math.sqrt(q.shape[-1])
        s = s.masked_fill(~m, float("-inf"))
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        out.append(p @ v[0, h].float())
    return torch.stack(out), idx


def rel_err(o, ref, idx, heads=(0, 1)):
    got = torch.stack([o[0, h, idx].float() for h in heads])
    if not torch.isfinite(got).all():
        return float("inf")
    return (torch.linalg.vector_norm(got - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-30)).item()


# ---------------------------------------------------------------------------------------------------- main


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=os.path.join(os.environ.get("SPATTN_BUILD", "build"), "libspattn.so"))
    ap.add_argument("--out", default=None, help="JSON file (default out/<gpu>-<date>.json, or none with --baseline)")
    ap.add_argument("--baseline", default=None, metavar="NAME",
                    help="also write bench/baselines/NAME.json and NAME.png (e.g. h100-fused)")
    ap.add_argument("--lengths", default="4096,16384")
    ap.add_argument("--patterns", default="",
                    help="comma list of suite names (default: all but the opt-in ones; 'strided': issue 42's cases)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--dims", default="", help="comma list of head dims for every pattern (default: each its own)")
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--sm80", action="store_true", help="also time the mma.sync kernel on Hopper")
    ap.add_argument("--shapes", default="",
                    help="also time forced tile shapes, e.g. 64x128,128x128,192x128,64x64 (empty: chosen, for a variant alone: "
                         "':nc' runs the pattern as one tile list); suffix :cp keeps the "
                         "cp.async kernels where the warp-specialized TMA kernel would run (128x128:cp); :p / :np run the "
                         "TMA kernel with persistent CTAs / one work item a CTA; :b / :nb with / without the band kernel "
                         "(band-row patterns)")
    ap.add_argument("--probe", default="", help="only run ours a few times (for ncu): SPEC;L;D;BMxBN")
    ap.add_argument("--budget-s", type=float, default=1e9, help="stop starting new cases after this many seconds")
    ap.add_argument("--no-graph", action="store_true",
                    help="time the calls themselves instead of CUDA-graph replays of them (host cost included)")
    args = ap.parse_args()
    global USE_GRAPHS
    USE_GRAPHS = not args.no_graph
    PROBLEM.update(batch=args.batch, heads=args.heads)
    t_start = time.time()
    assert args.reps >= 20, "docs/BENCHMARKS.md: median of at least 20"

    lib = Lib(args.lib)
    if args.probe:
        spec, L, D, shape = args.probe.split(";")
        L, D = int(L), int(D)
        tiles, _, variant = shape.partition(":")
        bm_, bn_ = (int(x) for x in tiles.split("x"))
        fp = Fused(lib, spec, L, D, block=bm_, block_n=bn_, variant=variant)
        q, k, v = (torch.randn(args.batch, args.heads, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        o = torch.empty_like(q)
        ms = time_ms(lambda: fp.forward(q, k, v, o), 20)
        print(f"probe {spec} L={L} D={D} {shape}: {ms:.3f} ms, {4.0 * fp.nnz * D * args.batch * args.heads / ms / 1e9:.1f} TF/s")
        return
    dev = torch.cuda.get_device_name()
    props = torch.cuda.get_device_properties(0)
    machine = {"gpu": dev, "sms": props.multi_processor_count, "torch": torch.__version__,
               "cuda": torch.version.cuda, "host": platform.node(), "date": datetime.datetime.now().isoformat()}
    print(f"# {dev}, torch {torch.__version__}", flush=True)

    flex = None
    if not args.no_flex:
        try:
            import torch._dynamo as dynamo
            # one compiled kernel per (mask_mod, shape): the suite needs more than the default 8
            dynamo.config.recompile_limit = 1000
            dynamo.config.cache_size_limit = 1000
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention
            flex = torch.compile(flex_attention, dynamic=False)
        except Exception as e:  # noqa: BLE001
            print(f"# FlexAttention unavailable: {e}")
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, H = args.batch, args.heads
    rows_out, table = [], []
    dense_cache = {}
    wanted = {n for w in filter(None, args.patterns.split(",")) for n in GROUPS.get(w, [w])}

    def row(impl, name, spec, L, D, density, ms, nnz, plan_ms=0.0, err=None):
        eff = 4.0 * nnz * D * B * H / (ms * 1e-3) / 1e12 if ms else None
        r = {"impl": impl, "pattern": name, "spec": spec, "device": dev, "B": B, "L": L, "Hq": H, "Hkv": H, "D": D,
             "dtype": "bf16", "density": density, "ms": ms, "eff_tflops": eff, "plan_ms": plan_ms, "rel_err": err,
             "timing": LAST_TIMING[0]}
        rows_out.append(r)
        return eff

    for L in [int(x) for x in args.lengths.split(",")]:
        for name, spec, mask_mod, dims in suite(L):
            if (wanted and name not in wanted) or (not wanted and name in OPT_IN):
                continue
            for D in ([int(x) for x in args.dims.split(",")] if args.dims else dims):
                if time.time() - t_start > args.budget_s:
                    print(f"# budget reached, skipping {name} L={L} D={D}", flush=True)
                    continue
                torch.manual_seed(0)
                q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                # dense anchors, once per (L, D)
                if (L, D) not in dense_cache:
                    res = {}
                    for impl, be in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION)):
                        try:
                            with sdpa_kernel(be):
                                res[impl] = time_ms(lambda: F.scaled_dot_product_attention(q, k, v), args.reps)
                        except Exception as e:  # noqa: BLE001
                            print(f"# {impl} failed: {str(e)[:120]}")
                            res[impl] = None
                    dense_cache[(L, D)] = res
                    for impl, ms in res.items():
                        if ms:
                            row(impl, "dense", "dense", L, D, 1.0, ms, L * L)
                dense = dense_cache[(L, D)]

                # ours and FlexAttention with the same pattern, timed in alternation (time_paired)
                fused = Fused(lib, spec, L, D)
                nnz = fused.nnz
                density = nnz / (L * L)
                o = torch.empty_like(q)
                lse = torch.empty(B, H, L, device="cuda", dtype=torch.float32)
                fns = [lambda: fused.forward(q, k, v, o, lse)]
                bm, full, flex_plan_ms = None, None, 0.0
                if flex is not None:
                    try:
                        if mask_mod is None:
                            full = lib.mask_rows(spec, L, [(0, L)]).cuda()
                            mm = lambda b, h, qi, ki: full[qi, ki]  # noqa: E731
                        else:
                            mm = mask_mod
                        t0 = time.perf_counter()
                        bm = create_block_mask(mm, B=None, H=None, Q_LEN=L, KV_LEN=L, device="cuda")
                        flex_plan_ms = (time.perf_counter() - t0) * 1e3
                        flex(q, k, v, block_mask=bm)  # compile
                        fns.append(lambda: flex(q, k, v, block_mask=bm))
                    except Exception as e:  # noqa: BLE001
                        print(f"# flex failed on {name} L={L}: {str(e)[:200]}", flush=True)
                try:
                    times, hows = time_paired(fns, args.reps)
                except Exception as e:  # noqa: BLE001
                    if len(fns) == 1:
                        raise
                    print(f"# flex failed on {name} L={L} while timed: {str(e)[:200]}", flush=True)
                    fns = fns[:1]
                    times, hows = time_paired(fns, args.reps)
                ms_ours = times[0]
                o.fill_(float("nan"))
                fused.forward(q, k, v, o, lse)
                torch.cuda.synchronize()
                rows = sample_rows(L)
                mrows = lib.mask_rows(spec, L, rows)
                ref, idx = reference(q, k, v, mrows, rows)
                err = rel_err(o, ref, idx)
                LAST_TIMING[0] = hows[0] + "-paired" * (len(fns) > 1)
                eff_ours = row("spattn", name, spec, L, D, density, ms_ours, nnz, fused.plan_ms, err)
                eff_flex, err_flex = None, None
                if len(fns) > 1:
                    of = flex(q, k, v, block_mask=bm)
                    err_flex = rel_err(of, ref, idx)
                    LAST_TIMING[0] = hows[1] + "-paired"
                    eff_flex = row("flex_attention", name, spec, L, D, density, times[1], nnz, flex_plan_ms, err_flex)
                    del of
                del bm, full
                ms80 = None
                if args.sm80:
                    f80 = Fused(lib, spec, L, D, force_sm80=True)
                    ms80 = time_ms(lambda: f80.forward(q, k, v, o, lse), args.reps)
                    f80.forward(q, k, v, o, lse)
                    row("spattn:sm80", name, spec, L, D, density, ms80, nnz, f80.plan_ms, rel_err(o, ref, idx))

                for shape in filter(None, args.shapes.split(",")):
                    tiles, _, variant = shape.partition(":")
                    bm_, bn_ = (int(x) for x in tiles.split("x")) if tiles else (0, 0)
                    if D == 128 and (bm_, bn_) in ((64, 128), (192, 128)):
                        continue
                    fs = Fused(lib, spec, L, D, block=bm_, block_n=bn_, variant=variant)
                    ms_s = time_ms(lambda: fs.forward(q, k, v, o, lse), args.reps)
                    fs.forward(q, k, v, o, lse)
                    eff_s = row(f"spattn:{shape}", name, spec, L, D, density, ms_s, nnz, fs.plan_ms, rel_err(o, ref, idx))
                    print(f"    forced {shape}: {eff_s:7.1f} TF/s ({ms_s:.3f} ms)", flush=True)
                    del fs

                cud = dense.get("sdpa_cudnn")
                eff_cudnn = 4.0 * L * L * D * B * H / (cud * 1e-3) / 1e12 if cud else None
                table.append((name, L, D, density, ms_ours, eff_ours, eff_flex, eff_cudnn, err, err_flex,
                              fused.block_m, fused.perm_d, ms80))
                print(f"{name:10s} L={L:5d} D={D:3d} ours {eff_ours:7.1f} TF/s ({ms_ours:.3f} ms, "
                      f"{fused.block_m}x{fused.block_n} d{fused.perm_d}, err {err:.2e})  flex "
                      f"{(eff_flex or 0):7.1f}  cudnn-dense {(eff_cudnn or 0):7.1f}  [{fused.explain}]", flush=True)
                del q, k, v, o, lse, fused
                torch.cuda.empty_cache()

    outs = [args.out] if args.out else []
    if not outs and not args.baseline:
        gpu = dev.lower().replace("nvidia ", "").split()[0]
        outs.append(os.path.join(baseline.ROOT, "out", f"{gpu}-{datetime.date.today().isoformat()}.json"))
    if args.baseline:
        outs.append(os.path.join(baseline.BASELINES, args.baseline + ".json"))
    command = " ".join(sys.argv)
    doc = {"meta": baseline.meta(args.baseline, command), "machine": machine, "command": command, "rows": rows_out}
    for out in outs:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            json.dump(doc, f, indent=1)
        baseline.plot(doc, os.path.splitext(out)[0] + ".png")
    out = ", ".join(outs)

    print(f"\n# {dev}; effective TFLOP/s = 4*nnz*D*B*H/time (B={B}, H={H}, bf16); results: {out}")
    print(f"{'pattern':10s} {'L':>6s} {'D':>4s} {'dens':>6s} {'ours':>7s} {'flex':>7s} {'ratio':>6s} "
          f"{'cudnn':>7s} {'o/cud':>6s} {'err':>8s} {'tile':>5s} {'sm80':>6s}")
    for (name, L, D, dens, ms, eo, ef, ec, err, errf, bm, pd, ms80) in table:
        ratio = eo / ef if ef else float("nan")
        oc = eo / ec if ec else float("nan")
        s80 = f"{4.0 * dens * L * L * D * B * H / (ms80 * 1e-3) / 1e12:6.1f}" if ms80 else "     -"
        print(f"{name:10s} {L:6d} {D:4d} {dens:6.3f} {eo:7.1f} {(ef or 0):7.1f} {ratio:6.2f} {(ec or 0):7.1f} "
              f"{oc:6.2f} {err:8.1e} {bm:5d} {s80}")


if __name__ == "__main__":
    main()
