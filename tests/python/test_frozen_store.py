"""strata._frozen.FrozenStore on its own: the reads a training step's schedule of binds costs,
and the values each bind shows, whatever the read buffers held before."""
import torch

from strata._frozen import FrozenStore


def _store(tmp_path, n_blocks, numel=3000):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(numel), requires_grad=False)
              for _ in range(n_blocks)]
    values = [p.detach().clone() for p in params]
    store = FrozenStore([[(f"h.{b}.w", p)] for b, p in enumerate(params)], lambda p: p.shape)
    store.place(lambda name: None, lambda b, ts: None, str(tmp_path), 0, torch.device("cpu"))
    return store, params, values


def _step(store, params, values, n):
    """One training step's binds: forward 0..n-1 (reading ahead into backward), then backward
    n-1..0 (reading ahead into the next forward), each bind checked against the values."""
    order = [(b, list(range(b + 1, n)) + list(range(n - 1, -1, -1))) for b in range(n)]
    order += [(b, list(range(b - 1, -1, -1)) + list(range(n))) for b in range(n - 1, -1, -1)]
    for b, upcoming in order:
        store.bind(b, upcoming)
        assert torch.equal(params[b].data, values[b]), b
        store.clear(b)


def test_backward_keeps_the_last_three_blocks_and_reads_ahead_two_into_the_next_forward(
        tmp_path):
    n = 8
    store, params, values = _store(tmp_path, n)
    block = (tmp_path / "strata.frozen.rank0").stat().st_size // n
    try:
        for step in range(3):
            before = store.bytes_read
            _step(store, params, values, n)
            # backward finds the forward's last three blocks still in the three buffers, and
            # leaves its last three there for the next forward (the old two buffers, one read
            # ahead: 2n - 2, then 2n - 4)
            reads = 2 * n - 3 if step == 0 else 2 * n - 6
            assert store.bytes_read - before == reads * block, step
    finally:
        store.close()


def test_every_bind_sees_its_values_in_any_order(tmp_path):
    n = 6
    store, params, values = _store(tmp_path, n)
    gen = torch.Generator().manual_seed(1)
    try:
        for _ in range(60):
            b = int(torch.randint(n, (1,), generator=gen))
            upcoming = torch.randint(n, (4,), generator=gen).tolist()
            store.bind(b, upcoming)
            assert torch.equal(params[b].data, values[b]), (b, upcoming)
            store.clear(b)
    finally:
        store.close()
