#!/usr/bin/env python3
"""The size limits of the code, checked: no source file past 800 lines and no function past
120, tests included (STYLE.md; docs/design.md, "Modules").

A file is every C++, CUDA, Python and shell file git tracks. A function's lines run from its
first line (the signature) to its closing brace, both counted: C++ and CUDA functions (a
gtest TEST body included) are found by universal-ctags, Python functions and methods by the
ast module. Without universal-ctags (tools/bootstrap.sh installs it) the C++ functions are
not checked and the exit code is 77 (CTest's skip) when nothing else is wrong.

Usage: check_lengths.py [--root DIR] [--file-lines N] [--function-lines N]
Prints each offender as path:line and its length; exits 1 when there is one.
"""
import argparse
import ast
import shutil
import subprocess
import sys
from pathlib import Path

CXX = (".cc", ".h", ".cu", ".cuh", ".cpp", ".hpp")
ALL = CXX + (".py", ".sh")


def tracked(root):
    """The files git tracks, or None where root is not a git work tree (an exported copy)."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], check=True,
                             capture_output=True).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        return None
    return sorted(p for p in out.split("\0") if p.endswith(ALL) and (root / p).is_file())


def universal_ctags():
    """True where `ctags` is universal-ctags (Exuberant's and BSD's lack --_xformat)."""
    if shutil.which("ctags") is None:
        return False
    try:
        out = subprocess.run(["ctags", "--version"], capture_output=True, text=True).stdout
    except OSError:
        return False
    return "Universal Ctags" in out


def cxx_functions(root, paths):
    """(path, first line, last line, name) of every C++/CUDA function definition."""
    if not paths:
        return []
    out = subprocess.run(
        ["ctags", "-L", "-", "--fields=+ne", "--kinds-C++=f", "--langmap=C++:+.cu.cuh",
         "-x", "--_xformat=%{end} %n %F %N"],
        cwd=root, input="\n".join(paths), check=True, capture_output=True, text=True).stdout
    found = []
    for row in out.splitlines():
        end, line, path, name = row.split(" ", 3)
        if end.isdigit():
            found.append((path, int(line), int(end), name))
    return found


def python_functions(root, path):
    tree = ast.parse((root / path).read_text(encoding="utf-8"), filename=path)
    return [(path, n.lineno, n.end_lineno, n.name) for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--file-lines", type=int, default=800)
    ap.add_argument("--function-lines", type=int, default=120)
    a = ap.parse_args()
    paths = tracked(a.root)
    if paths is None:
        print(f"{a.root} is not a git work tree: the tracked files are unknown, nothing checked")
        return 77
    bad = []
    for p in paths:
        n = sum(1 for _ in (a.root / p).open(encoding="utf-8", errors="replace"))
        if n > a.file_lines:
            bad.append(f"{p}: {n} lines (at most {a.file_lines} a file)")
    functions = []
    have_ctags = universal_ctags()
    if have_ctags:
        functions += cxx_functions(a.root, [p for p in paths if p.endswith(CXX)])
    for p in paths:
        if p.endswith(".py"):
            functions += python_functions(a.root, p)
    for path, first, last, name in sorted(functions):
        if last - first + 1 > a.function_lines:
            bad.append(f"{path}:{first}: {name} is {last - first + 1} lines "
                       f"(at most {a.function_lines} a function)")
    for b in bad:
        print(b)
    if bad:
        return 1
    if not have_ctags:
        print("universal-ctags is not installed (or `ctags` is another ctags): C++ function "
              "lengths not checked "
              "(tools/bootstrap.sh installs it)")
        return 77
    print(f"lengths: {len(paths)} files of at most {a.file_lines} lines, "
          f"{len(functions)} functions of at most {a.function_lines}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
