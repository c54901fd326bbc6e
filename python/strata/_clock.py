"""The offload layer's clock (strata.Engine(timing=True)): where the layer's time goes in a
step, and the engine binding with each call timed."""
import contextlib
import time


class _Region:
    """Adds the seconds between __enter__ and __exit__ to one of a _LayerClock's totals; nested
    regions of the same kind count once (the outermost)."""

    __slots__ = ("clock", "kind", "depth", "start")

    def __init__(self, clock, kind):
        self.clock, self.kind, self.depth, self.start = clock, kind, 0, 0.0

    def __enter__(self):
        self.depth += 1
        if self.depth == 1:
            self.start = time.perf_counter()

    def __exit__(self, *exc):
        self.depth -= 1
        if self.depth == 0:
            self.clock.totals[self.kind] += time.perf_counter() - self.start


class _LayerClock:
    """Engine(timing=True): where the layer's time goes in a step, as seconds per kind:
    layer (inside its entry points: the forward hook, each block's forward and backward,
    the rest block's gradient submission, opt.step), of which engine (calls into the engine),
    compute (the blocks' own forward, recompute and autograd.grad: torch's work, not the
    layer's) and copy (values copied between torch's tensors and the engine's buffers). One
    Python thread drives a step, so no locking."""

    KINDS = ("layer", "engine", "compute", "copy")

    def __init__(self):
        self.totals = dict.fromkeys(self.KINDS, 0.0)
        self.calls = {}  # engine seconds per binding method (acquire, submit_grads, ...)
        self._regions = {k: _Region(self, k) for k in ("layer", "compute", "copy")}

    def layer(self):
        return self._regions["layer"]

    def compute(self):
        return self._regions["compute"]

    def copy(self):
        return self._regions["copy"]

    def reset(self):
        for k in self.KINDS:
            self.totals[k] = 0.0
        self.calls = {}

    def snapshot(self):
        """{kind: seconds} plus "own": layer - engine - compute - copy, the layer's own Python
        (hooks, views, checks, bookkeeping), and "engine_calls": {method: seconds}."""
        t = dict(self.totals)
        t["own"] = t["layer"] - t["engine"] - t["compute"] - t["copy"]
        t["engine_calls"] = dict(self.calls)
        return t


class _NullClock:
    """The clock of an Engine without timing: every region is a no-op."""

    _NULL = contextlib.nullcontext()

    def layer(self):
        return self._NULL

    compute = copy = layer

    def reset(self):
        pass


_NO_CLOCK = _NullClock()


class _TimedCore:
    """The engine's binding with each call timed as the clock's "engine" kind."""

    def __init__(self, core, clock):
        self._c, self._clock = core, clock

    def __getattr__(self, name):
        attr = getattr(self._c, name)
        if not callable(attr):
            return attr
        clock = self._clock

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                sec = time.perf_counter() - start
                clock.totals["engine"] += sec
                clock.calls[name] = clock.calls.get(name, 0.0) + sec

        return timed
