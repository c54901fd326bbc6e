"""An exception inside a step of an offloaded model drops the step, and the run goes on: the
next forward starts a new step from the last commit (issue 25, D5). Misuse that is refused
leaves the run usable (D15)."""
import pytest
import torch

import strata
from gpt_model import GPT, Block, batches


class FlakyBlock(Block):
    """Raises when told to: in forward, or only in backward's recompute (grad enabled)."""

    fail = None  # None, "forward" or "recompute"

    def forward(self, x):
        if self.fail == "forward" or (self.fail == "recompute" and torch.is_grad_enabled()):
            raise ValueError("injected failure")
        return super().forward(x)


class FlakyGPT(GPT):
    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        dim, heads = self.wte.weight.shape[1], self.blocks[0].heads
        self.blocks = torch.nn.ModuleList(FlakyBlock(dim, heads) for _ in range(3))


def _train(nvme=None, fail_at=None, fail_how="forward", micro=1, steps=4, clip=0.0):
    """Trains FlakyGPT; at step `fail_at` block 1 raises (caught here), and the step is
    retried with the same batch. Returns (engine, model, the weights' bytes per step)."""
    eng = strata.Engine(device="cpu", nvme=nvme, host_mem="400K" if nvme else None)
    model = FlakyGPT()
    model = strata.offload(model, blocks=list(model.blocks), engine=eng, micro_batches=micro)
    opt = strata.optim.AdamW(model.parameters(), lr=1e-2, max_grad_norm=clip)
    weights = []
    for step, batch in enumerate(batches(steps, micro)):
        if step == fail_at:
            model.blocks[1].fail = fail_how
            with pytest.raises(ValueError, match="injected failure"):
                for x, y in batch:
                    model(x, y).backward()
            model.blocks[1].fail = None
            assert _gather(eng) == weights[-1]  # the step left nothing behind
        for x, y in batch:
            model(x, y).backward()
        opt.step()
        weights.append(_gather(eng))
    return eng, model, weights


def _gather(eng):
    return {n: t.numpy().tobytes() for n, t in eng._model.gather().items()}


@pytest.mark.parametrize("how,micro,clip", [("forward", 1, 0.0), ("forward", 2, 0.0),
                                            ("recompute", 2, 0.0), ("recompute", 1, 1.0)])
def test_an_exception_inside_a_step_drops_it_and_training_goes_on(how, micro, clip):
    """No NVMe: the step is run out with a non-finite gradient, so the engine skips it. In the
    last micro-batch's backward other blocks' gradients are final: with clipping their updates
    wait for the norm (or are undone, when speculative), so the step is still skipped whole."""
    eng, model, weights = _train(fail_at=1, fail_how=how, micro=micro, clip=clip)
    assert len(weights) == 4 and weights[1] != weights[0]
    eng.close()


def test_with_nvme_the_engine_is_reopened_at_the_last_commit(tmp_path):
    """The failed step is undone exactly: the run equals one that never failed, bit for bit,
    and the engine can be closed and resumed in the same process."""
    nvme = [tmp_path / "d0"]
    nvme[0].mkdir()
    eng, model, weights = _train(nvme=nvme, fail_at=2, fail_how="recompute", micro=2)
    eng.close()
    _, _, clean = _train(micro=2)
    assert weights == clean
    again = strata.Engine(device="cpu", nvme=nvme, host_mem="400K", resume=True)
    m = FlakyGPT()
    m = strata.offload(m, blocks=list(m.blocks), engine=again, micro_batches=2)
    strata.optim.AdamW(m.parameters(), lr=1e-2)
    assert again.resumed_step == 4
    assert _gather(again) == clean[-1]
    again.close()


def _train_pipelined(nvme=None, fail_block=None, fail_how="forward", micro=1, steps=5):
    """Clipped steps, so each step's updates run under the next one's forward (pipelined) and
    nothing is read between steps (a read would flush them). At step 2 block `fail_block`
    raises, or with fail_how="after" the whole step runs and abort_step() drops it; the step
    is then retried. Returns (the losses, the final weights)."""
    eng = strata.Engine(device="cpu", nvme=nvme, host_mem="300K" if nvme else None)
    model = FlakyGPT()
    model = strata.offload(model, blocks=list(model.blocks), engine=eng, micro_batches=micro)
    opt = strata.optim.AdamW(model.parameters(), lr=1e-2, max_grad_norm=1.0)
    losses = []
    for step, batch in enumerate(batches(steps, micro)):
        if step == 2 and fail_how == "after":
            for x, y in batch:
                model(x, y).backward()
            eng.abort_step()
        elif step == 2 and fail_block is not None:
            model.blocks[fail_block].fail = fail_how
            with pytest.raises(ValueError, match="injected failure"):
                for x, y in batch:
                    model(x, y).backward()
            model.blocks[fail_block].fail = None
        for x, y in batch:
            loss = model(x, y)
            losses.append(loss.item())
            loss.backward()
        opt.step()
    weights = _gather(eng)
    eng.close()
    return losses, weights


@pytest.mark.parametrize("fail_block,fail_how,micro", [
    (0, "forward", 1), (1, "forward", 2), (2, "forward", 1), (1, "recompute", 1),
    (2, "recompute", 2), (None, "after", 1), (None, "after", 2)])
def test_with_pipelined_updates_dropping_a_step_keeps_the_step_before(tmp_path, fail_block,
                                                                      fail_how, micro):
    """With pipelined updates step k-1 commits during step k's forward, once its updates ran.
    Dropping step k (reopening at the last commit) must not go back to k-2: the run equals one
    that never failed, bit for bit. Before the fix it reopened at k-2 for a failure in the
    forward, and for one later where the previous commit was still in flight."""
    nvme = [tmp_path / "d0"]
    nvme[0].mkdir()
    failed = _train_pipelined(nvme, fail_block, fail_how, micro)
    clean = _train_pipelined(micro=micro)
    assert failed == clean


def test_an_exception_outside_the_model_is_dropped_with_abort_step():
    eng = strata.Engine(device="cpu")
    model = GPT()
    model = strata.offload(model, blocks=list(model.blocks), engine=eng)
    opt = strata.optim.AdamW(model.parameters(), lr=1e-2)
    (x, y), = next(batches(1, 1))
    before = _gather(eng)
    model(x, y)  # the loss is lost (say, an exception while logging it)
    with pytest.raises(strata.Error, match=r"abort_step\(\) drops the step"):
        model(x, y)
    with pytest.raises(strata.Error, match=r"or engine.abort_step\(\)"):
        eng.close()
    eng.abort_step()
    assert eng.last_step_stats()["skipped"] and eng.last_step_stats()["aborted"]
    assert _gather(eng) == before
    model(x, y).backward()
    opt.step()
    assert _gather(eng) != before
    eng.abort_step()  # between steps: nothing to drop
    model(x, y).backward()
    with pytest.raises(strata.Error, match="after the step's last backward: its updates have "
                                           "run.*call opt.step"):
        eng.abort_step()  # no NVMe folders: an update that ran cannot be undone
    opt.step()  # the step is still whole
    assert not eng.last_step_stats()["skipped"]
    eng.close()


def test_a_model_is_offloaded_into_one_engine_only():
    model = GPT()
    strata.offload(model, blocks=list(model.blocks), engine=strata.Engine())
    with pytest.raises(strata.Error, match="already offloaded into another strata.Engine"):
        strata.offload(model, blocks=list(model.blocks), engine=strata.Engine())


def test_a_second_backward_is_refused_and_the_step_stays_usable():
    eng = strata.Engine(device="cpu")
    model = GPT()
    model = strata.offload(model, blocks=list(model.blocks), engine=eng)
    opt = strata.optim.AdamW(model.parameters(), lr=1e-2)
    (x, y), = next(batches(1, 1))
    loss = model(x, y)
    loss.backward(retain_graph=True)
    with pytest.raises(strata.Error, match="after this forward's backward had finished; call "
                                           "backward once per forward"):
        loss.backward()
    opt.step()
    assert not eng.last_step_stats()["skipped"]
    model(x, y).backward()
    opt.step()
    eng.close()
