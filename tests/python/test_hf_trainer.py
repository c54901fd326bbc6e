"""strata.hf.Trainer against transformers' own Trainer on the same model, data and
TrainingArguments, for an HF GPT-2 and an HF Llama config: per-step losses, the logged grad_norm
(clipping on), the lr schedule with warm-up, gradient accumulation, evaluation, bf16 autocast,
save_model then from_pretrained, and save_steps checkpoints resumed bit for bit in a fresh
process. Runs under the torch matrix's transformers 5 and under Debian's torch 1.13 with the
transformers 4.47 that tools/bootstrap.sh pins for it (4.48 and later import torch 2's
torch.optim.lr_scheduler.LRScheduler in their Trainer); skipped where the Trainer does not
import."""
import json
import os
import subprocess
import sys

import pytest
import torch

import strata

transformers = pytest.importorskip("transformers")
try:
    from transformers import Trainer  # noqa: F401
    import strata.hf  # noqa: F401
except Exception as e:  # noqa: BLE001
    pytest.skip(f"transformers' Trainer does not import here: {e}", allow_module_level=True)

from hf_trainer_case import ARCHS, Tokens, arguments, make_model, step_logs  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# max_grad_norm below the norms each model's first steps have, so that clipping applies
CLIP = {"gpt2": 1.0, "llama": 0.5}


def run_plain(tmp_path, arch="gpt2", **kw):
    trainer = transformers.Trainer(model=make_model(arch),
                                   args=arguments(tmp_path / "plain", **kw),
                                   train_dataset=Tokens())
    trainer.train()
    return trainer


def run_strata(tmp_path, arch="gpt2", engine=None, **kw):
    trainer = strata.hf.Trainer(model=make_model(arch), args=arguments(tmp_path / "strata", **kw),
                                train_dataset=Tokens(), engine=engine)
    trainer.train()
    return trainer


@pytest.mark.parametrize("arch", ARCHS)
def test_trainer_matches_transformers_step_by_step_and_saves_what_from_pretrained_loads(
        tmp_path, arch):
    clip = CLIP[arch]
    plain = run_plain(tmp_path, arch, max_grad_norm=clip)
    ours = run_strata(tmp_path, arch, max_grad_norm=clip)
    want, got = step_logs(plain), step_logs(ours)
    assert len(got) == len(want) == 4
    for (wl, wn, wlr), (gl, gn, glr) in zip(want, got):
        assert gl == pytest.approx(wl, rel=1e-4)
        assert gn == pytest.approx(wn, rel=1e-4)  # the true norm, not 0
        assert glr == wlr
    assert max(n for _, n, _ in got) > clip  # clipping applied at least once
    ours.save_model(tmp_path / "saved")
    loaded = type(plain.model).from_pretrained(tmp_path / "saved")
    for k, v in plain.model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[k], v, rtol=1e-4, atol=1e-4, msg=k)
    # The evaluation loop: no_grad forwards on the committed weights.
    e_plain = plain.evaluate(eval_dataset=Tokens(n=16, seed=7))
    e_ours = ours.evaluate(eval_dataset=Tokens(n=16, seed=7))
    assert e_ours["eval_loss"] == pytest.approx(e_plain["eval_loss"], rel=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_autocast_trains_as_transformers_does(tmp_path, arch):
    plain = run_plain(tmp_path, arch, bf16=True, max_steps=2)
    ours = run_strata(tmp_path, arch, bf16=True, max_steps=2)
    for (wl, _, _), (gl, _, _) in zip(step_logs(plain), step_logs(ours)):
        assert gl == pytest.approx(wl, rel=1e-2)


def test_a_plain_trainer_with_an_offloaded_model_does_not_drop_clipping(tmp_path):
    """transformers' own Trainer clips through .grad: an error naming max_grad_norm, not a
    run that trains unclipped with grad_norm 0 logged."""
    model = make_model()
    strata.offload(model, blocks=list(model.transformer.h), engine=strata.Engine(),
                   micro_batches=2)
    opt = strata.optim.AdamW(model.parameters(), lr=1e-2)
    trainer = transformers.Trainer(model=model, args=arguments(tmp_path / "p"),
                                   train_dataset=Tokens(), optimizers=(opt, None))
    with pytest.raises(strata.Error, match="max_grad_norm"):
        trainer.train()


@pytest.mark.parametrize("field,value", [("gradient_checkpointing", True), ("optim", "sgd")])
def test_training_arguments_it_cannot_honour_are_refused_by_name(tmp_path, field, value):
    model = make_model()
    with pytest.raises(strata.Error, match=field):
        strata.hf.Trainer(model=model, args=arguments(tmp_path, **{field: value}),
                          train_dataset=Tokens())
    assert all(getattr(p, "_strata_offload", None) is None for p in model.parameters())


def test_a_deepspeed_config_dict_is_taken_with_auto_values(tmp_path):
    (tmp_path / "nvme").mkdir()
    ds = {"zero_optimization": {"stage": 3, "offload_optimizer": {
        "device": "nvme", "nvme_path": str(tmp_path / "nvme")}},
          "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
          "train_micro_batch_size_per_gpu": "auto"}
    trainer = strata.hf.Trainer(model=make_model(), args=arguments(tmp_path / "o", max_steps=2),
                                train_dataset=Tokens(), deepspeed_config=ds)
    trainer.train()
    assert trainer.strata_engine.config.nvme == [str(tmp_path / "nvme")]
    ds["gradient_accumulation_steps"] = 4
    with pytest.raises(strata.Error, match="gradient_accumulation_steps=4 disagrees"):
        strata.hf.Trainer(model=make_model(), args=arguments(tmp_path / "o"),
                          train_dataset=Tokens(), deepspeed_config=ds)


def _child(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE] + [p for p in sys.path if p]))
    r = subprocess.run([sys.executable, os.path.join(HERE, "hf_trainer_case.py"), *map(str, args)],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("arch", ARCHS)
def test_save_steps_checkpoints_resume_bit_for_bit_in_a_fresh_process(tmp_path, arch):
    full = _child("run", arch, tmp_path / "out", tmp_path / "nvme1", 4)
    assert os.path.isdir(tmp_path / "out" / "checkpoint-2" / "strata")
    resumed = _child("resume", arch, tmp_path / "out", tmp_path / "nvme2", 4)
    assert resumed["weights"] == full["weights"]
    # The resumed Trainer's log holds the checkpoint's first two steps, then its own two.
    assert len(resumed["losses"]) == 4
    assert resumed["losses"] == full["losses"]
