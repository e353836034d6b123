#!/usr/bin/env python3
"""No upward or sideways include between the folders of src/ and bench/ (docs/ARCHITECTURE.md, "Layers").

Every folder under src/ and bench/ is a unit of the table below, or a data folder of bench/ (no source there); a
folder the table does not know is an error (add it, with what it may include). A file of unit X may include
"Y/..." only where Y is X or a unit X is allowed to reach (the MAY_INCLUDE edges, followed transitively), so two
units that do not reach each other (cpu and the cuda folders; the engine folders of cuda/; api and dist) never
include one another. Bottom first:

  common                       header-only helpers (allocation, the thread pool, command-line flags)
  pattern, tsvd                the pattern language; tiled SVD compression (needs only common)
  format                       CSR / block formats of a pattern
  plan (with plan/gpu)         analysis, the kernel table, planning: one unit, its sub-folders included
  cpu | cuda/common            the CPU engine | what every CUDA folder shares (device queries, Hopper helpers)
  cuda/fused, cuda/unfused,    the GPU engines and kernels: siblings, none includes another
  cuda/backward, cuda/tsvd
  cuda/runtime                 run-time masks on the GPU: lists written on the device for cuda/fused and cuda/backward
  api | dist                   spattn::Plan and the C API | context-parallel attention
  bench                        the benchmark drivers (bench/ at the repository root)
  tools                        the spattn command

Public headers (include/spattn/) are the library's interface and may be included anywhere. Exits 1 listing each
offence. --self-test checks, on made-up trees, that the check fails where it must.
"""
import pathlib
import re
import sys
import tempfile

# unit -> the units it may include directly (the check follows these edges transitively).
MAY_INCLUDE = {
    "common": [],
    "pattern": ["common"],
    "tsvd": ["common"],
    "format": ["pattern", "tsvd"],
    "plan": ["format"],
    "cpu": ["plan"],
    "cuda/common": ["plan"],
    "cuda/fused": ["cuda/common"],
    "cuda/unfused": ["cuda/common"],
    "cuda/backward": ["cuda/common"],
    "cuda/tsvd": ["cuda/common"],
    "cuda/runtime": ["cuda/fused", "cuda/backward"],
    "api": ["cpu", "cuda/fused", "cuda/unfused", "cuda/backward", "cuda/tsvd"],
    "dist": ["cpu", "cuda/fused", "cuda/unfused", "cuda/backward", "cuda/tsvd"],
    "bench": ["api", "dist"],
    "tools": ["bench"],
}
# Folders (relative to the repository) -> their unit. src/cuda itself holds only its sub-folders.
FOLDERS = {f"src/{u}": u for u in MAY_INCLUDE if u != "bench"}
FOLDERS.update({"src/plan/gpu": "plan", "bench": "bench"})
CONTAINERS = {"src", "src/cuda"}  # folders of folders: a source file directly inside is an error
DATA = re.compile(r"^bench/(baselines|results)(/[^/]+)?$")  # measurements, plots, logs: no source allowed
SOURCE = {".hpp", ".cpp", ".cu", ".cuh", ".inc", ".in", ".h", ".c"}
INCLUDE = re.compile(r'\s*#\s*include\s*([<"])([^>"]+)[>"]')


def reach(unit):
    seen, todo = set(), [unit]
    while todo:
        for d in MAY_INCLUDE[todo.pop()]:
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return seen


def unit_of_include(path):
    """The unit an include path names ("cuda/fused/x.hpp" -> "cuda/fused"), "" for public or same-folder headers,
    None for a path under no unit (an error)."""
    parts = path.split("/")
    if len(parts) == 1 or parts[0] == "spattn":
        return ""
    for n in (2, 1):
        folder = "bench" if parts[0] == "bench" and n == 1 else "src/" + "/".join(parts[:n])
        if len(parts) > n and folder in FOLDERS:
            return FOLDERS[folder]
    return None


def check(repo):
    bad = []
    dirs = [repo / "src", repo / "bench"]
    for top in dirs:
        for d in sorted([top] + [p for p in top.rglob("*") if p.is_dir()]):
            rel = d.relative_to(repo).as_posix()
            sources = sorted(f for f in d.iterdir() if f.is_file() and f.suffix in SOURCE)
            if rel in CONTAINERS:
                if rel != "src":
                    bad += [f"{f.relative_to(repo)}: {rel}/ holds only sub-folders (the table has none for it)"
                            for f in sources]
                continue
            if DATA.match(rel):
                bad += [f"{f.relative_to(repo)}: source in the data folder {rel}/" for f in sources]
                continue
            if rel not in FOLDERS:
                bad.append(f"{rel}/: a folder tests/layers_check.py does not know (add it to FOLDERS and MAY_INCLUDE)")
                continue
            unit = FOLDERS[rel]
            allowed = reach(unit) | {unit}
            for f in sources:
                for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    bracket, path = m.groups()
                    dep = unit_of_include(path)
                    if bracket == "<" and dep is None:
                        continue  # a system or third-party header
                    where = f"{f.relative_to(repo)}:{n}"
                    if dep is None:
                        bad.append(f"{where}: '{path}' is under no folder the table knows ({line.strip()})")
                    elif dep and dep not in allowed:
                        bad.append(f"{where}: '{unit}' includes '{dep}' ({line.strip()})")
    return bad


def self_test():
    """The check fails on each offence below and passes on the clean tree."""
    clean = {
        "src/common/a.hpp": "",
        "src/plan/p.hpp": '#include "common/a.hpp"\n',
        "src/plan/gpu/g.hpp": '#include "plan/p.hpp"\n',
        "src/cuda/common/c.hpp": '#include "plan/gpu/g.hpp"\n',
        "src/cuda/fused/f.cuh": '#include "cuda/common/c.hpp"\n#include <vector>\n#include "spattn/plan.hpp"\n',
        "src/cuda/backward/b.cuh": '#include "cuda/common/c.hpp"\n#include "b2.cuh"\n',
        "src/tools/main.cpp": '#include "bench/bench.hpp"\n#include "cuda/fused/f.cuh"\n',
        "bench/bench.hpp": '#include "cuda/common/c.hpp"\n',
        "bench/results/run1/log.txt": "",
    }
    offences = {
        "backward includes fused": ("src/cuda/backward/x.cu", '#include "cuda/fused/f.cuh"\n'),
        "fused includes backward": ("src/cuda/fused/x.cu", '#include "cuda/backward/b.cuh"\n'),
        "cpu includes cuda": ("src/cpu/x.cpp", '#include "cuda/common/c.hpp"\n'),
        "common includes plan": ("src/common/x.hpp", '#include "plan/p.hpp"\n'),
        "bench includes tools": ("bench/x.cpp", '#include "tools/args.hpp"\n'),
        "unknown folder": ("src/cuda/newkernels/x.cu", ""),
        "unknown include root": ("src/plan/x.cpp", '#include "kernels/x.hpp"\n'),
        "file directly in cuda/": ("src/cuda/x.cpp", ""),
        "source in a data folder": ("bench/results/run1/x.cpp", ""),
    }
    failures = []
    for name, extra in [("clean tree", None)] + list(offences.items()):
        with tempfile.TemporaryDirectory() as t:
            repo = pathlib.Path(t)
            files = dict(clean)
            if extra:
                files[extra[0]] = extra[1]
            for p, text in files.items():
                (repo / p).parent.mkdir(parents=True, exist_ok=True)
                (repo / p).write_text(text)
            bad = check(repo)
            if (extra is None) != (not bad):
                failures.append(f"{name}: {'flagged' if bad else 'passed'}{': ' + bad[0] if bad else ''}")
    print("\n".join(failures) if failures else f"layers self-test: {len(offences)} offences caught, clean tree passes")
    return 1 if failures else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(self_test())
    repo = pathlib.Path(__file__).resolve().parents[1]
    bad = check(repo)
    print("\n".join(bad) if bad else f"layers: no upward or sideways include in {repo}/src and {repo}/bench")
    sys.exit(1 if bad else 0)
