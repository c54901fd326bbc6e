"""Dropping an offloaded model's step part way (an exception in its forward or a block's
recompute, or engine.abort_step()): where the engine is in the step's schedule
(_progress.py) decides how. With NVMe folders and one rank the engine is closed and reopened
at its last commit; otherwise the rest of the step's schedule runs with non-finite gradients so
that the engine skips the step whole. StepDrop owns that procedure; the _Offloaded it serves
owns the engine, the step's progress and the hooks."""
import torch

from ._strata import Error


class StepDrop:
    def __init__(self, st):
        self.st = st  # the _Offloaded whose step is dropped

    def abort_after(self, exc):
        """`exc` was raised inside the step: drops the step when the engine is part way through
        a forward or backward (a misuse refused between passes leaves a usable step alone). A
        failure to drop it is added to `exc` as a note; `exc` is what the caller sees."""
        progress = self.st.progress
        if self.st._core is None or not progress.open:
            return
        if not progress.in_pass() and progress.acquired is None:
            return
        try:
            self.abort_step()
        except Exception as failure:  # noqa: BLE001 (exc stays the error the user sees)
            if hasattr(exc, "add_note"):
                exc.add_note(f"strata: {failure}")

    def abort_step(self):
        """Engine.abort_step. With NVMe folders and one rank the engine is closed and reopened
        at its last commit (the run continues as if the step had not begun; the step before,
        whose pipelined updates commit during this one, is kept). Otherwise the rest
        of the step's schedule runs with a non-finite gradient for every block not yet
        submitted, so that the engine skips the step whole (with several ranks too: the norm
        is global) and commits the states it began from; when some updates already ran, it
        cannot, and is closed (strata.Error)."""
        core = self.st.core()
        progress = self.st.progress
        if not progress.open:
            return
        if self.st.engine.config.nvme and core.world_size == 1:
            self._run_out_first_forward()
            self._reopen("dropping the step in progress")
            return
        total = progress.total()
        if progress.released == total and progress.acquired is None:
            raise Error("abort_step() after the step's last backward: its updates have run, and "
                        "an engine without NVMe folders keeps no earlier state to go back to; "
                        "call opt.step() to commit the step")
        try:
            self._run_out_step(total)
            stats = core.end_step()
        except Error as failure:
            self._reopen(f"the step in progress could not be dropped ({failure})")
            return
        finally:
            self.st._held_grads.clear()
        self.st._reset_step()
        self.st.engine._ended(stats, aborted=True)

    def _run_out_first_forward(self):
        """With pipelined updates the previous step commits during this one, once its updates
        ran, each before its block's first forward: runs the first micro-batch's forward out
        (acquire and release, no compute), so that closing the engine commits it and reopening
        goes back to it, not to the step before. A failure closes the engine for good."""
        n = len(self.st._engine_blocks)
        if self.st.progress.released >= n:
            return
        try:
            self._run_out_step(n)  # forward accesses only: no gradient is submitted
        except Error as failure:
            self.st.close_core(f"the step in progress could not be dropped ({failure})")
            raise Error(f"{self.st._closed}; create a new Engine") from failure

    def _run_out_step(self, total):
        """Acquires and releases the accesses left in the step up to `total` released, in the
        schedule's order (per micro-batch: forward 0..n-1, backward n-1..0), submitting NaN
        gradients in backward."""
        if self.st.progress.acquired is not None:
            b, backward, submitted = self.st.progress.acquired
            if backward and not submitted:
                self._submit_nan(b)
            self.st._release(b)
        for b, backward in self.st.progress.rest_of_schedule(total):
            self.st._acquire(b, backward)
            if backward:
                self._submit_nan(b)
            self.st._release(b)

    def _submit_nan(self, b):
        _, tensors, _ = self.st._layout[b]
        nan = torch.full((max(n for *_, n in tensors),), float("nan"),
                         device=self.st._torch_device)
        self.st.submit(b, [nan[:n] for *_, n in tensors])

    def _reopen(self, why):
        """Closes the engine and reopens it at its last commit (NVMe folders, one rank); closes
        it for good and raises strata.Error where it cannot."""
        config = self.st.engine.config
        several = self.st._core.world_size != 1
        if not config.nvme or several:
            self.st.close_core(why + (": with several ranks each must reopen its engine" if several
                                   else ": an engine without NVMe folders keeps no earlier "
                                   "state to go back to (with max_grad_norm > 0 updates wait "
                                   "for the whole gradient, so a step can always be dropped)"))
            raise Error(f"{self.st._closed}; create a new Engine")
        self.st.close_core(why)
        self.st.resume_core()
