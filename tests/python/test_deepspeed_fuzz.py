"""A fuzz target for strata.initialize's config (issue 45 §7): configs drawn from DeepSpeed's
documented schema (the keys strata maps, ignores or refuses, with values of the right type, the
wrong type, numbers as strings, "auto", out of range, non-finite, and keys that do not exist).
Property: strata.initialize either raises strata.Error naming one of the config's keys, with
the model untouched (same values, nothing offloaded), or returns an engine that trains a step
to a finite loss. Any other exception fails, with the seed to replay it
(STRATA_FUZZ_SEEDS=a:b runs another range)."""
import math
import os
import random
import warnings

import pytest
import torch

import strata
from gpt_model import GPT

_NUMBERS = [0, 1, 2, 3, 4, 8, -1, 0.5, 1e-3, 2e-2, 1.0, math.inf, -math.inf, math.nan]
_WRONG = ["auto", "1e-3", "3", "", None, True, False, [], {}, [1, 2], {"a": 1}]


def _value(rng, good):
    """One of the key's good values, mostly; else a number or a wrong-typed value."""
    r = rng.random()
    if r < 0.92:
        return rng.choice(good)
    return rng.choice(_NUMBERS if r < 0.96 else _WRONG)


def _section(rng, schema, keep=0.5):
    out = {}
    for k, good in schema.items():
        if rng.random() < keep:
            out[k] = good(rng) if callable(good) else _value(rng, good)
    if rng.random() < 0.02:  # a key DeepSpeed does not have, or strata does not take
        out[rng.choice(["bogus", "stage_3", "pipeline"])] = _value(rng, [1])
    return out


def _config(rng, nvme):
    offload = {"device": ["cpu", "nvme", "none", "gpu"], "nvme_path": [nvme, nvme + "-x"],
               "pin_memory": [True, False], "buffer_count": [4, 5], "fast_init": [False]}
    schema = {
        "train_batch_size": [4, 8, 16, "auto"],
        "train_micro_batch_size_per_gpu": [4, "auto"],
        "gradient_accumulation_steps": [1, 2, "auto"],
        "gradient_clipping": [0.0, 1.0, 0.5, "auto"],
        "steps_per_print": [10, 2000],
        "wall_clock_breakdown": [False],
        "optimizer": lambda r: (_section(r, {
            "type": ["AdamW", "Adam", "adamw", "SGD", "OneBitAdam"],
            "params": lambda r2: _section(r2, {
                "lr": [1e-3, 2e-2, "auto"], "betas": [[0.9, 0.999], [0.9, 0.95], [0.9], "auto"],
                "eps": [1e-8, 0, "auto"], "weight_decay": [0.0, 0.1, "auto"],
                "adam_w_mode": [True, False], "torch_adam": [True]}, 0.6)}, 0.9)
            if r.random() < 0.9 else _value(r, [None])),
        "scheduler": lambda r: _section(r, {
            "type": ["WarmupLR", "WarmupDecayLR", "OneCycle", "LRRangeTest"],
            "params": lambda r2: _section(r2, {
                "warmup_min_lr": [0, 1e-4, "auto"], "warmup_max_lr": [1e-3, 2e-2, "auto"],
                "warmup_num_steps": [0, 1, 10, "auto"], "warmup_type": ["log", "linear", "exp"],
                "total_num_steps": [10, 100, "auto"], "last_batch_iteration": [-1]}, 0.5)}, 0.9),
        "zero_optimization": lambda r: (_section(r, {
            "stage": [3, 3, 3, 2, 0],
            "offload_param": lambda r2: (_section(r2, offload, 0.7) if r2.random() < 0.9
                                         else _value(r2, ["cpu"])),
            "offload_optimizer": lambda r2: (_section(r2, offload, 0.7) if r2.random() < 0.9
                                             else _value(r2, ["cpu"])),
            "overlap_comm": [True], "contiguous_gradients": [True],
            "reduce_bucket_size": ["auto", 5e8], "stage3_prefetch_bucket_size": ["auto"],
            "stage3_param_persistence_threshold": ["auto"],
            "stage3_gather_16bit_weights_on_model_save": [True]}, 0.7)
            if r.random() < 0.95 else _value(r, [None])),
        "fp16": lambda r: _section(r, {"enabled": [False, False, True, "auto"], "loss_scale": [0],
                                       "initial_scale_power": [16]}, 0.7),
        "bf16": lambda r: _section(r, {"enabled": [False, True, "auto"]}, 0.8),
        "amp": lambda r: _section(r, {"enabled": [False, False, True]}, 0.8),
        "activation_checkpointing": [{"partition_activations": True}],
    }
    config = _section(rng, schema, 0.4)
    config.setdefault("optimizer", {"type": "AdamW", "params": {"lr": 1e-3}})
    config.setdefault("zero_optimization", {"stage": 3})
    return config


def _keys(value, into):
    """Every key of a (nested) config."""
    if isinstance(value, dict):
        for k, v in value.items():
            into.add(str(k))
            _keys(v, into)
    return into


def _seeds():
    lo, hi = os.environ.get("STRATA_FUZZ_SEEDS", "0:120").split(":")
    return range(int(lo), int(hi))


def test_initialize_config_fuzz(tmp_path):
    model = GPT(layers=2)
    reference = {n: p.detach().clone() for n, p in model.named_parameters()}
    outcomes = {"error": 0, "trained": 0}
    for seed in _seeds():
        rng = random.Random(seed)
        nvme = tmp_path / f"nvme{seed}"
        nvme.mkdir()
        config = _config(rng, str(nvme))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                engine, _, _, _ = strata.initialize(model=model, config=config,
                                                    device_mem="1M", host_mem="2M")
        except strata.Error as e:
            keys = _keys(config, set()) | {"config"}
            assert any(k in str(e) for k in keys), f"seed {seed}: {e} names no key of {config}"
            assert not any(hasattr(p, "_strata_offload") for p in model.parameters()), seed
            assert all(torch.equal(p, reference[n]) for n, p in model.named_parameters()), seed
            outcomes["error"] += 1
            continue
        except Exception as e:  # noqa: BLE001
            pytest.fail(f"seed {seed}: {type(e).__name__}: {e}\nconfig: {config}")
        try:
            torch.manual_seed(seed)
            for _ in range(engine.gradient_accumulation_steps()):
                x = torch.randint(0, 64, (2, 16))
                loss = engine(x, x)
                assert math.isfinite(loss.item()), f"seed {seed}: loss {loss.item()}"
                engine.backward(loss)
                engine.step()
            assert engine.global_steps == 1, seed
        except Exception as e:  # noqa: BLE001
            pytest.fail(f"seed {seed}: the engine did not train: {type(e).__name__}: {e}\n"
                        f"config: {config}")
        engine.strata_engine.close()
        outcomes["trained"] += 1
        model = GPT(layers=2)  # the last one is offloaded now
    assert outcomes["error"] and outcomes["trained"], outcomes  # both sides were reached
