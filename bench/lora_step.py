#!/usr/bin/env python3
"""LoRA on a frozen base streamed from NVMe (issue 41's benchmark): seconds per step of an HF
Llama-architecture model whose bf16 base is >= 4 x the engine's host budget, built on the
meta device (strata.init_empty) and read in place from its safetensors file (weights=), with
peft LoRA adapters on the attention projections trained by strata.optim.AdamW, against its
bound, all measured in the same run:

    bound = max(compute, base bytes read per step / fio's sequential O_DIRECT read rate)

  compute: the same model's step with plain torch + peft, the base in memory: the same ops
           as the offloaded step with recompute=False (the default here; with --recompute
           True the offloaded step also recomputes each block's forward);
  bytes read per step: what the frozen store read (state.frozen_bytes_read());
  fio: 1 MiB reads at queue depth 32, io_uring, O_DIRECT, on the base file itself.

Also checked: the engine's NVMe writes per step equal the adapters' states (master, exp_avg,
exp_avg_sq: 12 bytes a value of the engine's padded blocks), i.e. nothing of the base. Rounds
alternate (fio, plain step, offloaded step) so drift on a shared machine hits all alike;
medians of --steps rounds after --warmup.

DeepSpeed ZeRO-3 offload + peft on the same model (--deepspeed nvme|cpu, default nvme where
deepspeed imports): the base from the same safetensors file (from_pretrained, bf16), the same
LoRA, DeepSpeed's bf16 mode (its usual peft set-up: bf16 weights, fp32 master in its CPU Adam),
offload_param and offload_optimizer to --deepspeed's device (for nvme: a swap buffer for each
swapped weight, which peft needs, and stage3_prefetch_bucket_size 0), clipping 1.0,
DS_ACCELERATOR=cpu over gloo with world size 1. It runs in a child process (its own torch.distributed and
accelerator) that steps when the parent asks, so each round also times one DeepSpeed step.
Where deepspeed does not import (STRATA_DEEPSPEED=1 tools/bootstrap.sh installs it into the
torch-matrix venv: run this script with that venv's python) or its engine fails, the reason is
printed, DeepSpeed's own error text included.

    OMP_NUM_THREADS=2 PYTHONPATH=build/release/python /usr/bin/python3 bench/lora_step.py \\
        --folder /var/tmp/lora_bench
    OMP_NUM_THREADS=2 PYTHONPATH=build/release/python \\
        ~/.cache/strata/venv-torch-matrix/bin/python bench/lora_step.py --deepspeed nvme
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import torch

import strata

_PYDEPS = os.path.join(os.path.expanduser("~/.cache"), "strata", "pydeps")
if os.path.isdir(_PYDEPS) and _PYDEPS not in sys.path:
    sys.path.append(_PYDEPS)
import peft  # noqa: E402
import transformers  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
_DS_MARK = "@lora_step.ds "  # the DeepSpeed child's replies, among DeepSpeed's own stdout


def config(args):
    return transformers.LlamaConfig(vocab_size=args.vocab, hidden_size=args.dim,
                                    intermediate_size=args.ffn, num_hidden_layers=args.layers,
                                    num_attention_heads=args.heads,
                                    num_key_value_heads=args.heads,
                                    max_position_embeddings=args.seq, use_cache=False)


def lora(model, args):
    return peft.get_peft_model(model, peft.LoraConfig(r=args.rank, lora_alpha=2 * args.rank,
                                                      lora_dropout=0.0, target_modules=TARGETS))


def write_base(args, folder):
    """The base, bf16, saved by save_pretrained into folder/base (one safetensors file)."""
    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM(config(args)).to(torch.bfloat16)
    base.save_pretrained(os.path.join(folder, "base"), max_shard_size="100GB")
    block_bytes = sum(p.numel() * p.element_size() for p in base.model.layers.parameters())
    return base, block_bytes


def fio_read_rate(path, size):
    """fio's sequential read rate (bytes/s) of `path`: 1 MiB, qd 32, io_uring, O_DIRECT."""
    out = subprocess.run(["fio", "--name=r", f"--filename={path}", "--rw=read", "--bs=1M",
                          "--iodepth=32", "--ioengine=io_uring", "--direct=1", "--readonly",
                          f"--size={size // (1 << 20) << 20}", "--output-format=json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["jobs"][0]["read"]["bw_bytes"]


def plain_side(base, args):
    model = lora(base, args)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

    def step(x):
        model(input_ids=x, labels=x).loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        opt.step()
        opt.zero_grad()
    return step


def strata_side(args, folder):
    engine_dir = os.path.join(folder, "engine")
    os.makedirs(engine_dir)
    with strata.init_empty():
        model = transformers.LlamaForCausalLM(config(args))
    model = lora(model.to(torch.bfloat16), args)
    engine = strata.Engine(nvme=[engine_dir], host_mem=args.host_mem)
    strata.offload(model, blocks=model.base_model.model.model.layers, engine=engine,
                   weights=os.path.join(folder, "base"), recompute=args.recompute)
    opt = strata.optim.AdamW(model.parameters(), lr=1e-4, max_grad_norm=1.0)
    state = engine._model

    def step(x):
        read = state.frozen_bytes_read()
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        return state.frozen_bytes_read() - read
    return step, engine, state, engine_dir


def deepspeed_engine(args, folder):
    """DeepSpeed ZeRO-3 + offload + peft LoRA on the base in folder/base (the child's side)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    for k, v in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29518"), ("RANK", "0"),
                 ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(k, v)
    import deepspeed
    base = transformers.LlamaForCausalLM.from_pretrained(os.path.join(folder, "base"),
                                                         torch_dtype=torch.bfloat16)
    model = lora(base, args)
    if args.deepspeed == "nvme":
        nvme = os.path.join(folder, "ds_nvme")
        os.makedirs(nvme, exist_ok=True)
        # buffer_count: with peft, DeepSpeed keeps the frozen weights it swaps in (those over its
        # param_persistence_threshold, 1e5 values) in their swap buffers, so it needs a buffer
        # for about each of them: the default 5 fails the second step of a 2-layer model, 16
        # the 8-layer default ("AssertionError: Not enough buffers 0 for swapping 1"), 64 runs
        # (58 such weights). stage3_prefetch_bucket_size 0: DeepSpeed #3062.
        largest = max(p.numel() for p in model.parameters())
        swapped = sum(p.numel() > 100_000 for p in model.parameters())
        offload = {"device": "nvme", "nvme_path": nvme}
        zero = {"offload_param": dict(offload, buffer_count=swapped + 8, buffer_size=largest),
                "stage3_prefetch_bucket_size": 0}
    else:
        offload = {"device": "cpu"}
        zero = {"offload_param": dict(offload)}
    zero.update(stage=3, offload_optimizer=dict(offload))
    config = {"train_micro_batch_size_per_gpu": args.batch, "gradient_accumulation_steps": 1,
              "gradient_clipping": 1.0, "bf16": {"enabled": True}, "zero_optimization": zero,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.0}}}
    deepspeed.init_distributed(dist_backend="gloo")
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
        config=config)

    def step(x):
        loss = engine(input_ids=x, labels=x).loss
        engine.backward(loss)
        engine.step()
        return loss.item()
    return step


def deepspeed_child(args, folder):
    """--ds-child: builds the DeepSpeed side, prints "ready", then one JSON line of seconds and
    loss for each line read from stdin (marked: DeepSpeed logs to stdout too)."""
    step = deepspeed_engine(args, folder)
    x = batch(args)
    print(_DS_MARK + json.dumps({"ready": True}), flush=True)
    for _ in sys.stdin:
        t = time.perf_counter()
        loss = step(x)
        print(_DS_MARK + json.dumps({"s": time.perf_counter() - t, "loss": loss}), flush=True)


class DeepSpeedSide:
    """The parent's handle on the --ds-child process; `error` holds why it is not running."""

    def __init__(self, args, folder):
        self.proc, self.error, self.seconds = None, None, []
        if args.deepspeed == "none":
            self.error = "not run (--deepspeed none)"
            return
        probe = subprocess.run([sys.executable, "-c", "import deepspeed"], capture_output=True,
                               text=True, env=dict(os.environ, DS_ACCELERATOR="cpu"))
        if probe.returncode != 0:
            last = (probe.stderr.strip().splitlines() or ["(no message)"])[-1]
            self.error = (f"not run: deepspeed does not import under {sys.executable} ({last}); "
                          "STRATA_DEEPSPEED=1 tools/bootstrap.sh installs it into the "
                          "torch-matrix venv")
            return
        self.log = tempfile.TemporaryFile(mode="w+")
        cmd = [sys.executable, os.path.abspath(__file__), "--ds-child", "--folder", folder]
        cmd += [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
                if k in ("layers", "dim", "ffn", "heads", "vocab", "seq", "batch", "rank",
                         "deepspeed")]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True,
                                     env=dict(os.environ, DS_ACCELERATOR="cpu"))
        self._read()

    def _read(self):
        for line in self.proc.stdout:
            if line.startswith(_DS_MARK):
                return json.loads(line[len(_DS_MARK):])
        self.proc.wait()
        self.log.seek(0)
        err = self.log.read().strip().splitlines()
        tail = [ln for ln in err if "Error" in ln or "error" in ln][-3:] or err[-3:]
        self.error = (f"failed (exit {self.proc.returncode}): " + " | ".join(tail))
        self.proc = None
        return None

    def step(self, record):
        if self.proc is None:
            return
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        r = self._read()
        if r is not None and record:
            self.seconds.append(r["s"])

    def close(self):
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait()


def batch(args):
    return torch.randint(0, args.vocab, (args.batch, args.seq),
                         generator=torch.Generator().manual_seed(1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--folder", help="a folder on the NVMe drive (default: under /var/tmp)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=2816)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--host-mem", default="40M")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--recompute", default="False", choices=["False", "True", "auto"],
                    help="offload(recompute=...); False (the default) computes what plain "
                         "torch computes, so that its step is the compute bound")
    ap.add_argument("--deepspeed", default="nvme", choices=["nvme", "cpu", "none"],
                    help="DeepSpeed ZeRO-3 + peft beside it, offload_param and "
                         "offload_optimizer to this device (where deepspeed imports)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--ds-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.recompute = {"False": False, "True": True}.get(args.recompute, args.recompute)
    if args.ds_child:
        return deepspeed_child(args, args.folder)
    own = args.folder is None
    folder = tempfile.mkdtemp(prefix="strata_lora_", dir="/var/tmp") if own else args.folder
    os.makedirs(folder, exist_ok=True)
    try:
        run(args, folder)
    finally:
        if own:
            shutil.rmtree(folder, ignore_errors=True)


def run(args, folder):
    host_mem = strata._sizes.parse_bytes("host_mem", args.host_mem)
    base, block_bytes = write_base(args, folder)
    base_file = os.path.join(folder, "base", "model.safetensors")
    plain = plain_side(base, args)  # the base in memory, as plain torch holds it
    step, engine, state, engine_dir = strata_side(args, folder)
    ds = DeepSpeedSide(args, folder)
    x = batch(args)
    rows = {"fio_read_Bps": [], "plain_s": [], "strata_s": [], "read_B": []}
    for i in range(args.warmup + args.steps):
        rate = fio_read_rate(base_file, os.path.getsize(base_file))
        t = time.perf_counter()
        plain(x)
        plain_s = time.perf_counter() - t
        t = time.perf_counter()
        read = step(x)
        strata_s = time.perf_counter() - t
        ds.step(record=i >= args.warmup)
        if i >= args.warmup:
            for k, v in zip(rows, (rate, plain_s, strata_s, read)):
                rows[k].append(v)
    ds.close()
    engine.flush()
    stats = engine.step_stats()[args.warmup:]
    padded = sum(p for *_, p in state._layout)
    writes = [s["bytes"]["nvme_write"] for s in stats]
    med = {k: statistics.median(v) for k, v in rows.items()}
    io_bound = med["read_B"] / med["fio_read_Bps"]
    bound = max(med["plain_s"], io_bound)
    trainable = sum(p.numel() for _, p in state.trainable_params())
    out = {
        "base_block_bytes": block_bytes, "host_mem": host_mem,
        "base_over_host_mem": block_bytes / host_mem, "trainable": trainable,
        "fio_read_MBps": med["fio_read_Bps"] / 1e6, "read_per_step_MB": med["read_B"] / 1e6,
        "io_bound_s": io_bound, "compute_s": med["plain_s"], "step_s": med["strata_s"],
        "bound_s": bound, "ratio": med["strata_s"] / bound,
        "nvme_write_per_step": statistics.median(writes) if writes else None,
        "adapter_states_bytes": 12 * padded,
        "frozen_store_in_engine_folder": os.path.exists(
            os.path.join(engine_dir, "strata.frozen.rank0")),
        "deepspeed": ds.error or f"ZeRO-3, offload_param + offload_optimizer to "
                                  f"{args.deepspeed}, bf16, peft LoRA",
        "deepspeed_step_s": statistics.median(ds.seconds) if ds.seconds else None,
    }
    if out["deepspeed_step_s"]:
        out["strata_over_deepspeed"] = med["strata_s"] / out["deepspeed_step_s"]
    if args.json:
        print(json.dumps(out))
        return
    print(f"# HF Llama {args.layers}x{args.dim} ffn {args.ffn} vocab {args.vocab}, bf16 base "
          f"{block_bytes / 1e6:.0f} MB in the blocks = {out['base_over_host_mem']:.1f} x "
          f"host_mem ({host_mem / 1e6:.0f} MB); LoRA r={args.rank} on {','.join(TARGETS)} "
          f"({trainable} values); seq {args.seq} batch {args.batch}; folder {folder}")
    print(f"# medians of {args.steps} rounds after {args.warmup} (fio, plain, strata)")
    print("fio_read_MBps  read_MB/step  io_bound_s  compute_s  bound_s  step_s  ratio  "
          "nvme_write_B/step  adapter_states_B  #wrong")
    wrong = int(out["nvme_write_per_step"] != out["adapter_states_bytes"]) + int(
        out["frozen_store_in_engine_folder"])
    print(f"{out['fio_read_MBps']:13.0f}  {out['read_per_step_MB']:12.1f}  "
          f"{io_bound:10.3f}  {med['plain_s']:9.3f}  {bound:7.3f}  {med['strata_s']:6.3f}  "
          f"{out['ratio']:5.2f}  {out['nvme_write_per_step']:17}  "
          f"{out['adapter_states_bytes']:16}  {wrong:6}")
    print(f"# deepspeed ZeRO-3 offload + peft: {out['deepspeed']}")
    if out["deepspeed_step_s"]:
        print(f"# deepspeed step_s {out['deepspeed_step_s']:.3f} (median of "
              f"{len(ds.seconds)}); strata / deepspeed = {out['strata_over_deepspeed']:.2f}")


if __name__ == "__main__":
    main()
