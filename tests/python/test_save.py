"""strata.save_safetensors writes through the CLI's atomic writer (include/strata/atomic_file.h):
nothing planted next to the destination is followed, a failure leaves no temporary behind, and
every failure is a strata.Error."""
import json
import os
import resource
import signal
import struct
import weakref

import pytest
import torch

import strata
import strata.optim
from gpt_model import GPT


def _names(folder):
    return sorted(os.listdir(folder))


def _read(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return header, data


def test_writes_every_weight_once(tmp_path):
    m = GPT()
    path = tmp_path / "w.safetensors"
    strata.save_safetensors(m, path)
    header, data = _read(path)
    params = dict(m.named_parameters())
    assert header.pop("__metadata__") == {"format": "pt"}  # as save_pretrained writes it
    assert sorted(header) == sorted(params)
    for name, h in header.items():
        lo, hi = h["data_offsets"]
        got = torch.frombuffer(bytearray(data[lo:hi]), dtype=torch.float32).view(h["shape"])
        assert torch.equal(got, params[name].detach())
    assert _names(tmp_path) == ["w.safetensors"]


def test_a_symlink_planted_at_the_temporary_name_is_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    path = tmp_path / "w.safetensors"
    for planted in (str(path) + ".tmp", tmp_path / ".w.safetensors.tmp"):
        os.symlink(victim, planted)
    strata.save_safetensors(GPT(), path)
    assert victim.read_text() == "keep me"
    assert _read(path)[0]  # the weights went to the path named
    assert _names(tmp_path) == sorted([".w.safetensors.tmp", "victim.txt", "w.safetensors",
                                       "w.safetensors.tmp"])


def test_a_folder_or_a_symlink_at_the_path_is_a_strata_error_and_leaves_nothing(tmp_path):
    (tmp_path / "dir").mkdir()
    with pytest.raises(strata.Error, match="dir"):
        strata.save_safetensors(GPT(), tmp_path / "dir")
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    os.symlink(victim, tmp_path / "link")
    with pytest.raises(strata.Error, match="link"):
        strata.save_safetensors(GPT(), tmp_path / "link")
    assert victim.read_text() == "keep me"
    with pytest.raises(strata.Error, match="no_such_folder"):
        strata.save_safetensors(GPT(), tmp_path / "no_such_folder" / "w.safetensors")
    with pytest.raises(strata.Error, match="NUL byte"):
        strata.save_safetensors(GPT(), str(tmp_path / "w") + "\0x")
    assert _names(tmp_path) == ["dir", "link", "victim.txt"]


def test_a_failure_while_writing_leaves_the_old_file_and_no_temporary(tmp_path):
    """The file size limit (RLIMIT_FSIZE, SIGXFSZ ignored) makes a write fail with EFBIG half
    way through the weights."""
    path = tmp_path / "w.safetensors"
    path.write_bytes(b"old")
    m = GPT()
    assert sum(p.numel() * 4 for p in m.parameters()) > 16384
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (16384, old_limit[1]))
        with pytest.raises(strata.Error, match="too large|w.safetensors"):
            strata.save_safetensors(m, path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    assert path.read_bytes() == b"old"
    assert _names(tmp_path) == ["w.safetensors"]


def test_an_offloaded_model_is_written_one_gathered_tensor_at_a_time(tmp_path):
    """save_safetensors of an offloaded model reads each weight from the engine as the file
    is written, never the whole model at once (it used to gather every weight first)."""
    m = GPT()
    m = strata.offload(m, blocks=list(m.blocks), engine=strata.Engine())
    strata.optim.AdamW(m.parameters(), lr=1e-3)
    state = next(m.parameters())._strata_offload
    whole = state.gather()
    read, alive = state._read_fp32, []

    def read_one(b, t):
        alive[:] = [v for v in alive if v() is not None]
        assert not alive, "a weight read before the last one was written"
        v = read(b, t)
        alive.append(weakref.ref(v))
        return v
    state._read_fp32 = read_one
    state.gather = None  # the whole model at once
    strata.save_safetensors(m, tmp_path / "w.safetensors")
    header, data = _read(tmp_path / "w.safetensors")
    header.pop("__metadata__")
    assert sorted(header) == sorted(whole)
    for name, h in header.items():
        lo, hi = h["data_offsets"]
        got = torch.frombuffer(bytearray(data[lo:hi]), dtype=torch.float32).view(h["shape"])
        assert torch.equal(got, whole[name]), name


class _Ranks:
    """An offloaded model's state as _write_gathered_safetensors sees it, whose second gather
    fails on this rank (a local error before its collective)."""

    def __init__(self):
        self._where = {i: (0, i, f"w{i}") for i in range(4)}
        self._layout = [("", [(f"w{i}", (2,), 2 * i, 2) for i in range(4)], 8)]
        self._frozen = None
        self.gathers = []

    def _read_fp32(self, b, t):
        self.gathers.append(t)
        if t == 1:
            raise strata.Error("rank-local failure")
        return torch.zeros(2)


@pytest.mark.parametrize("writer", [False, True])
def test_a_rank_that_fails_a_gather_still_joins_every_other_one(tmp_path, writer, monkeypatch):
    """Each gather is a collective: a rank that stopped at its failure would leave the others
    waiting in the next one. Every rank goes through all of them, then raises."""
    from strata import _checkpoint
    monkeypatch.setattr(_checkpoint, "_frozen_entries", lambda state: {})
    state = _Ranks()
    with pytest.raises(strata.Error, match="rank-local failure"):
        _checkpoint._write_gathered_safetensors(state, tmp_path / "w.safetensors", writer)
    assert state.gathers == [0, 1, 2, 3]
    assert _names(tmp_path) == []
