#!/usr/bin/env python3
"""Summary of a band-kernel trace (a SPATTN_TRACE build run with SPATTN_TRACE_FILE=PATH; see FusedParams::trace).

Each event is one (work item, consumer warpgroup): start (the item's Q tile ready), before the store, after the
store, in globaltimer ns. Printed: the kernel's span, when each SM's last item ended (the tail), item durations by
kind (whole items, slab parts, chunk parts), how far apart the three consumers of one item end, and the gaps a
consumer spends between items.

  python3 bench/trace_band.py TRACE [--json OUT]

Caveat: the recording costs the consumers registers; at 6e36820 a trace build of the band kernel tips ptxas into
C7511 (wgmma serialized; see `-Xptxas -v`), so its items run slower than in a normal build: compare traces of one
build with each other, not with untraced timings. (Session 7's committed traces were taken before the bulk-copy
epilogue, from a build without C7511.)
"""
import argparse
import json
import struct
import statistics as st
from collections import defaultdict


def load(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        raw = f.read(32 * n)
    ev = []
    for i in range(n):
        w0, t0, t1, t2 = struct.unpack_from("<QQQQ", raw, 32 * i)
        split = (w0 >> 48) & 0xFFFF
        split = split - 0x10000 if split >= 0x8000 else split
        if t0 == 0:  # an index taken by a warpgroup that stored nothing (a slab part not its own, a merged part)
            continue
        ev.append({"item": w0 & 0xFFFFFFFF, "c": (w0 >> 32) & 0xFF, "sm": (w0 >> 40) & 0xFF, "split": split,
                   "start": t0, "pre": t1, "end": t2})
    return ev


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    ev = load(a.trace)
    if not ev:
        print("no events")
        return
    t0 = min(e["start"] for e in ev)
    span = max(e["end"] for e in ev) - t0
    by_sm = defaultdict(list)
    for e in ev:
        by_sm[e["sm"]].append(e)
    sm_end = sorted(max(e["end"] for e in es) - t0 for es in by_sm.values())
    out = {"events": len(ev), "sms": len(by_sm), "span_us": span / 1e3,
           "sm_end_us": {q: pct(sm_end, q) / 1e3 for q in (0.0, 0.1, 0.5, 0.9, 1.0)}}
    kinds = defaultdict(list)
    for e in ev:
        k = "whole" if e["split"] == -1 else "slab" if e["split"] <= -2 else "chunks"
        kinds[k].append(e)
    out["kinds"] = {}
    for k, es in kinds.items():
        d = [(e["end"] - e["start"]) / 1e3 for e in es]
        s = [(e["end"] - e["pre"]) / 1e3 for e in es]
        out["kinds"][k] = {"n": len(es), "dur_med_us": st.median(d), "dur_p90_us": pct(d, 0.9),
                           "store_med_us": st.median(s),
                           "last_start_us": (max(e["start"] for e in es) - t0) / 1e3}
    # consumers of one item on one SM: spread of their ends
    items = defaultdict(list)
    for e in ev:
        items[(e["sm"], e["item"], e["split"])].append(e)
    spread = [(max(x["pre"] for x in es) - min(x["pre"] for x in es)) / 1e3 for es in items.values() if len(es) == 3]
    if spread:
        out["end_spread_us"] = {"med": st.median(spread), "p90": pct(spread, 0.9)}
    gaps = []
    per_c = defaultdict(list)
    for e in ev:
        per_c[(e["sm"], e["c"])].append(e)
    for es in per_c.values():
        es.sort(key=lambda e: e["start"])
        gaps += [(b["start"] - a["end"]) / 1e3 for a, b in zip(es, es[1:])]
    if gaps:
        out["gap_us"] = {"med": st.median(gaps), "p90": pct(gaps, 0.9), "sum_per_consumer": sum(gaps) / len(per_c)}
    items_per_sm = sorted(len({(e["item"], e["split"]) for e in es}) for es in by_sm.values())
    out["items_per_sm"] = {"min": items_per_sm[0], "med": st.median(items_per_sm), "max": items_per_sm[-1]}
    print(json.dumps(out, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
