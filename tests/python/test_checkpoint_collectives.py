"""The multi-rank reads of the run's state are collectives: a rank whose part fails goes
through every collective all the same, so that every rank ends with an error (its own, or one
naming the failed rank) instead of one waiting in a collective the other never joins."""
import time

from checkpoint_run import ranks


def test_a_rank_whose_moments_cannot_be_read_fails_every_rank_at_once(tmp_path):
    """optimizer.state_dict() gathers each block's moments from every rank; rank 1's reads fail
    (injected). Rank 1 raises its own error and rank 0 one naming rank 1, right away (rank 1
    used to stop at its failure, leaving rank 0 in the next gather until the communicator's
    timeout, 10 minutes here)."""
    for r in range(2):
        (tmp_path / f"nvme{r}").mkdir()
    t0 = time.monotonic()
    for code, err in ranks(tmp_path, "moments_multirank_child.py", tmp_path / "nvme{rank}",
                           tmp_path / "rank{rank}.txt"):
        assert code == 0, err[-3000:]
    assert time.monotonic() - t0 < 100
    got = [(tmp_path / f"rank{r}.txt").read_text() for r in range(2)]
    assert "optimizer.state_dict() failed on rank 1" in got[0], got
    assert "injected: rank 1 cannot read its moments" in got[1], got
