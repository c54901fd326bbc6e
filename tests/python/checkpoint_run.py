"""What the checkpoint tests (test_checkpoint*.py) share: an offloaded GPT whose engine has one
NVMe folder, training it, the bytes of its weights and of a folder's files, a checkpoint as
several ranks save one, and a script started as several ranks."""
import json
import os
import subprocess
import sys
import time

import torch

import strata
from gpt_model import GPT, batches

HERE = os.path.dirname(os.path.abspath(__file__))


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


def ranks(tmp_path, script, *args, world=2, timeout=600, limit=120):
    """`script` as `world` ranks (launcher variables, a file rendezvous; one rank runs without
    them); `args` may name "{rank}", which each rank's arguments get its number in. `timeout`:
    the communicator's (STRATA_COMM_TIMEOUT, seconds). Returns the ranks' (exit code, stderr);
    a rank still running after `limit` seconds is killed and fails the test."""
    rdzv = tmp_path / f"rdzv-{len(os.listdir(tmp_path))}"
    rdzv.mkdir()
    procs = []
    for r in range(world):
        env = {k: v for k, v in os.environ.items()
               if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
        env.update(PYTHONPATH=os.pathsep.join([HERE] + [p for p in sys.path if p]))
        if world > 1:
            env.update(RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                       LOCAL_WORLD_SIZE=str(world), STRATA_RENDEZVOUS=f"file:{rdzv}",
                       STRATA_COMM_TIMEOUT=str(timeout))
        procs.append(subprocess.Popen(
            [sys.executable, os.path.join(HERE, script), *(str(a).format(rank=r) for a in args)],
            env=env, stderr=subprocess.PIPE, text=True))
    results, hung = [], []
    deadline = time.monotonic() + limit
    for r, p in enumerate(procs):
        try:
            _, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
            hung.append(r)
        results.append((p.returncode, err))
    assert not hung, f"ranks {hung} still ran after {limit} s: " + results[hung[0]][1][-2000:]
    return results
