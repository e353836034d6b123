#!/usr/bin/env python3
"""Every Markdown file the repository names exists in the repository.

Scans the tracked text files (git ls-files; without git, the tree less build folders) for names ending in .md and
fails on each that names no file here: a path from the repository root or from the naming file's folder
("docs/PATTERNS.md", "../README.md"), or a bare name ("PATTERNS.md") that some file of the repository has. URLs
and globs ("*.md") are not names of files here and are skipped. Exits 1 listing each dangling name.
--self-test checks, on a made-up tree, that a dangling name fails and the accepted forms pass.
"""
import os
import pathlib
import re
import subprocess
import sys
import tempfile

NAME = re.compile(r"(?<![\w./*:-])((?:\.{1,2}/)*[\w.-]+(?:/[\w.-]+)*\.md)(?![\w/-])")
URL = re.compile(r"[a-z]+://\S+")
SKIP_DIRS = {".git", "build", "node_modules", "__pycache__"}


def tracked(repo):
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=repo, capture_output=True, check=True).stdout
        return [repo / p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for root, dirs, names in os.walk(repo):
            dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith("build")]
            files += [pathlib.Path(root) / n for n in names]
        return files


def check(repo, files):
    rel = {f.relative_to(repo).as_posix() for f in files}
    basenames = {pathlib.PurePosixPath(r).name for r in rel}
    bad = []
    for f in files:
        try:
            text = f.read_text()
        except (UnicodeDecodeError, OSError):
            continue  # binary
        here = f.relative_to(repo).parent
        for n, line in enumerate(text.splitlines(), 1):
            for m in NAME.finditer(URL.sub(" ", line)):
                name = m.group(1)
                if "/" not in name and name in basenames:
                    continue
                from_root = os.path.normpath(name)
                from_here = os.path.normpath((here / name).as_posix())
                if from_root in rel or from_here in rel:
                    continue
                bad.append(f"{f.relative_to(repo)}:{n}: '{name}' is not a file of the repository")
    return bad


def self_test():
    # Fixture names spell ".md" as "%md" here, so that this file names no Markdown file itself.
    cases = {
        "docs/A%md": "see ../README%md and B%md, https://example.com/C%md, *%md",
        "docs/B%md": "",
        "README%md": "docs/A%md, [x](docs/B%md), `git show abc:docs/A%md`",
        "src/x.cpp": "// A%md section 1; docs/B%md",
    }
    with tempfile.TemporaryDirectory() as t:
        repo = pathlib.Path(t)
        files = []
        for p, text in cases.items():
            f = repo / p.replace("%md", ".md")
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(text.replace("%md", ".md"))
            files.append(f)
        clean = check(repo, files)
        (repo / "src/y.py").write_text("# GONE%md, docs/NOTES%md, src/README%md\n".replace("%md", ".md"))
        dirty = check(repo, files + [repo / "src/y.py"])
    ok = not clean and len(dirty) == 3
    print("doc refs self-test: " + ("pass" if ok else f"FAIL clean={clean} dirty={dirty}"))
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    repo = pathlib.Path(__file__).resolve().parents[1]
    files = tracked(repo)
    bad = check(repo, files)
    print("\n".join(bad) if bad else f"doc refs: every .md named in {len(files)} files exists")
    sys.exit(1 if bad else 0)
