"""strata.Engine's options that `strata train` has too, under the CLI's names (its --flag with
"-" as "_"), with the CLI's values and defaults (tools/strata/run_flags.cc):

    speculate="auto"|"on"|"off"        with max_grad_norm: update during backward and redo
    grad_spill="auto"|"on"|"off"       with max_grad_norm and NVMe: gradients to NVMe
    pipeline="on"|"off" (or a bool)    with max_grad_norm: the updates that wait for the norm
                                       run under the next step's forward (opt.step() returns
                                       before they ran; the step commits during the next one)
    state_dtype="fp32"|"bf16"|"bf16-rne"|"int8"  the Adam moments in host memory and on NVMe
    master_dtype="fp32"|"bf16"         the master weights in host memory and on NVMe; bf16 (rounded
                                       stochastically) is the model's bf16 params, so it needs a
                                       bfloat16 model
    io="auto"|"uring"|"posix"          the NVMe backend
    io_block="1M"                      NVMe request size, the swap store's stripe (4K multiple)
    collective_memory="auto"|"device"|"host"  where several ranks gather and reduce
    threads=N                          the CPU optimizer's threads (optimizer_threads)

threads: the CPU optimizer's threads. The default (0) is OMP_NUM_THREADS, else every CPU: on a CUDA
engine the CPU AdamW is the host's main work. On the CPU engine of one rank, where torch's own
OpenMP workers compute the model on the same CPUs, the default starts at the CPUs torch leaves
free, at least 1 (_threads.cpu_engine_threads; 1 where torch takes every CPU, as by default), and
switches to OMP_NUM_THREADS for good once other processes take the CPU (_threads.py). The reason
is libgomp's waiting. The engine's optimizer and torch share one OpenMP runtime (libgomp: torch's
own, or the system's, which the engine loads under the same name). While the process has no more
OpenMP threads than CPUs, an idle worker spins (GOMP_SPINCOUNT, 300000 by default) before it
sleeps, so torch's next operator finds its workers awake. With more (an optimizer team of several
beside torch's), every idle worker spins only 100 times and sleeps, and each of torch's operators
wakes its workers again through the kernel. Issue 27's GPT-2 6 x 384, OMP_NUM_THREADS=2 on 2 idle
cores (bench/PERFORMANCE.md, "Optimizer threads on the CPU engine"): in memory threads=1 took
0.34-0.40 s/step against 0.39-0.44 with threads=2, faster in 3 pairs of 4; with NVMe 0.47-0.51
against 0.55-0.57. The price is on a CPU shared with other busy processes: there torch's spinning
workers take the CPU the others and the engine's threads need. Beside two busy loops threads=1
took 1.41 s/step in memory against 0.96 (plain torch 1.26), and 3.2 with NVMe against 1.37: the
NVMe engine's I/O threads wait for a CPU at every completion. Hence the switch: beside two busy
loops the default engine switches after its first step (1 s or more) and then takes 1.1-1.2
s/step with NVMe, as threads=2. A rank among several (WORLD_SIZE > 1) keeps OMP_NUM_THREADS from
the start: the other ranks on its host are busy processes. threads=N fixes the count (no switch).
"""
from ._sizes import parse_bytes
from ._strata import Error

_TRI = {"auto": 0, "on": 1, "off": 2}
_ONOFF = {"on": True, "off": False}
# (StateFormat, StateRounding)
_STATE = {"fp32": (0, 1), "bf16": (1, 1), "bf16-rne": (1, 0), "int8": (2, 0)}
_MASTER = {"fp32": 0, "bf16": 1}  # MasterFormat (bf16: kBf16Stochastic)
_COLLECTIVE = {"auto": 0, "device": 1, "host": 2}
_IO = ("auto", "uring", "posix")


def _choice(name, value, choices):
    if value not in choices:
        raise Error(f"{name}={value!r}: expected one of {', '.join(map(repr, choices))} "
                    f"(as strata train --{name.replace('_', '-')})")
    return choices[value] if isinstance(choices, dict) else value


def apply_run_flags(config, flags, optimizer_threads):
    """Sets `config` (_strata.EngineConfig) from the CLI-named options in `flags`; returns the
    optimizer's thread count (threads= is the CLI's name for optimizer_threads)."""
    flags = dict(flags)
    config.speculate = _choice("speculate", flags.pop("speculate", "auto"), _TRI)
    config.grad_spill = _choice("grad_spill", flags.pop("grad_spill", "auto"), _TRI)
    pipeline = flags.pop("pipeline", "on")
    config.pipeline = pipeline if isinstance(pipeline, bool) else _choice(
        "pipeline", pipeline, _ONOFF)
    config.state_format, config.state_rounding = _choice(
        "state_dtype", flags.pop("state_dtype", "fp32"), _STATE)
    config.master_format = _choice("master_dtype", flags.pop("master_dtype", "fp32"), _MASTER)
    config.io = _choice("io", flags.pop("io", "auto"), _IO)
    io_block = flags.pop("io_block", None)
    if io_block is not None:
        config.io_block = parse_bytes("io_block", io_block)
        if config.io_block == 0 or config.io_block % 4096:
            raise Error(f"io_block={io_block!r}: expected a multiple of 4K, e.g. \"1M\"")
    config.collective_memory = _choice("collective_memory",
                                       flags.pop("collective_memory", "auto"), _COLLECTIVE)
    threads = flags.pop("threads", None)
    if threads is not None:
        if optimizer_threads and int(threads) != int(optimizer_threads):
            raise Error(f"threads={threads} and optimizer_threads={optimizer_threads}: give one")
        optimizer_threads = int(threads)
    if flags:
        raise Error(f"strata.Engine got unknown options {sorted(flags)}; known besides its own: "
                    "speculate, grad_spill, pipeline, state_dtype, master_dtype, io, io_block, "
                    "collective_memory, threads")
    return optimizer_threads

