"""strata.save_checkpoint / load_checkpoint: a fresh process that loads a checkpoint continues
the run bit for bit (weights, moments, step, lr schedule, dropout's RNG), and the checkpoint's
model.safetensors is the weights as plain safetensors."""
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch

import strata
from checkpoint_run import files as _listing, offloaded_run, train as _train
from checkpoint_run import weights as _weights
from gpt_model import GPT, batches, param_groups

HERE = os.path.dirname(os.path.abspath(__file__))


def _child(*args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE] + [p for p in sys.path if p]))
    r = subprocess.run([sys.executable, os.path.join(HERE, "checkpoint_child.py"), *map(str, args)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


def test_a_fresh_process_continues_from_a_checkpoint_bit_for_bit(tmp_path):
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    ckpt = tmp_path / "ckpt"
    _child("save", tmp_path / "a", ckpt, tmp_path / "straight.safetensors")
    _child("load", tmp_path / "b", ckpt, tmp_path / "resumed.safetensors")
    straight = (tmp_path / "straight.safetensors").read_bytes()
    assert (tmp_path / "resumed.safetensors").read_bytes() == straight
    assert sorted(os.listdir(ckpt)) == ["model.safetensors", "nvme0", "python.pt", "strata.json"]
    assert (ckpt / "model.safetensors").read_bytes() != straight  # step 3's weights, not 5's


def test_a_crash_between_the_renames_of_a_save_loses_no_checkpoint(tmp_path):
    """A save that died after moving the older checkpoint to path.old and before renaming
    path.partial into place: load finishes the replace when the new folder is whole (the older
    one here is damaged, so loading it would fail), and takes the older one back when not; a
    first save that died before its rename leaves a whole path.partial, which load takes."""
    for d in ("a", "b", "c"):
        (tmp_path / d).mkdir()
    ckpt = tmp_path / "ckpt"
    _child("save", tmp_path / "a", ckpt, tmp_path / "straight.safetensors")
    straight = (tmp_path / "straight.safetensors").read_bytes()
    old, partial = tmp_path / "ckpt.old", tmp_path / "ckpt.partial"
    shutil.copytree(ckpt, old)
    (old / "python.pt").unlink()
    os.rename(ckpt, partial)  # whole: strata.json is there
    _child("load", tmp_path / "b", ckpt, tmp_path / "resumed.safetensors")
    assert (tmp_path / "resumed.safetensors").read_bytes() == straight
    assert sorted(os.listdir(tmp_path)).count("ckpt") == 1 and not old.exists()
    assert not partial.exists()
    os.rename(ckpt, old)
    shutil.copytree(old, partial)
    (partial / "strata.json").unlink()  # the new folder was not finished
    _child("load", tmp_path / "c", ckpt, tmp_path / "resumed2.safetensors")
    assert (tmp_path / "resumed2.safetensors").read_bytes() == straight
    assert ckpt.is_dir() and not old.exists()
    # The first save of `path` cut off before its one rename: the whole new folder is taken.
    shutil.rmtree(partial)
    os.rename(ckpt, partial)
    (tmp_path / "d").mkdir()
    _child("load", tmp_path / "d", ckpt, tmp_path / "resumed3.safetensors")
    assert (tmp_path / "resumed3.safetensors").read_bytes() == straight
    assert ckpt.is_dir() and not partial.exists()


def _ranks(tmp_path, *args, timeout=60):
    """checkpoint_multirank_child.py as two ranks (launcher variables, a file rendezvous);
    `args` may name "{rank}", which each rank's arguments get its number in. `timeout`: the
    communicator's (STRATA_COMM_TIMEOUT, seconds)."""
    rdzv = tmp_path / f"rdzv-{args[0]}"
    rdzv.mkdir()
    procs = []
    for r in range(2):
        env = {k: v for k, v in os.environ.items()
               if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
        env.update(PYTHONPATH=os.pathsep.join([HERE] + [p for p in sys.path if p]), RANK=str(r),
                   WORLD_SIZE="2", LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="2",
                   STRATA_RENDEZVOUS=f"file:{rdzv}", STRATA_COMM_TIMEOUT=str(timeout))
        procs.append(subprocess.Popen(
            [sys.executable, os.path.join(HERE, "checkpoint_multirank_child.py"),
             *(str(a).format(rank=r) for a in args)],
            env=env, stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]


def test_two_ranks_save_their_shards_and_fresh_ranks_continue_bit_for_bit(tmp_path):
    for r in range(2):
        for d in ("a", "b"):
            (tmp_path / f"{d}{r}").mkdir()
    ckpt = tmp_path / "ckpt"
    _ranks(tmp_path, "save", tmp_path / "a{rank}", ckpt, tmp_path / "straight{rank}.safetensors")
    assert sorted(os.listdir(ckpt)) == ["model.safetensors", "python.pt", "rank0.pt", "rank1.pt",
                                        "strata.json"]
    # As a crash between the save's two renames leaves it (the older folder damaged here): the
    # load finishes the replace before any rank reads.
    shutil.copytree(ckpt, tmp_path / "ckpt.old")
    (tmp_path / "ckpt.old" / "rank1.pt").unlink()
    os.rename(ckpt, tmp_path / "ckpt.partial")
    _ranks(tmp_path, "load", tmp_path / "b{rank}", ckpt, tmp_path / "resumed{rank}.safetensors")
    assert not (tmp_path / "ckpt.old").exists() and not (tmp_path / "ckpt.partial").exists()
    straight = (tmp_path / "straight0.safetensors").read_bytes()
    assert (tmp_path / "straight1.safetensors").read_bytes() == straight
    for r in range(2):
        assert (tmp_path / f"resumed{r}.safetensors").read_bytes() == straight
    assert (ckpt / "model.safetensors").read_bytes() != straight  # step 3's weights, not 5's
    # A single-rank run loads the two ranks' checkpoint (each block's shards read from both
    # rank files): the weights are step 3's bit for bit, and it trains on.
    (tmp_path / "n").mkdir()
    model = GPT()
    model = strata.offload(model, blocks=list(model.blocks), micro_batches=2,
                           engine=strata.Engine(nvme=[tmp_path / "n"]))
    opt = strata.optim.AdamW(param_groups(model, 0.1), lr=2e-2)
    assert strata.load_checkpoint(model, ckpt) == {"epoch": 7}
    assert opt.state_dict()["state"][0]["step"] == 3
    strata.save_safetensors(model, tmp_path / "one.safetensors")
    assert (tmp_path / "one.safetensors").read_bytes() == (ckpt / "model.safetensors").read_bytes()
    for x, y in next(batches(1, 2)):
        (model(x, y) / 2).backward()
    opt.step()


def test_a_rank_that_fails_to_save_or_load_fails_every_rank_at_once(tmp_path):
    """A shard missing at load, or a full disk on one rank at save: that rank raises its own
    error and the other raises one naming it, right away (not at the communicator's timeout,
    set to 10 minutes here); a failed save leaves the earlier checkpoint as it was."""
    for r in range(2):
        for d in ("a", "b", "c"):
            (tmp_path / f"{d}{r}").mkdir()
    ckpt = tmp_path / "ckpt"
    _ranks(tmp_path, "save", tmp_path / "a{rank}", ckpt, tmp_path / "straight{rank}.safetensors")
    before = {n: (ckpt / n).read_bytes() for n in os.listdir(ckpt)}
    broken = tmp_path / "broken"
    shutil.copytree(ckpt, broken)
    (broken / "rank1.pt").unlink()
    t0 = time.monotonic()
    _ranks(tmp_path, "loadfail", tmp_path / "b{rank}", broken, tmp_path / "load{rank}.txt",
           timeout=600)
    _ranks(tmp_path, "savefail", tmp_path / "c{rank}", ckpt, tmp_path / "save{rank}.txt",
           timeout=600)
    assert time.monotonic() - t0 < 300  # far from the two timeouts of 10 minutes
    load = [(tmp_path / f"load{r}.txt").read_text() for r in range(2)]
    assert "failed on rank 1" in load[0] and "is incomplete" in load[1], load
    save = [(tmp_path / f"save{r}.txt").read_text() for r in range(2)]
    assert "failed on rank 1" in save[0] and "No space left" in save[1], save
    assert {n: (ckpt / n).read_bytes() for n in os.listdir(ckpt)} == before
    assert not (tmp_path / "ckpt.partial").exists() and not (tmp_path / "ckpt.old").exists()


def test_checkpoint_needs_nvme_and_a_step_boundary(tmp_path):
    model = GPT()
    model = strata.offload(model, blocks=list(model.blocks), engine=strata.Engine())
    strata.optim.AdamW(model.parameters())
    with pytest.raises(strata.Error, match="needs an engine with NVMe folders"):
        strata.save_checkpoint(model, tmp_path / "c")
    with pytest.raises(strata.Error, match="takes a model given to strata.offload"):
        strata.save_checkpoint(GPT(), tmp_path / "c")
    (tmp_path / "n").mkdir()
    model = GPT()
    model = strata.offload(model, blocks=list(model.blocks), micro_batches=2,
                           engine=strata.Engine(nvme=[tmp_path / "n"]))
    strata.optim.AdamW(model.parameters())
    x = torch.randint(0, 64, (2, 16))
    model(x, x).backward()
    with pytest.raises(strata.Error, match="middle of a step"):
        strata.save_checkpoint(model, tmp_path / "c")


def _offloaded_run(nvme):
    return offloaded_run(nvme)


def test_a_checkpoint_takes_and_replaces_only_the_runs_own_files(tmp_path):
    """The NVMe folder also holds the user's files and the checkpoint folder itself: the
    checkpoint copies the store's state files alone, and a load replaces those alone (it used
    to copy every file, fail on a folder, and delete whatever the folder held)."""
    nvme = tmp_path / "nvme"
    (nvme / "ckpts").mkdir(parents=True)
    (nvme / "notes.txt").write_text("the user's own")
    model, opt = _offloaded_run(nvme)
    _train(model, opt, 2, seed=1)
    saved = _weights(model, tmp_path / "saved.safetensors")
    ckpt = nvme / "ckpts" / "c"
    strata.save_checkpoint(model, ckpt, opt)
    state_files = sorted(strata._strata.store_state_files(0, 1))
    assert state_files == ["strata.manifest", "strata.swap.0-of-1"]
    assert sorted(os.listdir(ckpt / "nvme0")) == state_files
    (nvme / "notes.txt").write_text("changed after the save")
    (nvme / "added.bin").write_bytes(b"made after the save")
    _train(model, opt, 1, seed=2)
    strata.load_checkpoint(model, ckpt, opt)
    assert _weights(model, tmp_path / "loaded.safetensors") == saved
    assert (nvme / "notes.txt").read_text() == "changed after the save"
    assert (nvme / "added.bin").read_bytes() == b"made after the save"
    assert sorted(os.listdir(nvme)) == sorted(
        ["added.bin", "ckpts", "notes.txt", "strata.lock", "strata.stripe"] + state_files)
    _train(model, opt, 1, seed=2)  # the run goes on from the loaded state


def test_a_load_without_room_beside_the_run_replaces_it_in_place_or_changes_nothing(
        tmp_path, monkeypatch):
    """The free space a load sees (os.statvfs, the only thing faked here) decides: less than
    the checkpoint's state needs even in place of the run's: strata.Error saying so, the run's
    state untouched and usable; room only in its place: replaced in place, with a warning. The
    checkpoint's swap file is 1 MiB longer than the run's here (a longer file is still whole),
    so that the three cases differ."""
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    model, opt = _offloaded_run(nvme)
    _train(model, opt, 2, seed=1)
    saved = _weights(model, tmp_path / "saved.safetensors")
    ckpt = tmp_path / "c"
    strata.save_checkpoint(model, ckpt, opt)
    with open(ckpt / "nvme0" / "strata.swap.0-of-1", "ab") as f:
        f.write(bytes(1 << 20))
    saved_state = strata._checkpoint._torch_load(ckpt / "python.pt")  # its size, recorded
    saved_state["files"]["nvme0/strata.swap.0-of-1"] = strata._store_copy.file_digest(
        ckpt / "nvme0" / "strata.swap.0-of-1")
    torch.save(saved_state, ckpt / "python.pt")
    _train(model, opt, 1, seed=2)
    before = _listing(nvme)
    after_step3 = _weights(model, tmp_path / "step3.safetensors")
    need = sum(os.path.getsize(ckpt / "nvme0" / n) for n in os.listdir(ckpt / "nvme0"))
    own = sum(os.path.getsize(nvme / n) for n in os.listdir(ckpt / "nvme0"))
    assert need == own + (1 << 20)
    real = os.statvfs

    def free(bytes_free):
        class Fake:
            f_bavail, f_frsize = bytes_free, 1
        monkeypatch.setattr(os, "statvfs", lambda p: Fake() if str(p) == str(nvme) else real(p))

    free((1 << 20) - 1)
    with pytest.raises(strata.Error, match=f"has {(1 << 20) - 1} bytes free, and the "
                                           f"checkpoint's state needs {need} \\(even in place "
                                           f"of the run's own {own}\\).*nothing was changed"):
        strata.load_checkpoint(model, ckpt, opt)
    assert _listing(nvme) == before
    assert _weights(model, tmp_path / "still.safetensors") == after_step3
    free(1 << 20)
    with pytest.warns(UserWarning, match="replacing it in place"):
        strata.load_checkpoint(model, ckpt, opt)
    assert _weights(model, tmp_path / "loaded.safetensors") == saved
    assert not [n for n in os.listdir(nvme) if n.endswith(".loading")]
    _train(model, opt, 1, seed=2)


def test_a_load_that_fails_while_copying_leaves_the_run_as_it_was(tmp_path, monkeypatch):
    """A copy that fails (ENOSPC from the file system, injected into the copy) before the
    checkpoint's state is whole beside the run's: the staged files are removed, the run's
    state is untouched and the engine goes on from it."""
    import errno
    from strata import _store_copy

    nvme = tmp_path / "nvme"
    nvme.mkdir()
    model, opt = _offloaded_run(nvme)
    _train(model, opt, 2, seed=1)
    ckpt = tmp_path / "c"
    strata.save_checkpoint(model, ckpt, opt)
    _train(model, opt, 1, seed=2)
    before = _listing(nvme)
    after_step3 = _weights(model, tmp_path / "step3.safetensors")
    copies = []

    def failing_copy(src, dst):
        copies.append(dst)
        if len(copies) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", dst)
        return shutil.copyfile(src, dst)

    monkeypatch.setattr(_store_copy.shutil, "copyfile", failing_copy)
    with pytest.raises(strata.Error, match="the run's own state is unchanged"):
        strata.load_checkpoint(model, ckpt, opt)
    assert len(copies) == 2 and copies[0].endswith(".loading")
    assert _listing(nvme) == before
    assert _weights(model, tmp_path / "still.safetensors") == after_step3
    _train(model, opt, 1, seed=2)


def test_a_save_never_replaces_what_is_not_a_checkpoint(tmp_path):
    """save_checkpoint replaces `path` whole: a folder of the user's own there (it used to be
    moved aside and removed, with everything in it), a file or a link is refused before
    anything is written; an empty folder and an older checkpoint are replaced."""
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    model, opt = _offloaded_run(nvme)
    _train(model, opt, 1, seed=1)
    mine = tmp_path / "project"
    mine.mkdir()
    (mine / "train.log").write_text("the user's own")
    with pytest.raises(strata.Error, match="is a folder that is not a strata checkpoint"):
        strata.save_checkpoint(model, mine, opt)
    assert sorted(os.listdir(mine)) == ["train.log"]
    (tmp_path / "file").write_text("x")
    os.symlink(tmp_path / "ckpt", tmp_path / "link")
    for p in ("file", "link"):
        with pytest.raises(strata.Error, match="exists and is not a folder"):
            strata.save_checkpoint(model, tmp_path / p, opt)
    assert (tmp_path / "file").read_text() == "x" and os.path.islink(tmp_path / "link")
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith(("file", "link", "project"))) \
        == ["file", "link", "project"]
    (tmp_path / "ckpt").mkdir()
    strata.save_checkpoint(model, tmp_path / "ckpt", opt)  # an empty folder
    _train(model, opt, 1, seed=2)
    strata.save_checkpoint(model, tmp_path / "ckpt", opt)  # the older checkpoint
    strata.load_checkpoint(model, tmp_path / "ckpt", opt)


def test_a_save_never_removes_a_users_folder_named_like_its_scratch_folders(tmp_path):
    """save_checkpoint(path) writes path.partial and moves an older checkpoint to path.old; a
    folder of the user's own by either name (it used to be removed, with everything in it) is
    refused before anything is written, while a leftover of an earlier save is removed."""
    nvme = tmp_path / "nvme"
    nvme.mkdir()
    model, opt = _offloaded_run(nvme)
    _train(model, opt, 1, seed=1)
    ckpt = tmp_path / "ckpt"
    strata.save_checkpoint(model, ckpt, opt)
    for suffix in (".partial", ".old"):
        mine = tmp_path / ("ckpt" + suffix)
        mine.mkdir()
        (mine / "notes.txt").write_text("the user's own")
        with pytest.raises(strata.Error, match=f"ckpt\\{suffix} is in the way"):
            strata.save_checkpoint(model, ckpt, opt)
        assert sorted(os.listdir(mine)) == ["notes.txt"]
        assert os.path.isfile(ckpt / "strata.json")  # the older checkpoint stays
        shutil.rmtree(mine)
    # Leftovers of an earlier save (a cut-off .partial, a stale .old) are removed.
    shutil.copytree(ckpt, tmp_path / "ckpt.old")
    (tmp_path / "ckpt.partial").mkdir()
    (tmp_path / "ckpt.partial" / "python.pt").write_bytes(b"cut off")
    _train(model, opt, 1, seed=2)
    strata.save_checkpoint(model, ckpt, opt)
    assert not (tmp_path / "ckpt.old").exists() and not (tmp_path / "ckpt.partial").exists()
    strata.load_checkpoint(model, ckpt, opt)
