#!/usr/bin/env python3
"""Checks bench/PERFORMANCE.md and bench/history/ against an older PERFORMANCE.md.

1. No figure lost: every number of the old file (git show REV:bench/PERFORMANCE.md) occurs, as a
   whole token, in the new bench/PERFORMANCE.md or a file of bench/history/.
2. Every link of bench/PERFORMANCE.md to a Markdown file (history/x.md#anchor) names a file
   that exists and a heading that file has (GitHub's anchor rules).

Usage: tools/check_perf_record.py [REV]   (REV: the commit whose PERFORMANCE.md was the diary;
default 223ecbb, the last one before the record moved). Exit status 1 names what is missing.
"""
import collections
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def numbers(text):
    return collections.Counter(NUMBER.findall(text))


def anchor(heading):
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to '-'."""
    h = heading.strip().lower()
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def anchors(path):
    found, fenced = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            found.add(anchor(line.lstrip("#")))
    return found


def main():
    rev = sys.argv[1] if len(sys.argv) > 1 else "223ecbb"
    old = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:bench/PERFORMANCE.md"],
                         check=True, capture_output=True, text=True).stdout
    report = ROOT / "bench" / "PERFORMANCE.md"
    history = sorted((ROOT / "bench" / "history").glob("*.md"))
    new_text = "\n".join(p.read_text() for p in [report] + history)
    have = numbers(new_text)
    lost = sorted(n for n in numbers(old) if n not in have)
    problems = [f"number {n} of the old PERFORMANCE.md is in no new file" for n in lost]
    for target, frag in re.findall(r"\]\(((?:history/)?[\w.-]+\.md)(?:#([^)]*))?\)",
                                   report.read_text()):
        path = report.parent / target
        if not path.exists():
            problems.append(f"link to {target}: no such file")
        elif frag and frag not in anchors(path):
            problems.append(f"link to {target}#{frag}: no such heading there")
    old_lines = len(old.splitlines())
    moved = sum(len(p.read_text().splitlines()) for p in history)
    print(f"old file: {old_lines} lines, {sum(numbers(old).values())} numbers "
          f"({len(numbers(old))} distinct); report {len(report.read_text().splitlines())} lines; "
          f"history {len(history)} files, {moved} lines")
    for p in problems:
        print("MISSING:", p)
    print("ok" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
