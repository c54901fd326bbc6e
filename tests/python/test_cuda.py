"""strata.offload on a GPU (skipped without one; tools/gpu_check_python.sh runs it on the lent
GPU machine): the hand-offs are stream-ordered (no host synchronisation inside a step), the
offloaded run is bit-identical to the in-memory one and within the CUDA ops' tolerance of
torch's resident training, block inputs stashed in the engine (pinned host, then NVMe) change
no bit and add no host wait, and a bf16 model computes on the engine's bf16 buffers."""
import pytest
import torch

import strata
from gpt_model import GPT, batches, param_groups

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and strata._strata.cuda_available()),
                                reason="needs a CUDA GPU (and a binding built with CUDA)")

STEPS, MICRO, CLIP, LR = 8, 2, 1.0, 2e-2


def _train(engine=None, dtype=torch.float32, check_sync=False, **offload):
    """Losses (a list of tensors until the end: .item() would wait on the host) and the model.
    `offload`: more strata.offload arguments."""
    model = GPT(layers=4, dropout=offload.pop("dropout", 0.0)).to("cuda", dtype)
    kw = dict(lr=LR, betas=(0.9, 0.95), eps=1e-8)
    if engine is not None:
        model = strata.offload(model, blocks=list(model.blocks), engine=engine,
                               micro_batches=MICRO, **offload)
        opt = strata.optim.AdamW(param_groups(model, 0.1), max_grad_norm=CLIP, **kw)
    else:
        opt = torch.optim.AdamW(param_groups(model, 0.1), **kw)
    data = [[(x.cuda(), y.cuda()) for x, y in micro] for micro in batches(STEPS, MICRO)]
    losses = []
    for i, micro in enumerate(data):
        # From the second step on (the first sets up and may synchronise), torch raises on any
        # call that waits on the host for the GPU.
        if check_sync and i == 1:
            torch.cuda.set_sync_debug_mode("error")
        try:
            for x, y in micro:
                loss = model(x, y)
                (loss / MICRO).backward()
                losses.append(loss.detach())
        finally:
            torch.cuda.set_sync_debug_mode(0)
        if engine is None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
    return model, [l.item() for l in losses]


def test_offloaded_on_the_gpu_is_stream_ordered_and_equals_in_memory_bit_for_bit(tmp_path):
    nvme = [tmp_path / "d0", tmp_path / "d1"]
    for d in nvme:
        d.mkdir()
    tiny = strata.Engine(device="cuda", device_mem="160K", host_mem="400K", nvme=nvme)
    m_off, off = _train(tiny, check_sync=True)
    assert tiny._model._core.dtype == "fp32"  # the model's dtype, not the CUDA default bf16
    assert tiny._model._core.cuda_device == torch.cuda.current_device()
    mem = strata.Engine(device="cuda")
    m_mem, in_memory = _train(mem)
    _, resident = _train()
    assert off == in_memory, (off, in_memory)  # every micro-batch's loss, bit for bit
    a, b = tiny._model.gather(), mem._model.gather()
    assert all(torch.equal(a[n], b[n]) for n in a)
    stats = tiny.last_step_stats()
    assert stats["bytes"]["nvme_read"] > 0 and stats["peak_device_bytes"] <= 160 * 1024
    # torch's AdamW on the GPU: the same kernels for the model, another optimizer's rounding.
    for ours, theirs in zip(off, resident):
        assert abs(ours - theirs) <= 1e-4 * abs(theirs), (off, resident)
    tiny.close()
    mem.close()


def test_stashed_block_inputs_on_the_gpu_are_stream_ordered_and_change_no_bit(tmp_path):
    # A block input: batch 4 x seq 16 x dim 32 fp32 (gpt_model.batches). At this host budget
    # the stash keeps its minimum of host slots, so some inputs spill to the NVMe scratch file.
    runs = {}
    for stash in ("off", "on"):
        nvme = tmp_path / stash
        nvme.mkdir()
        eng = strata.Engine(device="cuda", device_mem="160K", host_mem="1000K", nvme=[nvme])
        _, runs[stash] = _train(eng, check_sync=True, recompute=True, dropout=0.1,
                                offload_activations=stash, activation_bytes=4 * 16 * 32 * 4)
        if stash == "on":
            moved = eng.last_step_stats()["activation_bytes"]
            assert moved["d2h"] > 0 and moved["h2d"] == moved["d2h"], moved
        eng.close()
    assert runs["on"] == runs["off"], runs  # dropout 0.1: the recompute's RNG too


def test_a_bf16_model_trains_on_the_engines_bf16_buffers():
    eng = strata.Engine(device="cuda")
    model, losses = _train(eng, dtype=torch.bfloat16, check_sync=True)
    assert eng._model._core.dtype == "bf16"
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert losses[-1] < losses[0], losses
    eng.close()


def test_fp16_is_refused_on_the_gpu():
    model = GPT().cuda()
    eng = strata.Engine(device="cuda")
    strata.offload(model, blocks=list(model.blocks), engine=eng)
    strata.optim.AdamW(model.parameters(), lr=1e-3)
    (x, y), = next(batches(1, 1))
    with torch.autocast("cuda", dtype=torch.float16):
        with pytest.raises(strata.Error, match="float16"):
            model(x.cuda(), y.cuda())
    eng.close()
