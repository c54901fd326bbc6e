"""Where an offloaded model is in the open step, and the checks of its calls against that.

The engine runs a fixed schedule per step: for each micro-batch, forward through its blocks
0..n-1, then backward n-1..0 (each an access: acquire, use, release). StepProgress follows the
model through it (which micro-batch, which block forward or backward expects next, how many
accesses were released, which one is acquired now), so that a call out of order is refused
with what was expected, and a step dropped part way (abort_step) can run the rest of the
schedule out. It holds no engine and no tensor: _offload.py's _Offloaded owns it and makes the
engine calls.

Blocks here are engine block indexes: `first` is the first offloaded block (0 is the rest
block, the parameters outside `blocks`, when there are any), `last` the last one.
"""
from ._strata import Error


class StepProgress:
    def __init__(self, first, last, micro_batches, accesses_per_pass, name):
        self.first, self.last = first, last
        self.micro_batches = micro_batches
        self.per_micro = 2 * accesses_per_pass  # forward and backward accesses of one micro-batch
        self._name = name  # engine block index -> its name, for errors
        self.open = False  # a step has begun (begin_step) and not ended
        self.reset()
        self.inference = False  # the forward running now is a no_grad one

    def reset(self):
        """Between steps: nothing acquired, released or expected."""
        self.open = False
        self.micro = 0  # micro-batches begun in this step
        self.released = 0  # accesses released so far
        self.acquired = None  # the access acquired now: (block, backward, gradient submitted)
        self.next_fwd = None  # block forward expects next; None between passes
        self.next_bwd = None

    def in_pass(self):
        """A micro-batch's forward or backward is under way."""
        return self.next_fwd is not None or self.next_bwd is not None

    # --- the model's calls ----------------------------------------------------------------

    def check_new_micro(self):
        """The model's forward would start a micro-batch: refused before the last one's
        backward finished, or past micro_batches (the caller counts it in `micro` once begun)."""
        if self.in_pass():
            raise Error("forward called again before loss.backward() of the previous forward "
                        "finished; every forward of an offloaded model needs its backward "
                        "(engine.abort_step() drops the step, after a failed loss say)")
        if self.micro == self.micro_batches:
            raise Error(f"forward number {self.micro + 1} in one step, with "
                        f"micro_batches={self.micro_batches}; call opt.step() after "
                        f"{self.micro_batches} forward/backward passes")

    def micro_begun(self):
        """A micro-batch began (the step with it, on the first)."""
        self.open = True
        self.micro += 1

    def start_forward(self):
        """The blocks' forward may begin (after the rest block's copy in)."""
        self.next_fwd = self.first

    def forward_begin(self, b):
        if self.next_fwd is None:
            raise Error(f"block {self._name(b)} was called outside the model's forward; "
                        "call the offloaded model itself")
        if b != self.next_fwd:
            if b < self.next_fwd:
                raise Error(f"block {self._name(b)} was called twice in one forward; each "
                            "block in `blocks` must run once per forward")
            raise Error(f"block {self._name(self.next_fwd)} was not called before block "
                        f"{self._name(b)}; `blocks` must list the blocks in the order "
                        "forward calls them, each once")

    def forward_end(self, b):
        self.next_fwd = b + 1

    def backward_begin(self, b):
        if not self.in_pass():
            raise Error(f"backward reached block {self._name(b)} after this forward's "
                        "backward had finished; call backward once per forward (a second "
                        "backward through an offloaded model, retain_graph=True, is not "
                        "supported)")
        if self.next_fwd is not None:  # the first backward of this micro-batch
            if self.next_fwd != self.last + 1:
                missing = self._name(self.next_fwd)
                self.next_fwd = None
                raise Error(f"block {missing} was not called in forward; `blocks` must list "
                            "only blocks that forward calls, each once, in order")
            self.next_fwd = None
            self.next_bwd = self.last
        if b != self.next_bwd:
            raise Error(f"backward reached block {self._name(b)} while block "
                        f"{self._name(self.next_bwd)} was expected; call backward once "
                        "per forward, on the whole loss")

    def backward_end(self, b):
        """Returns True when this ends the micro-batch's backward through the blocks."""
        self.next_bwd = b - 1
        if b != self.first:
            return False
        self.next_bwd = None
        return True

    def check_end(self):
        """opt.step(): every micro-batch's forward and backward ran."""
        if self.in_pass():
            raise Error("opt.step() called before loss.backward() finished; call "
                        "loss.backward() after every forward")
        if self.micro != self.micro_batches:
            raise Error(f"opt.step() after {self.micro} forward/backward passes, with "
                        f"micro_batches={self.micro_batches}; run {self.micro_batches} per step")

    # --- the engine's accesses --------------------------------------------------------------

    def acquired_now(self, b, backward):
        self.acquired = (b, backward, False)

    def submitted_now(self, b):
        self.acquired = (b, True, True)

    def released_now(self):
        self.acquired = None
        self.released += 1

    def total(self):
        """Accesses of the whole step."""
        return self.per_micro * self.micro_batches

    def rest_of_schedule(self, total):
        """The accesses after the released ones up to `total`, in the schedule's order (per
        micro-batch: forward 0..n-1, then backward n-1..0), as (block, backward)."""
        per = self.per_micro
        for i in range(self.released, total):
            j = i % per
            yield (j, False) if j < per // 2 else (per - 1 - j, True)
