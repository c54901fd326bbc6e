"""strata.save_safetensors writes through the CLI's atomic writer (include/strata/atomic_file.h):
nothing planted next to the destination is followed, a failure leaves no temporary behind, and
every failure is a strata.Error."""
import json
import os
import resource
import signal
import struct

import pytest
import torch

import strata
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
