"""strata.Engine's options that `strata train` has too, under the CLI's names (its --flag with
"-" as "_"), with the CLI's values and defaults (tools/strata/run_flags.cc):

    speculate="auto"|"on"|"off"        with max_grad_norm: update during backward and redo
    grad_spill="auto"|"on"|"off"       with max_grad_norm and NVMe: gradients to NVMe
    pipeline="on"|"off" (or a bool)    with max_grad_norm: the updates that wait for the norm
                                       run under the next step's forward (opt.step() returns
                                       before they ran; the step commits during the next one)
    state_dtype="fp32"|"bf16"|"bf16-rne"  the Adam moments in host memory and on NVMe
    io="auto"|"uring"|"posix"          the NVMe backend
    io_block="1M"                      NVMe request size, the swap store's stripe (4K multiple)
    collective_memory="auto"|"device"|"host"  where several ranks gather and reduce
    threads=N                          the CPU optimizer's threads (optimizer_threads)

threads: the default (0) is OMP_NUM_THREADS, else every CPU, as many as torch's. On a CPU
engine keep it so. The engine's optimizer and torch share one OpenMP runtime (libgomp: torch's
own, or the system's, which the engine loads under the same name), and libgomp's idle workers
spin for a long while (GOMP_SPINCOUNT 300000) unless the process has more OpenMP threads than
CPUs, when they spin 1000 times and sleep. The default puts it over, so torch's workers yield to
the engine's NVMe, lander and optimizer threads; threads=1 with torch on every CPU leaves them
spinning against those: issue 27's GPT-2 6 x 384 on NVMe, OMP_NUM_THREADS=2 on 2 cores, took
4.1-12 s/step instead of 0.9-1.4 (the same losses; with GOMP_SPINCOUNT=1000 in the
environment threads=1 took 0.83).
"""
from ._sizes import parse_bytes
from ._strata import Error

_TRI = {"auto": 0, "on": 1, "off": 2}
_ONOFF = {"on": True, "off": False}
_STATE = {"fp32": (0, 1), "bf16": (1, 1), "bf16-rne": (1, 0)}  # (StateFormat, StateRounding)
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
                    "speculate, grad_spill, pipeline, state_dtype, io, io_block, "
                    "collective_memory, threads")
    return optimizer_threads
