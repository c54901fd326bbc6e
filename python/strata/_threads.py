"""The CPU optimizer's threads when the caller gives none (strata.Engine(threads=...) and
strata.optim.AdamW(threads=...) unset), and the switch that follows the machine's load.

On the CPU engine of one rank, torch's OpenMP workers and the engine's optimizer share one
libgomp (see _flags.py). With the optimizer on the CPUs torch leaves free (at least 1: no team of
its own) the process has no more OpenMP threads than CPUs, so torch's idle workers spin before they
sleep: on an idle machine the fastest setting. Beside other busy processes the same spinning takes
the CPU they and the engine's own threads need: issue 27's GPT-2 6 x 384 took 1.41 s/step in
memory and 3.2 with NVMe, against 0.96 and 1.37 with the OMP_NUM_THREADS team, whose extra thread
makes libgomp throttle every idle worker to 100 spins.

So such an engine starts with the free CPUs and watches the machine: after each step, over a window
of at least a second, how much CPU time other processes took on the CPUs this process may use
(/proc/stat's busy time of those CPUs less this process's own). Once others took half a CPU or
more while those CPUs were saturated, it switches the optimizer to the OMP_NUM_THREADS team for
good (Engine.set_optimizer_threads(0): the team's thread stays in libgomp's pool, so the
throttling cannot be undone, nor need it be). The thread count never changes a result bit. Where
/proc/stat cannot be read it stays as it started.
"""
import os
import resource
import time


WINDOW_SECONDS = 1.0  # the shortest window a decision is taken over
OTHERS_CPUS = 0.5     # others' CPUs (CPU seconds per second) that count as a busy machine


def optimizer_threads(given, cpu_engine):
    """(the engine's optimizer_threads, the step hook): `given` when the caller set it (> 0),
    else the CPU engine's free CPUs with a LoadWatch, else 0 (OMP_NUM_THREADS) and no watch."""
    if given:
        return given, _NO_WATCH
    start = cpu_engine_threads() if cpu_engine else 0
    return (start, LoadWatch()) if start else (0, _NO_WATCH)


def _affinity():
    """The CPUs this process may run on."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


# The world-size variables comm/rank_env.cc reads (torchrun, Open MPI, Slurm).
_WORLD_SIZE_VARS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS")


def cpu_engine_threads():
    """The CPU engine's starting optimizer threads: the CPUs torch's own threads leave free, at
    least 1 (see _flags.py's threads); 0 (the engine's OMP_NUM_THREADS default) when the
    environment launches several ranks, whose processes may share the CPUs and would spin
    against each other as against any busy process."""
    for var in _WORLD_SIZE_VARS:
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 1:
            return 0
    import torch
    return max(1, len(_affinity()) - torch.get_num_threads())


def _proc_stat_busy(cpus=None):
    """Seconds of CPU time every process took on the CPUs `cpus` (this process's, by default),
    from /proc/stat's per-CPU lines; None where it cannot be read."""
    cpus = _affinity() if cpus is None else cpus
    try:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    ticks, seen = 0, 0
    for line in lines:
        fields = line.split()
        if not fields or not fields[0].startswith("cpu") or not fields[0][3:].isdigit():
            continue
        if int(fields[0][3:]) not in cpus or len(fields) < 8:
            continue
        user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields[1:8])
        steal = int(fields[8]) if len(fields) > 8 else 0
        ticks += user + nice + system + irq + softirq + steal
        seen += 1
    return ticks / os.sysconf("SC_CLK_TCK") if seen else None


def _own_cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def saturated_by_others(wall, busy, own, cpus):
    """Whether a window of `wall` seconds, in which this process's `cpus` CPUs were busy `busy`
    CPU seconds of which it took `own`, shows other processes taking CPU it needs: others took at
    least OTHERS_CPUS and those CPUs were nearly all busy."""
    if wall <= 0:
        return False
    others = max(0.0, busy - own) / wall
    return others >= OTHERS_CPUS and busy / wall >= cpus - OTHERS_CPUS


class LoadWatch:
    """The step hook of an engine that started on the free CPUs (see the module docstring)."""

    def __init__(self, clock=time.monotonic, busy=None, own=_own_cpu, cpus=None):
        cpu_set = _affinity()  # read once: the per-step sample only reads /proc/stat
        self._clock, self._own = clock, own
        self._busy = busy or (lambda: _proc_stat_busy(cpu_set))
        self._cpus = cpus or len(cpu_set)
        self.switched = False
        self._start = self._sample()

    def _sample(self):
        busy = self._busy()
        return None if busy is None else (self._clock(), busy, self._own())

    def after_step(self, core, config=None):
        """Called between steps: switches `core` to the OMP_NUM_THREADS team when the last
        window shows others taking the CPU (and `config`, the engine's EngineConfig, so that an
        engine reopened from it keeps the team)."""
        if self.switched or self._start is None:
            return
        now = self._sample()
        if now is None:
            self._start = None
            return
        wall = now[0] - self._start[0]
        if wall < WINDOW_SECONDS:
            return
        if saturated_by_others(wall, now[1] - self._start[1], now[2] - self._start[2],
                               self._cpus):
            core.set_optimizer_threads(0)
            if config is not None:
                config.optimizer_threads = 0
            self.switched = True
        self._start = now


class _NoWatch:
    switched = False

    def after_step(self, core, config=None):
        pass


_NO_WATCH = _NoWatch()
