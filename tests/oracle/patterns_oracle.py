#!/usr/bin/env python3
"""Independent Python implementation of the pattern language in PATTERNS.md.

Written from PATTERNS.md alone (never from the C++ sources), so that it can be
used to check the `spattn` command.  numpy only.

Public API:
    parse(spec)                  -> Node (raises SpecError on a malformed spec)
    mask(spec, q_len, k_len=None)-> numpy bool array [Lq, Lk] (raises SpecError)
    hash64(seed, q, k)           -> int, the `random` hash
    attention(q, k, v, mask, scale=None, Hkv=None) -> (O [B,Lq,H,Dv], LSE [B,H,Lq]) float64

Semantic decisions that PATTERNS.md leaves open (kept in line with the C++ side):
  * random(r, seed=x): seed defaults to 0, may also be the second positional argument.
  * summary(s, c=1) / sparse_fixed(s, c=1): c defaults to 1, may be positional or c=...
  * global(0:g) inside presets (longformer, bigbird) is clipped to the length, never an error.
  * user-written global(G): an index >= max(Lq, Lk) (or < 0) is an error;
    global_rows(G): index >= Lq is an error; global_cols(G): index >= Lk is an error.
  * neighborhood: causal takes 0/1 per axis; dims/kernel/dilation/causal are named only;
    dims may be omitted only for 1-D (then n0 = L); a single value applies to every axis.
    Token index of grid coordinate (i0, i1, i2) is ((i0*n1)+i1)*n2+i2.
  * document and neighborhood need Lq == Lk.
  * local(w) or local(left=a, right=b) (both of left/right required).
  * numbers are arbitrary integers that must fit in int64 (the arithmetic here is exact,
    so e.g. dilated(w, d) uses the mathematical w*d, never an overflowed one).

Run `python3 patterns_oracle.py --self-test` for the built-in checks.
"""

from __future__ import annotations

import sys

import numpy as np

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
U64 = (1 << 64) - 1


class SpecError(Exception):
    """A malformed spec, or one that is invalid for the given lengths."""

    def __init__(self, msg: str, pos: int | None = None):
        self.pos = pos
        super().__init__(msg if pos is None else f"{msg} at position {pos}")


# ----------------------------------------------------------------------------- hash

_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB


def mix(x: int) -> int:
    x &= U64
    x ^= x >> 30
    x = (x * _M1) & U64
    x ^= x >> 27
    x = (x * _M2) & U64
    x ^= x >> 31
    return x


def hash64(seed: int, q: int, k: int) -> int:
    return mix((mix((mix(seed) + q) & U64) + k) & U64)


def _mix_np(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= np.uint64(_M1)
        x ^= x >> np.uint64(27)
        x *= np.uint64(_M2)
        x ^= x >> np.uint64(31)
    return x


def hash_matrix(seed: int, Lq: int, Lk: int) -> np.ndarray:
    """[Lq, Lk] uint64 matrix of h(seed, q, k)."""
    ms = np.uint64(mix(seed & U64))
    with np.errstate(over="ignore"):
        a = _mix_np(ms + np.arange(Lq, dtype=np.uint64))
        return _mix_np(a[:, None] + np.arange(Lk, dtype=np.uint64)[None, :])


# ----------------------------------------------------------------------------- tokens

class Tok:
    __slots__ = ("kind", "text", "pos", "value")

    def __init__(self, kind, text, pos, value=None):
        self.kind, self.text, self.pos, self.value = kind, text, pos, value

    def __repr__(self):
        return f"Tok({self.kind},{self.text!r},{self.pos})"


_PUNCT = set("()|&,=:-")


def tokenize(s: str) -> list[Tok]:
    out: list[Tok] = []
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c.isspace():
            i += 1
        elif c.isascii() and (c.isalpha() or c == "_"):
            j = i
            while j < n and s[j].isascii() and (s[j].isalnum() or s[j] == "_"):
                j += 1
            out.append(Tok("NAME", s[i:j], i))
            i = j
        elif c.isascii() and c.isdigit():
            j = i
            while j < n and s[j].isascii() and s[j].isdigit():
                j += 1
            out.append(Tok("INT", s[i:j], i, int(s[i:j])))
            i = j
        elif c in _PUNCT:
            out.append(Tok(c, c, i))
            i += 1
        else:
            raise SpecError(f"unexpected character {c!r}", i)
    out.append(Tok("END", "", n))
    return out


# ----------------------------------------------------------------------------- nodes

def _grid(Lq, Lk):
    return np.arange(Lq, dtype=np.int64)[:, None], np.arange(Lk, dtype=np.int64)[None, :]


class Node:
    def eval(self, Lq: int, Lk: int) -> np.ndarray:
        raise NotImplementedError


class Union(Node):
    def __init__(self, parts):
        self.parts = parts

    def eval(self, Lq, Lk):
        m = self.parts[0].eval(Lq, Lk)
        for p in self.parts[1:]:
            m = m | p.eval(Lq, Lk)
        return m


class Inter(Node):
    def __init__(self, parts):
        self.parts = parts

    def eval(self, Lq, Lk):
        m = self.parts[0].eval(Lq, Lk)
        for p in self.parts[1:]:
            m = m & p.eval(Lq, Lk)
        return m


class Dense(Node):
    def eval(self, Lq, Lk):
        return np.ones((Lq, Lk), dtype=bool)


class Causal(Node):
    def eval(self, Lq, Lk):
        q, k = _grid(Lq, Lk)
        return k <= q


class LocalLR(Node):
    """q - a <= k <= q + b  (local(w) is a = b = w)."""

    def __init__(self, a, b):
        self.a, self.b = a, b

    def eval(self, Lq, Lk):
        q, k = _grid(Lq, Lk)
        big = max(Lq, Lk) + 1
        a, b = min(self.a, big), min(self.b, big)
        return (k >= q - a) & (k <= q + b)


class Dilated(Node):
    def __init__(self, w, d):
        self.w, self.d = w, d

    def eval(self, Lq, Lk):
        q, k = _grid(Lq, Lk)
        big = max(Lq, Lk) + 1
        wd = min(self.w * self.d, big)          # exact product, then clipped
        d = min(self.d, big)                    # |q-k| < big, so same residues test
        diff = q - k
        return (np.abs(diff) <= wd) & (np.mod(diff, d) == 0)


class Stride(Node):
    def __init__(self, s):
        self.s = s

    def eval(self, Lq, Lk):
        q, k = _grid(Lq, Lk)
        s = min(self.s, max(Lq, Lk) + 1)
        return np.mod(q - k, s) == 0


class BlockDiag(Node):
    def __init__(self, s):
        self.s = s

    def eval(self, Lq, Lk):
        q, k = _grid(Lq, Lk)
        s = min(self.s, max(Lq, Lk) + 1)
        return (q // s) == (k // s)


class Summary(Node):
    def __init__(self, s, c):
        self.s, self.c = s, c

    def eval(self, Lq, Lk):
        kk = np.arange(Lk, dtype=np.int64)
        kmod = kk % min(self.s, Lk + 1)         # == k mod s for every k < Lk
        thr = min(max(self.s - self.c, 0), Lk)  # exact s - c, clipped to [0, Lk]
        col = kmod >= thr
        return np.broadcast_to(col[None, :], (Lq, Lk)).copy()


def _index_vector(items, length, bound, clip, what, pos):
    """items: list of ('int', v) / ('range', a, b).  Returns bool vector [length]."""
    v = np.zeros(length, dtype=bool)
    for it in items:
        if it[0] == "int":
            a, b = it[1], it[1] + 1
        else:
            a, b = it[1], it[2]
        if b <= a:
            continue
        if clip:
            a, b = max(a, 0), min(b, bound)
            if b <= a:
                continue
        elif a < 0 or b > bound:
            bad = a if a < 0 else b - 1
            raise SpecError(f"{what}: index {bad} out of range for length {bound}", pos)
        a, b = min(a, length), min(b, length)
        if b > a:
            v[a:b] = True
    return v


class Global(Node):
    """kind: 'global' (q in G or k in G), 'rows' (q in G), 'cols' (k in G)."""

    def __init__(self, items, kind="global", clip=False, pos=None):
        self.items, self.kind, self.clip, self.pos = items, kind, clip, pos

    def eval(self, Lq, Lk):
        if self.kind == "global":
            bound = max(Lq, Lk)
            r = _index_vector(self.items, Lq, bound, self.clip, "global", self.pos)
            c = _index_vector(self.items, Lk, bound, self.clip, "global", self.pos)
            return r[:, None] | c[None, :]
        if self.kind == "rows":
            r = _index_vector(self.items, Lq, Lq, self.clip, "global_rows", self.pos)
            return np.broadcast_to(r[:, None], (Lq, Lk)).copy()
        c = _index_vector(self.items, Lk, Lk, self.clip, "global_cols", self.pos)
        return np.broadcast_to(c[None, :], (Lq, Lk)).copy()


class Random(Node):
    def __init__(self, r, seed):
        self.r, self.seed = r, seed

    def eval(self, Lq, Lk):
        r = self.r
        if r >= Lk:
            return np.ones((Lq, Lk), dtype=bool)
        m = np.zeros((Lq, Lk), dtype=bool)
        if r <= 0 or Lq == 0:
            return m
        # Floyd's sampling, one step j for every row at once: m[q] is the set S of row q so far.
        rows = np.arange(Lq)
        ms = np.uint64(mix(self.seed & U64))
        with np.errstate(over="ignore"):
            a = _mix_np(ms + np.arange(Lq, dtype=np.uint64))          # mix(mix(seed) + q)
            for j in range(Lk - r, Lk):
                h = _mix_np(a + np.uint64(j))                           # h(seed, q, j)
                t = (h % np.uint64(j + 1)).astype(np.int64)             # exact uint64 remainder
                m[rows, np.where(m[rows, t], j, t)] = True
        return m


class Document(Node):
    def __init__(self, segs, pos=None):
        self.segs, self.pos = segs, pos

    def eval(self, Lq, Lk):
        if Lq != Lk:
            raise SpecError("document needs q_len == k_len", self.pos)
        total = sum(self.segs)
        if total != Lq:
            raise SpecError(f"document segments sum to {total}, not {Lq}", self.pos)
        ids = np.repeat(np.arange(len(self.segs)), self.segs)
        return ids[:, None] == ids[None, :]


class Blocked(Node):
    def __init__(self, b, inner):
        self.b, self.inner = b, inner

    def eval(self, Lq, Lk):
        b = self.b
        Gq, Gk = -(-Lq // b), -(-Lk // b)
        inner = self.inner.eval(Gq, Gk)
        bq = np.arange(Lq, dtype=np.int64) // b
        bk = np.arange(Lk, dtype=np.int64) // b
        return inner[np.ix_(bq, bk)]


def axis_window(n, K, d, causal, pos=None):
    """[n, n] bool: A[i, j] = key coordinate j is in query coordinate i's window."""
    A = np.zeros((n, n), dtype=bool)
    for i in range(n):
        g, p = i % d, i // d
        ng = (n - g + d - 1) // d
        if causal:
            t0, t1 = max(0, p - K + 1), p
        else:
            if K > ng:
                raise SpecError(f"neighborhood kernel {K} larger than axis group ({ng} of size {n}, dilation {d})", pos)
            s = min(max(p - K // 2, 0), ng - K)
            t0, t1 = s, s + K - 1
        A[i, list(range(g + t0 * d, g + t1 * d + 1, d))] = True
    return A


class Neighborhood(Node):
    def __init__(self, dims, kernel, dilation, causal, pos=None):
        # dims: tuple or None (1-D, n0 = L); others: tuples of len nd
        self.dims, self.kernel, self.dilation, self.causal, self.pos = dims, kernel, dilation, causal, pos

    def eval(self, Lq, Lk):
        if Lq != Lk:
            raise SpecError("neighborhood needs q_len == k_len", self.pos)
        dims = self.dims if self.dims is not None else (Lq,)
        prod = 1
        for n in dims:
            prod *= n
        if prod != Lq:
            raise SpecError(f"neighborhood dims multiply to {prod}, not {Lq}", self.pos)
        m = None
        for ax, n in enumerate(dims):
            A = axis_window(n, self.kernel[ax], self.dilation[ax], self.causal[ax], self.pos)
            m = A.astype(np.uint8) if m is None else np.kron(m, A.astype(np.uint8))
        return m.astype(bool)


# ----------------------------------------------------------------------------- parser

ATOMS = {
    # name: (positional parameter names, defaults)
    "dense": ([], {}),
    "causal": ([], {}),
    "local": None,  # special
    "dilated": (["w", "d"], {}),
    "stride": (["s"], {}),
    "block_diag": (["s"], {}),
    "summary": (["s", "c"], {"c": 1}),
    "global": None,
    "global_rows": None,
    "global_cols": None,
    "random": (["r", "seed"], {"seed": 0}),
    "document": None,
    "blocked": (["b", "spec"], {}),
    "neighborhood": None,
    "longformer": (["w", "g"], {}),
    "bigbird": (["b", "w", "g", "r", "seed"], {"seed": 0}),
    "sparse_fixed": (["s", "c"], {"c": 1}),
    "sparse_strided": (["s"], {}),
}


class Parser:
    def __init__(self, text: str):
        self.text = text
        self.toks = tokenize(text)
        self.i = 0

    def peek(self, off=0) -> Tok:
        return self.toks[min(self.i + off, len(self.toks) - 1)]

    def next(self) -> Tok:
        t = self.toks[self.i]
        self.i += 1
        return t

    def expect(self, kind) -> Tok:
        t = self.peek()
        if t.kind != kind:
            raise SpecError(f"expected {kind!r}, found {t.text or 'end of spec'!r}", t.pos)
        return self.next()

    def parse(self) -> Node:
        node = self.spec()
        t = self.peek()
        if t.kind != "END":
            raise SpecError(f"trailing text {self.text[t.pos:]!r}", t.pos)
        return node

    def spec(self) -> Node:
        parts = [self.term()]
        while self.peek().kind == "|":
            self.next()
            parts.append(self.term())
        return parts[0] if len(parts) == 1 else Union(parts)

    def term(self) -> Node:
        parts = [self.factor()]
        while self.peek().kind == "&":
            self.next()
            parts.append(self.factor())
        return parts[0] if len(parts) == 1 else Inter(parts)

    def factor(self) -> Node:
        t = self.peek()
        if t.kind == "(":
            self.next()
            node = self.spec()
            self.expect(")")
            return node
        if t.kind == "NAME":
            return self.atom()
        raise SpecError(f"expected a pattern, found {t.text or 'end of spec'!r}", t.pos)

    # -- values
    def integer(self) -> tuple[int, int]:
        t = self.peek()
        neg = False
        if t.kind == "-":
            self.next()
            neg = True
        t2 = self.peek()
        if t2.kind != "INT":
            raise SpecError(f"expected an integer, found {t2.text or 'end of spec'!r}", t2.pos)
        self.next()
        v = -t2.value if neg else t2.value
        if v > INT64_MAX or v < INT64_MIN:
            raise SpecError(f"number {t2.text} does not fit in a signed 64-bit integer", t.pos)
        return v, t.pos

    def value(self, atom: str, slot):
        t = self.peek()
        if atom == "blocked" and slot == 1:
            return ("spec", self.spec(), t.pos)
        if t.kind == "(":
            self.next()
            vals = [self.integer()[0]]
            while self.peek().kind == ",":
                self.next()
                vals.append(self.integer()[0])
            self.expect(")")
            return ("tuple", tuple(vals), t.pos)
        a, _ = self.integer()
        if self.peek().kind == ":":
            self.next()
            b, _ = self.integer()
            if b < a:
                raise SpecError(f"range {a}:{b} has end before start", t.pos)
            return ("range", a, b, t.pos)
        return ("int", a, t.pos)

    def atom(self) -> Node:
        nt = self.next()
        name = nt.text
        if name not in ATOMS:
            raise SpecError(f"unknown name {name!r}", nt.pos)
        pos_args, named = [], {}
        if self.peek().kind == "(":
            self.next()
            while True:
                t = self.peek()
                if t.kind == "NAME" and self.peek(1).kind == "=":
                    self.next()
                    self.next()
                    if t.text in named:
                        raise SpecError(f"repeated argument {t.text!r}", t.pos)
                    named[t.text] = self.value(name, t.text)
                else:
                    pos_args.append(self.value(name, len(pos_args)))
                if self.peek().kind == ",":
                    self.next()
                    continue
                self.expect(")")
                break
        return build_atom(name, nt.pos, pos_args, named)


def _want_int(name, pname, v):
    if v[0] != "int":
        raise SpecError(f"{name}: argument {pname} must be an integer", v[-1])
    return v[1]


def _bind(name, pos, pos_args, named):
    params, defaults = ATOMS[name]
    if len(pos_args) > len(params):
        raise SpecError(f"{name}: extra argument", pos_args[len(params)][-1])
    out = {}
    for p, v in zip(params, pos_args):
        out[p] = v
    for k, v in named.items():
        if k not in params:
            raise SpecError(f"{name}: unknown argument {k!r}", v[-1])
        if k in out:
            raise SpecError(f"{name}: repeated argument {k!r}", v[-1])
        out[k] = v
    for p in params:
        if p not in out:
            if p in defaults:
                out[p] = ("int", defaults[p], pos)
            else:
                raise SpecError(f"{name}: missing argument {p!r}", pos)
    return out


def _need(cond, msg, pos):
    if not cond:
        raise SpecError(msg, pos)


def build_atom(name, pos, pos_args, named) -> Node:
    if name == "local":
        if named and pos_args:
            raise SpecError("local: use either local(w) or local(left=a, right=b)", pos)
        if pos_args or "w" in named:
            if len(pos_args) > 1:
                raise SpecError("local: extra argument", pos_args[1][-1])
            extra = [k for k in named if k != "w"]
            if extra:
                raise SpecError(f"local: unknown argument {extra[0]!r}", pos)
            w = _want_int(name, "w", pos_args[0] if pos_args else named["w"])
            _need(w >= 0, f"local: negative window {w}", pos)
            return LocalLR(w, w)
        for k in named:
            if k not in ("left", "right"):
                raise SpecError(f"local: unknown argument {k!r}", pos)
        if "left" not in named or "right" not in named:
            raise SpecError("local: missing argument", pos)
        a = _want_int(name, "left", named["left"])
        b = _want_int(name, "right", named["right"])
        _need(a >= 0 and b >= 0, "local: negative window", pos)
        return LocalLR(a, b)

    if name in ("global", "global_rows", "global_cols"):
        _need(not named, f"{name}: unexpected named argument", pos)
        _need(len(pos_args) > 0, f"{name}: missing argument", pos)
        items = []
        for v in pos_args:
            if v[0] not in ("int", "range"):
                raise SpecError(f"{name}: expected an index or a range", v[-1])
            items.append(v)
        kind = {"global": "global", "global_rows": "rows", "global_cols": "cols"}[name]
        return Global(items, kind, clip=False, pos=pos)

    if name == "document":
        _need(not named, "document: unexpected named argument", pos)
        _need(len(pos_args) > 0, "document: missing argument", pos)
        segs = []
        for v in pos_args:
            n = _want_int(name, "segment", v)
            _need(n >= 1, f"document: segment length {n} below 1", v[-1])
            segs.append(n)
        return Document(segs, pos)

    if name == "neighborhood":
        if pos_args:
            raise SpecError("neighborhood: arguments must be named", pos_args[0][-1])
        for k in named:
            if k not in ("dims", "kernel", "dilation", "causal"):
                raise SpecError(f"neighborhood: unknown argument {k!r}", named[k][-1])
        if "kernel" not in named:
            raise SpecError("neighborhood: missing argument 'kernel'", pos)

        def vals(v):
            if v[0] == "int":
                return (v[1],)
            if v[0] == "tuple":
                return v[1]
            raise SpecError("neighborhood: expected an integer or a tuple", v[-1])

        dims = None
        nd = 1
        if "dims" in named:
            dims = vals(named["dims"])
            nd = len(dims)
            _need(1 <= nd <= 3, "neighborhood: 1 to 3 dims", pos)
            for n in dims:
                _need(n >= 1, f"neighborhood: dim {n} below 1", pos)

        def per_axis(key, default):
            if key not in named:
                return (default,) * nd
            v = named[key]
            t = vals(v)
            if v[0] == "int":
                return t * nd
            _need(len(t) == nd, f"neighborhood: {key} has {len(t)} values for {nd} axes", v[-1])
            return t

        kernel = per_axis("kernel", None)
        dilation = per_axis("dilation", 1)
        causal = per_axis("causal", 0)
        for K in kernel:
            _need(K >= 1, f"neighborhood: kernel size {K} below 1", pos)
        for d in dilation:
            _need(d >= 1, f"neighborhood: dilation {d} below 1", pos)
        for c in causal:
            _need(c in (0, 1), f"neighborhood: causal must be 0 or 1, not {c}", pos)
        return Neighborhood(dims, kernel, dilation, tuple(bool(c) for c in causal), pos)

    a = _bind(name, pos, pos_args, named)
    if name == "blocked":
        b = _want_int(name, "b", a["b"])
        _need(b >= 1, f"blocked: block size {b} below 1", pos)
        if a["spec"][0] != "spec":
            raise SpecError("blocked: second argument must be a spec", a["spec"][-1])
        return Blocked(b, a["spec"][1])
    iv = {k: _want_int(name, k, v) for k, v in a.items()}
    if name == "dense":
        return Dense()
    if name == "causal":
        return Causal()
    if name == "dilated":
        _need(iv["w"] >= 0, "dilated: negative window", pos)
        _need(iv["d"] >= 1, "dilated: dilation below 1", pos)
        return Dilated(iv["w"], iv["d"])
    if name == "stride":
        _need(iv["s"] >= 1, "stride: stride below 1", pos)
        return Stride(iv["s"])
    if name == "block_diag":
        _need(iv["s"] >= 1, "block_diag: block size below 1", pos)
        return BlockDiag(iv["s"])
    if name == "summary":
        _need(iv["s"] >= 1, "summary: block size below 1", pos)
        _need(iv["c"] >= 0, "summary: negative count", pos)
        return Summary(iv["s"], iv["c"])
    if name == "random":
        _need(iv["r"] >= 0, "random: negative count", pos)
        return Random(iv["r"], iv["seed"])
    if name == "longformer":
        _need(iv["w"] >= 0, "longformer: negative window", pos)
        _need(iv["g"] >= 0, "longformer: negative count", pos)
        return Union([LocalLR(iv["w"], iv["w"]), Global([("range", 0, iv["g"], pos)], clip=True, pos=pos)])
    if name == "bigbird":
        _need(iv["b"] >= 1, "bigbird: block size below 1", pos)
        _need(iv["w"] >= 0, "bigbird: negative window", pos)
        _need(iv["g"] >= 0, "bigbird: negative count", pos)
        _need(iv["r"] >= 0, "bigbird: negative count", pos)
        inner = Union([LocalLR(iv["w"], iv["w"]),
                       Global([("range", 0, iv["g"], pos)], clip=True, pos=pos),
                       Random(iv["r"], iv["seed"])])
        return Blocked(iv["b"], inner)
    if name == "sparse_fixed":
        _need(iv["s"] >= 1, "sparse_fixed: block size below 1", pos)
        _need(iv["c"] >= 0, "sparse_fixed: negative count", pos)
        return Union([BlockDiag(iv["s"]), Summary(iv["s"], iv["c"])])
    if name == "sparse_strided":
        s = iv["s"]
        _need(s >= 1, "sparse_strided: stride below 1", pos)
        return Union([LocalLR(s - 1, 0), Inter([Stride(s), Causal()])])
    raise AssertionError(name)


def parse(spec: str) -> Node:
    return Parser(spec).parse()


def mask(spec: str, q_len: int, k_len: int | None = None) -> np.ndarray:
    """Boolean [q_len, k_len] mask of `spec` (k_len defaults to q_len)."""
    if k_len is None:
        k_len = q_len
    m = parse(spec).eval(int(q_len), int(k_len))
    return np.ascontiguousarray(m, dtype=bool)


def mask_rows(m: np.ndarray) -> list[str]:
    """The `spattn mask` text of a mask, one string per row (no newline)."""
    L = m.shape[1]
    names = [str(i) for i in range(L)]
    rows = []
    for r in m:
        rows.append(" ".join([names[j] for j in np.flatnonzero(r).tolist()]))
    return rows


# ----------------------------------------------------------------------------- attention

def attention(q, k, v, mask, scale=None, Hkv=None):
    """float64 reference.  q [B,Lq,H,D], k [B,Lk,HK,D], v [B,Lk,HK,Dv], mask [Lq,Lk] bool.
    Returns O [B,Lq,H,Dv] and LSE [B,H,Lq]; fully masked rows give O = 0, LSE = -inf."""
    q = np.asarray(q, dtype=np.float64)
    k = np.asarray(k, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    mask = np.asarray(mask, dtype=bool)
    B, Lq, H, D = q.shape
    _, Lk, HK, Dv = v.shape
    if Hkv is None:
        Hkv = k.shape[2]
    assert k.shape == (B, Lk, Hkv, D) and v.shape[2] == Hkv and H % Hkv == 0
    assert mask.shape == (Lq, Lk)
    if scale is None:
        scale = 1.0 / np.sqrt(D)
    group = H // Hkv
    O = np.zeros((B, Lq, H, Dv))
    LSE = np.full((B, H, Lq), -np.inf)
    rowany = mask.any(axis=1)
    for b in range(B):
        for h in range(H):
            hk = h // group
            S = scale * (q[b, :, h, :] @ k[b, :, hk, :].T)
            S = np.where(mask, S, -np.inf)
            m = np.where(rowany, np.max(S, axis=1, initial=-np.inf), 0.0)
            P = np.exp(S - m[:, None])
            l = P.sum(axis=1)
            lsafe = np.where(rowany, l, 1.0)
            LSE[b, h] = np.where(rowany, m + np.log(lsafe), -np.inf)
            O[b, :, h, :] = np.where(rowany[:, None], (P @ v[b, :, hk, :]) / lsafe[:, None], 0.0)
    return O, LSE


def attention_grads(q, k, v, dout, mask, scale=None, Hkv=None):
    """float64 gradients of attention(q, k, v, mask) for the loss <dout, O>, written out from the definition:
    dQ [B,Lq,H,D], dK [B,Lk,HK,D], dV [B,Lk,HK,Dv] (dK, dV summed over the query heads of a group). A fully masked
    row contributes nothing."""
    q, k, v, dout = (np.asarray(x, dtype=np.float64) for x in (q, k, v, dout))
    mask = np.asarray(mask, dtype=bool)
    B, Lq, H, D = q.shape
    Hkv = k.shape[2] if Hkv is None else Hkv
    g = H // Hkv
    s = 1.0 / np.sqrt(D) if scale is None else scale
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for b in range(B):
        for h in range(H):
            hk = h // g
            S = np.where(mask, s * q[b, :, h] @ k[b, :, hk].T, -np.inf)
            mx = np.max(S, axis=1, keepdims=True, initial=-np.inf)
            mx = np.where(np.isfinite(mx), mx, 0)
            E = np.where(mask, np.exp(S - mx), 0)
            den = E.sum(axis=1, keepdims=True)
            P = np.divide(E, den, out=np.zeros_like(E), where=den > 0)
            dO = dout[b, :, h]
            dv[b, :, hk] += P.T @ dO
            dP = dO @ v[b, :, hk].T
            dS = P * (dP - (dP * P).sum(axis=1, keepdims=True))
            dq[b, :, h] = s * dS @ k[b, :, hk]
            dk[b, :, hk] += s * dS.T @ q[b, :, h]
    return dq, dk, dv


# ----------------------------------------------------------------------------- self-test

def _rows(spec, Lq, Lk=None):
    m = mask(spec, Lq, Lk)
    return [list(np.flatnonzero(r)) for r in m]


def _expect_error(spec, Lq, Lk=None):
    try:
        mask(spec, Lq, Lk)
    except SpecError:
        return
    raise AssertionError(f"expected an error for {spec!r} at {Lq},{Lk}")


def _brute(spec_fn, Lq, Lk):
    return np.array([[bool(spec_fn(q, k)) for k in range(Lk)] for q in range(Lq)])


def self_test() -> int:
    n = 0

    def check(cond, what):
        nonlocal n
        if not cond:
            raise AssertionError(what)
        n += 1

    # local(1) at L=4 is tridiagonal
    check(_rows("local(1)", 4) == [[0, 1], [0, 1, 2], [1, 2, 3], [2, 3]], "local(1)")
    check(_rows("local(left=1, right=0)", 3) == [[0], [0, 1], [1, 2]], "local(left,right)")
    check(_rows("causal", 3) == [[0], [0, 1], [0, 1, 2]], "causal")
    check(_rows("causal", 2, 4) == [[0], [0, 1]], "causal cross")
    check(_rows("dense", 2, 3) == [[0, 1, 2]] * 2, "dense cross")
    check(_rows(" ( local ( 0 ) ) ", 2) == [[0], [1]], "whitespace/parens")
    # brute-force agreement for arithmetic atoms, several lengths
    for L, K in [(1, 1), (7, 7), (13, 13), (5, 11), (11, 5)]:
        brute = {
            "local(2)": lambda q, k: abs(q - k) <= 2,
            "local(left=3, right=1)": lambda q, k: q - 3 <= k <= q + 1,
            "dilated(2, 3)": lambda q, k: abs(q - k) <= 6 and (q - k) % 3 == 0,
            "stride(4)": lambda q, k: (q - k) % 4 == 0,
            "block_diag(3)": lambda q, k: q // 3 == k // 3,
            "summary(4)": lambda q, k: k % 4 >= 3,
            "summary(4, c=2)": lambda q, k: k % 4 >= 2,
            "summary(4, 3)": lambda q, k: k % 4 >= 1,
            "global(0, 3:5)": lambda q, k: q in (0, 3, 4) or k in (0, 3, 4),
            "global_rows(1:3)": lambda q, k: q in (1, 2),
            "global_cols(2)": lambda q, k: k == 2,
            "causal & local(1) | global_cols(0)": lambda q, k: (k <= q and abs(q - k) <= 1) or k == 0,
            "causal & (local(1) | global_cols(0))": lambda q, k: k <= q and (abs(q - k) <= 1 or k == 0),
            "sparse_strided(3)": lambda q, k: (q - 2 <= k <= q) or ((q - k) % 3 == 0 and k <= q),
            "sparse_fixed(3)": lambda q, k: q // 3 == k // 3 or k % 3 >= 2,
            "sparse_fixed(4, c=2)": lambda q, k: q // 4 == k // 4 or k % 4 >= 2,
            "longformer(1, 2)": lambda q, k: abs(q - k) <= 1 or q < 2 or k < 2,
            "blocked(2, causal)": lambda q, k: k // 2 <= q // 2,
            "blocked(3, local(0) | global_cols(0))": lambda q, k: q // 3 == k // 3 or k < 3,
            "local(9223372036854775807)": lambda q, k: True,
            "local(left=9223372036854775807, right=9223372036854775807)": lambda q, k: True,
            "dilated(9223372036854775807, 2)": lambda q, k: (q - k) % 2 == 0,
            "stride(9223372036854775807)": lambda q, k: q == k,
            "block_diag(9223372036854775807)": lambda q, k: True,
            "summary(9223372036854775807)": lambda q, k: False,
            "summary(5, c=9)": lambda q, k: True,
            "summary(5, c=0)": lambda q, k: False,
        }
        for spec, fn in brute.items():
            try:
                got = mask(spec, L, K)
            except SpecError:
                if "global" in spec and max(L, K) <= 4:
                    continue
                raise
            check(np.array_equal(got, _brute(fn, L, K)), f"{spec} at {L}x{K}")

    # hash: stateless definition, check against a direct reimplementation
    def mix_ref(x):
        x = x & U64
        x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 % 2**64
        x = (x ^ (x >> 27)) * 0x94D049BB133111EB % 2**64
        return x ^ (x >> 31)

    check(mix(0) == 0, "mix(0)")
    # splitmix64 finaliser of the golden-ratio increment is a well-known constant
    check(mix(0x9E3779B97F4A7C15) == 0xE220A8397B1DCDAF, "splitmix64 first output")
    for s, q, k in [(0, 0, 0), (1, 2, 3), (7, 4095, 4095), (2**63 - 1, 5, 9)]:
        hv = hash64(s, q, k)
        check(hv == mix_ref(mix_ref(mix_ref(s) + q) + k), "hash ref")
        check(int(hash_matrix(s, q + 1, k + 1)[q, k]) == hv, "hash_matrix")

    # random: Floyd's sampling, against a per-row transcription on Python integers (sets)
    def floyd_row(r, seed, q, Lk):
        if r >= Lk:
            return set(range(Lk))
        S = set()
        for j in range(Lk - r, Lk):
            t = hash64(seed, q, j) % (j + 1)
            S.add(j if t in S else t)
        return S

    for Lq, Lk, r, seed in [(9, 9, 3, 0), (17, 17, 5, 7), (6, 6, 6, 1), (6, 6, 9, 1), (6, 6, 0, 1), (12, 12, 11, 2),
                            (12, 12, 1, 3), (1, 1, 0, 4), (2, 2, 1, -1), (5, 40, 39, 2**63 - 1), (40, 5, 4, -(2**63)),
                            (30, 300, 1, 11), (64, 64, 32, 5)]:
        m = mask(f"random({r}, seed={seed})", Lq, Lk)
        m2 = mask(f"random({r}, {seed})", Lq, Lk)
        check(np.array_equal(m, m2), "random positional seed")
        for q in range(Lq):
            want = floyd_row(r, seed, q, Lk)
            check(set(np.flatnonzero(m[q]).tolist()) == want, f"random({r}, seed={seed}) row {q} at {Lq}x{Lk}")
            check(len(want) == min(r, Lk), "random row size")
    check(np.array_equal(mask("random(2)", 8), mask("random(2, seed=0)", 8)), "seed default")

    # document
    check(_rows("document(2, 1, 3)", 6) == [[0, 1], [0, 1], [2], [3, 4, 5], [3, 4, 5], [3, 4, 5]], "document")
    _expect_error("document(2, 2)", 5)

    # bigbird shape: blocked(b, local(w) | global(0:g) | random(r))
    m = mask("bigbird(4, 1, 1, 1, seed=3)", 32)
    blocks = m[::4, ::4]
    check(np.array_equal(np.kron(blocks, np.ones((4, 4), dtype=bool)).astype(bool), m), "bigbird blocky")
    inner = mask("local(1) | global(0:1) | random(1, seed=3)", 8)
    check(np.array_equal(blocks, inner), "bigbird grid")
    check(np.array_equal(mask("bigbird(4, 0, 100, 0)", 10), np.ones((10, 10), bool)), "bigbird clip")
    check(np.array_equal(mask("longformer(0, 99)", 5), np.ones((5, 5), bool)), "longformer clip")
    check(mask("bigbird(3, 1, 1, 1)", 10).shape == (10, 10), "bigbird ragged")
    # sparse_strided(4) at L=8
    check(_rows("sparse_strided(4)", 8)[7] == [3, 4, 5, 6, 7], "sparse_strided row 7")
    check(_rows("sparse_strided(4)", 10)[9] == [1, 5, 6, 7, 8, 9], "sparse_strided row 9")

    # neighborhood 1-D: NATTEN windows (shifted at borders)
    check(_rows("neighborhood(kernel=3)", 5) == [[0, 1, 2], [0, 1, 2], [1, 2, 3], [2, 3, 4], [2, 3, 4]], "na1d")
    check(_rows("neighborhood(kernel=3, causal=1)", 4) == [[0], [0, 1], [0, 1, 2], [1, 2, 3]], "na1d causal")
    # dilation 2, n=7: groups {0,2,4,6} and {1,3,5}, K=3
    r = _rows("neighborhood(dims=7, kernel=3, dilation=2)", 7)
    check(r[0] == [0, 2, 4] and r[6] == [2, 4, 6] and r[1] == [1, 3, 5] and r[4] == [2, 4, 6], "na1d dil")
    _expect_error("neighborhood(dims=7, kernel=4, dilation=2)", 7)  # group {1,3,5} has 3 < 4
    # 2-D: row-major, window per axis
    m = mask("neighborhood(dims=(3,4), kernel=(1,3))", 12)
    check(np.flatnonzero(m[5]).tolist() == [4, 5, 6], "na2d")
    m = mask("neighborhood(dims=(3,4), kernel=(3,1))", 12)
    check(np.flatnonzero(m[5]).tolist() == [1, 5, 9], "na2d col")
    m = mask("neighborhood(dims=(2,2,3), kernel=(1,1,2), causal=(0,0,1))", 12)
    check(np.flatnonzero(m[11]).tolist() == [10, 11] and np.flatnonzero(m[9]).tolist() == [9], "na3d")
    # brute 2-D check against the definition, written differently
    def win(i, n, K, d, c):
        g, p = i % d, i // d
        ng = len(range(g, n, d))
        if c:
            return {g + t * d for t in range(max(0, p - K + 1), p + 1)}
        s = max(0, min(p - K // 2, ng - K))
        return {g + t * d for t in range(s, s + K)}
    dims, K, D, C = (7, 6), (3, 2), (2, 1), (0, 1)
    m = mask("neighborhood(dims=(7,6), kernel=(3,2), dilation=(2,1), causal=(0,1))", 42)
    for qq in range(42):
        qi = (qq // 6, qq % 6)
        for kk in range(42):
            ki = (kk // 6, kk % 6)
            inn = all(ki[a] in win(qi[a], dims[a], K[a], D[a], C[a]) for a in range(2))
            check(bool(m[qq, kk]) == inn, "na2d brute")

    # errors
    for spec, L in [("foo", 4), ("local", 4), ("local(1, 2)", 4), ("causal(1)", 4), ("random(1, seed=1, seed=2)", 4),
                    ("local(9223372036854775808)", 4), ("global(3:2)", 4), ("block_diag(0)", 4), ("stride(0)", 4),
                    ("dilated(1, 0)", 4), ("local(-1)", 4), ("global(4)", 4), ("global(0:5)", 4), ("local(1) x", 4),
                    ("(local(1)", 4), ("local(1))", 4), ("document(1, 2)", 4), ("neighborhood(kernel=5)", 4),
                    ("neighborhood(kernel=0)", 4), ("blocked(0, dense)", 4), ("blocked(2, global(2))", 4),
                    ("summary(4, 2, c=1)", 4), ("", 4), ("causal |", 4), ("local(left=1)", 4),
                    ("neighborhood(dims=(2,2), kernel=(1,1,1))", 4), ("neighborhood(dims=(2,3), kernel=1)", 4),
                    ("random(-1)", 4), ("longformer(1, -1)", 4), ("sparse_strided(0)", 4), ("document(0, 4)", 4)]:
        _expect_error(spec, L)
        n += 1
    check(mask("global(5)", 3, 6)[0].tolist() == [False] * 5 + [True], "global cross index")

    # attention: fully masked rows, GQA
    rng = np.random.default_rng(0)
    B, L, H, HK, D = 2, 6, 4, 2, 8
    q, k, v = rng.standard_normal((B, L, H, D)), rng.standard_normal((B, L, HK, D)), rng.standard_normal((B, L, HK, D))
    m = mask("global_rows(0:3)", L) & mask("causal", L)
    O, LSE = attention(q, k, v, m)
    check(np.all(O[:, 3:] == 0) and np.all(np.isneginf(LSE[:, :, 3:])) and np.all(np.isfinite(LSE[:, :, :3])), "att masked")
    # naive per-element reference
    for b in range(B):
        for h in range(H):
            hk = h // (H // HK)
            for i in range(3):
                s = np.array([q[b, i, h] @ k[b, j, hk] / np.sqrt(D) for j in range(i + 1)])
                lse = np.log(np.exp(s).sum())
                check(abs(lse - LSE[b, h, i]) < 1e-12, "lse")
                o = sum(np.exp(s[j] - lse) * v[b, j, hk] for j in range(i + 1))
                check(np.allclose(o, O[b, i, h], atol=1e-12), "o")
    print(f"self-test: {n} checks passed")
    return 0


def main(argv):
    if "--self-test" in argv:
        return self_test()
    if len(argv) >= 2 and argv[0] == "--mask":
        # patterns_oracle.py --mask SPEC Lq [Lk]: print like `spattn mask`
        spec, Lq = argv[1], int(argv[2])
        Lk = int(argv[3]) if len(argv) > 3 else Lq
        try:
            m = mask(spec, Lq, Lk)
        except SpecError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        sys.stdout.write("".join(r + "\n" for r in mask_rows(m)))
        return 0
    print("usage: patterns_oracle.py --self-test | --mask SPEC Lq [Lk]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
