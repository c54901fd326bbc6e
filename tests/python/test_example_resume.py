"""examples/train_gpt.py runs, and a run killed with SIGKILL mid-step continues exactly with
--resume (Engine(resume=True)): the same losses as a run never interrupted."""
import os
import signal
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLE = os.path.join(ROOT, "examples", "train_gpt.py")
SMALL = ["--data", os.path.join(ROOT, "README.md"), "--dim", "32", "--layers", "2", "--seq",
         "16", "--batch", "4", "--host-mem", "600K", "--device-mem", "160K"]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def _run(args, **kw):
    return subprocess.run([sys.executable, EXAMPLE] + SMALL + args, env=_env(),
                          capture_output=True, text=True, timeout=300, **kw)


def _losses(path):
    with open(path) as f:
        return dict(line.split() for line in f)


def test_sigkill_then_resume_continues_exactly(tmp_path):
    steps = 12
    ref_dir, run_dir = tmp_path / "ref", tmp_path / "run"
    r = _run(["--steps", str(steps), "--nvme", str(ref_dir), "--losses", str(tmp_path / "ref.txt"),
              "--save", str(tmp_path / "ref.safetensors")])
    assert r.returncode == 0, r.stderr
    ref = _losses(tmp_path / "ref.txt")
    assert len(ref) == steps and float(ref[str(steps)]) < float(ref["1"])

    log = tmp_path / "run.txt"
    p = subprocess.Popen([sys.executable, EXAMPLE] + SMALL +
                         ["--steps", str(steps), "--nvme", str(run_dir), "--losses", str(log)],
                         env=_env(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in p.stdout:
        if line.startswith("step    5"):
            os.kill(p.pid, signal.SIGKILL)  # in step 6, somewhere
            break
    p.wait(timeout=60)
    assert p.returncode == -signal.SIGKILL
    before = _losses(log)
    assert len(before) >= 5
    r = _run(["--steps", str(steps), "--nvme", str(run_dir), "--resume", "--losses", str(log),
              "--save", str(tmp_path / "run.safetensors")])
    assert r.returncode == 0, r.stderr
    resumed = int(r.stdout.split("resuming after step ")[1].split(",")[0])
    # Step 5's commit lands during step 6's forward (its updates are pipelined under it), so
    # the kill finds step 4 or 5 committed (6 if step 6 ended): all continue exactly.
    assert resumed in (4, 5, 6)
    after = _losses(log)  # each step's last line: the killed run's, then the resumed run's
    assert set(after) >= {str(s) for s in range(1, steps + 1) if s != resumed}
    assert all(after[s] == ref[s] for s in after), (after, ref)  # bit for bit
    with open(tmp_path / "ref.safetensors", "rb") as a, open(tmp_path / "run.safetensors",
                                                              "rb") as b:
        assert a.read() == b.read()


def test_resume_without_a_committed_step_is_a_strata_error(tmp_path):
    (tmp_path / "empty").mkdir()
    r = _run(["--steps", "2", "--nvme", str(tmp_path / "empty"), "--resume"])
    assert r.returncode != 0 and "strata.Error" in r.stderr, r.stderr


def test_a_corrupted_store_is_a_strata_error_naming_it(tmp_path):
    run = tmp_path / "run"
    r = _run(["--steps", "3", "--nvme", str(run)])
    assert r.returncode == 0, r.stderr
    (swap,) = [p for p in run.iterdir() if p.name.startswith("strata.swap")]
    data = bytearray(swap.read_bytes())
    for i in range(0, len(data), 4096):  # flip a byte in every page: every extent is hit
        data[i] ^= 0xFF
    swap.write_bytes(bytes(data))
    r = _run(["--steps", "5", "--nvme", str(run), "--resume"])
    assert r.returncode != 0
    assert "strata.Error" in r.stderr and "Corruption" in r.stderr, r.stderr
