"""An offloaded Hugging Face model read, saved, loaded and clipped as a torch user does
(issue: "Fine-tuning the way Hugging Face users do"): state_dict(), save_pretrained() then
from_pretrained(), torch.save, safetensors' save_model, load_state_dict(), parameter counts,
and clip_grad_norm_ never silently dropped. Each is compared with plain torch on the same
model. Skipped where transformers is not installed (tools/bootstrap.sh installs it)."""
import json
import os
import subprocess
import sys

import pytest
import torch

import strata
from gpt_model import batches

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB, SEQ, STEPS, LR, CLIP = 64, 16, 3, 1e-2, 1.0


def make_model(seed=0, layers=3):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32,
                                     n_layer=layers, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0, use_cache=False)
    return transformers.GPT2LMHeadModel(config)


def offloaded(model, nvme=None, clip=CLIP):
    if nvme:
        os.makedirs(nvme, exist_ok=True)
    engine = strata.Engine(nvme=[nvme] if nvme else None)
    model = strata.offload(model, blocks=list(model.transformer.h), engine=engine)
    opt = strata.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0, max_grad_norm=clip)
    return model, opt


def train_steps(model, opt, plain=False):
    """STEPS steps; plain torch clips with clip_grad_norm_ first. Returns the losses."""
    losses = []
    for micro in batches(STEPS, 1, seq=SEQ, vocab=VOCAB):
        for x, _ in micro:
            loss = model(input_ids=x, labels=x).loss
            loss.backward()
            losses.append(loss.item())
        if plain:
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
    return losses


def plain_run():
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0)
    losses = train_steps(model, opt, plain=True)
    return model, losses


def test_state_dict_and_save_pretrained_hold_the_trained_weights(tmp_path):
    """Before the fix every block parameter was saved as a tensor of shape (0,)."""
    torch_model, torch_losses = plain_run()
    model, opt = offloaded(make_model())
    losses = train_steps(model, opt)
    assert losses == pytest.approx(torch_losses, rel=1e-4, abs=1e-5)
    want = torch_model.state_dict()
    got = model.state_dict()
    assert set(got) == set(want)
    for k in want:
        assert got[k].shape == want[k].shape, k
        # atol 1e-4: the key bias gets a gradient of ~0 (softmax ignores it), which Adam turns
        # into +-lr steps whose sign is rounding noise (1e-5 here after 3 steps)
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-4, msg=k)
    # save_pretrained (streamed), then from_pretrained: the same logits as the offloaded model.
    model.save_pretrained(tmp_path / "hf")
    assert (tmp_path / "hf" / "model.safetensors").exists()
    assert (tmp_path / "hf" / "config.json").exists()
    loaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf")
    x = torch.randint(0, VOCAB, (2, SEQ))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=x).logits, model(input_ids=x).logits,
                                   rtol=1e-5, atol=1e-5)
    # torch.save of the state_dict and safetensors' save_model write the real tensors too.
    torch.save(model.state_dict(), tmp_path / "sd.pt")
    back = torch.load(tmp_path / "sd.pt")
    assert all(torch.equal(back[k], got[k]) for k in got)
    safetensors_torch.save_model(model, str(tmp_path / "m.safetensors"))
    plain = make_model(seed=5)
    safetensors_torch.load_model(plain, str(tmp_path / "m.safetensors"))
    for k, v in plain.state_dict().items():
        assert torch.equal(v, got[k]), k


def test_a_sharded_save_pretrained_writes_transformers_index_and_loads(tmp_path):
    model, opt = offloaded(make_model(), nvme=tmp_path / "nvme")
    train_steps(model, opt)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "model-00009-of-00009.safetensors").write_bytes(b"stale")
    (tmp_path / "hf" / "notes.txt").write_text("the user's own file")
    model.save_pretrained(tmp_path / "hf", max_shard_size="40KB")
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2
    assert sorted(f for f in os.listdir(tmp_path / "hf") if f.endswith(".safetensors")) == shards
    assert (tmp_path / "hf" / "notes.txt").read_text() == "the user's own file"
    loaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf")
    want = model.state_dict()
    for k, v in loaded.state_dict().items():
        if k in want:
            assert torch.equal(v, want[k]), k


def test_load_state_dict_writes_into_the_engine():
    other = make_model(seed=3)
    model, opt = offloaded(make_model())
    train_steps(model, opt)
    result = model.load_state_dict(other.state_dict())
    assert not result.missing_keys and not result.unexpected_keys
    x = torch.randint(0, VOCAB, (2, SEQ))
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=x).logits, other(input_ids=x).logits,
                                   rtol=1e-5, atol=1e-5)
    for k, v in other.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    # The next step trains from the loaded weights (the engine holds them, not a copy).
    train_steps(model, opt)
    bad = dict(other.state_dict())
    bad["transformer.h.0.attn.c_attn.weight"] = torch.zeros(3, 3)
    with pytest.raises(RuntimeError, match="size mismatch for transformer.h.0.attn.c_attn"):
        model.load_state_dict(bad)


def test_parameter_counts_and_shapes_tell_the_truth():
    plain = make_model()
    model, _ = offloaded(make_model())
    assert model.num_parameters() == plain.num_parameters()
    assert sum(p.numel() for p in model.parameters()) == sum(
        p.numel() for p in plain.parameters())
    assert [p.shape for p in model.parameters()] == [p.shape for p in plain.parameters()]


def test_clip_grad_norm_is_never_silently_dropped():
    model, opt = offloaded(make_model())
    x = torch.randint(0, VOCAB, (4, SEQ))
    model(input_ids=x, labels=x).loss.backward()
    # torch's own clip_grad_norm_ reads .grad: an error naming what works, not a silent 0.
    with pytest.raises(strata.Error, match=r"max_grad_norm"):
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    with pytest.raises(strata.Error, match=r"max_grad_norm=0.5"):
        strata.clip_grad_norm_(model.parameters(), 0.5)  # not the engine's threshold
    with pytest.raises(strata.Error, match="part of an offloaded model"):
        strata.clip_grad_norm_(list(model.parameters())[:3], CLIP)
    norm = strata.clip_grad_norm_(model.parameters(), CLIP)
    opt.step()
    assert norm.item() == opt.last_grad_norm  # the engine's norm, the same bits
    assert norm.item() > CLIP  # this step clips: the plain run below agrees
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())  # between steps, as torch's
    # The plain torch run's first-step norm (the same model and batch).
    plain = make_model()
    plain(input_ids=x, labels=x).loss.backward()
    want = torch.nn.utils.clip_grad_norm_(plain.parameters(), CLIP)
    assert norm.item() == pytest.approx(want.item(), rel=1e-5)


def test_clip_grad_norm_without_engine_clipping_names_max_grad_norm():
    model, opt = offloaded(make_model(), clip=0.0)
    x = torch.randint(0, VOCAB, (4, SEQ))
    model(input_ids=x, labels=x).loss.backward()
    with pytest.raises(strata.Error, match=r"AdamW\(\.\.\., max_grad_norm=1.0\)"):
        strata.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def test_state_dict_in_the_middle_of_a_step_is_refused():
    model, opt = offloaded(make_model())
    x = torch.randint(0, VOCAB, (4, SEQ))
    model(input_ids=x, labels=x).loss.backward()
    with pytest.raises(strata.Error, match="after opt.step"):
        model.state_dict()
    opt.step()
    model.state_dict()


def test_save_pretrained_of_a_model_4x_the_host_budget_streams(tmp_path):
    """Peak RSS growth of save_pretrained stays within 1.5 x host_mem + one shard (weights
    4 x host_mem, on NVMe); measured in its own process (save_rss_child.py)."""
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # strata, transformers
    r = subprocess.run([sys.executable, os.path.join(HERE, "save_rss_child.py"),
                        str(tmp_path / "nvme"), str(tmp_path / "hf")], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    growth, host_mem, shard, weights = map(int, r.stdout.split())
    assert weights >= 4 * host_mem
    assert growth <= 1.5 * host_mem + shard, (growth, host_mem, shard)
    index = json.loads((tmp_path / "hf" / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] >= weights * 0.99


def make_llama(seed=0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=3, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=SEQ,
                                      use_cache=False, tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(config)


def test_a_llama_trains_saves_and_loads_as_torch(tmp_path):
    plain = make_llama()
    popt = torch.optim.AdamW(plain.parameters(), lr=LR, weight_decay=0.0)
    want_losses = train_steps(plain, popt, plain=True)
    model = make_llama()
    strata.offload(model, blocks=list(model.model.layers), engine=strata.Engine())
    opt = strata.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0, max_grad_norm=CLIP)
    assert model.num_parameters() == plain.num_parameters()
    losses = train_steps(model, opt)
    assert losses == pytest.approx(want_losses, rel=1e-4, abs=1e-5)
    got = model.state_dict()
    for k, v in plain.state_dict().items():
        torch.testing.assert_close(got[k], v, rtol=1e-4, atol=1e-4, msg=k)
    model.save_pretrained(tmp_path / "llama", max_shard_size="30KB")
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "llama")
    x = torch.randint(0, VOCAB, (2, SEQ))
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=x).logits, model(input_ids=x).logits,
                                   rtol=1e-5, atol=1e-5)


def test_load_state_dict_into_an_nvme_engine_writes_all_or_nothing(tmp_path):
    """Each module's post-hook committed what it had loaded: on an engine with NVMe folders
    the second commit of a step was refused (CommitParams: step N is already committed), so
    load_state_dict raised there, after part of the model was written; now one call writes all
    or nothing, and the next step commits it."""
    other = make_model(seed=3)
    model, opt = offloaded(make_model(), nvme=str(tmp_path / "nvme"))
    train_steps(model, opt)
    model.load_state_dict(other.state_dict())
    for k, v in other.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    with pytest.raises(strata.Error, match="commits the loaded weights with the next step"):
        strata.save_checkpoint(model, str(tmp_path / "ck"), optimizer=opt)
    # A size mismatch in the last block: torch raises, and no block took the new values.
    before = {k: v.clone() for k, v in model.state_dict().items()}
    third = make_model(seed=4).state_dict()
    third["transformer.h.2.mlp.c_fc.weight"] = torch.zeros(3, 3)
    with pytest.raises(RuntimeError, match="size mismatch for transformer.h.2.mlp.c_fc"):
        model.load_state_dict(third)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    # A block's own load_state_dict (its keys without the model's prefix).
    block = make_model(seed=5).transformer.h[1].state_dict()
    model.transformer.h[1].load_state_dict(block)
    for k, v in block.items():
        assert torch.equal(model.transformer.h[1].state_dict()[k], v), k
    # The next step trains from them and commits them: a resumed engine starts there.
    train_steps(model, opt)
    strata.save_checkpoint(model, str(tmp_path / "ck"), optimizer=opt)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    model.transformer.h[0].forward.state.engine.close()
    resumed = make_model(seed=9)
    engine = strata.Engine(nvme=[str(tmp_path / "nvme")], resume=True)
    resumed = strata.offload(resumed, blocks=list(resumed.transformer.h), engine=engine)
    strata.optim.AdamW(resumed.parameters(), lr=LR, weight_decay=0.0, max_grad_norm=CLIP)
    for k in want:
        assert torch.equal(resumed.state_dict()[k], want[k]), k
