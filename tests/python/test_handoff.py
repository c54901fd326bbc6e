"""The torch <-> engine protocol of strata.offload (issue 28): the model's dtype is the engine's
(bf16 in, no conversion per acquire), fp16 is refused, the GPU comes from the launcher's local
rank, and every hand-off of engine memory is ordered (_handoff.py). The CUDA side of these
runs in test_cuda.py (skipped without a GPU)."""
import pytest
import torch

import strata
from gpt_model import GPT, batches
from strata import _handoff, _strata

_LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                  "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                  "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID")


def _update_of_one_step(model, offloaded):
    """The fp32 change of every weight over one AdamW step with lr = eps = 1e3: at step 1 that
    is 1e3 * g / (|g| + 1e3), so it compares the gradients (widened to fp32)."""
    start = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    kw = dict(lr=1e3, eps=1e3, weight_decay=0.0)
    (x, y), = next(batches(1, 1))
    if offloaded:
        eng = strata.Engine(device="cpu")
        model = strata.offload(model, blocks=list(model.blocks), engine=eng)
        strata.optim.AdamW(model.parameters(), **kw)
        assert eng._model._core.dtype == "bf16"  # the model's dtype, not the CPU's fp32
        model(x, y).backward()
        eng._model._opt.step()
        after = eng._model.gather()
        eng.close()
        return {n: start[n] - after[n] for n in start}
    model(x, y).backward()
    return {n: 1e3 * p.grad.float() / (p.grad.float().abs() + 1e3)
            for n, p in model.named_parameters()}


def test_a_bfloat16_model_computes_on_the_engines_bf16_buffers_and_trains():
    model = GPT().bfloat16()
    eng = strata.Engine(device="cpu")
    strata.offload(model, blocks=list(model.blocks), engine=eng)
    opt = strata.optim.AdamW(model.parameters(), lr=1e-2)
    st = eng._model
    seen = []
    acquire = st._acquire

    def recording_acquire(b, backward):
        address = acquire(b, backward)
        seen.append((b, address))
        return address
    st._acquire = recording_acquire

    checked = []

    def check_views(layer, inputs):  # inside a block's forward or recompute
        b, address = seen[-1]
        nbytes = st._layout[b][2] * 2
        for p in layer.parameters():  # the engine's own memory, as bf16: nothing converted
            assert p.dtype == torch.bfloat16
            assert address <= p.data_ptr() < address + nbytes
        checked.append(layer)
    hooks = [blk.c_attn.register_forward_pre_hook(check_views) for blk in model.blocks]
    losses = []
    (x, y), = next(batches(1, 1))
    for _ in range(6):  # one batch, learned by heart
        loss = model(x, y)
        loss.backward()
        losses.append(loss.item())
        opt.step()
    for h in hooks:
        h.remove()
    assert st._core.backend == "" and st._core.cuda_device == -1  # one rank, no GPU
    assert len(seen) == 6 * 2 * (len(model.blocks) + 1)
    # each block's forward, and the recompute of all but the last (which keeps its graph)
    assert len(checked) == 6 * (2 * len(model.blocks) - 1)
    assert losses[-1] < losses[0] - 0.1, losses  # it learned
    eng.close()


def test_bf16_gradients_reach_the_engine_as_torch_computed_them():
    """The engine's update from a bf16 model's gradients (widened into its fp32 buffer) is
    torch's gradient of the same bf16 model, to within 1e-3 of its largest element (measured:
    1.8e-4, in LayerNorm weights, whose gradient is a bf16 sum over tokens that tips differently
    in the recompute's backward). A gradient lost, misplaced or mis-scaled is off by all of it."""
    torch.manual_seed(0)
    ours = _update_of_one_step(GPT().bfloat16(), offloaded=True)
    torch.manual_seed(0)
    theirs = _update_of_one_step(GPT().bfloat16(), offloaded=False)
    for n, b in theirs.items():
        err = (ours[n] - b).abs().max().item() / max(b.abs().max().item(), 1e-30)
        assert err <= 1e-3, f"{n}: the update differs from torch's gradient by {err:.3g}"


def test_fp16_and_mixed_dtypes_are_refused():
    eng = strata.Engine(device="cpu")
    with pytest.raises(strata.Error, match="float16.*GradScaler.*bfloat16"):
        m = GPT().half()
        strata.offload(m, blocks=list(m.blocks), engine=eng)
    m = GPT()
    m.blocks[0].bfloat16()
    with pytest.raises(strata.Error, match="all float32 or all bfloat16.*float32.*bfloat16"):
        strata.offload(m, blocks=list(m.blocks), engine=eng)


@pytest.mark.filterwarnings("ignore:In CPU autocast, but the target dtype is not supported")
def test_fp16_autocast_is_refused_at_forward():
    m = GPT()
    eng = strata.Engine(device="cpu")
    strata.offload(m, blocks=list(m.blocks), engine=eng)
    strata.optim.AdamW(m.parameters(), lr=1e-3)
    (x, y), = next(batches(1, 1))
    try:
        fp16 = torch.autocast("cpu", dtype=torch.float16)
        fp16.__enter__()
    except RuntimeError:
        pytest.skip("this torch has no float16 autocast on the CPU (torch < 2.1)")
    try:
        with pytest.raises(strata.Error, match="autocast.*float16.*bfloat16"):
            m(x, y)
    finally:
        fp16.__exit__(None, None, None)
    m(x, y).backward()  # refused before the step began: the step is usable
    eng._model._opt.step()
    eng.close()


def test_the_launchers_local_rank_selects_the_gpu(monkeypatch):
    for v in _LAUNCHER_VARS:
        monkeypatch.delenv(v, raising=False)
    assert _strata.cuda_device_for() == 0  # no launcher
    assert _strata.cuda_device_for(3) == 3  # given
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert _strata.cuda_device_for() == 1  # torchrun
    assert _strata.cuda_device_for(2) == 2
    monkeypatch.setenv("LOCAL_RANK", "one")
    with pytest.raises(strata.Error, match="LOCAL_RANK"):
        _strata.cuda_device_for()
    for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(v)
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    monkeypatch.setenv("SLURM_LOCALID", "3")
    assert _strata.cuda_device_for() == 3  # srun


class _RecordingHandoff(_handoff.HostHandoff):
    def __init__(self, core, log):
        super().__init__(core)
        self.log = log

    def to_torch(self):
        self.log.append(("to_torch",))

    def to_engine(self):
        self.log.append(("to_engine",))


def test_every_hand_off_of_engine_memory_is_ordered():
    """Over a step of two micro-batches: after every acquire torch waits on the engine before
    it touches the block; before every release and every gradient submission the engine waits
    on torch. On a CUDA device these are the stream events; on the HostDevice the same calls,
    with nothing left to order."""
    m = GPT()
    eng = strata.Engine(device="cpu")
    strata.offload(m, blocks=list(m.blocks), engine=eng, micro_batches=2)
    opt = strata.optim.AdamW(m.parameters(), lr=1e-3)
    st = eng._model
    core = st._core
    log = []
    st._handoff = _RecordingHandoff(core, log)

    class Logged:
        def __getattr__(self, name):
            fn = getattr(core, name)
            if name not in ("acquire", "release", "submit_grads", "submit_grads_from"):
                return fn

            def logged(*args):
                log.append((name, args[0]))
                return fn(*args)
            return logged
    st._core = Logged()
    for micro in batches(1, 2):
        for x, y in micro:
            m(x, y).backward()
        opt.step()
    st._core = core
    n = len(st._engine_blocks)
    calls = [e[0] for e in log]
    assert calls.count("acquire") == calls.count("release") == 2 * 2 * n
    assert calls.count("submit_grads") + calls.count("submit_grads_from") == 2 * n
    for i, e in enumerate(log):
        if e[0] == "acquire":
            assert log[i + 1] == ("to_torch",), log[i:i + 2]
        if e[0] in ("release", "submit_grads", "submit_grads_from"):
            assert log[i - 1] == ("to_engine",), log[i - 1:i + 1]
    eng.close()


@pytest.mark.filterwarnings("ignore:GradScaler is going to stop passing itself")
def test_a_grad_scaler_is_refused_and_its_step_dropped(tmp_path):
    """GradScaler.step(opt) on an offloaded model: its scaled gradients are in the engine, which
    cannot unscale or check them, so the step is dropped (the weights stay) and refused."""
    if not hasattr(torch, "amp") or not hasattr(torch.amp, "GradScaler"):
        pytest.skip("this torch has no GradScaler for the CPU (torch < 2.3)")
    m = GPT()
    eng = strata.Engine(device="cpu", nvme=tmp_path)
    strata.offload(m, blocks=list(m.blocks), engine=eng)
    opt = strata.optim.AdamW(m.parameters(), lr=1e-2)
    before = eng._model.gather()
    scaler = torch.amp.GradScaler("cpu")
    (x, y), = next(batches(1, 1))
    scaler.scale(m(x, y)).backward()
    with pytest.raises(strata.Error, match="GradScaler.*never reach .grad.*the step was dropped.*bf16"):
        scaler.step(opt)
    after = eng._model.gather()
    assert all(torch.equal(before[n], after[n]) for n in before)
    m(x, y).backward()  # the next step runs as usual
    opt.step()
    assert not all(torch.equal(before[n], v) for n, v in eng._model.gather().items())
    eng.close()
    # Without NVMe the updates ran before the scaler was seen: committed, and said so.
    m = GPT()
    eng = strata.Engine(device="cpu")
    strata.offload(m, blocks=list(m.blocks), engine=eng)
    opt = strata.optim.AdamW(m.parameters(), lr=1e-2)
    scaler.scale(m(x, y)).backward()
    with pytest.raises(strata.Error, match="already run on the scaled gradients and it was "
                                           "committed"):
        scaler.step(opt)
    m(x, y).backward()  # the next step runs
    opt.step()
    eng.close()
