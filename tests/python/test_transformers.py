"""strata.offload on a Hugging Face model: GPT2LMHeadModel(GPT2Config(...)), randomly initialised,
its blocks (model.transformer.h) in the engine, trained as a user calls it,
model(input_ids=x, labels=x).loss. The blocks are called with keyword arguments (an attention
mask tensor, flags) and return a tuple (transformers 4: with the default use_cache=True, a
nested (key, value) tuple) or a tensor (transformers 5, which passes every block one mutable
DynamicCache). Skipped where transformers is not installed (tools/bootstrap.sh installs it)."""
import inspect
import os
import subprocess
import sys

import pytest
import torch

import strata
from gpt_model import batches, param_groups

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

STEPS, MICRO, CLIP, LR, WD = 8, 2, 1.0, 1e-2, 0.1
VOCAB, SEQ = 64, 16


def make_model(dropout=0.0, **config):
    """A 3-layer GPT-2, randomly initialised (seeded), in training mode."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=3,
                                     n_head=4, resid_pdrop=dropout, embd_pdrop=dropout,
                                     attn_pdrop=dropout, **config)
    return transformers.GPT2LMHeadModel(config)


def train(engine=None, dropout=0.0, mask=False, **config):
    """STEPS steps of MICRO micro-batches: offloaded into `engine`, or plain torch (AdamW after
    clip_grad_norm_) when engine is None. Returns the model, every micro-batch's loss, and the
    engine's stats per step."""
    model = make_model(dropout, **config)
    if engine is not None:
        model = strata.offload(model, blocks=list(model.transformer.h), engine=engine,
                               micro_batches=MICRO, recompute=True)
        opt = strata.optim.AdamW(param_groups(model, WD), lr=LR, betas=(0.9, 0.95), eps=1e-8,
                                 max_grad_norm=CLIP)
    else:
        opt = torch.optim.AdamW(param_groups(model, WD), lr=LR, betas=(0.9, 0.95), eps=1e-8)
    losses, stats = [], []
    for micro in batches(STEPS, MICRO, seq=SEQ, vocab=VOCAB):
        step_loss = []
        for x, _ in micro:  # the model shifts the labels itself
            kw = {"attention_mask": torch.ones_like(x)} if mask else {}
            loss = model(input_ids=x, labels=x, **kw).loss
            (loss / MICRO).backward()
            step_loss.append(loss.item())
        if engine is None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
        losses.append(step_loss)
        if engine is not None:
            stats.extend(engine.step_stats())  # with clipping: the step before, committed now
    if engine is not None:
        engine.flush()  # the last step commits
        stats.extend(engine.step_stats())
    return model, losses, stats


def tiny_engine(tmp_path):
    """Budgets under the model's size (a block's parameters are 50 KiB, its states 150 KiB):
    the states live on NVMe and the blocks are fetched again for backward."""
    nvme = [tmp_path / "d0", tmp_path / "d1"]
    for d in nvme:
        d.mkdir()
    return strata.Engine(device="cpu", device_mem="160K", host_mem="400K", nvme=nvme)


def assert_close(ours, theirs):
    for a_step, b_step in zip(ours, theirs):
        for a, b in zip(a_step, b_step):
            assert abs(a - b) <= 1e-4 * abs(b), (ours, theirs)


@pytest.mark.parametrize("dropout, mask, config", [
    (0.0, False, {"use_cache": False}),
    (0.1, True, {}),  # GPT2Config's defaults: dropout 0.1, blocks return the key/value cache
], ids=["no-dropout-no-cache", "defaults-dropout-and-mask"])
def test_gpt2_offloaded_equals_in_memory_bit_for_bit_and_torch_within_1e4(tmp_path, dropout,
                                                                           mask, config):
    m_off, off, stats = train(tiny_engine(tmp_path), dropout, mask, **config)
    m_mem, mem, _ = train(strata.Engine(device="cpu"), dropout, mask, **config)
    m_ref, ref, _ = train(None, dropout, mask, **config)
    assert off == mem  # every micro-batch's loss, bit for bit
    # Every step reads NVMe; its updates' writes land under the next step (pipelined).
    assert all(s["bytes"]["nvme_read"] > 0 for s in stats)
    assert all(s["bytes"]["nvme_write"] > 0 for s in stats[1:])
    assert all(s["peak_device_bytes"] <= 160 * 1024 for s in stats)
    assert len(off) == len(ref) == STEPS
    assert_close(off, ref)  # the same dropout masks as torch's
    assert sum(off[-1]) < sum(off[0]) - 0.2  # it learned
    a, b = tmp_path / "off.safetensors", tmp_path / "mem.safetensors"
    strata.save_safetensors(m_off, a)
    strata.save_safetensors(m_mem, b)
    assert a.read_bytes() == b.read_bytes()


def test_gpt2_head_stays_tied_and_saved_weights_load_with_from_pretrained(tmp_path):
    """The tied head is one parameter to the engine (held with the embeddings outside the
    blocks); it stays tied, is written once, and transformers loads the file back as a model
    that computes what the plain torch run's model computes."""
    model, _, _ = train(tiny_engine(tmp_path), use_cache=False)
    ref, _, _ = train(None, use_cache=False)
    assert model.lm_head.weight is model.transformer.wte.weight
    out = tmp_path / "gpt2"
    model.config.save_pretrained(out)
    strata.save_safetensors(model, out / "model.safetensors")
    got = safetensors_torch.load_file(out / "model.safetensors")
    assert set(got) == {n for n, _ in ref.named_parameters()}  # lm_head.weight is not written
    assert "lm_head.weight" not in got and "transformer.wte.weight" in got
    # {"format": "pt"}, without which transformers < 4.49's from_pretrained fails
    with safetensors_torch.safe_open(out / "model.safetensors", framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
    loaded = transformers.GPT2LMHeadModel.from_pretrained(out)  # eval mode, no dropout
    assert loaded.lm_head.weight is loaded.transformer.wte.weight
    for n, p in loaded.named_parameters():
        assert torch.equal(p, got[n]), n
    ref.eval()
    (x, _), = next(batches(1, 1, seq=SEQ, vocab=VOCAB, seed=7))
    with torch.no_grad():
        a = loaded(input_ids=x, labels=x).loss.item()
        b = ref(input_ids=x, labels=x).loss.item()
    assert abs(a - b) <= 1e-4 * abs(b), (a, b)


def test_gpt2_gradient_checkpointing_is_refused_as_not_needed():
    model = make_model()
    # transformers 5 renames it (the old name warns, and goes in 6)
    enable = (getattr(model, "activation_checkpointing_enable", None)
              or model.gradient_checkpointing_enable)
    enable()
    model = strata.offload(model, blocks=list(model.transformer.h), engine=strata.Engine())
    strata.optim.AdamW(model.parameters(), lr=LR)
    (x, _), = next(batches(1, 1, seq=SEQ, vocab=VOCAB))
    with pytest.raises(strata.Error, match="gradient_checkpointing_disable"):
        model(input_ids=x, labels=x)


def test_gpt2_key_value_cache_holding_positions_is_refused():
    """A block appends to the key/value cache it is given (transformers 5: one DynamicCache
    for all blocks, use_cache=True by default); the layer gives the blocks none, which for an
    empty cache computes the same (the defaults test above). A cache that already holds
    positions would change the result, so it is refused."""
    (x, _), = next(batches(1, 1, seq=SEQ // 2, vocab=VOCAB))
    with torch.no_grad():
        past = make_model()(input_ids=x, use_cache=True).past_key_values
    if isinstance(past, tuple):
        pytest.skip(f"transformers {transformers.__version__} passes tuples, not a Cache")
    model = make_model()
    model = strata.offload(model, blocks=list(model.transformer.h), engine=strata.Engine())
    strata.optim.AdamW(model.parameters(), lr=LR)
    # transformers 5 renames the argument (past_key_values warns, and goes in 5.40)
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    with pytest.raises(strata.Error, match=f"already holds {SEQ // 2} positions.*use_cache=False"):
        model(input_ids=x, labels=x, **{name: past})


def test_example_trains_offloaded_and_saves_what_from_pretrained_loads(tmp_path):
    """examples/train_hf_gpt2.py: states on NVMe, the loss falls, the saved folder loads."""
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, os.path.join(root, "examples", "train_hf_gpt2.py"),
                        "--data", os.path.join(root, "README.md"), "--steps", "8", "--dim", "32",
                        "--layers", "2", "--seq", "32", "--batch", "4", "--host-mem", "300K",
                        "--nvme", str(tmp_path / "run"), "--out", str(tmp_path / "out")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    steps = [line.split() for line in r.stdout.splitlines() if line.startswith("step ")]
    assert [int(s[1]) for s in steps] == list(range(1, 9))
    assert all(float(s[s.index("read") + 1]) > 0 for s in steps)  # nvme read, MiB
    assert float(steps[-1][3]) < float(steps[0][3]) - 0.2
    assert "from_pretrained loads it: eval loss" in r.stdout
    got = safetensors_torch.load_file(tmp_path / "out" / "model.safetensors")
    assert got["transformer.wte.weight"].shape == (256, 32) and "lm_head.weight" not in got
