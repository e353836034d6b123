#!/usr/bin/env python3
"""Check the `spattn` command against the independent oracle (patterns_oracle.py).

    check_cli.py --spattn PATH [--quick] [--seed N] [--verbose]

Checks `spattn mask` dumps (every atom and preset, awkward lengths, random rows at
edge counts, random nested specs, neighborhood 1-D/2-D/3-D, lengths up to 4096),
`spattn run --impl reference --device cpu` outputs against a float64 reference (GQA,
fully masked rows, cross attention), the gradients of `spattn run --dq --dk --dv`
(--impl reference and fused) against the oracle's, and error paths (malformed
specs, bad npy inputs, missing files).

Prints one line per failure and ends with a line `N passed, M failed`.
Exit status 0 only if every check passed.  Random specs come from a seeded RNG;
the seed is printed first so that a failing run can be replayed with --seed.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

try:
    import numpy as np
except ImportError:  # pragma: no cover - reported as a failed check
    np = None

if np is not None:
    import patterns_oracle as po

INT64_MAX = 2**63 - 1
CALL_TIMEOUT = 120


def short(s: str, n: int = 160) -> str:
    s = s.replace("\n", "\\n")
    return s if len(s) <= n else s[: n - 3] + "..."


class Checker:
    def __init__(self, exe: str, verbose: bool = False):
        self.exe = exe
        self.verbose = verbose
        self.passed = 0
        self.failed = 0
        self.tmp = tempfile.mkdtemp(prefix="spattn-oracle-")

    # -- bookkeeping
    def ok(self, what: str = ""):
        self.passed += 1
        if self.verbose and what:
            print(f"ok   {what}")

    def fail(self, what: str):
        self.failed += 1
        print(f"FAIL {what}", flush=True)

    def call(self, args: list[str], timeout: int = CALL_TIMEOUT):
        """(rc, stdout, stderr) or (None, '', reason) when it could not run / timed out."""
        try:
            p = subprocess.run([self.exe] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return None, "", f"timed out after {timeout}s"
        except OSError as e:
            return None, "", f"could not run: {e}"
        return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")

    @staticmethod
    def crashed(rc, err) -> str | None:
        if rc is None:
            return err
        if rc < 0:
            return f"killed by signal {-rc}"
        if rc >= 128:
            return f"exit code {rc} (signal?)"
        for bad in ("terminate called", "Aborted", "Segmentation fault", "core dumped", "AddressSanitizer",
                    "runtime error:"):
            if bad in err:
                return f"stderr contains {bad!r}"
        return None

    # -- error paths
    def expect_error(self, args: list[str], what: str, stdout_empty: bool = True, want_position: bool = False):
        rc, out, err = self.call(args)
        c = self.crashed(rc, err)
        lines = [l for l in err.strip("\n").split("\n")] if err.strip() else []
        if c:
            self.fail(f"{what}: expected a clean error, got {c}; stderr={short(err)!r}")
        elif rc == 0:
            self.fail(f"{what}: expected an error, got exit 0; stdout={short(out, 100)!r}")
        elif len(lines) != 1 or not lines[0].strip():
            self.fail(f"{what}: expected a one-line message on stderr, got {len(lines)} lines: {short(err)!r}")
        elif stdout_empty and out:
            self.fail(f"{what}: error exit but stdout not empty: {short(out, 100)!r}")
        elif want_position and not re.search(r"[0-9]", lines[0]):
            self.fail(f"{what}: message gives no position: {short(err)!r}")
        else:
            self.ok(what)

    # -- mask dumps
    def mask_args(self, spec, Lq, Lk):
        if Lk is None:
            return ["mask", "--pattern", spec, "--len", str(Lq)]
        return ["mask", "--pattern", spec, "--q-len", str(Lq), "--k-len", str(Lk)]

    def check_mask(self, spec: str, Lq: int, Lk: int | None = None, label: str = "", m=None):
        where = f"len={Lq}" if Lk is None else f"q-len={Lq} k-len={Lk}"
        what = f"mask{(' [' + label + ']') if label else ''} {where} spec={spec!r}"
        if m is None:
            try:
                m = po.mask(spec, Lq, Lk)
            except po.SpecError as e:
                self.expect_error(self.mask_args(spec, Lq, Lk), f"{what} (oracle: {e})", want_position=True)
                return
        rows = po.mask_rows(m)
        expected = "".join(r + "\n" for r in rows)
        rc, out, err = self.call(self.mask_args(spec, Lq, Lk))
        c = self.crashed(rc, err)
        if c:
            self.fail(f"{what}: {c}; stderr={short(err)!r}")
            return
        if rc != 0:
            self.fail(f"{what}: exit {rc}, expected a mask; stderr={short(err)!r}")
            return
        if out == expected:
            self.ok(what)
            return
        self.fail(f"{what}: {self.describe_diff(out, rows)}")

    @staticmethod
    def describe_diff(out: str, rows: list[str]) -> str:
        if out.endswith("\n"):
            got = out[:-1].split("\n") if out != "\n" else [""]
        else:
            got = out.split("\n")
            if got == rows:
                return "missing final newline (otherwise identical)"
        if len(got) != len(rows):
            return f"{len(got)} lines, expected {len(rows)}; first lines {short(chr(10).join(got[:3]), 120)!r}"
        diff_rows = [i for i, (a, b) in enumerate(zip(got, rows)) if a != b]
        i = diff_rows[0]
        try:
            gs = set(int(x) for x in got[i].split(" ")) if got[i] else set()
            es = set(int(x) for x in rows[i].split(" ")) if rows[i] else set()
            if gs == es:
                detail = f"same keys, different formatting: {got[i][:80]!r}"
            else:
                extra = sorted(gs - es)[:8]
                missing = sorted(es - gs)[:8]
                detail = f"extra keys {extra} missing keys {missing}"
        except ValueError:
            detail = f"unparsable line {short(got[i], 80)!r}"
        return (f"{len(diff_rows)} rows differ; first row {i}: {detail}; "
                f"got {short(got[i], 90)!r} expected {short(rows[i], 90)!r}")

    # -- attention
    def check_run(self, spec: str, Lq: int, Lk: int | None, B: int, H: int, HK: int, D: int,
                  seed: int, label: str = ""):
        cross = Lk is not None
        Lk_ = Lk if cross else Lq
        where = f"L={Lq}" if not cross else f"Lq={Lq} Lk={Lk}"
        what = f"run{(' [' + label + ']') if label else ''} {where} B={B} H={H} HK={HK} D={D} spec={spec!r}"
        try:
            m = po.mask(spec, Lq, Lk_)
        except po.SpecError as e:
            self.fail(f"{what}: checker bug, oracle rejects spec: {e}")
            return
        rng = np.random.default_rng(seed)
        q = rng.standard_normal((B, Lq, H, D)).astype(np.float32)
        k = rng.standard_normal((B, Lk_, HK, D)).astype(np.float32)
        v = rng.standard_normal((B, Lk_, HK, D)).astype(np.float32)
        paths = {n: os.path.join(self.tmp, f"{n}.npy") for n in ("q", "k", "v", "o", "lse")}
        for n, a in (("q", q), ("k", k), ("v", v)):
            np.save(paths[n], a)
        for n in ("o", "lse"):
            if os.path.exists(paths[n]):
                os.remove(paths[n])
        args = ["run", "--pattern", spec]
        args += (["--q-len", str(Lq), "--k-len", str(Lk)] if cross else ["--len", str(Lq)])
        args += ["--batch", str(B), "--heads", str(H), "--kv-heads", str(HK), "--dim", str(D),
                 "--q", paths["q"], "--k", paths["k"], "--v", paths["v"], "--out", paths["o"],
                 "--lse", paths["lse"], "--impl", "reference", "--device", "cpu"]
        rc, out, err = self.call(args)
        c = self.crashed(rc, err)
        if c or rc != 0:
            self.fail(f"{what}: {c or f'exit {rc}'}; stderr={short(err)!r}")
            return
        try:
            o = np.load(paths["o"])
            lse = np.load(paths["lse"])
        except Exception as e:  # noqa: BLE001
            self.fail(f"{what}: cannot read outputs: {e}")
            return
        O_ref, LSE_ref = po.attention(q, k, v, m, None, HK)
        problems = []
        if o.dtype != np.float32 or lse.dtype != np.float32:
            problems.append(f"dtypes {o.dtype}/{lse.dtype}, expected float32")
        if o.shape != O_ref.shape:
            problems.append(f"O shape {o.shape}, expected {O_ref.shape}")
        if lse.shape != LSE_ref.shape:
            problems.append(f"LSE shape {lse.shape}, expected {LSE_ref.shape}")
        if problems:
            self.fail(f"{what}: {'; '.join(problems)}")
            return
        o64 = o.astype(np.float64)
        l64 = lse.astype(np.float64)
        empty = ~m.any(axis=1)
        if np.isnan(o64).any() or np.isnan(l64).any():
            problems.append("NaN in output")
        if empty.any():
            if not np.all(o64[:, empty] == 0):
                problems.append(f"O not exactly 0 on {int(empty.sum())} fully masked rows")
            if not np.all(np.isneginf(l64[:, :, empty])):
                problems.append("LSE not -inf on fully masked rows")
        live = ~empty
        if live.any():
            if not np.all(np.isfinite(l64[:, :, live])):
                problems.append("LSE not finite on rows with keys")
            ref_o = O_ref[:, live]
            den = np.linalg.norm(ref_o)
            num = np.linalg.norm(np.nan_to_num(o64[:, live] - ref_o, nan=1e30, posinf=1e30, neginf=1e30))
            rel = num / den if den > 0 else num
            if not rel <= 1e-6:
                problems.append(f"O relative error {rel:.3g} > 1e-6")
            ref_l = LSE_ref[:, :, live]
            got_l = np.nan_to_num(l64[:, :, live], nan=1e30, posinf=1e30, neginf=-1e30)
            den = np.linalg.norm(ref_l)
            num = np.linalg.norm(got_l - ref_l)
            rel = num / den if den > 0 else num
            if not rel <= 1e-6:
                problems.append(f"LSE relative error {rel:.3g} > 1e-6")
        if problems:
            self.fail(f"{what}: {'; '.join(problems)}")
        else:
            self.ok(what)

    def check_run_grads(self, spec: str, Lq: int, Lk: int | None, B: int, H: int, HK: int, D: int, seed: int,
                        impl: str):
        """`spattn run --do --dq --dk --dv --impl IMPL` against the oracle's gradients (float64, from the dense mask)."""
        Lk_ = Lq if Lk is None else Lk
        what = f"run grads [{impl}] Lq={Lq} Lk={Lk_} B={B} H={H} HK={HK} D={D} spec={spec!r}"
        m = po.mask(spec, Lq, Lk_)
        rng = np.random.default_rng(seed)
        arrays = {"q": rng.standard_normal((B, Lq, H, D)), "k": rng.standard_normal((B, Lk_, HK, D)),
                  "v": rng.standard_normal((B, Lk_, HK, D)), "do": rng.standard_normal((B, Lq, H, D))}
        paths = {n: os.path.join(self.tmp, f"g{n}.npy") for n in ("q", "k", "v", "do", "dq", "dk", "dv")}
        for n, a in arrays.items():
            arrays[n] = a.astype(np.float32)
            np.save(paths[n], arrays[n])
        for n in ("dq", "dk", "dv"):
            if os.path.exists(paths[n]):
                os.remove(paths[n])
        args = ["run", "--pattern", spec, "--q", paths["q"], "--k", paths["k"], "--v", paths["v"], "--do", paths["do"],
                "--dq", paths["dq"], "--dk", paths["dk"], "--dv", paths["dv"], "--impl", impl, "--device", "cpu"]
        rc, out, err = self.call(args)
        c = self.crashed(rc, err)
        if c or rc != 0:
            self.fail(f"{what}: {c or f'exit {rc}'}; stderr={short(err)!r}")
            return
        want = po.attention_grads(arrays["q"], arrays["k"], arrays["v"], arrays["do"], m, None, HK)
        # fp32 out of an fp64 reference: ~1e-7; the fused backward accumulates in fp32.
        tol = 1e-6 if impl == "reference" else 1e-5
        problems = []
        for name, ref in zip(("dq", "dk", "dv"), want):
            try:
                got = np.load(paths[name])
            except Exception as e:  # noqa: BLE001
                problems.append(f"cannot read {name}: {e}")
                continue
            if got.dtype != np.float32 or got.shape != ref.shape:
                problems.append(f"{name} is {got.dtype} {got.shape}, expected float32 {ref.shape}")
                continue
            den = np.linalg.norm(ref)
            num = np.linalg.norm(np.nan_to_num(got.astype(np.float64) - ref, nan=1e30, posinf=1e30, neginf=1e30))
            rel = num / den if den > 0 else num
            if not rel <= tol:
                problems.append(f"{name} relative error {rel:.3g} > {tol:g}")
        if problems:
            self.fail(f"{what}: {'; '.join(problems)}")
        else:
            self.ok(what)

    def run_error(self, what, q_shape, k_shape, v_shape, L, B, H, HK, D, spec="local(1)",
                  missing=(), garbage=(), out_dir=None):
        rng = np.random.default_rng(1)
        paths = {n: os.path.join(self.tmp, f"e{n}.npy") for n in ("q", "k", "v", "o", "lse")}
        for n, shp in (("q", q_shape), ("k", k_shape), ("v", v_shape)):
            if n in missing:
                if os.path.exists(paths[n]):
                    os.remove(paths[n])
            elif n in garbage:
                with open(paths[n], "wb") as f:
                    f.write(b"this is not an npy file\n")
            else:
                np.save(paths[n], rng.standard_normal(shp).astype(np.float32))
        if out_dir is not None:
            paths["o"] = os.path.join(out_dir, "o.npy")
        args = ["run", "--pattern", spec, "--len", str(L), "--batch", str(B), "--heads", str(H),
                "--kv-heads", str(HK), "--dim", str(D), "--q", paths["q"], "--k", paths["k"], "--v", paths["v"],
                "--out", paths["o"], "--lse", paths["lse"], "--impl", "reference", "--device", "cpu"]
        self.expect_error(args, f"run error [{what}]", stdout_empty=False)


# ----------------------------------------------------------------------------- spec generation

def spaced(rng: random.Random, spec: str) -> str:
    """Random whitespace around punctuation (whitespace is ignored by the grammar)."""
    def rep(mt):
        return rng.choice(["", "", " ", "  "]) + mt.group(0) + rng.choice(["", "", " ", "\t"])
    return re.sub(r"[(),|&=:]", rep, spec)


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def split_sum(rng, L, parts):
    """Random positive parts summing to L."""
    parts = max(1, min(parts, L))
    cuts = sorted(rng.sample(range(1, L), parts - 1)) if parts > 1 else []
    bounds = [0] + cuts + [L]
    return [bounds[i + 1] - bounds[i] for i in range(parts)]


def gen_neighborhood(rng: random.Random, L: int, nd: int | None = None) -> str:
    if nd is None:
        nd = rng.choice([1, 2, 2, 3])
    # factor L into nd factors
    dims = []
    rest = L
    for ax in range(nd - 1):
        ds = divisors(rest)
        # prefer balanced factors
        target = round(rest ** (1 / (nd - ax)))
        ds.sort(key=lambda d: abs(d - target) + rng.random() * max(1, target))
        d = ds[0]
        dims.append(d)
        rest //= d
    dims.append(rest)
    rng.shuffle(dims)
    kern, dil, cau = [], [], []
    for n in dims:
        c = 1 if rng.random() < 0.3 else 0
        d = 1 if rng.random() < 0.5 else rng.randint(1, max(1, min(n, 4)))
        if c:
            K = rng.randint(1, min(n, 9) + 2)
        else:
            K = rng.randint(1, max(1, min(n // d, 9)))
        kern.append(K)
        dil.append(d)
        cau.append(c)

    def fmt(vals, force_tuple=False):
        if not force_tuple and len(set(vals)) == 1 and rng.random() < 0.5:
            return str(vals[0])
        return "(" + ",".join(map(str, vals)) + ")"

    parts = []
    if nd > 1 or rng.random() < 0.6:
        parts.append("dims=" + fmt(dims, force_tuple=nd > 1 or rng.random() < 0.5))
    else:
        kern, dil, cau = kern[:1], dil[:1], cau[:1]
    parts.append("kernel=" + fmt(kern))
    if any(d != 1 for d in dil) or rng.random() < 0.3:
        parts.append("dilation=" + fmt(dil))
    if any(cau) or rng.random() < 0.3:
        parts.append("causal=" + fmt(cau))
    rng.shuffle(parts)
    return "neighborhood(" + ", ".join(parts) + ")"


def gen_index_list(rng, bound):
    items = []
    for _ in range(rng.randint(1, 3)):
        if rng.random() < 0.5:
            items.append(str(rng.randrange(bound)))
        else:
            a = rng.randrange(bound)
            b = rng.randint(a, min(bound, a + rng.randint(0, 6)))
            items.append(f"{a}:{b}")
    return ", ".join(items)


def gen_atom(rng: random.Random, Lq: int, Lk: int, depth: int) -> str:
    self_attn = Lq == Lk
    L = max(Lq, Lk)
    small = lambda hi: rng.randint(0, max(0, hi))  # noqa: E731
    choices = ["dense", "causal", "local", "local_lr", "dilated", "stride", "block_diag", "summary",
               "global", "global_rows", "global_cols", "random", "longformer", "bigbird", "sparse_fixed",
               "sparse_strided"]
    if depth > 0:
        choices += ["blocked", "blocked"]
    if self_attn:
        choices += ["document", "neighborhood", "neighborhood"]
    a = rng.choice(choices)
    if a in ("dense", "causal"):
        return a
    if a == "local":
        return f"local({small(min(L, 12)) if rng.random() < 0.9 else rng.randint(0, 2 * L)})"
    if a == "local_lr":
        return f"local(left={small(min(L, 10))}, right={small(min(L, 10))})" if rng.random() < 0.7 else \
            f"local(right={small(5)}, left={small(5)})"
    if a == "dilated":
        return f"dilated({small(6)}, {rng.randint(1, 5)})"
    if a == "stride":
        return f"stride({rng.randint(1, max(1, min(L, 40)))})"
    if a == "block_diag":
        return f"block_diag({rng.randint(1, max(1, min(L, 70)))})"
    if a == "summary":
        s = rng.randint(1, max(1, min(L, 40)))
        c = rng.randint(1, s)
        return rng.choice([f"summary({s})", f"summary({s}, c={c})", f"summary({s}, {c})"])
    if a == "global":
        return f"global({gen_index_list(rng, L)})"
    if a == "global_rows":
        return f"global_rows({gen_index_list(rng, Lq)})"
    if a == "global_cols":
        return f"global_cols({gen_index_list(rng, Lk)})"
    if a == "random":
        u = rng.random()
        r = rng.randint(0, 4) if u < 0.8 else max(0, Lk - rng.randint(0, 1)) if u < 0.9 else rng.randint(0, Lk + 2)
        seed = rng.choice([0, 1, 7, rng.randrange(2**32), rng.randrange(2**63), -rng.randrange(1, 2**63)])
        return rng.choice([f"random({r})", f"random({r}, seed={seed})", f"random({r}, {seed})"])
    if a == "longformer":
        return f"longformer({small(8)}, {small(6) if rng.random() < 0.8 else L + rng.randint(0, 50)})"
    if a == "bigbird":
        b = rng.randint(1, max(1, min(L, 64)))
        G = -(-L // b)
        g = small(3) if rng.random() < 0.8 else G + rng.randint(0, 10)
        seed = rng.randrange(1000)
        r = small(3) if rng.random() < 0.8 else max(0, -(-Lk // b) - rng.randint(0, 1))  # r = key blocks (- 1)
        args = f"{b}, {small(2)}, {g}, {r}"
        return rng.choice([f"bigbird({args})", f"bigbird({args}, seed={seed})", f"bigbird({args}, {seed})"])
    if a == "sparse_fixed":
        s = rng.randint(1, max(1, min(L, 64)))
        c = rng.randint(1, s)
        return rng.choice([f"sparse_fixed({s})", f"sparse_fixed({s}, c={c})", f"sparse_fixed({s}, {c})"])
    if a == "sparse_strided":
        return f"sparse_strided({rng.randint(1, max(1, min(L, 64)))})"
    if a == "document":
        return "document(" + ", ".join(map(str, split_sum(rng, Lq, rng.randint(1, 5)))) + ")"
    if a == "neighborhood":
        return gen_neighborhood(rng, Lq)
    if a == "blocked":
        b = rng.randint(1, max(1, min(L, 64)))
        Gq, Gk = -(-Lq // b), -(-Lk // b)
        return f"blocked({b}, {gen_spec(rng, Gq, Gk, depth - 1)})"
    raise AssertionError(a)


def gen_spec(rng: random.Random, Lq: int, Lk: int, depth: int = 2) -> str:
    """A random derivation of the grammar: spec := term ('|' term)*, term := factor ('&' factor)*."""
    def factor(d):
        if d > 0 and rng.random() < 0.3:
            return "(" + spec(d - 1) + ")"
        return gen_atom(rng, Lq, Lk, d)

    def term(d):
        n = 1 if rng.random() < 0.5 else rng.randint(2, 3)
        return " & ".join(factor(d) for _ in range(n))

    def spec(d):
        n = 1 if rng.random() < 0.4 else rng.randint(2, 3)
        return " | ".join(term(d) for _ in range(n))

    s = spec(depth)
    if rng.random() < 0.1:
        s = "(" + s + ")"
    return s


def atom_specs(L: int, rng: random.Random) -> list[str]:
    """Every atom and preset, with fixed arguments (some invalid at small L: then an error is expected)."""
    specs = [
        "dense", "causal", "local(0)", "local(1)", "local(3)", "local(200)",
        "local(left=2, right=0)", "local(left=0, right=3)", "local(right=1, left=5)",
        "dilated(2, 3)", "dilated(0, 4)", "dilated(5, 1)", "dilated(40, 7)",
        "stride(1)", "stride(3)", "stride(64)",
        "block_diag(1)", "block_diag(4)", "block_diag(64)", "block_diag(1000)",
        "summary(4)", "summary(8, c=3)", "summary(8, 3)", "summary(5, c=5)", "summary(1)",
        "global(0)", "global(0:3)", "global(0, 5, 100:104)", "global(3:3, 1)",
        "global_rows(2:5)", "global_cols(1, 6)", "global_rows(0)",
        "random(3)", "random(3, seed=7)", "random(2, 42)", "random(0)", "random(1000, seed=1)",
        "random(1, seed=9223372036854775807)",
        "blocked(4, causal)", "blocked(16, local(1) | global(0))", "blocked(3, random(2, seed=9))",
        "blocked(1, local(2))", "blocked(5, blocked(2, causal))",
        "longformer(2, 3)", "longformer(4, 0)", "longformer(1, 10000)",
        "bigbird(4, 1, 1, 2, seed=3)", "bigbird(16, 1, 2, 1)", "bigbird(2, 0, 100000, 1)",
        "bigbird(8, 1, 1, 3, 11)",
        "sparse_fixed(4)", "sparse_fixed(8, c=2)", "sparse_fixed(8, 2)",
        "sparse_strided(4)", "sparse_strided(1)", "sparse_strided(9)",
        f"document({L})", "neighborhood(kernel=1)", f"neighborhood(kernel={min(L, 7)})",
        f"neighborhood(kernel={min(L, 5)}, causal=1)", "neighborhood(kernel=3, causal=1)",
        f"neighborhood(dims=({L},1), kernel=(3,1))", f"neighborhood(dims=(1,{L}), kernel=1, causal=(1,1))",
    ]
    if L >= 2:
        specs.append("document(" + ", ".join(map(str, split_sum(rng, L, 3))) + ")")
        specs.append(f"document(1, {L - 1})")
    if L >= 6:
        specs.append("neighborhood(dims=" + str(L) + ", kernel=3, dilation=2)")
    for _ in range(2):
        specs.append(gen_neighborhood(rng, L))
    return specs


EDGE_SPECS = [
    # numbers at the int64 limit: the contract's arithmetic is exact
    "local(9223372036854775807)",
    "local(left=9223372036854775807, right=9223372036854775807)",
    "local(left=0, right=9223372036854775807)",
    "dilated(9223372036854775807, 2)",
    "dilated(3, 9223372036854775807)",
    "stride(9223372036854775807)",
    "block_diag(9223372036854775807)",
    "summary(9223372036854775807)",
    "summary(9223372036854775807, c=9223372036854775807)",
    "random(9223372036854775807)",
    "random(2, seed=9223372036854775807)",
    "blocked(9223372036854775807, causal)",
    "longformer(9223372036854775807, 9223372036854775807)",
    "bigbird(9223372036854775807, 0, 0, 0)",
    "sparse_strided(9223372036854775807)",
    "sparse_fixed(9223372036854775807, c=9223372036854775807)",
    "neighborhood(kernel=9223372036854775807, causal=1)",
    # count larger than the block (the formula keeps every key)
    "summary(4, c=9)",
    "sparse_fixed(4, c=9)",
    # whitespace everywhere between tokens
    "  local ( left = 1 , right = 2 )\t|\tglobal ( 0 : 2 , 5 ) ",
    "((((causal))))",
    "causal & local(3) | global_cols(0) & local(5) | local(0)",
    "local(\n1\n)\n|\ncausal",
    # leading zeros: still an integer that fits in int64
    "local(003)", "local(00000000000000000000001)",
    # an empty range is an empty set of indices
    "global(3:3)", "global(0:0) | local(0)",
    # dilation larger than the axis: every group has one token
    "neighborhood(kernel=1, dilation=20)", "neighborhood(kernel=3, dilation=9, causal=1)",
    "neighborhood(dims=(1,1,1), kernel=1)",
    # presets nested in blocked, global clipped on the grid
    "blocked(2, longformer(1, 100))", "blocked(3, bigbird(2, 1, 9, 1, seed=4))",
    "random(0, seed=5) | random(1, seed=5) & random(1, seed=6)",
]

# (spec, L): each must be rejected.  Comments say which rule of PATTERNS.md applies.
ERROR_SPECS = [
    ("foo", 64), ("locall(3)", 64), ("local(3) | bar(2)", 64), ("blocked(4, foo)", 64),            # unknown
    ("local", 64), ("dilated(3)", 64), ("blocked(4)", 64), ("stride", 64), ("bigbird(4, 1, 1)", 64),  # missing
    ("local(left=2)", 64), ("global", 64), ("document", 64), ("summary", 64), ("neighborhood(dims=(8,8))", 64),
    ("random(3, seed=1, seed=2)", 64), ("summary(4, 2, c=1)", 64), ("random(3, 4, seed=1)", 64),          # repeated
    ("local(left=1, left=2, right=0)", 64), ("neighborhood(kernel=3, kernel=5)", 64),
    ("causal(1)", 64), ("dense(0)", 64), ("local(1, 2)", 64), ("stride(2, 3)", 64),                      # extra
    ("sparse_strided(4, 1)", 64), ("dilated(1, 2, 3)", 64), ("block_diag(2, 2)", 64),
    ("random(1, 2, 3)", 64), ("longformer(1, 2, 3)", 64), ("local(3, left=1, right=1)", 64),
    ("local(9223372036854775808)", 64), ("random(2, seed=99999999999999999999)", 64),                    # int64
    ("global(18446744073709551616)", 64), ("stride(100000000000000000000000000000)", 64),
    ("global(5:3)", 64), ("global_cols(10:9)", 64),                                                     # range
    ("block_diag(0)", 64), ("blocked(0, dense)", 64), ("summary(0)", 64), ("sparse_fixed(0)", 64),      # size 0
    ("bigbird(0, 1, 1, 1)", 64), ("stride(0)", 64), ("sparse_strided(0)", 64), ("dilated(2, 0)", 64),
    ("neighborhood(kernel=3, dilation=0)", 64), ("neighborhood(kernel=0)", 64),
    ("neighborhood(dims=(8,8), kernel=(3,0))", 64), ("document(0, 64)", 64),
    ("local(-1)", 64), ("local(left=-1, right=2)", 64), ("dilated(-1, 2)", 64),                         # negative
    ("longformer(-1, 2)", 64), ("random(-1)", 64), ("longformer(2, -1)", 64), ("summary(4, c=-1)", 64),
    ("global(64)", 64), ("global_rows(0:65)", 64), ("global_cols(100)", 64), ("global(-1)", 64),        # index
    ("global(0, 5, 100:104)", 64), ("blocked(2, global(32))", 64), ("global(7)", 7),
    ("local(1) x", 64), ("local(1))", 64), ("causal causal", 64), ("dense 5", 64), ("local(1),", 64),   # trailing
    ("local(1) |", 64), ("causal &", 64), ("| causal", 64), ("causal || dense", 64), ("&", 64), ("", 64),
    ("local(3)(4)", 64), ("blocked(4, local(1)) x", 64), ("local(1) = 2", 64),
    ("(local(1)", 64), ("((causal)", 64), ("local(1", 64), ("blocked(4, (causal)", 64), (")", 64),      # parens
    ("()", 64), ("(causal))", 64),
    ("document(30, 30)", 64), ("document(64, 1)", 64), ("document(1)", 2), ("document(2)", 1),          # document
    ("neighborhood(kernel=65)", 64), ("neighborhood(dims=(8,8), kernel=9)", 64),                        # window
    ("neighborhood(dims=(8,8), kernel=(3,5), dilation=(1,2))", 64), ("neighborhood(kernel=4, dilation=20)", 64),
    ("neighborhood(dims=(4,4,4), kernel=5)", 64), ("neighborhood(kernel=2)", 1),
    ("neighborhood(dims=(8,9), kernel=3)", 64), ("neighborhood(dims=(4,4,4), kernel=(3,3))", 64),       # dims
    ("neighborhood(dims=(8,8), kernel=3, causal=2)", 64),
    ("local(1:3)", 64), ("local(#)", 64), ("local2(3)", 64), ("Causal", 64), ("loc al(1)", 64),
    ("local(1 0)", 64), ("local(left=1 right=2)", 64), ("random(2, seed=)", 64), ("local(=3)", 64),
    ("dilated(2, 3, seed=1)", 64), ("causal(seed=1)", 64), ("global(0:5:7)", 64), ("global(,1)", 64),
    ("document(3,)", 64), ("blocked(4, )", 64), ("blocked(4, causal, causal)", 64),
    ("bigbird(4, 1, 1, 1, seed=1, 3)", 64), ("sparse_fixed(4, c=5, 2)", 64),
    ("neighborhood(kernel=3, causal=-1)", 64), ("neighborhood(dims=(2,2,2,8), kernel=1)", 64),
    ("neighborhood(dims=(8,8), kernel=(3,3,3))", 64), ("document(32, 32", 64), ("local(1) & (causal | )", 64),
]


def mask_error_cli_cases(ck: Checker):
    ck.expect_error(["mask", "--len", "8"], "cli: mask without --pattern")
    ck.expect_error(["mask", "--pattern", "causal"], "cli: mask without --len")
    ck.expect_error(["frobnicate"], "cli: unknown subcommand")
    ck.expect_error(["mask", "--pattern", "causal", "--len", "abc"], "cli: non-numeric --len")
    ck.expect_error(["mask", "--pattern", "causal", "--len", "-5"], "cli: negative --len")
    ck.expect_error(["explain", "--pattern", "causal", "--len", "8", "--dim", "96"], "cli: explain with a head dim the fused kernel lacks")
    rc, out, err = ck.call(["explain", "--pattern", "local(3)", "--len", "300", "--dim", "128"])
    if rc == 0 and re.search(r"^fused +D=128, sm_90a: block \d+x\d+, .*waste [0-9.]+", out, re.M):
        ck.ok("cli: explain prints the fused tile plan")
    else:
        ck.fail(f"cli: explain prints the fused tile plan: rc={rc} stdout={short(out)!r} stderr={short(err)!r}")


def self_attn_run_cases(rng: random.Random, quick: bool):
    cases = [
        # spec, Lq, Lk, B, H, HK, D
        ("dense", 7, None, 1, 2, 2, 16),
        ("causal", 33, None, 2, 4, 2, 8),
        ("local(3)", 64, None, 2, 4, 1, 32),
        ("global_rows(0:3)", 17, None, 2, 4, 2, 16),
        ("local(2) & global_cols(5)", 29, None, 1, 4, 1, 8),
        ("bigbird(4, 1, 1, 2, seed=3)", 48, None, 1, 4, 2, 16),
        ("local(1)", 5, 17, 1, 4, 2, 8),
        ("global(0:2) | causal", 9, 4, 2, 2, 1, 16),
    ]
    if not quick:
        cases += [
            ("dense", 1, None, 1, 1, 1, 4),
            ("sparse_strided(4)", 128, None, 2, 4, 4, 64),
            ("neighborhood(dims=(8,8), kernel=3, causal=(1,0))", 64, None, 1, 4, 2, 32),
            ("causal & global_rows(10:20)", 40, None, 2, 4, 2, 16),
            ("random(3, seed=5)", 200, None, 1, 4, 4, 64),
            ("document(10, 1, 30)", 41, None, 2, 2, 1, 16),
            ("dense", 3, 50, 1, 4, 1, 16),
            ("causal", 50, 3, 1, 4, 2, 16),
            ("local(left=0, right=0)", 6, 6, 1, 2, 2, 8),
            ("longformer(2, 1)", 300, None, 1, 2, 1, 128),
            ("bigbird(64, 1, 1, 2)", 1024, None, 1, 4, 2, 64),
            ("global_rows(0:3) & local(4)", 7, 19, 2, 4, 2, 8),
        ]
        for _ in range(4):
            L = rng.choice([3, 16, 31, 100])
            H, HK = rng.choice([(4, 4), (4, 2), (4, 1), (6, 3), (2, 1)])
            cases.append((gen_spec(rng, L, L, 2), L, None, rng.randint(1, 2), H, HK, rng.choice([8, 16, 32])))
    return cases


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--spattn", required=True, help="path of the spattn binary")
    ap.add_argument("--quick", action="store_true", help="smaller run (< 30 s)")
    ap.add_argument("--seed", type=int, default=None, help="seed of the random specs (default: fresh)")
    ap.add_argument("--verbose", action="store_true", help="print passing checks too")
    ap.add_argument("--part", choices=("all", "masks", "runs"), default="all",
                    help="masks: sections 1-4 (spec parsing and masks, errors); runs: section 5 (attention through "
                         "`spattn run`); ctest runs the two as separate tests")
    args = ap.parse_args(argv)

    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "little")
    print(f"check_cli: seed {seed}{' (quick)' if args.quick else ''}; replay with --seed {seed}", flush=True)
    if np is None:
        print("FAIL numpy is not installed (pip install numpy)")
        print("0 passed, 1 failed")
        return 1
    exe = os.path.abspath(args.spattn)
    if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
        print(f"FAIL spattn binary not found or not executable: {exe}")
        print("0 passed, 1 failed")
        return 1
    ck = Checker(exe, args.verbose)
    rng = random.Random(seed)
    t0 = time.time()
    quick = args.quick

    def progress(section: str) -> None:  # a line as each section starts (the whole run takes minutes)
        print(f"check_cli: [{time.time() - t0:.0f} s] {section} ({ck.passed} passed, {ck.failed} failed so far)",
              flush=True)

    if args.part in ("all", "masks"):
        progress('1. every atom and preset at awkward lengths')
        # 1. every atom and preset at awkward lengths
        lengths = [1, 7, 113] if quick else [1, 7, 113, 799]
        for L in lengths:
            for spec in atom_specs(L, rng):
                if quick and L == 113 and rng.random() < 0.5:
                    continue
                ck.check_mask(spec, L, label="atom")
        # edge values
        for spec in (EDGE_SPECS[::3] if quick else EDGE_SPECS):
            for L in ([7] if quick else [1, 7, 50]):
                ck.check_mask(spec, L, label="edge")
        # cross attention for atoms that allow it
        cross = [(1, 7), (7, 1), (5, 113)] if quick else [(1, 7), (7, 1), (5, 113), (113, 40), (64, 799), (799, 3)]
        cross_specs = ["dense", "causal", "local(2)", "local(left=3, right=0)", "dilated(2, 2)", "stride(3)",
                       "block_diag(4)", "summary(4, c=2)", "global(0, 2:4)", "global_rows(0)", "global_cols(0:1)",
                       "random(2, seed=3)", "random(50)", "blocked(4, causal)", "blocked(3, local(1) | random(1))",
                       "longformer(1, 2)", "bigbird(4, 1, 1, 1)", "sparse_fixed(4)", "sparse_strided(3)",
                       "causal & local(3) | global_cols(0)"]
        for Lq, Lk in cross:
            for spec in cross_specs:
                if quick and rng.random() < 0.5:
                    continue
                ck.check_mask(spec, Lq, Lk, label="cross")
        # global index in [min(Lq,Lk), max(Lq,Lk)) is valid for global(...)
        ck.check_mask("global(6)", 3, 7, label="cross")
        ck.check_mask("global(6)", 7, 3, label="cross")
        # decisions PATTERNS.md leaves open, on which the oracle and the C++ side agreed (see patterns_oracle.py)
        for spec, Lq, Lk in [("global_rows(5)", 3, 6), ("global_cols(5)", 3, 6), ("global_rows(5)", 6, 3),
                             ("global_cols(5)", 6, 3), ("document(3)", 3, 6), ("neighborhood(kernel=1)", 3, 6),
                             ("blocked(2, document(2))", 4, 3), ("random(2, seed=-1)", 50, 50),
                             ("random(3, seed=-9223372036854775808)", 9, 40)]:
            ck.check_mask(spec, Lq, Lk, label="decision")

        progress('1b. random(r, seed=x)')
        # 1b. random(r, seed=x): Floyd's sampling per row (r = 1, r = Lk - 1, r >= Lk, seeds at the ends of the
        # range, cross lengths, rows of one key in 256 either side), and on bigbird's / blocked's block grid
        seeds = [0, 1, 42, 2**63 - 1, -1, -(2**63), rng.randrange(2**63), -rng.randrange(1, 2**63)]
        rcases = []
        for Lq, Lk in [(1, 1), (2, 2), (7, 7), (64, 64), (113, 113), (300, 300), (5, 3000), (300, 7), (50, 2), (3, 5003)]:
            for r in sorted({1, 2, max(1, Lk // 20), Lk - 1, Lk, Lk + 3}):
                rcases.append((f"random({r}, seed={rng.choice(seeds)})", Lq, Lk))
        rcases += [(f"random(1, seed={s})", 40, 40) for s in seeds]
        rcases += [("random(15, seed=3)", 20, 4096), ("random(16, seed=3)", 20, 4096), ("random(19)", 9, 5003),
                   ("random(20)", 9, 5003), ("random(4095, seed=8)", 30, 4096), ("random(2000, seed=-3)", 40, 4096),
                   ("random(4, seed=5) & causal | random(3, seed=6)", 200, 200), ("random(30) & random(30, seed=1)", 90, 300)]
        for b, Lq, Lk in [(4, 30, 30), (4, 100, 100), (16, 257, 257), (8, 40, 200), (8, 200, 40), (64, 1000, 1000)]:
            nb = -(-Lk // b)
            for r in sorted({1, 2, nb - 1, nb}):
                rcases.append((f"bigbird({b}, 1, 1, {r}, seed={rng.choice(seeds[:3])})", Lq, Lk))
            rcases.append((f"blocked({b}, random({nb - 1}, seed={rng.choice(seeds)}))", Lq, Lk))
        if quick:
            rcases = rcases[::3]
        for spec, Lq, Lk in rcases:
            ck.check_mask(spec, Lq, None if Lq == Lk and rng.random() < 0.5 else Lk, label="random rows")
        if not quick:
            for spec in ("random(1000, seed=5)", "random(4000)", "bigbird(64, 1, 2, 3, seed=0)", "bigbird(16, 1, 1, 40, seed=9)"):
                ck.check_mask(spec, 4096, label="4096")

        progress('2. random nested specs')
        # 2. random nested specs
        n_random = 60 if quick else 900
        small_L = [1, 2, 3, 5, 7, 8, 12, 16, 31, 60, 64, 97, 128]
        mid_L = [113, 144, 255, 360, 500, 799, 1000]
        big_L = [1024, 2048, 3000, 4096]
        n_big = 0
        max_big = 1 if quick else 25
        for i in range(n_random):
            u = rng.random()
            if u < 0.55:
                Lq = rng.choice(small_L)
            elif u < 0.9 or n_big >= max_big:
                Lq = rng.choice(mid_L if not quick else mid_L[:4])
            else:
                Lq = rng.choice(big_L)
                n_big += 1
            Lk = Lq
            crossed = rng.random() < 0.2
            if crossed:
                Lk = rng.choice(small_L + mid_L[:3])
            spec = None
            for _try in range(20):
                cand = gen_spec(rng, Lq, Lk, depth=rng.choice([1, 2, 2, 3]))
                try:
                    m = po.mask(cand, Lq, Lk)
                except po.SpecError as e:
                    ck.fail(f"checker bug: generated spec {cand!r} rejected by oracle at {Lq}x{Lk}: {e}")
                    continue
                if Lq * Lk > 1_000_000 and m.sum() > 1_500_000:
                    continue
                spec = cand
                break
            if spec is None:
                continue
            spec = spaced(rng, spec)
            ck.check_mask(spec, Lq, Lk if crossed else None, label="random", m=m)

        progress('3. neighborhood 2-D / 3-D with dilation and causal axes')
        # 3. neighborhood 2-D / 3-D with dilation and causal axes, large lengths
        na_cases = [(64, 2), (799, 2), (1000, 3), (360, 3), (113, 1), (4096, 2), (4096, 3), (3000, 3)]
        if quick:
            na_cases = [(64, 2), (360, 3), (1024, 2)]
        for L, nd in na_cases:
            for _ in range(1 if quick else 3):
                ck.check_mask(gen_neighborhood(rng, L, nd), L, label="neighborhood")
        big_specs = ["local(3)", "sparse_strided(64)", "bigbird(64, 1, 1, 1)", "longformer(8, 4)",
                     "random(5, seed=123)", "blocked(128, local(1)) & causal", "stride(512) & causal | local(1)",
                     "neighborhood(dims=(64,64), kernel=7)", "neighborhood(dims=(16,16,16), kernel=3, dilation=2)",
                     "document(1000, 1, 3000, 95) & local(5)", "sparse_fixed(256, c=2) & causal",
                     "neighborhood(dims=(4096), kernel=9, dilation=7, causal=1)", "random(100, seed=77)",
                     "dilated(100, 7)", "summary(300, c=7)", "blocked(300, local(0) | random(1, seed=3)) & local(600)",
                     "global(0:4, 4000:4096) | causal & stride(1000)"]
        for spec in (big_specs[::4] if quick else big_specs):
            ck.check_mask(spec, 4096, label="4096")

        progress('4. error paths')
        # 4. error paths
        err_cases = ERROR_SPECS if not quick else ERROR_SPECS[::3]
        for spec, L in err_cases:
            try:
                po.mask(spec, L)
                ck.fail(f"checker bug: oracle accepts error case {spec!r} at L={L}")
                continue
            except po.SpecError as e:
                reason = str(e)
            ck.expect_error(["mask", "--pattern", spec, "--len", str(L)], f"mask error len={L} spec={spec!r} ({reason})",
                            want_position=True)
        ck.expect_error(["mask", "--pattern", "global(5)", "--q-len", "3", "--k-len", "5"],
                        "mask error q-len=3 k-len=5 spec='global(5)'")
        mask_error_cli_cases(ck)

    if args.part in ("all", "runs"):
        progress('5. attention through `spattn run`')
        # 5. attention through `spattn run`
        for i, (spec, Lq, Lk, B, H, HK, D) in enumerate(self_attn_run_cases(rng, quick)):
            ck.check_run(spec, Lq, Lk, B, H, HK, D, seed=rng.randrange(2**31))
        # gradients through `spattn run --dq --dk --dv`, both CPU implementations
        grad_cases = [("longformer(5, 2)", 40, None, 1, 4, 2, 16), ("causal & global_rows(3:30)", 33, None, 2, 2, 1, 8),
                      ("local(left=4, right=1) | random(2, seed=9)", 20, 37, 1, 2, 2, 32)]
        if not quick:
            grad_cases += [("neighborhood(dims=(8,8), kernel=3)", 64, None, 1, 2, 1, 64),
                           ("dilated(6, 3) | global(0)", 100, None, 2, 4, 1, 24)]
        for spec, Lq, Lk, B, H, HK, D in grad_cases:
            for impl in ("reference", "fused"):
                ck.check_run_grads(spec, Lq, Lk, B, H, HK, D, seed=rng.randrange(2**31), impl=impl)
        # run error paths
        ck.run_error("q head dim != --dim", (1, 8, 2, 16), (1, 8, 2, 8), (1, 8, 2, 8), 8, 1, 2, 2, 8)
        ck.run_error("k has wrong kv-heads", (1, 8, 2, 8), (1, 8, 1, 8), (1, 8, 2, 8), 8, 1, 2, 2, 8)
        ck.run_error("v has wrong length", (1, 8, 2, 8), (1, 8, 2, 8), (1, 9, 2, 8), 8, 1, 2, 2, 8)
        ck.run_error("q has wrong batch", (2, 8, 2, 8), (1, 8, 2, 8), (1, 8, 2, 8), 8, 1, 2, 2, 8)
        ck.run_error("q is 3-D", (8, 2, 8), (1, 8, 2, 8), (1, 8, 2, 8), 8, 1, 2, 2, 8)
        ck.run_error("heads not a multiple of kv-heads", (1, 8, 3, 8), (1, 8, 2, 8), (1, 8, 2, 8), 8, 1, 3, 2, 8)
        ck.run_error("missing q file", (1, 8, 2, 8), (1, 8, 2, 8), (1, 8, 2, 8), 8, 1, 2, 2, 8, missing=("q",))
        ck.run_error("missing v file", (1, 8, 2, 8), (1, 8, 2, 8), (1, 8, 2, 8), 8, 1, 2, 2, 8, missing=("v",))
        ck.run_error("k is not an npy file", (1, 8, 2, 8), (1, 8, 2, 8), (1, 8, 2, 8), 8, 1, 2, 2, 8, garbage=("k",))
        ck.run_error("output directory missing", (1, 8, 2, 8), (1, 8, 2, 8), (1, 8, 2, 8), 8, 1, 2, 2, 8,
                     out_dir=os.path.join(ck.tmp, "no", "such", "dir"))
        ck.run_error("malformed spec", (1, 8, 2, 8), (1, 8, 2, 8), (1, 8, 2, 8), 8, 1, 2, 2, 8, spec="local(")
        ck.run_error("document does not sum to L", (1, 8, 2, 8), (1, 8, 2, 8), (1, 8, 2, 8), 8, 1, 2, 2, 8,
                     spec="document(3, 4)")

    dt = time.time() - t0
    print(f"check_cli: {dt:.1f} s", flush=True)
    print(f"{ck.passed} passed, {ck.failed} failed", flush=True)
    return 0 if ck.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
