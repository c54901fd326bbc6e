"""strata.save_checkpoint / load_checkpoint: a fresh process that loads a checkpoint continues
the run bit for bit (weights, moments, step, lr schedule, dropout's RNG), and the checkpoint's
model.safetensors is the weights as plain safetensors."""
import os
import subprocess
import sys

import pytest
import torch

import strata
from gpt_model import GPT

HERE = os.path.dirname(os.path.abspath(__file__))


def _child(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE] + [p for p in sys.path if p]))
    r = subprocess.run([sys.executable, os.path.join(HERE, "checkpoint_child.py"), *map(str, args)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


def test_a_fresh_process_continues_from_a_checkpoint_bit_for_bit(tmp_path):
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    ckpt = tmp_path / "ckpt"
    _child("save", tmp_path / "a", ckpt, tmp_path / "straight.safetensors")
    _child("load", tmp_path / "b", ckpt, tmp_path / "resumed.safetensors")
    straight = (tmp_path / "straight.safetensors").read_bytes()
    assert (tmp_path / "resumed.safetensors").read_bytes() == straight
    assert sorted(os.listdir(ckpt)) == ["model.safetensors", "nvme0", "python.pt", "strata.json"]
    assert (ckpt / "model.safetensors").read_bytes() != straight  # step 3's weights, not 5's


def test_checkpoint_needs_nvme_and_a_step_boundary(tmp_path):
    model = GPT()
    model = strata.offload(model, blocks=list(model.blocks), engine=strata.Engine())
    strata.optim.AdamW(model.parameters())
    with pytest.raises(strata.Error, match="needs an engine with NVMe folders"):
        strata.save_checkpoint(model, tmp_path / "c")
    with pytest.raises(strata.Error, match="takes a model given to strata.offload"):
        strata.save_checkpoint(GPT(), tmp_path / "c")
    (tmp_path / "n").mkdir()
    model = GPT()
    model = strata.offload(model, blocks=list(model.blocks), micro_batches=2,
                           engine=strata.Engine(nvme=[tmp_path / "n"]))
    strata.optim.AdamW(model.parameters())
    x = torch.randint(0, 64, (2, 16))
    model(x, x).backward()
    with pytest.raises(strata.Error, match="middle of a step"):
        strata.save_checkpoint(model, tmp_path / "c")
