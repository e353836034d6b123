#!/usr/bin/env python3
"""No upward include between src/ layers (ARCHITECTURE.md: data flows down; nothing imports upward).

Order, bottom first: common, pattern, format, plan, then the engines cpu and cuda (neither includes the other),
then api and dist (context-parallel attention over the public Plan, beside api: neither includes the other), then tools. tsvd (tiled SVD compression and its CPU matmul) needs only common: it sits beside pattern,
so the engines, api and tools may include it and nothing of the attention stack goes into it. A file of layer X may include "Y/..." only for Y at or below X. Public headers
(include/spattn/) are the library's interface and may be included anywhere. Exits 1 listing each offence.
"""
import pathlib
import re
import sys

RANK = {"common": 0, "pattern": 1, "tsvd": 1, "format": 2, "plan": 3, "cpu": 4, "cuda": 4, "api": 5, "dist": 5, "tools": 6}
root = pathlib.Path(__file__).resolve().parents[1] / "src"
bad = []
for f in sorted(root.rglob("*")):
    if f.suffix not in {".hpp", ".cpp", ".cu", ".cuh", ".inc", ".in"}:
        continue
    layer = f.relative_to(root).parts[0]
    if layer not in RANK:
        if f.parent != root:
            bad.append(f"{f.relative_to(root)}: unknown layer '{layer}' (add it to tests/layers_check.py)")
        continue
    for n, line in enumerate(f.read_text().splitlines(), 1):
        m = re.match(r'\s*#\s*include\s+"([a-z_]+)/', line)
        if not m or m.group(1) == "spattn" or m.group(1) not in RANK:
            continue
        dep = m.group(1)
        if RANK[dep] > RANK[layer] or (RANK[dep] == RANK[layer] and dep != layer):
            bad.append(f"src/{f.relative_to(root)}:{n}: layer '{layer}' includes '{dep}' ({line.strip()})")
print("\n".join(bad) if bad else f"layers: no upward include in {root}")
sys.exit(1 if bad else 0)
