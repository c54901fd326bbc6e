"""For test_lazy.py, in its own process: builds a GPT whose fp32 states (master, exp_avg,
exp_avg_sq) are 4 x host_mem, eagerly or on the meta device (argv[1]: eager|lazy), offloads it
with its states on NVMe (argv[2]), trains one step and prints peak RSS growth over the Python
runtime (torch and strata imported and a small model's step run) and host_mem, in bytes.

The peak is the kernel's VmHWM, reset to the current RSS once the runtime is up (clear_refs 5):
getrusage's ru_maxrss cannot be reset, and under torch 2.15 the import alone can peak above
the whole measured run (file-backed library pages, later dropped), which made every growth 0."""
import resource
import sys

import torch

import strata
from gpt_model import GPT


def _status_kib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {key}")


def reset_peak():
    """Resets the peak to the current RSS and returns that RSS in bytes; without clear_refs
    (not Linux, or not allowed) falls back to the lifetime peak."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _status_kib("VmRSS") * 1024
    except OSError:
        return peak()


def peak():
    try:
        return _status_kib("VmHWM") * 1024
    except (OSError, RuntimeError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(mode, nvme):
    torch.set_num_threads(1)
    x = torch.randint(0, 64, (1, 16))
    # The runtime: a small model's step first, so that the code torch and strata page in on
    # first use (oneDNN, the engine's threads) is counted in it, not in the growth.
    small = GPT()
    small = strata.offload(small, blocks=list(small.blocks), engine=strata.Engine())
    opt = strata.optim.AdamW(small.parameters())
    small(x, x).backward()
    opt.step()
    base = reset_peak()
    dim, layers = 384, 24  # 1.77M parameters a block, 42.5M in all: 510 MB of fp32 states
    if mode == "lazy":
        with strata.init_empty():
            model = GPT(dim=dim, layers=layers, heads=6)
    else:
        model = GPT(dim=dim, layers=layers, heads=6)
    states = 12 * sum(p.numel() for p in model.parameters())
    host_mem = states // 4
    engine = strata.Engine(device_mem="16M", host_mem=host_mem, nvme=[nvme])
    model = strata.offload(model, blocks=list(model.blocks), engine=engine)
    opt = strata.optim.AdamW(model.parameters(), lr=1e-3)
    model(x, x).backward()
    opt.step()
    print(peak() - base, host_mem)


if __name__ == "__main__":
    main(*sys.argv[1:])
