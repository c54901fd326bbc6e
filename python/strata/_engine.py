"""strata.Engine: the budgets, drives and engine options of one offloaded model, and its
user-facing calls between steps; strata.offload (_offload.py) binds a model to it.
"""
import collections
import os

from . import _strata
from ._clock import _LayerClock
from ._flags import apply_run_flags
from ._sizes import parse_bytes
from ._strata import Error

__all__ = ["Engine"]


class Engine:
    """Budgets and drives for one offloaded model (see strata.offload). Besides these, the
    options of `strata train` under their CLI names (speculate, grad_spill, pipeline, state_dtype,
    io, io_block, collective_memory, threads; see _flags.py)."""

    def __init__(self, device="cpu", device_mem=None, host_mem=None, nvme=None, resume=False,
                 optimizer_threads=0, trace=None, rendezvous=None, timing=False, **run_flags):
        if device not in ("cpu", "cuda", "auto"):
            raise Error(f"device={device!r}: expected \"cpu\", \"cuda\" or \"auto\"")
        self.config = _strata.EngineConfig()
        optimizer_threads = apply_run_flags(self.config, run_flags, optimizer_threads)
        self.config.device = device
        self.config.device_mem = parse_bytes("device_mem", device_mem)
        self.config.host_mem = parse_bytes("host_mem", host_mem)
        if isinstance(nvme, (str, os.PathLike)):
            nvme = [nvme]
        nvme = [str(p) for p in (nvme or [])]
        for p in nvme:
            if not os.path.isdir(p):
                raise Error(f"nvme folder {p!r} does not exist; create it first (one folder "
                            "per drive)")
        if resume and not nvme:
            raise Error("resume=True needs nvme=[...]: the committed state lives there")
        if nvme and not resume:
            _refuse_committed(nvme[0])
        self.config.nvme = nvme
        self.config.resume = bool(resume)
        # As `strata train`: with NVMe folders every step commits a complete state, so that
        # Engine(..., resume=True) can continue from the last one.
        self.config.durable = bool(nvme)
        self.config.optimizer_threads = int(optimizer_threads)
        self.config.trace_path = str(trace or "")
        # Under a launcher (torchrun, strata launch, mpirun, srun) the ranks meet here:
        # "file:DIR" or "redis:HOST:PORT"; None = STRATA_RENDEZVOUS.
        self.config.rendezvous = str(rendezvous or "")
        self._model = None  # the _Offloaded state using this engine
        self._stats = None  # the last opt.step()'s figures so far (the engine's EndStep)
        self._last = None  # the last committed step's final statistics
        self._committed = collections.deque(maxlen=4096)  # final, not yet taken by step_stats
        self._extras = {}  # step -> what the layer adds to its statistics once final
        self._clock = _LayerClock() if timing else None

    def last_step_stats(self):
        """The last committed step's statistics, final ("step" says which): seconds, bound,
        efficiency, bytes per edge, busy seconds per resource, grad_norm, clip_coef, peaks,
        deferred_blocks, overlapped_seconds, stall_seconds and tail_seconds (the layer's own:
        the engine sees no compute on its lanes, torch computes outside them; stall is the
        seconds the training thread waited in the engine's calls, tail the seconds from the
        step's last release to the end of opt.step()); with Engine(timing=True) also "python": the
        layer's seconds in that step (see _LayerClock.snapshot). With pipelined updates
        (pipeline="on", the default, with max_grad_norm) opt.step() returns before the step's
        updates ran, and the step commits during the next one: this is then the step before
        the last opt.step(), and the last one after flush(), a read (state_dict, save) or
        close(). Its figures count the step's own updates (their optimizer time, NVMe bytes
        written, overlapped_seconds under the next step), as `strata train --json` does."""
        self._take()
        if self._last is None:
            raise Error("no step has been committed yet; call opt.step() first (with pipelined "
                        "updates a step commits during the next one, or call engine.flush())")
        return dict(self._last)

    def step_stats(self):
        """The final statistics (as last_step_stats) of every step committed since the last
        call, oldest first (at most the last 4096): one per step, also where two steps commit
        within one opt.step()."""
        self._take()
        out = list(self._committed)
        self._committed.clear()
        return out

    def flush(self):
        """Runs the last step's pending updates now and commits it (between steps), so that
        last_step_stats() reports it. A training loop need not call it: reads, saves and
        close() do it, and the next step runs those updates under its forward."""
        st = self._state()
        if st.progress.open:
            raise Error("Engine.flush() in the middle of a step; call opt.step() first")
        st.core().flush()
        self._take()

    def _take(self):
        """Moves the final statistics of the steps the engine committed since the last call
        into last_step_stats() and step_stats(), with what the layer added to each."""
        st = self._model
        core = st._core if st is not None else None
        if core is None:
            return
        for s in core.take_committed_stats():
            s.update(self._extras.pop(s["step"], {}))
            self._committed.append(s)
            self._last = s

    def _ended(self, stats, **extras):
        """opt.step() (or abort_step) ended a step with EndStep's `stats`; `extras` go into its
        final statistics once it commits."""
        self._stats = stats
        stats.update(extras)
        if extras:
            self._extras[stats["step"]] = extras
        self._take()

    def placement(self):
        """The planner's report (which component lives where, and why), as text."""
        return self._state().core().placement()

    @property
    def rank(self):
        """This process's rank (0 without a launcher); each rank feeds its own rows."""
        return self._state().core().rank

    @property
    def world_size(self):
        return self._state().core().world_size

    @property
    def resumed_step(self):
        """The last committed step a resumed engine continues from (0 for a fresh run)."""
        return self._state().core().resumed_step()

    def abort_step(self):
        """Drops the step in progress (nothing when none is): no weight or moment changes, and
        the next forward starts a new step. An exception raised inside the offloaded model's
        forward or a block's backward does this itself; call it after an exception elsewhere
        in the step (computing the loss, say). The step is run to its end with a non-finite
        gradient, so the engine skips it whole (last_step_stats()["skipped"]) and commits the
        states it started from; where some blocks were already updated (an exception late in
        the last backward, without max_grad_norm) an engine with NVMe folders is reopened at
        its last commit, and one without cannot go back and is closed (strata.Error says so)."""
        self._state().abort_step()

    def close(self):
        """Ends the engine: frees its memory and releases its NVMe folders (their lock), so a
        later Engine(..., resume=True) in this process can continue the run. The offloaded
        model cannot train afterwards. Also at the end of a `with strata.Engine(...)` block."""
        st = self._model
        if st is not None and st._core is not None:
            if st.progress.open:
                raise Error("Engine.close() in the middle of a step; call opt.step() first, "
                            "or engine.abort_step() to drop the step")
            try:
                self.flush()  # the last step commits; last_step_stats() keeps its figures
            except Error:
                pass  # closing, as before: a failed engine keeps its last commit
            finally:
                st.close_core()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._model is not None and self._model._core is not None:
            self._model.close_core()  # an exception mid-step: the step is dropped

    def _state(self):
        if self._model is None:
            raise Error("this strata.Engine holds no model yet; call strata.offload(model, "
                        "blocks=..., engine=...) and create strata.optim.AdamW first")
        return self._model


def _refuse_committed(folder):
    """A fresh engine never starts over a run's committed state: strata.Error naming the
    Python ways to continue it (the engine's own refusal names the CLI's --resume). A folder
    with no store, or one whose manifest cannot be read, is left to the engine, which reports
    it when it opens; so is one whose run stopped at step 0, its initial commit (nothing
    trained: the engine takes it for the new run)."""
    try:
        step = _strata.peek_committed_step(folder)
    except Error:
        return
    if step is not None and step > 0:
        raise Error(f"NVMe folder {folder} already holds a committed engine state (step {step});"
                    f" continue that run with strata.Engine(nvme=[{folder!r}, ...], "
                    "resume=True) (or strata.load_checkpoint to go back to a checkpoint), or "
                    "give an empty folder for a new run")
