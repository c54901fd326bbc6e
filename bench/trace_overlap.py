#!/usr/bin/env python3
"""Counts how much of a rank's collectives overlapped the device's compute, from the
engine's Chrome trace (strata bench step / strata train --trace).

An all-gather of block k can overlap only compute of other blocks: block k's H2D copy waits
for its gather and block k's compute waits for that copy. So an all-gather that overlaps a
compute interval is a prefetch running under the compute of an earlier block.

Usage: bench/trace_overlap.py TRACE.json [TRACE.json ...]
Prints, per trace and per collective kind: count, how many overlap compute, and the share
of the collectives' busy time that ran while compute was busy.
"""
import json
import sys


NOT_BLOCKS = {"grad norm", "read params", "loss", "resumed step", "--init configuration"}


def lanes(trace):
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[e["tid"]] = e["args"]["name"].split(" #")[0]
    out = {}
    for e in events:
        if e.get("ph") == "X":
            out.setdefault(names.get(e["tid"], "?"), []).append(
                (e["ts"], e["ts"] + e["dur"], e["name"]))
    return out


def merged(intervals):
    res = []
    for s, e in sorted((s, e) for s, e, _ in intervals):
        if res and s <= res[-1][1]:
            res[-1][1] = max(res[-1][1], e)
        else:
            res.append([s, e])
    return res


def overlap(s, e, busy):
    return sum(max(0.0, min(e, b) - max(s, a)) for a, b in busy)


def main(paths):
    print("# %-28s %-15s %6s %10s %12s %12s" %
          ("trace", "collective", "count", "overlapped", "busy_ms", "hidden_%"))
    for path in paths:
        with open(path) as f:
            ls = lanes(json.load(f))
        compute = merged(ls.get("compute", []))
        for kind in ("all-gather", "reduce-scatter"):
            # Per-block collectives ("all-gather h.3"), not the step's small ones.
            ops = [(s, e, n) for s, e, n in ls.get("comm", [])
                   if n.startswith(kind + " ") and n[len(kind) + 1:] not in NOT_BLOCKS]
            if not ops:
                continue
            hit = sum(1 for s, e, _ in ops if overlap(s, e, compute) > 0)
            busy = merged(ops)
            total = sum(b - a for a, b in busy)
            hidden = sum(overlap(a, b, compute) for a, b in busy)
            print("  %-28s %-15s %6d %10d %12.3f %12.1f" %
                  (path[-28:], kind, len(ops), hit, total / 1e3,
                   100.0 * hidden / total if total else 0.0))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
