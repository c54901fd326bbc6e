"""strata.Engine's options under `strata train`'s names (speculate, grad_spill, pipeline,
state_dtype, master_dtype, io, io_block, collective_memory, threads) reach the engine: each
changes what the engine does as the CLI's flag does, and a bad value is refused naming the
option."""
import os

import pytest
import torch

import strata
from gpt_model import GPT, batches, param_groups


def _train(tmp_path, name, steps=3, dtype=torch.float32, host_mem="400K", **options):
    nvme = tmp_path / name
    nvme.mkdir()
    engine = strata.Engine(device_mem="160K", host_mem=host_mem, nvme=[nvme], **options)
    model = GPT().to(dtype)
    model = strata.offload(model, blocks=list(model.blocks), engine=engine, micro_batches=2)
    opt = strata.optim.AdamW(param_groups(model, 0.1), lr=2e-2, max_grad_norm=0.5)
    for micro in batches(steps, 2):
        for x, y in micro:
            (model(x, y) / 2).backward()
        opt.step()
    strata.save_safetensors(model, tmp_path / f"{name}.st")
    return (tmp_path / f"{name}.st").read_bytes(), engine


def test_speculate_and_grad_spill_change_how_not_what(tmp_path):
    base, eng = _train(tmp_path, "base", speculate="off", grad_spill="off")
    spec, _ = _train(tmp_path, "spec", speculate="on", io="posix", threads=1)
    spill, spill_eng = _train(tmp_path, "spill", grad_spill="on", io_block="64K")
    assert base == spec == spill  # same results (the CLI's promise)
    # a spilled gradient is written to NVMe, and read back for the update
    assert (spill_eng.last_step_stats()["bytes"]["nvme_write"]
            > eng.last_step_stats()["bytes"]["nvme_write"])
    assert "64.0 KiB" in spill_eng.placement() or "65536" in spill_eng.placement()


def test_state_dtype_bf16_halves_the_moments(tmp_path):
    fp32, eng = _train(tmp_path, "fp32")
    bf16, bf_eng = _train(tmp_path, "bf16", state_dtype="bf16")
    assert fp32 != bf16  # the moments of step 1 are stored in bf16, and step 2 reads them
    assert "Adam moments bf16" in bf_eng.placement()
    assert "Adam moments fp32" in eng.placement()


def test_state_dtype_int8_moves_about_half_the_nvme_bytes(tmp_path):
    # (No gradient to NVMe: the states' bytes alone are compared.)
    fp32, eng = _train(tmp_path, "fp32", grad_spill="off")
    int8, i8_eng = _train(tmp_path, "int8", state_dtype="int8", grad_spill="off")
    assert fp32 != int8
    assert "Adam moments int8" in i8_eng.placement()
    w32 = eng.last_step_stats()["bytes"]["nvme_write"]
    w8 = i8_eng.last_step_stats()["bytes"]["nvme_write"]
    assert 0 < w8 <= 0.55 * w32, (w8, w32)


def test_master_dtype_bf16_with_int8_moments_moves_a_third_of_the_nvme_bytes(tmp_path):
    # A bf16 master is the bf16 model's params: 2 + 1 + 1 bytes (and int8's scales) per
    # parameter against fp32's 12, fp32 master with a bf16 model 14. (Every state is written
    # each step, durable, whatever the budget; no gradient goes to NVMe.)
    fp32, eng = _train(tmp_path, "fp32", host_mem="600K", grad_spill="off")
    bf16, bf_eng = _train(tmp_path, "bf16", dtype=torch.bfloat16, host_mem="600K",
                          grad_spill="off")
    small, sm_eng = _train(tmp_path, "small", dtype=torch.bfloat16, host_mem="600K",
                           grad_spill="off", state_dtype="int8", master_dtype="bf16")
    assert small != bf16
    assert "master bf16-sr" in sm_eng.placement()
    assert "master fp32" in bf_eng.placement()
    w32 = eng.last_step_stats()["bytes"]["nvme_write"]
    w16 = bf_eng.last_step_stats()["bytes"]["nvme_write"]
    w4 = sm_eng.last_step_stats()["bytes"]["nvme_write"]
    assert 0 < w4 <= 0.36 * w32 and w4 <= 0.36 * w16, (w4, w32, w16)
    # An fp32 model is refused by name: the bf16 master is the model's params.
    with pytest.raises(strata.Error, match="master_format bf16-sr needs the bf16 working dtype"):
        _train(tmp_path, "fp32-model", master_dtype="bf16")


def _steps(tmp_path, name, steps, **options):
    """Trains `steps` steps; returns each step's final statistics as they came: per step the
    list Engine.step_stats() gave after its opt.step(), then the one after flush()."""
    nvme = tmp_path / name
    nvme.mkdir()
    engine = strata.Engine(device_mem="160K", host_mem="400K", nvme=[nvme], **options)
    model = GPT()
    model = strata.offload(model, blocks=list(model.blocks), engine=engine, micro_batches=2)
    opt = strata.optim.AdamW(param_groups(model, 0.1), lr=2e-2, max_grad_norm=0.5)
    came = []
    for micro in batches(steps, 2):
        for x, y in micro:
            (model(x, y) / 2).backward()
        opt.step()
        came.append(engine.step_stats())
    engine.flush()
    came.append(engine.step_stats())
    assert engine.last_step_stats()["step"] == steps
    engine.close()
    return came


def test_pipeline_reports_each_step_when_it_commits_with_its_own_updates(tmp_path):
    """With pipeline="on" (the default) a step commits during the next one: step_stats()
    gives it one opt.step() later, the last at flush(), each counting its own updates (the
    NVMe bytes written equal those of pipeline=False step for step, where each step commits
    at its opt.step())."""
    steps = 4
    on = _steps(tmp_path, "on", steps)
    off = _steps(tmp_path, "off", steps, pipeline=False)
    assert [[s["step"] for s in c] for c in on] == [[], [1], [2], [3], [4]]
    assert [[s["step"] for s in c] for c in off] == [[1], [2], [3], [4], []]
    on = [s for c in on for s in c]
    off = [s for c in off for s in c]
    assert all(s["deferred_blocks"] > 0 for s in on)
    assert all(s["deferred_blocks"] == 0 for s in off)
    assert [s["bytes"]["nvme_write"] for s in on] == [s["bytes"]["nvme_write"] for s in off]
    assert all(s["bytes"]["nvme_write"] > 0 for s in on)
    assert [s["grad_norm"] for s in on] == [s["grad_norm"] for s in off]
    assert all(s["overlapped_seconds"] > 0 for s in on[:-1])


@pytest.mark.parametrize("options, message", [
    ({"speculate": "yes"}, "speculate='yes'.*--speculate"),
    ({"grad_spill": 1}, "grad_spill=1"),
    ({"pipeline": "yes"}, "pipeline='yes'.*--pipeline"),
    ({"state_dtype": "fp16"}, "state_dtype='fp16'"),
    ({"master_dtype": "fp16"}, "master_dtype='fp16'"),
    ({"io": "aio"}, "io='aio'"),
    ({"io_block": "5K"}, "io_block='5K': expected a multiple of 4K"),
    ({"collective_memory": "gpu"}, "collective_memory='gpu'"),
    ({"thread": 2}, r"unknown options \['thread'\]"),
])
def test_bad_options_are_refused_naming_them(options, message):
    with pytest.raises(strata.Error, match=message):
        strata.Engine(**options)


def _bound_threads(tmp_path, name, **options):
    """The optimizer threads the engine was opened with, once strata.optim.AdamW bound it."""
    if options.pop("nvme", False):
        (tmp_path / name).mkdir()
        options.update(nvme=[tmp_path / name], device_mem="160K", host_mem="400K")
    engine = strata.Engine(device="cpu", **options)
    model = GPT()
    model = strata.offload(model, blocks=list(model.blocks), engine=engine)
    strata.optim.AdamW(model.parameters(), lr=1e-3)
    return engine.config.optimizer_threads


def test_cpu_engine_threads_default_to_the_cpus_torch_leaves_free(tmp_path):
    # More OpenMP threads than CPUs make libgomp's idle workers sleep after 100 spins, and
    # every one of torch's operators then wakes them (python/strata/_flags.py). With NVMe too:
    # on a busy machine the engine switches to its own default (python/strata/_threads.py,
    # tests/python/test_threads.py).
    cpus = len(os.sched_getaffinity(0))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(cpus)
        assert _bound_threads(tmp_path, "all") == 1
        torch.set_num_threads(1)
        assert _bound_threads(tmp_path, "one") == max(1, cpus - 1)
        assert _bound_threads(tmp_path, "given", threads=3) == 3  # an explicit count is kept
        torch.set_num_threads(cpus)
        assert _bound_threads(tmp_path, "nvme", nvme=True) == 1
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("var", ["WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"])
def test_a_rank_among_several_keeps_the_engines_thread_default(monkeypatch, var):
    # Ranks on one host spin against each other as against any busy process.
    from strata._threads import cpu_engine_threads
    for v in ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"):
        monkeypatch.delenv(v, raising=False)
    assert cpu_engine_threads() >= 1
    monkeypatch.setenv(var, "2")
    assert cpu_engine_threads() == 0
    monkeypatch.setenv(var, "1")
    assert cpu_engine_threads() >= 1
