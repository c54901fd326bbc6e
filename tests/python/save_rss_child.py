"""For test_hf_reads.py, in its own process: builds a Hugging Face GPT-2 on the meta device whose
weights are 4 x host_mem, offloads it with its states on NVMe (argv[1]), trains one step, then
save_pretrained(argv[2]) with shards of weights / 8, and prints the peak RSS growth of the save
over the peak before it, host_mem, the shard size and the weights' bytes. It then checks every
saved tensor against the engine's committed weights (after the measurement)."""
import json
import os
import resource
import sys

import torch
import transformers
from safetensors import safe_open

import strata


def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(nvme, out):
    torch.set_num_threads(1)
    os.makedirs(nvme, exist_ok=True)
    config = transformers.GPT2Config(vocab_size=256, n_positions=32, n_embd=384, n_layer=16,
                                     n_head=6, use_cache=False)
    with strata.init_empty():
        model = transformers.GPT2LMHeadModel(config)
    weights = 4 * sum(p.numel() for p in model.parameters())
    host_mem = weights // 4
    engine = strata.Engine(device_mem="32M", host_mem=host_mem, nvme=[nvme])
    model = strata.offload(model, blocks=list(model.transformer.h), engine=engine)
    opt = strata.optim.AdamW(model.parameters(), lr=1e-3, max_grad_norm=1.0)
    x = torch.randint(0, 256, (1, 32))
    model(input_ids=x, labels=x).loss.backward()
    opt.step()
    shard = weights // 8
    base = peak()
    model.save_pretrained(out, max_shard_size=shard)
    growth = max(peak() - base, 0)
    print(growth, host_mem, shard, weights)
    state = next(iter(model.parameters()))._strata_offload
    params = dict(model.named_parameters())
    index = json.load(open(os.path.join(out, "model.safetensors.index.json")))
    for name, f in index["weight_map"].items():
        with safe_open(os.path.join(out, f), framework="pt") as r:
            got = r.get_tensor(name)
        assert torch.equal(got, state.committed_value(params[name], "check")), name


if __name__ == "__main__":
    main(*sys.argv[1:])
