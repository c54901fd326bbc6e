"""Two ranks under launcher variables (as torchrun or strata launch set them): strata.Engine
joins them through STRATA_RENDEZVOUS, each rank feeds its own rows, and the run follows the
single-rank one up to the rounding of averaging gradients over ranks."""
import json
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = os.path.join(HERE, "multirank_child.py")
STEPS, MICRO = 6, 2


def _env(extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join([HERE] + [p for p in sys.path if p])
    env.update(extra)
    return env


def _run_ranks(tmp_path, world, nvme, fail=None):
    rdzv = tmp_path / f"rdzv{world}"
    rdzv.mkdir()
    procs = []
    for r in range(world):
        folders = []
        for d in range(nvme):
            f = tmp_path / f"w{world}r{r}d{d}"
            f.mkdir()
            folders.append(str(f))
        extra = {} if world == 1 else {
            "RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r),
            "LOCAL_WORLD_SIZE": str(world), "STRATA_RENDEZVOUS": f"file:{rdzv}",
            "STRATA_COMM_TIMEOUT": "60"}
        if fail:
            extra["STRATA_TEST_FAIL"] = fail
        out = tmp_path / f"w{world}r{r}.json"
        procs.append((subprocess.Popen(
            [sys.executable, CHILD, str(STEPS), str(MICRO), str(out)] + folders,
            env=_env(extra), stderr=subprocess.PIPE, text=True), out))
    results = []
    for p, out in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        with open(out) as f:
            results.append(json.load(f))
    return results


def test_two_ranks_follow_the_single_rank_run(tmp_path):
    (one,) = _run_ranks(tmp_path, 1, nvme=0)
    two = _run_ranks(tmp_path, 2, nvme=1)
    assert [r["rank"] for r in two] == [0, 1] and all(r["world"] == 2 for r in two)
    # Each rank's loss is the mean over its rows; their mean is the global mean.
    for i, want in enumerate(one["losses"]):
        got = (two[0]["losses"][i] + two[1]["losses"][i]) / 2
        assert abs(got - want) <= 1e-4 * abs(want), (i, got, want)
    assert abs(two[0]["norm"] - one["norm"]) <= 1e-4 * one["norm"]
    assert two[0]["norm"] == two[1]["norm"]  # one global norm
    # Both ranks hold the same model: the gathered weights are identical.
    with open(tmp_path / "w2r0.json.safetensors", "rb") as a, \
            open(tmp_path / "w2r1.json.safetensors", "rb") as b:
        assert a.read() == b.read()
    # optimizer.state_dict() gathers every rank's shard of the moments: both ranks give the
    # same whole moments, which follow the single-rank run's up to the averaging's rounding
    # (the child also checks that load_state_dict writes each rank's shard, read back bit
    # for bit).
    m0, m1, ref = (torch.load(tmp_path / f"{n}.json.moments") for n in ("w2r0", "w2r1", "w1r0"))
    assert m0.keys() == m1.keys() == ref.keys() and len(ref) > 0
    for i in ref:
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(m0[i][k], m1[i][k]), (i, k)
            assert m0[i][k].shape == ref[i][k].shape
            assert torch.allclose(m0[i][k], ref[i][k], rtol=1e-3,
                                  atol=1e-3 * float(ref[i][k].abs().max())), (i, k)
        assert float(m0[i]["step"]) == float(ref[i]["step"]) == STEPS


def test_an_exception_on_one_rank_drops_the_step_on_every_rank(tmp_path):
    """Rank 1's forward raises in step 2: it runs the step out with a non-finite gradient, so
    the global norm skips the step on both ranks (rank 0 never sees an error), and the two go on
    in step, holding the same model."""
    two = _run_ranks(tmp_path, 2, nvme=1, fail="1:2")
    assert [r["skipped"] for r in two] == [[False, False, True, False, False, False]] * 2
    assert two[1]["losses"][2 * MICRO:3 * MICRO] == [None] * MICRO
    assert two[0]["norm"] == two[1]["norm"]
    with open(tmp_path / "w2r0.json.safetensors", "rb") as a, \
            open(tmp_path / "w2r1.json.safetensors", "rb") as b:
        assert a.read() == b.read()


def test_launcher_variables_without_rendezvous_are_a_strata_error(tmp_path):
    out = tmp_path / "x.json"
    r = subprocess.run([sys.executable, CHILD, "1", "1", str(out)],
                       env=_env({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                                 "LOCAL_WORLD_SIZE": "2", "STRATA_RENDEZVOUS": ""}),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "strata.Error" in r.stderr and "STRATA_RENDEZVOUS" in r.stderr, r.stderr
