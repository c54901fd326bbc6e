"""save_checkpoint's path and disk (issue 45 §6): "dir/" is the folder dir (it used to put its
scratch folder inside it, copy everything, then fail with a raw OSError); a path that names no
folder ("", "/", ".") and a disk without room are strata.Error before anything is written; a
disk that fills up midway is strata.Error naming the path, with nothing left of the save and
the engine training on. The room asked for counts the frozen weights too."""
import errno
import os
import re
import shutil
import subprocess

import pytest

import strata
from checkpoint_run import offloaded_run, train as _train, weights as _weights
from gpt_model import GPT


def _run(nvme):
    nvme.mkdir()
    model, opt = offloaded_run(nvme)
    _train(model, opt, 2, seed=1)
    return model, opt


def test_a_trailing_slash_names_the_folder_itself(tmp_path):
    model, opt = _run(tmp_path / "nvme")
    saved = _weights(model, tmp_path / "saved.safetensors")
    assert strata.save_checkpoint(model, f"{tmp_path / 'ckpt'}/", opt) == str(tmp_path / "ckpt")
    assert sorted(os.listdir(tmp_path / "ckpt")) == [
        "model.safetensors", "nvme0", "python.pt", "strata.json"]
    strata.save_checkpoint(model, f"{tmp_path / 'ckpt'}//", opt)  # replaces it, as without
    _train(model, opt, 1, seed=2)
    strata.load_checkpoint(model, f"{tmp_path / 'ckpt'}/", opt)
    assert _weights(model, tmp_path / "loaded.safetensors") == saved
    assert not [n for n in os.listdir(tmp_path) if n.startswith("ckpt.")]


@pytest.mark.parametrize("path", ["", "/", ".", "..", "a/.."])
def test_a_path_that_names_no_folder_is_refused_before_anything_is_written(
        tmp_path, monkeypatch, path):
    model, opt = _run(tmp_path / "nvme")
    monkeypatch.chdir(tmp_path)
    before = sorted(os.listdir(tmp_path))
    for call in (strata.save_checkpoint, strata.load_checkpoint):
        with pytest.raises(strata.Error, match=f"{call.__name__}\\({path!r}\\): give the "
                                               "checkpoint's own folder"):
            call(model, path, opt)
    assert sorted(os.listdir(tmp_path)) == before
    _train(model, opt, 1, seed=2)


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs: a real full disk (a checkpoint here needs about 600 KiB)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}); "
                    "test_a_disk_that_fills_up_midway_* covers the failure by fault injection")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


def test_a_disk_without_room_is_refused_before_anything_is_written(tmp_path, small_disk):
    model, opt = _run(tmp_path / "nvme")
    with pytest.raises(strata.Error, match=f"save_checkpoint\\('{small_disk}/c'\\): the file "
                                           f"system of {small_disk} has \\d+ bytes free, and "
                                           "the checkpoint needs about \\d+"):
        strata.save_checkpoint(model, small_disk / "c", opt)
    assert os.listdir(small_disk) == []
    _train(model, opt, 1, seed=2)


def test_a_disk_that_fills_up_midway_leaves_nothing_and_the_old_checkpoint(
        tmp_path, monkeypatch):
    """ENOSPC from the second file copied (fault injection into the copy: the free space looked
    enough): strata.Error naming the path and the file, no .partial folder, the checkpoint
    saved before at that path whole, the engine trains on."""
    from strata import _store_copy

    model, opt = _run(tmp_path / "nvme")
    ckpt = tmp_path / "ckpt"
    strata.save_checkpoint(model, ckpt, opt)
    first = {n: (ckpt / n).read_bytes() for n in ("python.pt", "model.safetensors")}
    _train(model, opt, 1, seed=2)
    copies = []

    def failing_copy(src, dst):
        copies.append(dst)
        if len(copies) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", dst)
        return shutil.copyfile(src, dst)

    monkeypatch.setattr(_store_copy.shutil, "copyfile", failing_copy)
    with pytest.raises(strata.Error, match=f"save_checkpoint\\('{ckpt}'\\): No space left on "
                                           f"device \\({ckpt}.partial/nvme0/.*\\); nothing was "
                                           "saved"):
        strata.save_checkpoint(model, ckpt, opt)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "nvme"]
    assert {n: (ckpt / n).read_bytes() for n in first} == first
    _train(model, opt, 1, seed=3)
    strata.load_checkpoint(model, ckpt, opt)  # the earlier checkpoint still loads


def test_the_room_a_save_needs_counts_the_frozen_weights(tmp_path, monkeypatch):
    """The free space save_checkpoint asks for covers every file it writes: the run's state
    files and model.safetensors, whose frozen weights (a PEFT base) it used to leave out."""
    (tmp_path / "nvme").mkdir()
    model = GPT()
    for b in model.blocks:
        for p in (*b.c_fc.parameters(), *b.mlp_proj.parameters()):
            p.requires_grad_(False)
    model = strata.offload(model, blocks=list(model.blocks), engine=strata.Engine(
        device_mem="160K", host_mem="400K", nvme=[tmp_path / "nvme"]))
    opt = strata.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-2)
    _train(model, opt, 1, seed=1)
    strata.save_checkpoint(model, tmp_path / "c", opt)
    written = os.path.getsize(tmp_path / "c" / "model.safetensors")
    written += sum(os.path.getsize(f) for f in (tmp_path / "c" / "nvme0").iterdir())
    statvfs = os.statvfs
    monkeypatch.setattr(os, "statvfs", lambda p: os.statvfs_result(
        (*statvfs(p)[:4], 0, *statvfs(p)[5:])))  # no block free
    with pytest.raises(strata.Error, match="the checkpoint needs about") as e:
        strata.save_checkpoint(model, tmp_path / "d", opt)
    need = int(re.search(r"needs about (\d+)", str(e.value)).group(1))
    assert need >= written, (need, written)
