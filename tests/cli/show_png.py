#!/usr/bin/env python3
"""`spattn show -o` keeps sparse structure visible at any size: a cell with any kept entry is not white however many
entries it covers (a shade of the kept share rounded them to white: random(1) at L = 100000 in 16x16 drew an empty
picture), a cell with none is white, and the command prints a legend. Usage: show_png.py SPATTN WORKDIR."""
import os
import struct
import subprocess
import sys
import zlib


def read_gray_png(path):
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, w, h = 8, b"", 0, 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color == 0, "expected 8-bit grayscale"
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    rows = []
    for y in range(h):
        line = raw[y * (w + 1):(y + 1) * (w + 1)]
        assert line[0] == 0, "filter type 0 expected"
        rows.append(list(line[1:]))
    return rows


def show(spattn, work, spec, size, length=100000):
    out = os.path.join(work, "mask.png")
    r = subprocess.run([spattn, "show", "--pattern", spec, "--len", str(length), "-o", out, "--size", str(size)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "legend: white none kept, black all kept" in r.stderr, r.stderr
    return read_gray_png(out)


def main():
    spattn, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    px = show(spattn, work, "random(1, seed=1)", 16)  # ~390 kept of 39 million entries a cell
    assert all(0 < v < 255 for row in px for v in row), px
    px = show(spattn, work, "local(2)", 16)  # the diagonal's cells keep a few entries, the others none
    for y, row in enumerate(px):  # rows near a cell's edge keep keys of the next cell across
        for x, v in enumerate(row):
            assert (v < 255) == (abs(x - y) <= 1), (y, x, v)
    px = show(spattn, work, "dense", 16)
    assert all(v == 0 for row in px for v in row), "every entry kept: black"
    # A length that is not a multiple of the cell count (local(0) at L = 1000 in 512x512 drew 24 half-kept cells
    # black): a cell is black exactly where all its entries are kept, the cells binned here independently.
    length, size = 1000, 512
    px = show(spattn, work, "local(0)", size, length)
    rows = [0] * size  # entries of each bin: index i goes to bin i * size // length
    for i in range(length):
        rows[i * size // length] += 1
    kept = {}
    for q in range(length):  # local(0): the diagonal only
        cell = (q * size // length, q * size // length)
        kept[cell] = kept.get(cell, 0) + 1
    for y, row in enumerate(px):
        for x, v in enumerate(row):
            k, n = kept.get((y, x), 0), rows[y] * rows[x]
            want = 255 if k == 0 else 0 if k == n else None
            assert (v == want) if want is not None else 0 < v < 255, (y, x, v, k, n)
    print("show -o: sparse cells visible, empty cells white, full cells black, legend printed; uneven bins right")


main()
