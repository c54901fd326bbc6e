"""strata.offload: a GPT-2 nn.Module trained with its parameters and states in the engine."""
import os

import pytest
import torch

import strata
from gpt_model import GPT, HfStyleGPT, batches, param_groups

STEPS, MICRO, CLIP, LR, WD = 16, 2, 1.0, 2e-2, 0.1


def _lr_lambda(step):
    return min(1.0, (step + 1) / 3)


def train_strata(engine, dropout=0.0, cls=GPT):
    model = cls(dropout=dropout) if cls is GPT else cls()
    model = strata.offload(model, blocks=list(model.blocks), engine=engine, micro_batches=MICRO)
    opt = strata.optim.AdamW(param_groups(model, WD), lr=LR, betas=(0.9, 0.95), eps=1e-8,
                             max_grad_norm=CLIP)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda)
    losses, stats = [], []
    for micro in batches(STEPS, MICRO):
        step_loss = []
        for x, y in micro:
            loss = model(x, y)
            (loss / MICRO).backward()
            step_loss.append(loss.item())
        opt.step()
        opt.zero_grad()
        sched.step()
        losses.append(step_loss)
        stats.extend(engine.step_stats())  # with clipping: the step before, committed now
    engine.flush()  # the last step commits
    stats.extend(engine.step_stats())
    assert [s["step"] for s in stats] == list(range(1, STEPS + 1))
    return model, losses, stats


def train_torch(dropout=0.0, cls=GPT):
    model = cls(dropout=dropout) if cls is GPT else cls()
    opt = torch.optim.AdamW(param_groups(model, WD), lr=LR, betas=(0.9, 0.95), eps=1e-8)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda)
    losses = []
    for micro in batches(STEPS, MICRO):
        step_loss = []
        for x, y in micro:
            loss = model(x, y)
            (loss / MICRO).backward()
            step_loss.append(loss.item())
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
        sched.step()
        losses.append(step_loss)
    return model, losses


def _weights(model, path):
    strata.save_safetensors(model, path)
    with open(path, "rb") as f:
        return f.read()


def test_offloaded_equals_in_memory_bit_for_bit_and_torch_within_1e4(tmp_path):
    nvme = [tmp_path / "d0", tmp_path / "d1"]
    for d in nvme:
        d.mkdir()
    tiny = strata.Engine(device="cpu", device_mem="160K", host_mem="400K", nvme=nvme)
    m_off, off, stats = train_strata(tiny)
    m_mem, mem, _ = train_strata(strata.Engine(device="cpu"))
    m_ref, ref = train_torch()
    assert off == mem  # every micro-batch's loss, bit for bit
    assert _weights(m_off, tmp_path / "a.st") == _weights(m_mem, tmp_path / "b.st")
    # The budgets really offloaded: the states went through NVMe every step (with clipping, a
    # step's updates and their writes run under the next step's forward, and its final
    # statistics count them: every step writes; all but the last, flushed, overlapped).
    assert all(s["bytes"]["nvme_read"] > 0 for s in stats)
    assert all(s["bytes"]["nvme_write"] > 0 for s in stats)
    assert all(s["deferred_blocks"] > 0 for s in stats)
    assert all(s["overlapped_seconds"] > 0 for s in stats[:-1])
    assert all(s["peak_device_bytes"] <= 160 * 1024 for s in stats)
    assert stats[-1]["step"] == STEPS and 0 < stats[-1]["clip_coef"] <= 1
    last = stats[-1]
    assert last["seconds"] > 0 and 0 < last["efficiency"] <= 1.5 and last["bound"]
    # Stall and tail are the layer's (the engine sees no compute on its lanes): the waits in
    # the engine's calls, and from the last release to the end of opt.step(), never the whole
    # step (which the engine's own figure would be).
    for s in stats:
        assert 0 <= s["stall_seconds"] and 0 <= s["tail_seconds"] < s["seconds"], s
        assert s["stall_seconds"] + s["tail_seconds"] <= s["seconds"] + 0.05, s
    assert set(last["bytes"]) == {"nvme_read", "nvme_write", "h2d", "d2h", "comm"}
    for ours, theirs in zip(off, ref):
        for a, b in zip(ours, theirs):
            assert abs(a - b) <= 1e-4 * abs(b), (off, ref)
    assert sum(off[-1]) < sum(off[0]) - 0.2  # it learned
    got = _read_safetensors(tmp_path / "a.st")
    want = dict(m_ref.named_parameters())
    assert set(got) == set(want)  # every parameter, the tied one once
    # The tied embedding/head, trained by both paths of its use, agrees with torch's. (Not
    # every tensor can: the key biases' true gradient is zero, so theirs is rounding noise
    # that Adam scales up to lr-sized steps in both runs, differently.)
    w = want["wte.weight"].detach()
    assert (got["wte.weight"] - w).abs().max() <= 1e-3 * w.abs().max()


def _read_safetensors(path):
    import json
    import struct
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    assert header.pop("__metadata__") == {"format": "pt"}
    for name, h in header.items():
        a, b = h["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[8 + n + a:8 + n + b]),
                                     dtype=torch.float32).view(h["shape"])
    return out


def test_dropout_is_recomputed_with_the_same_mask():
    """Backward recomputes each block under the forward's RNG state: with dropout the losses
    still follow torch's (same masks), and the offloaded run stays bit-identical."""
    torch.manual_seed(5)
    _, off, _ = train_strata(strata.Engine(device="cpu", device_mem="160K"), dropout=0.1)
    torch.manual_seed(5)
    _, mem, _ = train_strata(strata.Engine(device="cpu"), dropout=0.1)
    torch.manual_seed(5)
    _, ref = train_torch(dropout=0.1)
    assert off == mem
    for ours, theirs in zip(off, ref):
        for a, b in zip(ours, theirs):
            assert abs(a - b) <= 1e-4 * abs(b), (off, ref)


def test_timing_splits_the_layers_time_and_leaves_the_results_unchanged():
    """Engine(timing=True): each step's stats carry the layer's seconds by kind; the split adds
    up (own = layer - engine - compute - copy >= 0), lies within the step's wall time, and the
    instrumented run trains bit for bit as the plain one."""
    import time
    torch.manual_seed(0)
    _, plain, _ = train_strata(strata.Engine(device="cpu"))
    eng = strata.Engine(device="cpu", timing=True)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    _, timed, stats = train_strata(eng)
    wall = time.perf_counter() - t0
    assert timed == plain
    for s in stats:
        t = s["python"]
        assert set(t) == {"layer", "engine", "compute", "copy", "own", "engine_calls"}
        assert {"acquire", "release", "submit_grads_from", "end_step"} <= set(t["engine_calls"])
        assert abs(sum(t["engine_calls"].values()) - t["engine"]) < 1e-9
        assert all(t[k] > 0 for k in ("layer", "engine", "compute", "copy"))
        assert t["own"] >= 0
        assert abs(t["own"] - (t["layer"] - t["engine"] - t["compute"] - t["copy"])) < 1e-9
    assert sum(s["python"]["layer"] for s in stats) < wall
    untimed = strata.Engine(device="cpu")
    train_strata(untimed)
    assert "python" not in untimed.last_step_stats()


def test_close_releases_the_folders_for_a_resume_in_the_same_process(tmp_path):
    nvme = [tmp_path / "d0"]
    nvme[0].mkdir()
    with strata.Engine(device="cpu", host_mem="400K", nvme=nvme) as eng:
        model, losses, _ = train_strata(eng)
    with pytest.raises(strata.Error, match="was closed"):
        model(*next(batches(1, 1))[0])
    eng2 = strata.Engine(device="cpu", host_mem="400K", nvme=nvme, resume=True)
    m2 = GPT()
    m2 = strata.offload(m2, blocks=list(m2.blocks), engine=eng2, micro_batches=MICRO)
    strata.optim.AdamW(param_groups(m2, WD), lr=LR, betas=(0.9, 0.95), max_grad_norm=CLIP)
    assert eng2.resumed_step == STEPS
    assert _weights(m2, tmp_path / "a.st") == _weights_of_closed(losses, tmp_path)
    eng2.close()


def _weights_of_closed(losses, tmp_path):
    """The in-memory run's final weights (the same run, so the same bits)."""
    m, mem, _ = train_strata(strata.Engine(device="cpu"))
    assert mem == losses
    return _weights(m, tmp_path / "b.st")


def test_blocks_called_with_keywords_returning_tuples_as_hugging_face_blocks_are():
    _, off, _ = train_strata(strata.Engine(device="cpu", device_mem="160K"), cls=HfStyleGPT)
    _, mem, _ = train_strata(strata.Engine(device="cpu"), cls=HfStyleGPT)
    _, ref = train_torch(cls=HfStyleGPT)
    assert off == mem
    for ours, theirs in zip(off, ref):
        for a, b in zip(ours, theirs):
            assert abs(a - b) <= 1e-4 * abs(b), (off, ref)
