"""strata.initialize's DeepSpeed config, key by key (issue 45 §2, §6): the schedules run step
for step as DeepSpeed's own formula, every bad value is a strata.Error naming its key, its value
and what is accepted, raised before the model is touched (a retry with the config fixed
works), and "auto" is resolved as HF's DeepSpeed integration resolves it where strata knows the
value, refused by name where it does not."""
import copy
import math
import warnings

import pytest
import torch

import strata
from gpt_model import GPT
from test_deepspeed import deepspeed_warmup_lr

BASE = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "AdamW", "params": {"lr": 2e-2}},
    "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"},
                          "offload_optimizer": {"device": "cpu"}},
}


def _config(**changes):
    c = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        *path, last = dotted.split("__")
        d = c
        for p in path:
            d = d.setdefault(p, {})
        if value is _DELETE:
            d.pop(last, None)
        else:
            d[last] = value
    return c


_DELETE = object()


def _init(model, config):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return strata.initialize(model=model, config=config, device_mem="160K", host_mem="1M")


@pytest.mark.parametrize("kind, warmup_type", [("WarmupLR", "log"), ("WarmupLR", "linear"),
                                               ("WarmupDecayLR", "log"),
                                               ("WarmupDecayLR", "linear")])
def test_the_schedules_run_step_for_step_as_deepspeeds_formula(kind, warmup_type):
    """DeepSpeed's constructor sets warmup_min_lr and leaves the iteration at -1; the engine
    calls step() after each optimizer step. So optimizer step k runs iteration k - 2's lr (the
    first two run warmup_min_lr). strata's used to run one iteration ahead."""
    params = {"warmup_min_lr": 1e-3, "warmup_max_lr": 2e-2, "warmup_num_steps": 5,
              "warmup_type": warmup_type}
    total = 12 if kind == "WarmupDecayLR" else None
    if total:
        params["total_num_steps"] = total
    _, opt, _, sched = _init(GPT(), _config(scheduler={"type": kind, "params": params}))
    for k in range(1, 16):  # the lr optimizer step k runs with, then DeepSpeed's step()
        want = deepspeed_warmup_lr(k - 2, 1e-3, 2e-2, 5, warmup_type, total)
        assert opt.param_groups[0]["lr"] == pytest.approx(want, rel=1e-12, abs=0), k
        sched.step()

    # Resumed at every step: a new scheduler over a new optimizer, given the saved
    # param_groups and state_dict (as load_checkpoint restores them), continues the sequence.
    _, opt, _, sched = _init(GPT(), _config(scheduler={"type": kind, "params": params}))
    for k in range(1, 10):
        saved = (copy.deepcopy(sched.state_dict()), [dict(g) for g in opt.param_groups])
        _, opt, _, sched = _init(GPT(), _config(scheduler={"type": kind, "params": params}))
        for g, s in zip(opt.param_groups, saved[1]):
            g["lr"] = s["lr"]
        sched.load_state_dict(saved[0])
        want = deepspeed_warmup_lr(k - 2, 1e-3, 2e-2, 5, warmup_type, total)
        assert opt.param_groups[0]["lr"] == pytest.approx(want, rel=1e-12, abs=0), k
        sched.step()


def test_warmup_max_lr_defaults_to_deepspeeds_and_auto_takes_the_optimizers_lr():
    _, opt, _, sched = _init(GPT(), _config(scheduler={
        "type": "WarmupLR", "params": {"warmup_num_steps": 2}}))
    for _ in range(4):
        sched.step()
    assert opt.param_groups[0]["lr"] == 0.001  # DeepSpeed's default
    _, opt, _, sched = _init(GPT(), _config(scheduler={
        "type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                       "warmup_num_steps": 2}}))
    assert opt.param_groups[0]["lr"] == 0.0  # HF's warmup_min_lr
    for _ in range(4):
        sched.step()
    assert opt.param_groups[0]["lr"] == 2e-2  # optimizer.params.lr, as HF fills both


def test_auto_batch_keys_are_resolved_where_known():
    engine, _, _, _ = _init(GPT(), _config(train_batch_size=8, train_micro_batch_size_per_gpu=4,
                                           gradient_accumulation_steps="auto"))
    assert engine.gradient_accumulation_steps() == 2
    engine, _, _, _ = _init(GPT(), _config(train_batch_size="auto",
                                           train_micro_batch_size_per_gpu="auto",
                                           fp16={"enabled": "auto", "loss_scale": 0},
                                           bf16={"enabled": "auto"},
                                           zero_optimization__reduce_bucket_size="auto"))
    assert engine.gradient_accumulation_steps() == 1


REFUSED = {
    # key: (config changes, what the message says after the key and value)
    "auto lr": (dict(optimizer__params__lr="auto"),
                r"optimizer.params.lr=\"auto\": strata.initialize has no TrainingArguments"),
    "auto betas": (dict(optimizer__params__betas="auto"), r"optimizer.params.betas=\"auto\""),
    "auto clipping": (dict(gradient_clipping="auto"), r"gradient_clipping=\"auto\""),
    "auto warmup steps": (dict(scheduler={"type": "WarmupLR",
                                          "params": {"warmup_num_steps": "auto"}}),
                          r"scheduler.params.warmup_num_steps=\"auto\""),
    "auto accumulation": (dict(gradient_accumulation_steps="auto"),
                          r"gradient_accumulation_steps=\"auto\": known only from"),
    "lr as a string": (dict(optimizer__params__lr="1e-3"),
                       r"optimizer.params.lr='1e-3': expected a finite number >= 0 \(a number, "
                       r"not a string\)"),
    "stage as a string": (dict(zero_optimization__stage="3"),
                          r"zero_optimization.stage='3': expected 3"),
    "batch as a string": (dict(train_micro_batch_size_per_gpu="4"),
                          r"train_micro_batch_size_per_gpu='4': expected an integer >= 1"),
    "accumulation as a string": (dict(gradient_accumulation_steps="2"),
                                 r"gradient_accumulation_steps='2': expected an integer >= 1"),
    "one beta": (dict(optimizer__params__betas=[0.9]),
                 r"optimizer.params.betas=\[0.9\]: expected two numbers in \[0, 1\)"),
    "beta of 1": (dict(optimizer__params__betas=[0.9, 1.0]),
                  r"optimizer.params.betas=\[0.9, 1.0\]: expected two numbers in \[0, 1\)"),
    "betas as a string": (dict(optimizer__params__betas="0.9,0.95"),
                          r"optimizer.params.betas='0.9,0.95'"),
    "fp16 enabled": (dict(fp16={"enabled": True}), r"fp16.enabled=True: strata trains fp32"),
    "fp16 as a bool": (dict(fp16=True), r"fp16=True: expected a section \(a dict\)"),
    "fp16 enabled as a string": (dict(fp16={"enabled": "true"}),
                                 r"fp16.enabled='true': expected true, false or \"auto\""),
    "offload as a string": (dict(zero_optimization__offload_optimizer="cpu"),
                            r"zero_optimization.offload_optimizer='cpu': expected a section "
                            r"\(a dict such as \{\"device\": \"cpu\"\}\)"),
    "offload device": (dict(zero_optimization__offload_param={"device": "gpu"}),
                       r"zero_optimization.offload_param.device='gpu': expected \"none\", "
                       r"\"cpu\" or \"nvme\""),
    "nvme without a path": (dict(zero_optimization__offload_param={"device": "nvme"}),
                            r"zero_optimization.offload_param.nvme_path=None"),
    "clipping true": (dict(gradient_clipping=True),
                      r"gradient_clipping=True: expected a finite number >= 0 \(0 = no "
                      r"clipping\)"),
    "clipping negative": (dict(gradient_clipping=-1.0), r"gradient_clipping=-1.0"),
    "eps infinite": (dict(optimizer__params__eps=math.inf),
                     r"optimizer.params.eps=inf: expected a finite number >= 0"),
    "eps nan": (dict(optimizer__params__eps=math.nan), r"optimizer.params.eps=nan"),
    "weight decay true": (dict(optimizer__params__weight_decay=True),
                          r"optimizer.params.weight_decay=True"),
    "optimizer type": (dict(optimizer={"type": 3}), r"optimizer.type=3: expected \"AdamW\""),
    "optimizer params list": (dict(optimizer={"type": "AdamW", "params": [1]}),
                              r"optimizer.params=\[1\]: expected a section"),
    "scheduler warmup type": (dict(scheduler={"type": "WarmupLR",
                                              "params": {"warmup_type": "cosine"}}),
                              r"scheduler.params.warmup_type='cosine': expected \"log\""),
    "scheduler steps float": (dict(scheduler={"type": "WarmupLR",
                                              "params": {"warmup_num_steps": 2.5}}),
                              r"scheduler.params.warmup_num_steps=2.5: expected an integer"),
    "scheduler min lr string": (dict(scheduler={"type": "WarmupLR",
                                                "params": {"warmup_min_lr": "0"}}),
                                r"scheduler.params.warmup_min_lr='0'"),
    "per-group lrs": (dict(scheduler={"type": "WarmupLR",
                                      "params": {"warmup_max_lr": [1e-3, 2e-3]}}),
                      r"scheduler.params.warmup_max_lr=\[0.001, 0.002\]: expected one number, "
                      r"or one per param group \(1\)"),
    "decay without total": (dict(scheduler={"type": "WarmupDecayLR", "params": {}}),
                            r"WarmupDecayLR needs params.total_num_steps"),
    "zero as a list": (dict(zero_optimization=[3]), r"zero_optimization=\[3\]: expected a section"),
    "batch mismatch": (dict(train_batch_size=16), r"train_batch_size 16 != "),
}


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_bad_value_is_named_before_the_model_is_touched(case):
    changes, message = REFUSED[case]
    model = GPT()
    before = _params(model)
    with pytest.raises(strata.Error, match=message):
        _init(model, _config(**changes))
    after = _params(model)
    assert before.keys() == after.keys()
    assert all(torch.equal(before[n], after[n]) for n in before)
    assert not any(hasattr(p, "_strata_offload") for p in model.parameters())
    engine, _, _, _ = _init(model, _config())  # the retry with the config fixed works
    x = torch.randint(0, 64, (2, 16))
    loss = engine(x, x)
    engine.backward(loss)
    engine.step()


def test_eps_zero_is_accepted_as_by_the_cli_and_non_finite_refused_in_both_apis():
    """`strata train --eps` takes a finite number >= 0; so do initialize and AdamW (the engine
    skips a step that would commit a non-finite master weight)."""
    engine, opt, _, _ = _init(GPT(), _config(optimizer__params__eps=0))
    assert opt.param_groups[0]["eps"] == 0.0
    for bad in (math.inf, math.nan, -1.0):
        with pytest.raises(strata.Error, match="eps=.*finite number >= 0"):
            strata.optim.AdamW(GPT().parameters(), eps=bad)
