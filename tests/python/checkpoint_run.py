"""What the checkpoint tests (test_checkpoint*.py) share: an offloaded GPT whose engine has one
NVMe folder, training it, the bytes of its weights and of a folder's files, and a checkpoint
as several ranks save one."""
import json
import os

import torch

import strata
from gpt_model import GPT, batches


def offloaded_run(nvme, device_mem="160K", host_mem="400K", engine_options=None,
                  **model_options):
    """An offloaded GPT(**model_options) over `nvme` and its strata.optim.AdamW (lr 2e-2)."""
    model = GPT(**model_options)
    model = strata.offload(model, blocks=list(model.blocks), engine=strata.Engine(
        device_mem=device_mem, host_mem=host_mem, nvme=[nvme], **(engine_options or {})))
    opt = strata.optim.AdamW(model.parameters(), lr=2e-2)
    return model, opt


def train(model, opt, steps, seed):
    for micro in batches(steps, 1, seed=seed):
        for x, y in micro:
            model(x, y).backward()
        opt.step()


def weights(model, path):
    """The model's weights as save_safetensors writes them to `path`."""
    strata.save_safetensors(model, path)
    return path.read_bytes()


def files(folder):
    """{name: bytes} of the files directly in `folder`."""
    return {n: (folder / n).read_bytes() for n in sorted(os.listdir(folder))
            if (folder / n).is_file()}


def as_ranks(model, path, world, client_state=None):
    """A checkpoint of the single-rank offloaded `model` at `path` as `world` ranks save one
    (each rank<r>.pt holding its contiguous part of every block's states; world_size `world`
    in strata.json and python.pt): a multi-rank checkpoint without starting ranks, for the
    loads that re-shard it."""
    from strata import _checkpoint, _checkpoint_shards
    state = next(model.parameters())._strata_offload
    _checkpoint_shards.save_shards(model, state, str(path), None, None, client_state)
    whole = _checkpoint._torch_load(path / "rank0.pt")
    for r in range(world):
        shards = {key: v.view(world, -1)[r].clone() for key, v in whole["shards"].items()}
        torch.save(dict(whole, rank=r, world_size=world, shards=shards), path / f"rank{r}.pt")
    saved = _checkpoint._torch_load(path / "python.pt")
    torch.save(dict(saved, world_size=world), path / "python.pt")
    meta = json.loads((path / "strata.json").read_text())
    (path / "strata.json").write_text(json.dumps(dict(meta, world_size=world)))
