#!/usr/bin/env python3
"""gpu_check_record.py: updates docs/gpu_record.md from one tools/gpu_check.sh run.

A kernel variant's row gets the run's device, date and commit when every check that covers
the variant passed in that run (COVERS below); rows of variants not covered are left as they
were (a failed check never erases an earlier pass). gpu_check.sh calls it at the end of a real
run (the device machine's copy of the table) and writes the result into its output folder as
gpu_record.md; the dry run calls it on a copy with made-up passes (--self-test) to check the
table still parses.

  gpu_check_record.py RESULTS.jsonl TABLE.md OUT.md --commit C [--date YYYY-MM-DD]
  gpu_check_record.py --self-test TABLE.md

Exit status 0; 1 when the table has no row for a covered variant or cannot be read.
"""
import datetime
import json
import re
import sys

OPS = "test:model_gpt2_cuda_ops_test"  # every variant of every op against the CPU reference
# The train-side steps run with STRATA_CUDA_KERNELS=tuned (gpu_check.sh): they prove the tuned
# kernels in training; the naive ones run in the bench's previous-kernels step.
TUNED = [OPS, "kernels", "bench", "test:train_cuda_test", "train:small", "train:gpt2s",
         "resident", "gradbf16"]
NAIVE = [OPS, "bench"]
COVERS = {("attention", "flash"): [OPS, "kernels"],
          ("activations", "slots"): ["test:train_cuda_test", "layermajor"],
          ("python", "cuda"): ["python"]}
for family in ("attention", "embedding", "classifier", "matmul", "elementwise"):
    COVERS[(family, "naive")] = NAIVE
    COVERS[(family, "tuned")] = TUNED

ROW = re.compile(r"^\| *([a-z]+) *\| *([a-z]+) *\|([^|]*)\|([^|]*)\|([^|]*)\|(.*)$")


def passed_variants(steps):
    status = {s["step"]: s["status"] for s in steps}
    return {key for key, need in COVERS.items() if all(status.get(n) == "PASS" for n in need)}


def device_name(steps):
    for s in steps:
        if s["step"] == "device" and s["status"] == "PASS":
            cuda = s.get("data", {}).get("cuda", {})
            if isinstance(cuda, dict) and cuda.get("name"):
                cc = str(cuda.get("compute_capability", "")).replace(".", "")
                return "%s (sm_%s)" % (cuda["name"], cc) if cc else cuda["name"]
    return None


def update(table_text, variants, device, date, commit):
    """The table with each row of `variants` set to device/date/commit; and the variants with
    no row."""
    out, seen = [], set()
    for line in table_text.splitlines(keepends=True):
        m = ROW.match(line.rstrip("\n"))
        if m and (m.group(1), m.group(2)) in variants:
            seen.add((m.group(1), m.group(2)))
            line = "| %s | %s | %s | %s | %s |%s\n" % (m.group(1), m.group(2), device, date,
                                                     commit, m.group(6))
        out.append(line)
    return "".join(out), sorted(set(variants) - seen)


def main(argv):
    if len(argv) == 3 and argv[1] == "--self-test":
        text = open(argv[2]).read()
        fake = [{"step": s, "status": "PASS"} for need in COVERS.values() for s in need]
        new, missing = update(text, passed_variants(fake), "TEST GPU (sm_00)", "2000-01-01",
                              "0000000")
        rows = [m.groups() for m in map(ROW.match, new.splitlines()) if m and m.group(1) != "family"]
        if missing or len(rows) != len(COVERS) or any(r[2].strip() != "TEST GPU (sm_00)" for r in rows):
            print("gpu_check_record.py: the table does not take an update: missing rows %s, "
                  "%d rows for %d variants" % (missing, len(rows), len(COVERS)), file=sys.stderr)
            return 1
        print("gpu_check_record.py: %d variants, each row updatable" % len(rows))
        return 0
    args = argv[1:]
    try:
        results, table, out_path = args[0], args[1], args[2]
        commit = args[args.index("--commit") + 1]
    except (IndexError, ValueError):
        print(__doc__, file=sys.stderr)
        return 2
    date = args[args.index("--date") + 1] if "--date" in args else \
        datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    steps = [json.loads(l) for l in open(results) if l.strip()]
    device = device_name(steps)
    variants = passed_variants(steps) if device else set()
    new, missing = update(open(table).read(), variants, device, date, commit)
    open(out_path, "w").write(new)
    for family, variant in sorted(variants):
        print("gpu_record: %s=%s passed on %s (%s, %s)" % (family, variant, device, date, commit))
    if missing:
        print("gpu_check_record.py: no row for %s in %s" % (missing, table), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
