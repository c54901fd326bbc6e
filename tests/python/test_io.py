"""strata.io.Handle: byte-exact round trips on both backends, async requests, errors, GIL."""
import os
import threading
import time

import pytest
import torch

import strata


def _backends():
    out = ["posix"]
    try:
        strata.io.Handle(backend="uring")
        out.append("uring")
    except strata.Error:
        pass  # io_uring refused by this kernel: "auto" falls back, tested below
    return out


def _pattern(nbytes, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)


@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("nbytes,offset", [(0, 0), (1, 0), (17, 15), (1023, 4096), (4095, 7),
                                           (4096, 4096), (1 << 20, 0), ((1 << 20) + 7, 3),
                                           (3 * (1 << 20) + 123, 4096 * 3 + 1)])
def test_round_trip_is_byte_exact(tmp_path, backend, nbytes, offset):
    h = strata.io.Handle(block_size="1M", queue_depth=8, backend=backend)
    assert h.backend == ("io_uring" if backend == "uring" else "posix")
    path = tmp_path / "x.bin"
    src = _pattern(nbytes, nbytes)
    assert h.pwrite(src, path, offset=offset) == nbytes
    assert os.path.getsize(path) == offset + nbytes
    with open(path, "rb") as f:
        f.seek(offset)
        assert f.read() == src.numpy().tobytes()
    dst = torch.zeros(nbytes, dtype=torch.uint8)
    assert h.pread(dst, path, offset=offset) == nbytes
    assert torch.equal(dst, src)


@pytest.mark.parametrize("backend", _backends())
def test_aligned_pinned_buffers_and_typed_tensors(tmp_path, backend):
    h = strata.io.Handle(block_size="64K", backend=backend)
    buf = strata.io.pinned_empty((1 << 18,), torch.float32)  # 1 MiB, page-aligned: O_DIRECT
    assert buf.data_ptr() % 4096 == 0 and torch.count_nonzero(buf) == 0
    buf.copy_(torch.arange(1 << 18, dtype=torch.float32))
    h.pwrite(buf, tmp_path / "f.bin", offset=8192)
    back = strata.io.pinned_empty((512, 512), torch.float32)
    h.pread(back, tmp_path / "f.bin", offset=8192)
    assert torch.equal(back.flatten(), buf)


@pytest.mark.parametrize("backend", _backends())
def test_async_requests(tmp_path, backend):
    h = strata.io.Handle(block_size="4K", queue_depth=4, backend=backend)
    srcs = [_pattern(10000 + i, i) for i in range(6)]
    reqs = [h.async_pwrite(s, tmp_path / f"{i}.bin") for i, s in enumerate(srcs)]
    reqs[0].wait()
    assert reqs[0].done()
    assert h.wait() == 5
    dsts = [torch.empty_like(s) for s in srcs]
    reqs = [h.async_pread(d, tmp_path / f"{i}.bin") for i, d in enumerate(dsts)]
    for r in reversed(reqs):
        r.wait()
    assert all(torch.equal(a, b) for a, b in zip(srcs, dsts))
    assert h.wait() == 0


def test_errors_are_strata_errors(tmp_path):
    h = strata.io.Handle()
    with pytest.raises(strata.Error, match="missing.bin"):
        h.pread(torch.empty(10, dtype=torch.uint8), tmp_path / "missing.bin")
    h.pwrite(_pattern(100, 1), tmp_path / "short.bin")
    with pytest.raises(strata.Error):
        h.pread(torch.empty(200, dtype=torch.uint8), tmp_path / "short.bin")  # past the end
    r = h.async_pread(torch.empty(10, dtype=torch.uint8), tmp_path / "short.bin", offset=95)
    with pytest.raises(strata.Error):
        r.wait()
    with pytest.raises(strata.Error, match="block_size"):
        strata.io.Handle(block_size=1000)
    with pytest.raises(strata.Error, match="not a size"):
        strata.io.Handle(block_size="lots")
    with pytest.raises(strata.Error):
        strata.io.Handle(backend="floppy")
    with pytest.raises(strata.Error, match="contiguous"):
        h.pwrite(torch.zeros(4, 4).t(), tmp_path / "t.bin")


def test_a_path_with_a_nul_byte_is_refused_not_cut_short(tmp_path):
    h = strata.io.Handle()
    for call in (h.pwrite, h.pread):
        with pytest.raises(strata.Error, match="NUL byte at offset"):
            call(_pattern(100, 1), str(tmp_path / "a") + "\0b")
    assert os.listdir(tmp_path) == []  # nothing was written to "a"


def test_blocking_calls_release_the_gil(tmp_path):
    """A Python thread counts while the main thread is inside pread/pwrite."""
    h = strata.io.Handle(block_size="4K", queue_depth=1, backend="posix")
    big = _pattern(64 << 20, 3)
    stop, ticks = threading.Event(), [0]

    def spin():
        while not stop.is_set():
            ticks[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    time.sleep(0.05)
    before = ticks[0]
    start = time.monotonic()
    h.pwrite(big, tmp_path / "big.bin")
    h.pread(big, tmp_path / "big.bin")
    inside = time.monotonic() - start
    during = ticks[0] - before
    stop.set()
    t.join()
    # With the GIL held the spinner would count only at the call's edges (a few hundred at
    # most); released, it runs the whole time.
    assert inside > 0.02 and during > 10000, (inside, during)
