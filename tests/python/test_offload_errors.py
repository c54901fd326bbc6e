"""strata.offload refuses what the engine cannot hold or run, each with a strata.Error that says
what is wrong and what to do."""
import pytest
import torch
import torch.utils.checkpoint

import strata
from gpt_model import GPT, batches


def _ready(model, **engine):
    eng = strata.Engine(device="cpu", **engine)
    model = strata.offload(model, blocks=list(model.blocks), engine=eng)
    opt = strata.optim.AdamW(model.parameters(), lr=1e-3)
    return model, opt


def _batch():
    return next(batches(1, 1))[0]


class SkipsLast(GPT):
    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.blocks[:-1]:
            x = b(x)
        return torch.nn.functional.cross_entropy((x @ self.wte.weight.t()).flatten(0, 1),
                                                 targets.reshape(-1))


class SkipsMiddle(GPT):
    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        x = self.blocks[2](self.blocks[0](x))
        return (x @ self.wte.weight.t()).mean()


class CallsTwice(GPT):
    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        x = self.blocks[0](self.blocks[0](x))
        return x.mean()


class Checkpointed(GPT):
    """Each block under torch.utils.checkpoint, as Hugging Face's
    model.gradient_checkpointing_enable() runs them."""

    def __init__(self, reentrant):
        super().__init__()
        self.reentrant = reentrant

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for b in self.blocks:
            x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=self.reentrant)
        return torch.nn.functional.cross_entropy((x @ self.wte.weight.t()).flatten(0, 1),
                                                 targets.reshape(-1))


def test_block_not_called_in_forward():
    model, _ = _ready(SkipsLast())
    loss = model(*_batch())
    with pytest.raises(strata.Error, match="'blocks.2' was not called in forward"):
        loss.backward()
    model, _ = _ready(SkipsMiddle())
    with pytest.raises(strata.Error, match="'blocks.1' was not called before block 'blocks.2'"):
        model(*_batch())


def test_block_called_twice():
    model, _ = _ready(CallsTwice())
    with pytest.raises(strata.Error, match="'blocks.0' was called twice"):
        model(*_batch())


def test_parameters_shared_across_blocks_or_with_the_rest():
    m = GPT()
    m.blocks[1].c_fc.weight = m.blocks[0].c_fc.weight
    with pytest.raises(strata.Error, match="'blocks.0.c_fc.weight' is shared by block 0 and "
                                           "block 1"):
        strata.offload(m, blocks=list(m.blocks), engine=strata.Engine())
    m = GPT()
    m.ln_f.weight = m.blocks[2].ln_2.weight
    with pytest.raises(strata.Error, match="shared by .*outside the blocks"):
        strata.offload(m, blocks=list(m.blocks), engine=strata.Engine())


def test_budget_too_small_names_the_minimum():
    m = GPT()
    m = strata.offload(m, blocks=list(m.blocks), engine=strata.Engine(device_mem="8K"))
    with pytest.raises(strata.Error, match=r"OutOfMemory: device budget 8\.0 KiB .*need at least"):
        strata.optim.AdamW(m.parameters())


def test_misuse_of_the_step():
    model = GPT()
    model = strata.offload(model, blocks=list(model.blocks), engine=strata.Engine())
    with pytest.raises(strata.Error, match="before the first forward"):
        model(*_batch())
    opt = strata.optim.AdamW(model.parameters())
    with torch.no_grad():
        model(*_batch())  # an evaluation between steps (test_inference.py) is no misuse
    with pytest.raises(strata.Error, match="after 0 forward/backward passes"):
        opt.step()
    loss = model(*_batch())
    with pytest.raises(strata.Error, match="before loss.backward"):
        model(*_batch())
    loss.backward()
    with pytest.raises(strata.Error, match="micro_batches=1"):
        model(*_batch())
    opt.step()
    assert model(*_batch()).item() > 0  # the misuses above left the run usable


def test_bad_arguments():
    m = GPT()
    with pytest.raises(strata.Error, match="does not exist"):
        strata.Engine(nvme=["/no/such/folder"])
    with pytest.raises(strata.Error, match="not a size"):
        strata.Engine(host_mem="lots")
    with pytest.raises(strata.Error, match="device="):
        strata.Engine(device="tpu")
    with pytest.raises(strata.Error, match="no step has been committed"):
        strata.Engine().last_step_stats()
    with pytest.raises(strata.Error, match="not a sub-module"):
        strata.offload(m, blocks=[GPT().blocks[0]], engine=strata.Engine())
    m = strata.offload(m, blocks=list(m.blocks), engine=strata.Engine())
    with pytest.raises(strata.Error, match="together with other parameters"):
        strata.optim.AdamW(list(m.parameters()) + [torch.nn.Parameter(torch.zeros(3))])
    with pytest.raises(strata.Error, match="every parameter"):
        strata.optim.AdamW(list(m.parameters())[:3])


def test_activation_checkpointing_around_a_block_is_refused_as_not_needed():
    """The reentrant form runs the block under no_grad (refused in forward); the other one
    recomputes it when backward unpacks its saved inputs (refused there; torch passes the error
    on as a RuntimeError)."""
    model, _ = _ready(Checkpointed(reentrant=True))
    with pytest.raises(strata.Error, match="'blocks.0' was called under no_grad: activation "
                                           "checkpointing .* not needed"):
        model(*_batch())
    model, _ = _ready(Checkpointed(reentrant=False))
    loss = model(*_batch())
    with pytest.raises(RuntimeError, match="'blocks.2' was called in backward: activation "
                                           "checkpointing .* not needed"):
        loss.backward()
