"""strata.hf.Trainer's DeepSpeed config dict goes through the one validator strata.initialize
uses (_ds_config.resolve_for_trainer): "auto" takes the TrainingArguments' value, and a key
that is unknown, mistyped or disagrees with the arguments is refused by name before the model
is touched. The Trainer's own checks (three batch keys and fp16) let every case below through:
it trained with the arguments' learning rate where the config said another, and ignored a
misspelt key or a DeepSpeed scheduler."""
import pytest

import strata

transformers = pytest.importorskip("transformers")
try:
    from transformers import Trainer  # noqa: F401
    import strata.hf  # noqa: F401
except Exception as e:  # noqa: BLE001
    pytest.skip(f"transformers' Trainer does not import here: {e}", allow_module_level=True)

from hf_trainer_case import Tokens, arguments, make_model  # noqa: E402


def config(tmp_path, **top):
    (tmp_path / "nvme").mkdir(exist_ok=True)
    ds = {"zero_optimization": {"stage": 3, "offload_optimizer": {
        "device": "nvme", "nvme_path": str(tmp_path / "nvme")}},
          "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
          "train_batch_size": "auto", "gradient_clipping": "auto",
          "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto",
                                                    "eps": "auto", "weight_decay": "auto"}},
          "bf16": {"enabled": "auto"}}
    ds.update(top)
    return ds


@pytest.mark.parametrize("top, match", [
    ({"gradient_clip": 1.0}, r"not supported.*gradient_clip"),
    ({"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}},
     r"optimizer.params.lr=0.001 disagrees"),
    ({"optimizer": {"type": "AdamW", "params": {"betas": [0.8, 0.9]}}},
     r"optimizer.params.betas=\[0.8, 0.9\] disagrees"),
    ({"optimizer": {"type": "Lion"}}, r"optimizer.type"),
    ({"train_batch_size": 64}, r"train_batch_size=64 disagrees"),
    ({"bf16": {"enabled": "yes"}}, r"bf16.enabled"),
    ({"gradient_clipping": "1.0"}, r"gradient_clipping"),
    ({"scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}}},
     r"scheduler.*lr_scheduler_type"),
])
def test_a_config_the_arguments_contradict_is_refused_by_name(tmp_path, top, match):
    model = make_model()
    with pytest.raises(strata.Error, match=match):
        strata.hf.Trainer(model=model, args=arguments(tmp_path / "o"), train_dataset=Tokens(),
                          deepspeed_config=config(tmp_path, **top))
    assert all(getattr(p, "_strata_offload", None) is None for p in model.parameters())


def test_auto_values_and_matching_numbers_are_taken(tmp_path):
    args = arguments(tmp_path / "o")
    ds = config(tmp_path, train_batch_size=8, gradient_clipping=1.0,
                optimizer={"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}})
    engine = strata.hf._engine_from_deepspeed(ds, args)
    assert engine.config.nvme == [str(tmp_path / "nvme")]
    engine = strata.hf._engine_from_deepspeed(config(tmp_path), args)  # all "auto"
    assert engine.config.nvme == [str(tmp_path / "nvme")]
