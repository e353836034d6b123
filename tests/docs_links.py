#!/usr/bin/env python3
"""Every relative link of README.md and docs/*.md resolves: the file or folder exists, and an #anchor into a
Markdown file names one of its headings (GitHub's slugs). Web links are not followed. And the README stays a front
door: under 15,000 characters, the two commands and a Python example on its first screen (60 lines).
Exit 1 listing what is wrong."""
import glob
import os
import re
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def slugs(path):
    """The anchors of a Markdown file's headings, as GitHub makes them."""
    with open(path) as f:
        text = FENCE.sub("", f.read())
    out = set()
    for h in re.findall(r"^#+\s+(.*)$", text, re.M):
        s = re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
        out.add(s)
    return out


def main():
    docs = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    bad, n = [], 0
    for doc in docs:
        with open(doc) as f:
            text = FENCE.sub("", f.read())
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            n += 1
            path, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
            where = os.path.relpath(doc, ROOT)
            if not os.path.exists(full):
                bad.append(f"{where}: link '{target}': no {os.path.relpath(full, ROOT)}")
            elif anchor and full.endswith(".md") and anchor not in slugs(full):
                bad.append(f"{where}: link '{target}': no heading '#{anchor}' in {os.path.relpath(full, ROOT)}")
    with open(docs[0]) as f:
        readme = f.read()
    first = "\n".join(readme.splitlines()[:60])
    if len(readme) >= 15000:
        bad.append(f"README.md: {len(readme)} characters (at most 15,000: move detail to docs/)")
    for want in ("scripts/install-deps.sh && cmake", "ctest --test-dir build", "```python", "import spattn"):
        if want not in first:
            bad.append(f"README.md: '{want}' is not on the first screen (60 lines)")
    for b in bad:
        print(b, file=sys.stderr)
    print(f"{len(docs)} documents, {n} relative links, {len(bad)} broken")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
