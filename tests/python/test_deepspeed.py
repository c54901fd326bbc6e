"""strata.initialize: a script written for deepspeed.initialize (ZeRO-3 offload config,
engine.backward / engine.step every micro-batch, engine.save_checkpoint) runs with one line
changed, and computes what the same run written against strata.offload computes."""
import copy
import math
import warnings

import pytest
import torch

import strata
from gpt_model import GPT, batches

CONFIG = {
    "train_batch_size": 8,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 2,
    "gradient_clipping": 1.0,
    "steps_per_print": 10,
    "optimizer": {"type": "AdamW", "params": {"lr": 2e-2, "betas": [0.9, 0.95], "eps": 1e-8,
                                              "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 2e-2,
                                                 "warmup_num_steps": 4,
                                                 "warmup_type": "linear"}},
    "zero_optimization": {
        "stage": 3,
        "offload_param": {"device": "nvme", "nvme_path": None, "pin_memory": True},
        "offload_optimizer": {"device": "nvme", "nvme_path": None, "buffer_count": 4},
        "overlap_comm": True,
        "stage3_prefetch_bucket_size": 1e6,
    },
}
IGNORED = ["steps_per_print", "zero_optimization.overlap_comm",
           "zero_optimization.stage3_prefetch_bucket_size",
           "zero_optimization.offload_param.pin_memory",
           "zero_optimization.offload_optimizer.buffer_count"]


def _config(nvme):
    c = copy.deepcopy(CONFIG)
    for k in ("offload_param", "offload_optimizer"):
        c["zero_optimization"][k]["nvme_path"] = str(nvme)
    return c


def deepspeed_warmup_lr(iteration, min_lr, max_lr, warmup_steps, warmup_type="log",
                        total_steps=None):
    """DeepSpeed's documented WarmupLR / WarmupDecayLR lr at `iteration` (its
    last_batch_iteration; -1 before the first step(), which is warmup_min_lr): gamma rises as
    log(it + 1) / log(warmup) (or it / warmup) for it < warmup (warmup at least 2), is then 1,
    or with total_steps falls as (total - it) / max(1, total - warmup), never below 0;
    lr = min + (max - min) * gamma."""
    warmup = max(2, warmup_steps)
    if iteration < 0:
        return min_lr
    if iteration < warmup:
        gamma = (math.log(iteration + 1) / math.log(warmup) if warmup_type == "log"
                 else iteration / warmup)
    elif total_steps is None:
        gamma = 1.0
    else:
        gamma = max(0.0, (total_steps - iteration) / max(1.0, total_steps - warmup))
    return min_lr + (max_lr - min_lr) * gamma


def _deepspeed_script(engine, steps, seed=1):
    """The training loop of a DeepSpeed script."""
    for micro in batches(steps, 2, seed=seed):
        for x, y in micro:
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()


def _initialize(tmp_path, name):
    (tmp_path / name).mkdir()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine, opt, _, sched = strata.initialize(model=GPT(dropout=0.1),
                                                  config=_config(tmp_path / name),
                                                  device_mem="160K", host_mem="400K")
    return engine, [str(w.message) for w in caught]


def test_a_deepspeed_script_computes_what_strata_offload_computes(tmp_path):
    engine, warned = _initialize(tmp_path, "ds")
    assert engine.ignored_config_keys == IGNORED
    assert any(all(k in w for k in IGNORED) for w in warned), warned
    _deepspeed_script(engine, 4)
    assert engine.global_steps == 4

    (tmp_path / "ref").mkdir()
    model = GPT(dropout=0.1)
    decay = strata.Engine(device_mem="160K", host_mem="400K", nvme=[tmp_path / "ref"])
    model = strata.offload(model, blocks=list(model.blocks), engine=decay, micro_batches=2)
    opt = strata.optim.AdamW(model.parameters(), lr=2e-2, betas=(0.9, 0.95), eps=1e-8,
                             weight_decay=0.1, max_grad_norm=1.0)
    for k, micro in enumerate(batches(4, 2), start=1):
        for g in opt.param_groups:  # DeepSpeed's WarmupLR: step k runs iteration k - 2's lr
            g["lr"] = deepspeed_warmup_lr(k - 2, 0.0, 2e-2, 4, "linear")
        for x, y in micro:
            (model(x, y) / 2).backward()
        opt.step()
    strata.save_safetensors(engine.module, tmp_path / "ds.st")
    strata.save_safetensors(model, tmp_path / "ref.st")
    assert (tmp_path / "ds.st").read_bytes() == (tmp_path / "ref.st").read_bytes()


def test_engine_save_checkpoint_and_load_checkpoint_continue_the_run(tmp_path):
    a, _ = _initialize(tmp_path, "a")
    _deepspeed_script(a, 2)
    assert a.save_checkpoint(tmp_path / "ckpt", client_state={"epoch": 1})
    assert (tmp_path / "ckpt" / "latest").read_text() == "global_step2"
    _deepspeed_script(a, 2, seed=5)
    b, _ = _initialize(tmp_path, "b")
    with pytest.warns(UserWarning, match="no checkpoint to load"):  # DeepSpeed's (None, None)
        assert b.load_checkpoint(tmp_path / "none") == (None, None)
    path, client = b.load_checkpoint(tmp_path / "ckpt")
    # After two steps DeepSpeed's WarmupLR is at iteration 1: 2e-2 x 1/4.
    assert client == {"epoch": 1} and b.global_steps == 2 and b.get_lr() == [5e-3]
    _deepspeed_script(b, 2, seed=5)
    strata.save_safetensors(a.module, tmp_path / "a.st")
    strata.save_safetensors(b.module, tmp_path / "b.st")
    assert (tmp_path / "a.st").read_bytes() == (tmp_path / "b.st").read_bytes()


@pytest.mark.parametrize("change, message", [
    ({"fp16": {"enabled": True}}, "fp16.enabled"),
    ({"zero_optimization": {"stage": 2}}, "stage=2"),
    ({"optimizer": {"type": "SGD", "params": {"lr": 0.1}}}, "'SGD'"),
    ({"optimizer": {"type": "Adam", "params": {"adam_w_mode": False}}}, "adam_w_mode=false"),
    ({"pipeline": {"stages": 2}}, r"\['pipeline'\]"),
    ({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "nvme": 1}}},
     r"offload_param: keys not supported by strata.initialize: \['nvme'\]"),
    ({"scheduler": {"type": "OneCycle", "params": {}}}, "'OneCycle'"),
    ({"train_batch_size": 16}, "train_batch_size 16 != "),
])
def test_refused_config_keys_are_named(change, message):
    c = copy.deepcopy(CONFIG)
    c["zero_optimization"]["offload_param"] = {"device": "cpu"}
    c["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    c.update(change)
    with pytest.raises(strata.Error, match=message):
        strata.initialize(model=GPT(), config=c)


def test_nvme_folders_are_given_in_one_place(tmp_path):
    with pytest.raises(strata.Error, match="give the NVMe folders in one place"):
        strata.initialize(model=GPT(), config=_config(tmp_path), nvme=[tmp_path])
    c = _config(tmp_path)  # the folders as an Engine option, the config offloading to the CPU
    for k in ("offload_param", "offload_optimizer"):
        c["zero_optimization"][k] = {"device": "cpu"}
    with pytest.warns(UserWarning, match="ignores these DeepSpeed config keys"):
        engine, _, _, _ = strata.initialize(model=GPT(), config=c, nvme=[tmp_path])
    assert engine.strata_engine.config.nvme == [str(tmp_path)]


def test_initialize_passes_the_activation_stash_to_offload(tmp_path):
    """initialize(activation_bytes=...) stashes the block inputs as strata.offload does: the
    same weights as without, and the stash's bytes in the engine's statistics."""
    weights = []
    for stash in ("off", "on"):
        (tmp_path / stash).mkdir()
        with pytest.warns(UserWarning, match="ignores these DeepSpeed config keys"):
            engine, _, _, _ = strata.initialize(model=GPT(dropout=0.1),
                                                config=_config(tmp_path / stash),
                                                offload_activations=stash,
                                                activation_bytes=4 * 16 * 32 * 4,
                                                device_mem="160K", host_mem="600K")
        _deepspeed_script(engine, 2)
        strata.save_safetensors(engine.module, tmp_path / f"{stash}.st")
        weights.append((tmp_path / f"{stash}.st").read_bytes())
        stashed = engine.strata_engine.last_step_stats()["activation_bytes"]["d2h"]
        # 2 micro-batches x the inputs of the 2 of 3 blocks that are recomputed (not the last)
        assert stashed == (0 if stash == "off" else 2 * 2 * 4 * 16 * 32 * 4)
    assert weights[0] == weights[1]
