#!/usr/bin/env python3
"""No source file under src/ over 1,000 lines; no function over 200 lines outside kernel bodies.

Scans every .cpp, .hpp, .cu, .cuh and .inc file under src/. Comments, string and character literals and preprocessor
lines are blanked first (newlines kept), then braces are matched:

  - a brace whose declaration names namespace, class, struct, union or enum (or extern "C") opens a container: the
    functions inside it are found the same way;
  - any other brace at container level whose declaration has a parameter list and no '=' outside parentheses opens a
    function; everything up to its matching brace (lambdas, local structs) is part of that function;
  - other braces at container level (initializers such as `int t[] = {...}`) are neither.

A function's length is its lines from the first line of its declaration (the template line, where there is one)
through its closing brace. The one exemption is a kernel body: a function whose declaration carries __global__ or
__device__ (device code, split only where a name explains a part of the kernel); nothing else is exempt.
Exits 1 listing each file over 1,000 lines and each function over 200. --self-test checks, on made-up files, that
the check fails where it must.
"""
import pathlib
import re
import sys
import tempfile

MAX_FILE_LINES = 1000
MAX_FUNCTION_LINES = 200
SUFFIXES = {".cpp", ".hpp", ".cu", ".cuh", ".inc"}
KERNEL = re.compile(r"\b(__global__|__device__)\b")
CONTAINER = re.compile(r"(\b(namespace|class|struct|union|enum)\b[^(){};=]*|\bextern\s*)$")
NOISE = re.compile(r"\b(alignas|__align__|__declspec|__launch_bounds__)\s*\((?:[^()]|\([^()]*\))*\)|\[\[.*?\]\]")
ACCESS = re.compile(r"^\s*(public|private|protected)\s*:(?!:)")


def blank(text):
    """Comments, string / character literals and preprocessor lines replaced by spaces; newlines kept."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#" or (line_start and c in " \t" and text[i:].lstrip(" \t").startswith("#")):
            # A preprocessor line, with its continuations.
            j = i
            while j < n and text[j] != "\n":
                j = j + 2 if text[j] == "\\" and j + 1 < n else j + 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            continue
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
            line_start = False
            continue
        raw = re.match(r'(?:u8|[uUL])?R"([^()\\\s]{0,16})\(', text[i:i + 24])
        if raw and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            j = text.find(")" + raw.group(1) + '"', i + raw.end())
            j = n if j < 0 else j + len(raw.group(1)) + 2
            out.append('""' + re.sub(r"[^\n]", " ", text[i + 2:j]))
            i = j
            line_start = False
            continue
        if c in "\"'":
            # A digit separator (1'000) is not a character literal.
            if c == "'" and i > 0 and text[i - 1].isalnum() and i + 1 < n and text[i + 1].isalnum():
                out.append(c)
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j = j + 2 if text[j] == "\\" else j + 1
            j = min(j + 1, n)
            out.append(c + " " * (j - i - 2) + c if j - i >= 2 else c)
            i = j
            line_start = False
            continue
        out.append(c)
        if c == "\n":
            line_start = True
        elif c not in " \t":
            line_start = False
        i += 1
    return "".join(out)


def matching(code, open_at):
    """Index of the brace closing the one at open_at (len(code) where unbalanced)."""
    depth = 0
    for j in range(open_at, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(code)


def outside_parens(s):
    """s with everything inside parentheses, angle-bracket-free, removed (one level is enough for '=' tests)."""
    out, depth = [], 0
    for ch in s:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(depth - 1, 0)
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def name_of(header):
    m = re.search(r"((?:[\w~]+\s*::\s*)*(?:operator\s*[^\s(]+|~?\w+))\s*\(", header)
    return re.sub(r"\s+", "", m.group(1)) if m else "?"


def functions(code):
    """(name, first line, last line, is_kernel) of every function defined in code (already blanked)."""
    found = []

    def line_of(k):
        return code.count("\n", 0, k) + 1

    def scan(lo, hi):
        header_at = lo
        i = lo
        while i < hi:
            ch = code[i]
            if ch in ";}":
                header_at = i + 1
            elif ch == "{":
                header = NOISE.sub(" ", code[header_at:i])
                header = ACCESS.sub(" ", header)
                close = matching(code, i)
                flat = " ".join(header.split())
                if CONTAINER.search(flat):
                    scan(i + 1, close)
                    header_at = close + 1
                    i = close + 1
                    continue
                # A brace-initialized member of a constructor's initializer list (`x_{a}, y_{b} {`): part of
                # the declaration of the body that follows.
                after = code[close + 1:hi].lstrip()
                if "(" in flat and after[:1] in (",", "{"):
                    i = close + 1
                    continue
                if "(" in flat and "=" not in re.sub(r"operator\s*\S+", "", outside_parens(flat)):
                    start = header_at + (len(header) - len(header.lstrip()))
                    found.append((name_of(flat), line_of(start), line_of(close), bool(KERNEL.search(flat))))
                header_at = close + 1
                i = close + 1
                continue
            i += 1

    scan(0, len(code))
    return found


def line_count(text):
    return text.count("\n") + (0 if text.endswith("\n") or not text else 1)


def check(src):
    """Offences under the folder src, as printable lines."""
    offences = []
    for path in sorted(p for p in pathlib.Path(src).rglob("*") if p.suffix in SUFFIXES and p.is_file()):
        text = path.read_text(encoding="utf-8", errors="replace")
        rel = path.relative_to(pathlib.Path(src).parent)
        lines = line_count(text)
        if lines > MAX_FILE_LINES:
            offences.append(f"{rel}: {lines} lines (limit {MAX_FILE_LINES})")
        for name, first, last, kernel in functions(blank(text)):
            length = last - first + 1
            if length > MAX_FUNCTION_LINES and not kernel:
                offences.append(f"{rel}:{first}: {name} is {length} lines (limit {MAX_FUNCTION_LINES})")
    return offences


def self_test():
    def body(n):
        """A function of exactly n lines (signature and closing brace included)."""
        return "int f(int x) {\n" + "  x += 1;\n" * (n - 2) + "  return x; }\n"

    cases = {
        "201-line function": ("a.cpp", body(201), 1),
        "200-line function": ("a.cpp", body(200), 0),
        "300-line __global__ kernel": ("k.cu", "__global__ void k(float* p) {\n" + "  p[0] += 1;\n" * 298 + "}\n", 0),
        "300-line __device__ template": (
            "k.cuh", "template <int N>\n__device__ __forceinline__ void d(float (&s)[N]) {\n" + "  s[0] += 1;\n" * 297 + "}\n", 0),
        "300-line __host__ function (not exempt)": ("h.cu", "__host__ void h() {\n" + "  ;\n" * 298 + "}\n", 1),
        "1,001-line file": ("big.hpp", "// x\n" * 1001, 1),
        "1,000-line file": ("big.hpp", "// x\n" * 1000, 0),
        "201-line member in a class in a namespace": (
            "m.hpp", "namespace a {\nstruct S {\n  " + body(201) + "};\n}  // namespace a\n", 1),
        "namespace of 300 lines of short functions": (
            "n.cpp", "namespace a {\n" + "int g() { return 1; }\n" * 298 + "}\n", 0),
        "long lambda counts to its function": (
            "l.cpp", "void f() {\n  auto g = [](int x) {\n" + "    x += 1;\n" * 197 + "    return x;\n  };\n  g(1);\n}\n", 1),
        "braces in comments and strings ignored": (
            "c.cpp", "// {\nconst char* s = \"{\";\n/* { */\n" + body(201).replace("x += 1;", "x += '}';", 1), 1),
        "constructor with brace-initialized members": (
            "k.cpp", "struct A { A(int a); int x_, y_; };\nA::A(int a) : x_{a}, y_(a) {\n" + "  ;\n" * 199 + "}\n", 1),
        "300-line initializer is not a function": ("t.cpp", "const int t[] = {\n" + "  1,\n" * 298 + "};\n", 0),
    }
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (what, (name, text, expect)) in enumerate(cases.items()):
            src = pathlib.Path(tmp) / str(i) / "src"
            src.mkdir(parents=True)
            (src / name).write_text(text)
            got = check(src)
            if len(got) != expect:
                failures.append(f"{what}: expected {expect} offence(s), got {got}")
    for f in failures:
        print("self-test:", f)
    print(f"self-test: {len(cases) - len(failures)} of {len(cases)} cases as expected")
    return 1 if failures else 0


def main():
    if "--self-test" in sys.argv[1:]:
        return self_test()
    src = pathlib.Path(__file__).resolve().parent.parent / "src"
    offences = check(src)
    for o in offences:
        print(o)
    print(f"{len(offences)} offence(s): files over {MAX_FILE_LINES} lines, functions over {MAX_FUNCTION_LINES} "
          "lines outside __global__ / __device__ kernel bodies")
    return 1 if offences else 0


if __name__ == "__main__":
    sys.exit(main())
