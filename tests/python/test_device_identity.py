"""A tensor on another GPU of the same process is not the engine's (issue 44, fix 5): the
activation stash (_stash.InputStash.kind_qualifies) and the gradient hand-off
(_Offloaded._submit_from) compare the device itself, cuda:1 against the engine's cuda:0, not
only its type. Runs without a GPU: the tensors are stand-ins carrying two device indices (no
tensor can live on a GPU this machine lacks); the CUDA runs of the same paths are in
test_cuda.py."""
import collections
import contextlib
import types

import torch

from strata import _offload, _stash


class _FakeTensor:
    """What the two checks read of a tensor: its device, dtype, layout, shape; `to` records the
    move and returns the tensor on the target device."""

    def __init__(self, device, dtype=torch.float32, requires_grad=True, numel=16):
        self.device = torch.device(device)
        self.dtype = dtype
        self.requires_grad = requires_grad
        self.layout = torch.strided
        self._numel = numel
        self.shape = (numel,)
        self.moved_to = None

    def numel(self):
        return self._numel

    def element_size(self):
        return 4

    def is_contiguous(self):
        return True

    def detach(self):
        return self

    def data_ptr(self):
        return 4096 * (1 + (self.device.index or 0))

    def to(self, device, dtype):
        moved = _FakeTensor(device, dtype, self.requires_grad, self._numel)
        self.moved_to = moved.device
        return moved

    def contiguous(self):
        return self


def _stash_on(device):
    s = _stash.InputStash("on", "1M", blocks=2)
    s.enabled = True
    s.device = torch.device(device)
    return s


def test_stash_takes_only_the_engines_own_gpu():
    s = _stash_on("cuda:0")
    assert s.kind_qualifies(_FakeTensor("cuda:0"))
    assert not s.kind_qualifies(_FakeTensor("cuda:1"))  # same type, another GPU
    assert not s.kind_qualifies(_FakeTensor("cpu"))
    assert _stash_on("cuda:1").kind_qualifies(_FakeTensor("cuda:1"))
    assert _stash_on("cpu").kind_qualifies(_FakeTensor("cpu"))


def test_stash_learns_the_device_from_the_handoff():
    s = _stash.InputStash("on", "1M", blocks=2)
    s.configure(types.SimpleNamespace(nvme=[], activation_bytes=0, activation_count=0),
                cpu_engine=False)
    calls = []
    core = types.SimpleNamespace(stash_activation=lambda *a: calls.append(a))
    handoff = types.SimpleNamespace(device=torch.device("cuda", 0), to_engine=lambda: None,
                                    to_torch=lambda: None)
    metas = s.stash(core, handoff, [_FakeTensor("cuda:1"), _FakeTensor("cuda:0")])
    assert metas[0] is None  # kept in torch's memory: not the engine's GPU
    assert metas[1] is not None and len(calls) == 1


def _submit(engine_device, grad_device):
    """Runs _Offloaded._submit_from on a stand-in model whose engine is on `engine_device`;
    returns the gradient it was given and the addresses submitted."""
    submitted = []
    fake = types.SimpleNamespace(
        _clock=types.SimpleNamespace(copy=contextlib.nullcontext),
        _torch_device=torch.device(engine_device),
        _handoff=types.SimpleNamespace(to_engine=lambda: None),
        _core=types.SimpleNamespace(submit_grads_from=lambda b, a: submitted.append(a) or 1),
        _waited=0.0,
        progress=types.SimpleNamespace(submitted_now=lambda b: None),
        _held_grads=collections.deque(),
        _drop_read_grads=lambda: None)
    g = _FakeTensor(grad_device)
    _offload._Offloaded._submit_from(fake, 0, [g])
    return g, submitted[0]


def test_gradients_on_another_gpu_are_moved_to_the_engines():
    g, addresses = _submit("cuda:0", "cuda:1")
    assert g.moved_to == torch.device("cuda", 0)
    assert addresses == [4096]  # the copy's (on cuda:0), not cuda:1's
    g, addresses = _submit("cuda:0", "cuda:0")
    assert g.moved_to is None and addresses == [4096]
    g, _ = _submit("cpu", "cpu")
    assert g.moved_to is None
