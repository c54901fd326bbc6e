"""Copying a closed engine's committed state out of its NVMe folders and back in: what
save_checkpoint and load_checkpoint (one rank) do with the folders.

The state is the files _strata.store_state_files names (folder 0's manifest and each folder's
swap file), nothing else: the folders may hold the user's own files, a checkpoint folder, the
engine's lock or its activations' scratch files, and a copy neither takes nor replaces those.

Copying in keeps the run's own state until the checkpoint's is whole beside it: each file is
copied under a temporary name (`name`.loading) and synced, then folder 0's manifest is removed
(from here until the last rename the folders hold no committed state, never a manifest naming
another file's extents), the swap files are renamed into place, and the manifest last. Where a
file system has no room for both, the run's state is replaced in place instead (with a warning:
a failure midway leaves no committed state, and the checkpoint itself is untouched); where it
has no room even then, nothing is changed and strata.Error says how much is missing.
"""
import os
import shutil
import warnings
import zlib

from . import _strata
from ._strata import Error

_STAGED = ".loading"


def copy_state_out(folders, dst, what):
    """Copies the committed state of the closed engine whose NVMe folders are `folders` into
    dst/nvme<i>/ (made here), each file synced. Returns {"nvme<i>/name": (bytes, CRC-32)} of
    the copies, which load_checkpoint checks before it changes anything (check_digests)."""
    digests = {}
    for i, folder in enumerate(folders):
        out = os.path.join(dst, f"nvme{i}")
        os.makedirs(out)
        for name in _strata.store_state_files(i, len(folders)):
            src = os.path.join(folder, name)
            if not os.path.isfile(src):
                raise Error(f"{what}: {src} is missing: the engine's NVMe folder {folder} holds "
                            "no committed state to save (was it removed or replaced while the "
                            "engine ran?)")
            _copy_synced(src, os.path.join(out, name))
            digests[f"nvme{i}/{name}"] = file_digest(os.path.join(out, name))
        _sync_folder(out)
    return digests


def file_digest(path):
    """(bytes, CRC-32) of the file at `path`."""
    crc, size, buf = 0, 0, bytearray(8 << 20)
    with open(path, "rb", buffering=0) as f:
        view = memoryview(buf)
        while True:
            n = f.readinto(view)
            if not n:
                return size, crc
            crc, size = zlib.crc32(view[:n], crc), size + n


def check_digests(src, digests):
    """strata.Error naming the first file of the checkpoint `src` whose size or CRC-32 is not
    the one its save recorded (`digests`, as copy_state_out returns them)."""
    for name, (size, crc) in sorted(digests.items()):
        path = os.path.join(src, name)
        if not os.path.isfile(path):
            raise Error(f"the checkpoint {src} is incomplete: it has no {name}; nothing was "
                        "changed")
        got = file_digest(path)
        if got != (size, crc):
            raise Error(f"the checkpoint {src} is damaged: {name} has {got[0]} bytes with "
                        f"CRC-32 {got[1]:08x}, its save wrote {size} bytes with CRC-32 "
                        f"{crc:08x}; nothing was changed")


def copy_state_in(src, folders, what):
    """Replaces the committed state in `folders` (the closed engine's NVMe folders) with the
    one saved in src/nvme<i>/; see the module docstring."""
    n = len(folders)
    files = []  # (target in a folder, source in the checkpoint); folder 0's manifest last
    for i, folder in enumerate(folders):
        for name in _strata.store_state_files(i, n):
            path = os.path.join(src, f"nvme{i}", name)
            if not os.path.isfile(path):
                raise Error(f"the checkpoint {src} is incomplete: it has no nvme{i}/{name}")
            files.append((os.path.join(folder, name), path))
    manifest = files[0][0]
    files = files[1:] + files[:1]
    for target, _ in files:
        _remove(target + _STAGED)  # left by a load cut short
    if _in_place(files, what):
        try:
            _remove(manifest)
            for target, path in files:
                _copy_synced(path, target)
        except OSError as e:
            raise Error(f"{what}: replacing the run's state in place failed ({e}): its NVMe "
                        f"folders hold no committed state now; the checkpoint {src} is "
                        "untouched, so load it again once the cause is fixed") from e
    else:
        try:
            for target, path in files:
                _copy_synced(path, target + _STAGED)
        except OSError as e:
            for target, _ in files:
                _remove(target + _STAGED)
            raise Error(f"{what}: copying the checkpoint's state beside the run's failed ({e}); "
                        "the run's own state is unchanged") from e
        _remove(manifest)
        for target, _ in files:
            os.replace(target + _STAGED, target)
    for folder in folders:
        _sync_folder(folder)


def _in_place(files, what):
    """False when every file system holds the checkpoint's files beside the run's own; True
    (with a warning) when only in their place; strata.Error when not even then."""
    need, own, free, where = {}, {}, {}, {}
    for target, path in files:
        folder = os.path.dirname(target)
        dev = os.stat(folder).st_dev
        if dev not in where:
            st = os.statvfs(folder)
            where[dev], free[dev], need[dev], own[dev] = folder, st.f_bavail * st.f_frsize, 0, 0
        need[dev] += os.path.getsize(path)
        if os.path.isfile(target):
            own[dev] += os.path.getsize(target)
    short = [d for d in need if need[d] > free[d]]
    for d in short:
        if need[d] > free[d] + own[d]:
            raise Error(f"{what}: the file system of {where[d]} has {free[d]} bytes free, and "
                        f"the checkpoint's state needs {need[d]} (even in place of the run's "
                        f"own {own[d]}); free some space there and call it again (nothing was "
                        "changed)")
    if short:
        warnings.warn(f"{what}: no room for the checkpoint's state beside the run's own in "
                      f"{', '.join(where[d] for d in short)}: replacing it in place (if this "
                      "fails midway, the folders hold no committed state until a load "
                      "succeeds; the checkpoint is untouched)", stacklevel=2)
    return bool(short)


def _copy_synced(src, dst):
    _remove(dst)
    shutil.copyfile(src, dst)
    fd = os.open(dst, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path):
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _sync_folder(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
