"""The Trainer runs test_hf_trainer.py compares (imported there, and run in a fresh process
for the resume test): a 3-layer GPT-2 or Llama (ARCHS) on a fixed synthetic data set, the same
TrainingArguments for transformers' Trainer and strata.hf.Trainer.

As a script: argv = [run|resume, arch, output_dir, nvme_dir, steps]; trains (or resumes from the
output_dir's checkpoint-2) and prints one JSON line: the per-step losses logged and a hash of
the final weights."""
import hashlib
import json
import os
import sys

import torch
import transformers

import strata
import strata.hf

VOCAB, SEQ = 64, 16


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n=64, seed=1):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randint(0, VOCAB, (n, SEQ), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


ARCHS = ("gpt2", "llama")


def make_model(arch="gpt2", layers=3):
    torch.manual_seed(0)
    if arch == "gpt2":
        config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32,
                                         n_layer=layers, n_head=4, resid_pdrop=0.0,
                                         embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
        return transformers.GPT2LMHeadModel(config)
    config = transformers.LlamaConfig(vocab_size=VOCAB, max_position_embeddings=SEQ,
                                      hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=layers, num_attention_heads=4,
                                      num_key_value_heads=2, use_cache=False)
    return transformers.LlamaForCausalLM(config)


def arguments(output_dir, steps=4, **kw):
    base = dict(output_dir=str(output_dir), per_device_train_batch_size=4,
                gradient_accumulation_steps=2, max_steps=steps, learning_rate=1e-2,
                warmup_steps=1, lr_scheduler_type="linear", weight_decay=0.1,
                max_grad_norm=1.0, logging_steps=1, save_strategy="no", report_to=[], seed=0,
                use_cpu=True, disable_tqdm=True, dataloader_num_workers=0)
    base.update(kw)
    return transformers.TrainingArguments(**base)


def step_logs(trainer):
    """[(loss, grad_norm, learning_rate)] of every logged training step."""
    return [(h["loss"], h.get("grad_norm"), h["learning_rate"])
            for h in trainer.state.log_history if "loss" in h]


def weights_hash(model):
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def main(mode, arch, output_dir, nvme, steps):
    os.makedirs(nvme, exist_ok=True)
    args = arguments(output_dir, steps=int(steps), save_strategy="steps", save_steps=2)
    trainer = strata.hf.Trainer(model=make_model(arch), args=args, train_dataset=Tokens(),
                                engine=strata.Engine(nvme=[nvme]))
    resume = os.path.join(output_dir, "checkpoint-2") if mode == "resume" else None
    trainer.train(resume_from_checkpoint=resume)
    print(json.dumps({"losses": step_logs(trainer), "weights": weights_hash(trainer.model)}))


if __name__ == "__main__":
    main(*sys.argv[1:])
