"""The CPU engine's optimizer threads follow the machine's load (python/strata/_threads.py): an
engine that started on the CPUs torch leaves free switches to the OMP_NUM_THREADS team once other
processes take the CPU, never back, and never changes a result bit."""
import os

import pytest
import torch

import strata
from strata._threads import (LoadWatch, _proc_stat_busy, optimizer_threads,
                             saturated_by_others)
from gpt_model import GPT, batches


def test_others_count_only_when_they_take_half_a_cpu_of_a_saturated_machine():
    # 2 CPUs, a 2-second window: this process spinning on both, nobody else.
    assert not saturated_by_others(2.0, busy=4.0, own=4.0, cpus=2)
    # Others took a whole CPU of a saturated machine.
    assert saturated_by_others(2.0, busy=4.0, own=2.0, cpus=2)
    # Others took a CPU, but the machine had room (16 CPUs, 3 busy): no contention.
    assert not saturated_by_others(2.0, busy=6.0, own=4.0, cpus=16)
    # Background noise: others at a quarter of a CPU.
    assert not saturated_by_others(2.0, busy=4.0, own=3.5, cpus=2)
    assert not saturated_by_others(0.0, busy=1.0, own=0.0, cpus=2)


class _Core:
    def __init__(self):
        self.calls = []

    def set_optimizer_threads(self, n):
        self.calls.append(n)


def _watch(samples):
    """A LoadWatch over scripted (time, machine busy, own) samples, 2 CPUs."""
    it = iter(samples)
    cur = {}

    def advance():
        cur["t"], cur["busy"], cur["own"] = next(it)
        return cur["busy"]
    watch = LoadWatch(clock=lambda: cur["t"], busy=advance, own=lambda: cur["own"], cpus=2)
    return watch


def test_the_watch_switches_once_after_a_busy_window_and_not_on_short_or_quiet_ones():
    core = _Core()
    w = _watch([(0.0, 0.0, 0.0),
                (0.5, 1.9, 1.0),   # busy, but the window is shorter than a second: no decision
                (1.2, 2.4, 2.3),   # 1.2 s, others 0.1 CPU: quiet
                (2.5, 5.0, 3.3),   # 1.3 s, others 1.0 CPU, machine saturated: switch
                (4.0, 8.0, 4.0)])
    for _ in range(2):
        w.after_step(core)
    assert core.calls == [] and not w.switched
    config = type("Config", (), {"optimizer_threads": 1})()
    w.after_step(core, config)
    assert core.calls == [0] and w.switched
    assert config.optimizer_threads == 0  # an engine reopened from it keeps the team
    w.after_step(core, config)  # for good: never asked again
    assert core.calls == [0]


def test_without_proc_stat_the_watch_keeps_the_start():
    core = _Core()
    w = LoadWatch(busy=lambda: None, cpus=2)
    w.after_step(core)
    assert core.calls == []


def test_proc_stat_counts_this_process_busy_time():
    before = _proc_stat_busy()
    if before is None:
        pytest.skip("no /proc/stat here")
    assert _proc_stat_busy(cpus={10 ** 6}) is None  # no such CPU: nothing to read
    x = torch.randn(512, 512)
    t = 0
    while _proc_stat_busy() - before < 0.2 and t < 10000:
        x = x @ x.T / 512
        t += 1
    assert _proc_stat_busy() - before >= 0.2


def test_a_given_count_or_a_cuda_engine_is_not_watched():
    assert optimizer_threads(3, True)[0] == 3 and not hasattr(optimizer_threads(3, True)[1],
                                                              "_start")
    assert optimizer_threads(0, False)[0] == 0
    n, watch = optimizer_threads(0, True)
    assert n >= 1 and isinstance(watch, LoadWatch)


def _train(tmp_path, name, switch_at=None, threads=None):
    (tmp_path / name).mkdir()
    eng = strata.Engine(device="cpu", device_mem="160K", host_mem="400K",
                        nvme=[tmp_path / name], threads=threads)
    model = GPT()
    model = strata.offload(model, blocks=list(model.blocks), engine=eng, micro_batches=2)
    opt = strata.optim.AdamW(model.parameters(), lr=2e-2, max_grad_norm=1.0)
    state = next(model.parameters())._strata_offload
    losses = []
    for step, micro in enumerate(batches(5, 2)):
        if step == switch_at:  # what the watch does on a busy machine, between two steps
            state.core().set_optimizer_threads(0)
        for x, y in micro:
            loss = model(x, y)
            (loss / 2).backward()
            losses.append(loss.item())
        opt.step()
    return losses, strata.optim.AdamW.state_dict(opt)["state"], state, model


def test_switching_threads_between_steps_changes_no_bit(tmp_path):
    base, moments, _, _ = _train(tmp_path, "a", threads=1)
    got, got_moments, state, model = _train(tmp_path, "b", switch_at=2)
    assert got == base
    for i in moments:
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(got_moments[i][k], moments[i][k])
    # A negative count, or a change during a step, is refused.
    with pytest.raises(strata.Error, match="expected 0"):
        state.core().set_optimizer_threads(-1)
    x, y = next(batches(1, 1))[0]
    model(x, y)
    with pytest.raises(strata.Error, match="during a step"):
        state.core().set_optimizer_threads(1)
