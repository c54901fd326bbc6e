"""offload(offload_activations=..., activation_bytes=...): the block inputs kept for recompute
wait for backward in the engine's activation stash (pinned host slots within the host budget,
then the NVMe scratch file), not in torch's memory. The same losses and weights, bit for bit,
as with them in torch's memory; a damaged or unreadable scratch file is a strata.Error and a
dropped step, never a wrong gradient."""
import pytest
import torch

import strata
from gpt_model import GPT, batches, param_groups

LAYERS, STEPS = 6, 3
# A block input: batch 4 x seq 16 x dim 32 fp32, one 8 KiB slot. At these host budgets the
# states leave the stash only its minimum, 3 host slots (engine.placement() says so), so 2 or
# more of the 5 stashed block inputs of a forward (the last block keeps its graph) spill to the
# scratch file.
INPUT_BYTES = 4 * 16 * 32 * 4
HOST = "1000K"
# Here the states are host-homed but some moments, which the first step does not read: the
# first read of the step is the stash's (with 2 micro-batches; with 1 every input fits).
HOST_NO_STATE_READS = "1372K"


def _engine(tmp_path, name, host=HOST):
    nvme = tmp_path / name
    nvme.mkdir()
    return strata.Engine(device="cpu", device_mem="400K", host_mem=host, nvme=[nvme])


def _train(tmp_path, stash, micro, recompute=True, dropout=0.1, name=None, host=HOST,
           activation_bytes=INPUT_BYTES):
    """Trains STEPS steps; returns (losses, the saved weights' bytes, every step's stats)."""
    name = name or f"{stash}-{micro}-{recompute}"
    engine = _engine(tmp_path, name, host)
    model = GPT(layers=LAYERS, dropout=dropout)
    model = strata.offload(model, blocks=list(model.blocks), engine=engine, micro_batches=micro,
                           recompute=recompute, offload_activations=stash,
                           activation_bytes=activation_bytes)
    opt = strata.optim.AdamW(param_groups(model, 0.1), lr=2e-2, max_grad_norm=1.0)
    losses = []
    for mb in batches(STEPS, micro):
        for x, y in mb:
            loss = model(x, y)
            (loss / micro).backward()
            losses.append(loss.item())
        opt.step()
    engine.flush()
    stats = engine.step_stats()
    path = tmp_path / f"{name}.safetensors"
    strata.save_safetensors(model, path)
    engine.close()
    return losses, path.read_bytes(), stats


@pytest.mark.parametrize("micro", [1, 3])
def test_stashed_inputs_train_bit_identically_and_spill_to_nvme(tmp_path, micro):
    ref, ref_w, ref_stats = _train(tmp_path, "off", micro)
    got, got_w, stats = _train(tmp_path, "on", micro)
    assert got == ref and got_w == ref_w  # losses and weights, bit for bit (dropout 0.1)
    assert len(stats) == STEPS
    for s in ref_stats:
        assert s["activation_bytes"]["d2h"] == 0
    for s in stats:
        act = s["activation_bytes"]
        # every recomputed block's input of every micro-batch went in and came back: all but
        # the last block's, whose graph is kept (its backward follows the head's at once)
        assert act["d2h"] == act["h2d"] == (LAYERS - 1) * micro * INPUT_BYTES, s
        # some waited in the scratch file: written there, read back (slots are 8 KiB)
        assert act["nvme_write"] >= 2 * INPUT_BYTES and act["nvme_read"] >= 2 * INPUT_BYTES, s


def test_auto_recompute_stashes_only_the_blocks_it_recomputes(tmp_path):
    ref, ref_w, _ = _train(tmp_path, "off", 2, recompute="auto")
    got, got_w, stats = _train(tmp_path, "on", 2, recompute="auto")
    assert got == ref and got_w == ref_w
    assert all(0 < s["activation_bytes"]["d2h"] <= LAYERS * 2 * INPUT_BYTES for s in stats)


def test_without_activation_bytes_inputs_stay_in_torch_memory(tmp_path):
    engine = _engine(tmp_path, "auto")
    model = GPT(layers=2)
    model = strata.offload(model, blocks=list(model.blocks), engine=engine)  # "auto", no size
    opt = strata.optim.AdamW(model.parameters(), lr=1e-3)
    (x, y), = next(batches(1, 1))
    model(x, y).backward()
    opt.step()
    engine.flush()
    assert engine.last_step_stats()["activation_bytes"]["d2h"] == 0
    with pytest.raises(strata.Error, match="offload_activations='yes'"):
        strata.offload(GPT(), blocks=[], engine=strata.Engine(), offload_activations="yes")


@pytest.mark.parametrize("fault,error", [("flip_read@1", "Corruption: activation"),
                                         ("eio_read@1", "IOError: activation")])
def test_a_damaged_scratch_file_drops_the_step(tmp_path, monkeypatch, fault, error):
    """The first read of the stash's scratch file (and of the swap store's, which reads nothing
    in the first step here) returns flipped bits or EIO: backward raises, the step is dropped
    (the engine reopens at its last commit) and the next step trains as if it never ran."""
    engine = _engine(tmp_path, "faulty", HOST_NO_STATE_READS)
    model = GPT(layers=LAYERS)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    model = strata.offload(model, blocks=list(model.blocks), engine=engine, micro_batches=2,
                           offload_activations="on", activation_bytes=INPUT_BYTES)
    monkeypatch.setenv("STRATA_TEST_FAULT", fault)  # read when the engine is created
    opt = strata.optim.AdamW(model.parameters(), lr=1e-2)
    monkeypatch.delenv("STRATA_TEST_FAULT")  # the engine reopened after the failure reads clean
    (x, y), (x2, y2) = next(batches(1, 2))
    loss = model(x, y)
    with pytest.raises(strata.Error, match=error):
        loss.backward()
    after = engine._model.gather()
    assert all(torch.equal(after[n], start[n]) for n in start)  # nothing was updated

    def step(m, o):
        losses = []
        for a, b in ((x, y), (x2, y2)):
            loss = m(a, b)
            (loss / 2).backward()
            losses.append(loss.item())
        o.step()
        return losses

    # The run goes on from there: its next step is a clean run's first.
    again = step(model, opt)
    ref_engine = _engine(tmp_path, "clean", HOST_NO_STATE_READS)
    ref = GPT(layers=LAYERS)
    ref = strata.offload(ref, blocks=list(ref.blocks), engine=ref_engine, micro_batches=2,
                         offload_activations="on", activation_bytes=INPUT_BYTES)
    ref_opt = strata.optim.AdamW(ref.parameters(), lr=1e-2)
    assert again == step(ref, ref_opt) and again[0] == loss.item()
    got, want = engine._model.gather(), ref_engine._model.gather()
    assert all(torch.equal(got[n], want[n]) for n in want)


@pytest.mark.parametrize("stash", ["off", "on"])
def test_a_stashed_input_leaves_torch_memory_until_backward(tmp_path, stash):
    """Between forward and backward torch holds no stashed block input: the layer keeps neither
    the saved tensor nor the argument (without a stash autograd's saved tensors hold them). The
    last block's input stays: that block keeps its graph (its backward follows the head's)."""
    import gc
    import weakref
    engine = _engine(tmp_path, stash)
    model = GPT(layers=LAYERS)
    inputs = []
    for b in model.blocks:
        b.register_forward_pre_hook(lambda m, args: inputs.append(weakref.ref(args[0])))
    model = strata.offload(model, blocks=list(model.blocks), engine=engine,
                           offload_activations=stash, activation_bytes=INPUT_BYTES)
    opt = strata.optim.AdamW(model.parameters(), lr=1e-3)
    (x, y), = next(batches(1, 1))
    loss = model(x, y)
    gc.collect()
    alive = sum(r() is not None for r in inputs)
    loss.backward()
    opt.step()
    assert alive == (1 if stash == "on" else LAYERS)


def _train_learned(tmp_path, name, micro, stash, host=HOST):
    """Without a size: "on" learns it from the first step."""
    return _train(tmp_path, stash, micro, name=name, host=host, activation_bytes=None)


@pytest.mark.parametrize("micro", [1, 2])
def test_on_without_a_size_learns_it_from_the_first_step(tmp_path, micro):
    """The first step keeps the inputs in torch's memory and measures them; the engine reopens
    at its commit with the stash, and the run goes on bit for bit as without one."""
    ref, ref_w, _ = _train_learned(tmp_path, "off", micro, "off")
    got, got_w, stats = _train_learned(tmp_path, "learned", micro, "on")
    assert got == ref and got_w == ref_w
    assert [s["step"] for s in stats] == list(range(1, STEPS + 1))  # the reopen lost none
    assert stats[0]["activation_bytes"]["d2h"] == 0
    for s in stats[1:]:
        assert s["activation_bytes"]["d2h"] == (LAYERS - 1) * micro * INPUT_BYTES, s


def test_on_without_a_size_needs_nvme(tmp_path):
    model = GPT(layers=2)
    model = strata.offload(model, blocks=list(model.blocks), engine=strata.Engine(),
                           offload_activations="on")
    with pytest.raises(strata.Error, match="needs the CPU engine with NVMe folders"):
        strata.optim.AdamW(model.parameters(), lr=1e-3)


def test_a_learned_stash_that_does_not_fit_leaves_the_inputs_in_torch_memory(tmp_path):
    """At 380K the states fit (376K with 2 micro-batches) and the stash's minimum (3 slots,
    24K) does not: the engine reopens without it, with a warning, and trains on as before."""
    ref, ref_w, _ = _train_learned(tmp_path, "off", 2, "off", host="380K")
    with pytest.warns(UserWarning, match="stay in torch's memory.*OutOfMemory"):
        got, got_w, stats = _train_learned(tmp_path, "learned", 2, "on", host="380K")
    assert got == ref and got_w == ref_w
    assert all(s["activation_bytes"]["d2h"] == 0 for s in stats)
