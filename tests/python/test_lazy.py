"""Lazy construction: a model built with its parameters on the meta device (strata.init_empty)
is materialised one engine block at a time, from safetensors files or by its modules' own
initialisation, and trains as the eagerly built model does; peak host memory stays near the
engine's host budget rather than the model's size."""
import os
import subprocess
import sys

import pytest
import torch

import strata
from gpt_model import GPT, batches

HERE = os.path.dirname(os.path.abspath(__file__))


def _train(model, tmp_path, name, **kw):
    (tmp_path / name).mkdir()
    engine = strata.Engine(device_mem="160K", host_mem="400K", nvme=[tmp_path / name])
    model = strata.offload(model, blocks=list(model.blocks), engine=engine, **kw)
    opt = strata.optim.AdamW(model.parameters(), lr=2e-2, max_grad_norm=1.0)
    for micro in batches(3, 1):
        for x, y in micro:
            model(x, y).backward()
        opt.step()
    strata.save_safetensors(model, tmp_path / f"{name}.st")
    return (tmp_path / f"{name}.st").read_bytes()


def test_a_meta_model_loaded_from_sharded_safetensors_trains_as_the_eager_one(tmp_path):
    eager = GPT()
    # the eager model's weights in two shards, as from_pretrained's sharded checkpoints
    shards = tmp_path / "shards"
    shards.mkdir()
    names = [n for n, _ in eager.named_parameters()]
    for i, part in enumerate((names[:len(names) // 2], names[len(names) // 2:])):
        _write(shards / f"model-{i}.safetensors",
               {n: dict(eager.named_parameters())[n] for n in part})
    with strata.init_empty():
        lazy = GPT()
    assert all(p.is_meta for p in lazy.parameters())
    assert _train(lazy, tmp_path, "lazy", weights=shards) == _train(GPT(), tmp_path, "eager")


def test_a_meta_model_is_initialised_by_its_modules(tmp_path):
    with strata.init_empty():
        lazy = GPT()
    model = strata.offload(lazy, blocks=list(lazy.blocks), engine=strata.Engine())
    strata.optim.AdamW(model.parameters())
    w = next(iter(model.parameters()))._strata_offload.gather()
    ln = w["blocks.0.ln_1.weight"]
    assert torch.equal(ln, torch.ones_like(ln))  # LayerNorm.reset_parameters
    fc = w["blocks.1.c_fc.weight"]
    assert fc.std() > 0 and fc.abs().max() <= 1 / 32 ** 0.5  # nn.Linear's kaiming uniform


def test_meta_buffers_and_missing_tensors_are_refused(tmp_path):
    with strata.init_empty():
        m = GPT()
    m.register_buffer("mask", torch.empty(3, device="meta"))
    with pytest.raises(strata.Error, match="buffer 'mask' is on the meta device.*init_empty"):
        strata.offload(m, blocks=list(m.blocks), engine=strata.Engine())
    _write(tmp_path / "w.safetensors", {"wte.weight": GPT().wte.weight})
    with strata.init_empty():
        m = GPT()
    m = strata.offload(m, blocks=list(m.blocks), engine=strata.Engine(),
                       weights=tmp_path / "w.safetensors")
    with pytest.raises(strata.Error, match="no tensor 'wpe.weight'"):
        strata.optim.AdamW(m.parameters())


def _write(path, tensors):
    """A safetensors file of fp32 tensors (strata.save_safetensors' format)."""
    import json
    import struct
    header, blobs, off = {}, [], 0
    for n in sorted(tensors):
        t = tensors[n].detach().float().contiguous()
        header[n] = {"dtype": "F32", "shape": list(t.shape),
                     "data_offsets": [off, off + 4 * t.numel()]}
        blobs.append(t.numpy().tobytes())
        off += 4 * t.numel()
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def _rss_growth(mode, nvme):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE] + [p for p in sys.path if p]))
    r = subprocess.run([sys.executable, os.path.join(HERE, "lazy_rss_child.py"), mode,
                        str(nvme)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    growth, host_mem = map(int, r.stdout.split())
    return growth / host_mem


def test_peak_host_memory_stays_near_the_host_budget_not_the_model_size(tmp_path):
    """A model whose fp32 states are 4 x host_mem (510 MB; states on NVMe) trains one step with
    its peak RSS growth over the runtime at most 1.5 x host_mem (the device budget, 16M, is
    host memory on the CPU device and counts too); built eagerly, the whole model is in
    memory first (2.3 to 2.5 x). Lazily, the engine's budgets are 1.125 x and construction
    ends at 1.17 x under both torches; the first step's backward (torch's own working memory
    for one block) adds 0.11-0.16 x under torch 1.13 and 0.17-0.37 x under torch 2.15, so
    there the bound is 1.6 x. (Before strata returned each materialised block's freed heap to
    the system, construction alone peaked at 1.6-2.0 x under torch 2.15: glibc raises its
    mmap threshold to a freed block's size, and later blocks' freed chunks stayed resident.)
    The child resets the kernel's peak once its runtime is up; measured from getrusage's
    lifetime peak, torch 2.15's import could outgrow the whole run and both growths read 0."""
    for mode in ("lazy", "eager"):
        (tmp_path / mode).mkdir()
    lazy = _rss_growth("lazy", tmp_path / "lazy")
    eager = _rss_growth("eager", tmp_path / "eager")
    bound = 1.5 if torch.__version__.startswith("1.") else 1.6
    assert lazy <= bound and lazy < eager, (lazy, eager)


def test_a_hugging_face_model_on_meta_loads_its_safetensors_and_trains_as_the_eager_one(
        tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2,
                                     n_head=4, use_cache=False)

    def train(model, name, **kw):
        (tmp_path / name).mkdir()
        model = strata.offload(model, blocks=list(model.transformer.h), **kw,
                               engine=strata.Engine(nvme=[tmp_path / name]))
        opt = strata.optim.AdamW(model.parameters(), lr=2e-2, max_grad_norm=1.0)
        torch.manual_seed(1)  # the same dropout masks
        for micro in batches(2, 1):
            for x, _ in micro:
                model(input_ids=x, labels=x).loss.backward()
            opt.step()
        strata.save_safetensors(model, tmp_path / f"{name}.st")
        return (tmp_path / f"{name}.st").read_bytes()

    torch.manual_seed(0)
    eager = transformers.GPT2LMHeadModel(config)
    strata.save_safetensors(eager, tmp_path / "init.safetensors")  # the tied head once
    with strata.init_empty():
        lazy = transformers.GPT2LMHeadModel(config)
    assert lazy.lm_head.weight is lazy.transformer.wte.weight
    got = train(lazy, "lazy", weights=tmp_path / "init.safetensors")
    assert lazy.lm_head.weight is lazy.transformer.wte.weight  # still tied
    assert got == train(eager, "eager")
