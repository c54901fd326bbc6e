"""`strata export` of a 2-rank `strata train` store as a Hugging Face folder: transformers'
GPT2LMHeadModel.from_pretrained loads it (config.json, sharded model.safetensors with its
index), its logits equal those of a GPT2LMHeadModel holding the weights `--save` wrote (bit for
bit), and it generates the text `strata generate` does from those weights. Skipped where
transformers is not installed (tools/bootstrap.sh installs it) or the CLI is not built."""
import json
import os
import subprocess

import pytest
import torch

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
STRATA = os.environ.get("STRATA_CLI") or os.path.join(ROOT, "build", "release", "tools", "strata")
LAYERS, DIM, HEADS, SEQ, VOCAB = 2, 64, 2, 32, 256
PROMPT = "The engine "

pytestmark = pytest.mark.skipif(not os.access(STRATA, os.X_OK),
                                reason=f"no strata binary at {STRATA} (set STRATA_CLI)")


def _strata(*args):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    r = subprocess.run([STRATA, *args], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 2-rank run's stores and the weights its --save wrote."""
    tmp = tmp_path_factory.mktemp("export")
    nvme, saved = str(tmp / "nvme" / "{rank}"), str(tmp / "saved.safetensors")
    _strata("launch", "-n", "2", "--", STRATA, "train", "--layers", str(LAYERS), "--d-model",
            str(DIM), "--heads", str(HEADS), "--seq-len", str(SEQ), "--batch", "4", "--steps",
            "20", "--lr", "3e-3", "--threads", "1", "--data", os.path.join(ROOT, "README.md"),
            "--nvme", nvme, "--save", saved)
    return tmp, nvme, saved


def test_hf_folder_loads_with_from_pretrained_and_gives_the_saved_models_logits(run):
    tmp, nvme, saved = run
    out = tmp / "hf"
    _strata("export", nvme, "--out", str(out), "--max-shard-size", "200K")
    assert (out / "model.safetensors.index.json").exists()  # sharded
    loaded = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    assert loaded.lm_head.weight is loaded.transformer.wte.weight

    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=DIM,
                                     n_layer=LAYERS, n_head=HEADS)
    want = transformers.GPT2LMHeadModel(config).eval()
    missing, unexpected = want.transformer.load_state_dict(safetensors_torch.load_file(saved),
                                                           strict=False)
    assert not unexpected and all(".attn.bias" in n or "masked_bias" in n for n in missing)
    x = torch.randint(0, VOCAB, (3, SEQ), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        got_logits, want_logits = loaded(input_ids=x).logits, want(input_ids=x).logits
    assert torch.equal(got_logits, want_logits)


def test_hf_folder_generates_what_strata_generate_does(run):
    tmp, nvme, saved = run
    out = tmp / "hf-one"
    _strata("export", nvme, "--out", str(out))
    loaded = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    tokens = 16
    text = _strata("generate", "--init", saved, "--prompt", PROMPT, "--tokens", str(tokens),
                   "--threads", "1")
    ids = list(PROMPT.encode())
    with torch.no_grad():  # greedy, one token at a time (generate() needs a newer torch here)
        for _ in range(tokens):
            logits = loaded(input_ids=torch.tensor([ids[-SEQ:]])).logits[0, -1]
            ids.append(int(torch.argmax(logits)))
    hf_text = bytes(ids).decode("utf-8", errors="replace")
    assert hf_text == text.rstrip("\n"), (hf_text, text)


def test_hf_folder_computes_the_loss_strata_eval_does(run):
    """The logits of strata's own model (C++), seen through `strata eval`'s loss over one
    window: the held-out split of a 330-byte file is its last 33 bytes, 32 predictions."""
    tmp, nvme, saved = run
    out = tmp / "hf-eval"
    _strata("export", nvme, "--out", str(out))
    loaded = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    with open(os.path.join(ROOT, "README.md"), "rb") as f:
        data = f.read(330)
    (tmp / "d.txt").write_bytes(data)
    r = json.loads(_strata("eval", "--init", saved, "--data", str(tmp / "d.txt"), "--seq-len",
                           str(SEQ), "--threads", "1", "--json", "-"))
    assert r["held_out_begin"] == 297 and r["tokens"] == SEQ
    x = torch.tensor(list(data[297:]))  # 33 tokens: 32 inputs (wpe's rows), 32 targets
    with torch.no_grad():
        logits = loaded(input_ids=x[None, :SEQ]).logits[0]
        loss = torch.nn.functional.cross_entropy(logits, x[1:]).item()
    assert abs(loss - r["loss"]) <= 1e-5 * r["loss"], (loss, r["loss"])
