"""What the checkpoint tests (test_checkpoint*.py) share: an offloaded GPT whose engine has one
NVMe folder, training it, and the bytes of its weights and of a folder's files."""
import os

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
