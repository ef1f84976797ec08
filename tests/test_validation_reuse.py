"""What `simulate validate` reuses across runs and rows (prepared runs, name lookups, worker processes) never leaks:
a reused answer is the answer computed afresh, and a different GPU, config folder or setting gets its own."""

import csv
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from simulator.errors import InputError
from simulator.model import load_gpu, load_model, registry
from simulator.plan.run import simulate_settings
from simulator.validation.crossval import cross_validate
from simulator.validation.prepared import PreparedRuns
from simulator.validation.replay import Efficiencies, Replayer
from simulator.validation.table import COLUMNS, load_table

ROOT = Path(__file__).resolve().parent.parent
SMALL = Path(__file__).parent / "data" / "published_small.csv"

STATIC = {"model": "llama2-7b", "gpu": "a100", "tp": 1, "engine": "vllm", "scheduler": "static", "batch": 8,
          "max_num_seqs": 8, "prompt_tokens": "300", "output_tokens": "50", "client_path": "off", "seed": 0}


def _with(options: dict, compute: float, memory: float, expert: float = 1.0) -> dict:
    return dict(options, compute_efficiency=compute, memory_efficiency=memory, expert_efficiency=expert)


def _figures(run) -> tuple:
    m = run.metrics
    return (m.ttft.mean, m.tpot.mean, m.duration_seconds, m.output_tokens_per_second, m.completed)


# --- a run prepared once, rebuilt for other efficiencies ------------------------------------------

def test_a_run_rebuilt_for_other_efficiencies_is_the_run_prepared_afresh():
    runs = PreparedRuns()
    first = runs.simulate(_with(STATIC, 0.7, 0.8))
    for compute, memory in ((0.3, 0.9), (1.0, 0.05), (0.7, 0.8)):
        reused = runs.simulate(_with(STATIC, compute, memory))
        fresh = simulate_settings(_with(STATIC, compute, memory))
        assert _figures(reused) == _figures(fresh)  # bit for bit
        gpu = reused.deployment.system.gpu
        assert (gpu.efficiency.compute, gpu.efficiency.memory) == (compute, memory)
        assert (reused.settings.compute_efficiency, reused.settings.memory_efficiency) == (compute, memory)
    assert runs.prepared == 1  # one preparation, three rebuilds
    assert _figures(runs.simulate(_with(STATIC, 0.7, 0.8))) == _figures(first)


def test_half_the_bandwidth_halves_a_bare_batch_1_decode_rebuilt_or_not(tmp_path):
    """The shipped A100 with every efficiency 1 and no launch or collective costs, the ideal engine, batch 1: llama2-7b
    streams 2 x (6,738,415,616 - 32,000 x 4096) = 13,214,687,232 weight bytes per token, so at 2.039e12 B/s a decode
    step takes at least 13,214,687,232 / 2.039e12 = 6.481 ms, and at half the bandwidth (memory efficiency 0.5)
    at least 12.962 ms; KV reads (<= 129 tokens) and activations add well under 5%."""
    streamed = 2 * (6_738_415_616 - 32_000 * 4096)
    assert streamed == 13_214_687_232
    bare = tmp_path / "a100-bare.yaml"
    bare.write_text(yaml.safe_dump({"base": "a100", "efficiency": {
        "compute": 1.0, "memory": 1.0, "link": 1.0, "kernel_launch_seconds": 0.0, "allreduce_latency_seconds": 0.0}}),
        encoding="utf-8")
    options = dict(STATIC, gpu=str(bare), engine="ideal", batch=1, max_num_seqs=1, prompt_tokens="1",
                   output_tokens="128")
    runs = PreparedRuns()
    full = runs.simulate(_with(options, 1.0, 1.0)).metrics.tpot.mean
    half = runs.simulate(_with(options, 1.0, 0.5)).metrics.tpot.mean
    assert runs.prepared == 1
    assert 6.481e-3 <= full <= 6.481e-3 * 1.05
    assert 12.962e-3 <= half <= 12.962e-3 * 1.05
    assert half == simulate_settings(_with(options, 1.0, 0.5)).metrics.tpot.mean


def test_another_gpu_or_setting_is_prepared_on_its_own():
    runs = PreparedRuns()
    a100 = runs.simulate(_with(STATIC, 0.7, 0.8))
    h100 = runs.simulate(_with(dict(STATIC, gpu="h100"), 0.7, 0.8))
    longer = runs.simulate(_with(dict(STATIC, output_tokens="60"), 0.7, 0.8))
    assert runs.prepared == 3
    # The H100 streams 3.35 TB/s to the A100's 2.039 TB/s: its decode steps are faster.
    assert h100.deployment.system.gpu.name == "H100-SXM5-80GB" and h100.metrics.tpot.mean < a100.metrics.tpot.mean
    assert _figures(h100) == _figures(simulate_settings(_with(dict(STATIC, gpu="h100"), 0.7, 0.8)))
    assert longer.metrics.completed == 8 and longer.metrics.duration_seconds > a100.metrics.duration_seconds


def test_a_shared_workload_is_not_changed_by_the_runs_that_read_it(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_seconds,prompt_tokens,output_tokens\n0.0,100,20\n0.05,300,40\n0.1,50,10\n",
                     encoding="utf-8")
    options = dict(model="llama2-7b", gpu="a100", tp=1, engine="vllm", trace=str(trace), ctx=400, gen=1, seed=0)
    runs = PreparedRuns()
    prepared = runs.prepare(_with(options, 0.7, 0.8))
    before = [np.array(a, copy=True) for a in (prepared.workload.arrival_seconds, prepared.workload.prompt_tokens,
                                               prepared.workload.output_tokens)]
    first = [_figures(runs.simulate(_with(options, c, 0.8))) for c in (0.7, 0.4)]
    again = [_figures(runs.simulate(_with(options, c, 0.8))) for c in (0.7, 0.4)]
    assert first == again and first[0] != first[1]
    after = (prepared.workload.arrival_seconds, prepared.workload.prompt_tokens, prepared.workload.output_tokens)
    assert all(np.array_equal(b, a) for b, a in zip(before, after))


def test_a_refused_run_is_refused_again_with_the_same_message():
    runs = PreparedRuns()
    options = dict(STATIC, model="llama2-70b", gpu="l4")  # 140 GB of fp16 weights on one 24 GB L4
    messages = []
    for compute in (0.7, 0.3):
        with pytest.raises(InputError) as caught:
            runs.simulate(_with(options, compute, 0.8))
        messages.append(str(caught.value))
    assert messages[0] == messages[1] and "does not fit" in messages[0]


def _rebuild_cases() -> list:
    from simulator.cost.system import System
    from simulator.model.engine_profile import load_engine_profile
    from simulator.model.precision import Precision

    moe = load_model("mixtral-8x7b")
    return [
        System(load_model("llama3-8b"), load_gpu("h100"), Precision(), engine=load_engine_profile("vllm"),
               collectives="auto", kernel_efficiency="shape"),
        System(load_model("llama2-13b"), load_gpu("a100"), Precision(weights="int4"), tp=2, kernel_efficiency="shape"),
        System(moe, load_gpu("h100"), Precision(weights="fp8"), tp=2, ep=2, engine=load_engine_profile("sglang"),
               collectives="auto", kernel_efficiency="shape"),
        # llama.cpp accumulates FP16 GEMMs in FP16 (a faster peak on an RTX 4090); FP4 weights on B200 tensor cores
        System(load_model("llama2-7b"), load_gpu("rtx4090"), Precision(), engine=load_engine_profile("llamacpp")),
        System(load_model("llama3-8b"), load_gpu("b200"), Precision(weights="fp4"), engine=load_engine_profile("trtllm"),
               kernel_efficiency="shape"),
    ]


@pytest.mark.parametrize("system", _rebuild_cases(), ids=lambda s: s.describe())
def test_a_system_rebuilt_for_other_efficiencies_is_the_system_built_afresh(system):
    from simulator.model.step import Step

    steps = [Step.prefill(4.0, 2000.0), Step.decode(64.0, 64.0 * 3000.0), Step.decode(8.0, np.array([800.0, 9000.0]))]
    for compute, memory, expert in ((0.3, 0.9, 1.0), (1.0, 0.05, 0.5), (0.7, 0.8, 1.0)):
        rebuilt = system.with_efficiency(compute=compute, memory=memory, expert=expert)
        fresh = replace(system, gpu=system.gpu.with_efficiency(compute=compute, memory=memory, expert=expert))
        assert rebuilt == fresh and rebuilt.operators == fresh.operators and rebuilt.rates == fresh.rates
        assert rebuilt.time_model == fresh.time_model
        for step in steps:
            assert all(np.array_equal(a, b) for a, b in zip(rebuilt.step_totals(step), fresh.step_totals(step)))
    # other efficiencies, other times: a 2000-token prefill is compute-bound, so a third of the compute ceiling
    # makes it slower; the cost memo of the system it was rebuilt from is not read
    slow = system.with_efficiency(compute=system.gpu.efficiency.compute / 3)
    assert slow.totals_memo is not system.totals_memo
    assert slow.step_seconds(steps[0]) > 2 * system.step_seconds(steps[0])


def _profile_file(folder: Path, name: str, per_sequence_seconds: float) -> str:
    """The shipped profile ``name`` as a file, its host seconds per sequence replaced."""
    data = yaml.safe_load((ROOT / "configs" / "engines" / f"{name}.yaml").read_text(encoding="utf-8"))
    data["cpu"]["per_sequence_seconds"] = per_sequence_seconds
    path = folder / f"{name}-{per_sequence_seconds}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return str(path)


def test_a_run_rebuilt_for_another_host_time_is_the_run_of_a_profile_file_with_it(tmp_path):
    """vLLM V0's loop overlaps nothing with the GPU (cpu.overlap 0), so each decode iteration of the batch of 8 lasts
    8 x the host seconds per sequence longer: 60 us more per sequence, 8 x 60 = 480 us more per output token."""
    from simulator.validation.prepared import HOST_OPTION

    options = dict(STATIC, engine="vllm-v0")
    runs = PreparedRuns()
    tpot = {}
    for compute, host in ((0.7, 0.0), (0.7, 6e-5), (0.5, 6e-5), (0.7, 0.0)):
        reused = runs.simulate(dict(_with(options, compute, 0.8), **{HOST_OPTION: host}))
        fresh = simulate_settings(_with(dict(options, engine=_profile_file(tmp_path, "vllm-v0", host)), compute, 0.8))
        assert _figures(reused) == _figures(fresh)  # bit for bit
        tpot[compute, host] = reused.metrics.tpot.mean
    assert runs.prepared == 1
    assert tpot[0.7, 6e-5] - tpot[0.7, 0.0] == pytest.approx(480e-6, abs=1e-12)


def test_systems_share_step_costs_only_where_their_engines_differ_in_host_work_alone():
    from simulator.cost.system import System
    from simulator.model.engine_profile import load_engine_profile
    from simulator.model.precision import Precision
    from simulator.model.step import Step
    from simulator.validation.prepared import engine_with_host

    vllm = load_engine_profile("vllm-v0")
    system = System(load_model("llama2-7b"), load_gpu("a100"), Precision(), tp=2, engine=vllm, collectives="auto",
                    kernel_efficiency="shape")
    slower_host = system.with_engine(engine_with_host(vllm, 5e-4))
    eager = system.with_engine(vllm.eager())  # no CUDA graphs: other launch costs, its own memo
    assert slower_host.totals_memo is system.totals_memo and eager.totals_memo is not system.totals_memo
    steps = [Step.decode(8.0, 8.0 * 500.0), Step.prefill(2.0, 700.0) + Step.decode(6.0, 6.0 * 900.0),
             Step.decode(8.0, np.array([400.0, 401.0, 402.0]))]  # a decode stretch's ticks
    for built in (slower_host, eager, system):  # the shared memo filled by one, read by the other
        fresh = replace(system, engine=built.engine)
        for step in steps * 2:
            assert all(np.array_equal(a, b) for a, b in zip(built.step_totals(step), fresh.step_totals(step)))
    stretch = system.step_totals(steps[2])
    assert isinstance(stretch.flops, np.ndarray) and not stretch.flops.flags.writeable  # shared: nobody may change it
    # A decode tick traced through the shared memo (simulator.cost.tracing): its symbolic evaluation is not kept, the
    # two samples' steps and the one checked here are: three entries more.
    from simulator.cost.step_cost import SHARED_STEPS
    from simulator.cost.tracing import trace_scalar

    shared = system.totals_memo[SHARED_STEPS]
    before = len(shared)
    traced = trace_scalar(lambda keys: slower_host.step_totals(Step.decode(8.0, keys)), (8.0, 8e3))
    assert traced is not None
    assert traced(3000.0) == tuple(float(v) for v in slower_host.step_totals(Step.decode(8.0, 3000.0)))
    assert len(shared) == before + 3
    # A decode step of 8 sequences waits 8 x (500 - 171) us more for the synchronous host loop (vllm-v0: overlap 0).
    more = slower_host.step_seconds(steps[0]) - system.step_seconds(steps[0])
    assert more == pytest.approx(8 * (500e-6 - 171e-6), abs=1e-12)


# --- name lookups remembered per config folder ----------------------------------------------------

def _write_gpu(folder: Path, name: str, bandwidth: float) -> None:
    """A copy of the shipped L4 (300 GB/s) under another name and bandwidth."""
    data = yaml.safe_load((ROOT / "configs" / "gpus" / "l4.yaml").read_text(encoding="utf-8"))
    data.update(name=name, aliases=[name.lower()], hbm_bandwidth_bytes_per_second=bandwidth)
    (folder / "gpus").mkdir(parents=True, exist_ok=True)
    (folder / "gpus" / "mine.yaml").write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")


def test_a_gpu_name_is_looked_up_in_the_config_folder_of_the_moment(tmp_path, monkeypatch):
    one, two = tmp_path / "one", tmp_path / "two"
    _write_gpu(one, "MyGPU", 1.0e12)
    _write_gpu(two, "MyGPU", 2.0e12)
    monkeypatch.setenv(registry.CONFIG_DIR_ENV, str(one))
    assert load_gpu("mygpu").hbm_bandwidth_bytes_per_second == 1.0e12
    assert load_gpu("MYGPU").hbm_bandwidth_bytes_per_second == 1.0e12  # remembered, case-insensitive
    monkeypatch.setenv(registry.CONFIG_DIR_ENV, str(two))
    assert load_gpu("mygpu").hbm_bandwidth_bytes_per_second == 2.0e12
    # a user file named like a shipped GPU's alias wins over the shipped one, and leaving the folder restores it
    _write_gpu(two, "L4", 3.0e12)
    assert load_gpu("l4").hbm_bandwidth_bytes_per_second == 3.0e12
    monkeypatch.delenv(registry.CONFIG_DIR_ENV)
    assert load_gpu("l4").hbm_bandwidth_bytes_per_second == 300.0e9
    with pytest.raises(InputError, match="unknown GPU 'mygpu'"):
        load_gpu("mygpu")


def test_a_remembered_config_file_that_changes_is_read_again(tmp_path, monkeypatch):
    _write_gpu(tmp_path, "MyGPU", 1.0e12)
    monkeypatch.setenv(registry.CONFIG_DIR_ENV, str(tmp_path))
    assert load_gpu("mygpu").hbm_bandwidth_bytes_per_second == 1.0e12
    path = tmp_path / "gpus" / "mine.yaml"
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data["hbm_bandwidth_bytes_per_second"] = 4.0e12
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    stamp = path.stat().st_mtime_ns + 1_000_000_000  # a second later, whatever the file system's clock resolution
    os.utime(path, ns=(stamp, stamp))
    assert load_gpu("mygpu").hbm_bandwidth_bytes_per_second == 4.0e12


def test_a_model_name_is_looked_up_in_the_config_folder_of_the_moment(tmp_path, monkeypatch):
    data = yaml.safe_load((ROOT / "configs" / "models" / "llama2-7b.yaml").read_text(encoding="utf-8"))
    data.update(name="my-model", aliases=[])
    for folder, layers in (("one", 32), ("two", 16)):
        (tmp_path / folder / "models").mkdir(parents=True)
        (tmp_path / folder / "models" / "mine.yaml").write_text(
            yaml.safe_dump(dict(data, num_layers=layers), sort_keys=False), encoding="utf-8")
    monkeypatch.setenv(registry.CONFIG_DIR_ENV, str(tmp_path / "one"))
    assert load_model("my-model").num_layers == 32
    monkeypatch.setenv(registry.CONFIG_DIR_ENV, str(tmp_path / "two"))
    assert load_model("my-model").num_layers == 16
    assert load_model("llama2-7b").num_layers == 32


@pytest.mark.parametrize("kind, shipped, field, load", [
    ("engines", "vllm.yaml", ("cpu", "fixed_seconds"), "simulator.model.engine_profile:load_engine_profile"),
    ("interconnects", "nvlink4.yaml", ("one_shot_latency_seconds",), "simulator.model.interconnect:load_interconnect"),
])
def test_engine_and_interconnect_names_are_looked_up_in_the_config_folder_of_the_moment(
        tmp_path, monkeypatch, kind, shipped, field, load):
    import importlib

    module, name = load.split(":")
    loader = getattr(importlib.import_module(module), name)
    data = yaml.safe_load((ROOT / "configs" / kind / shipped).read_text(encoding="utf-8"))
    data.update(name="mine", aliases=["my-alias"])

    def write(folder: Path, value: float) -> None:
        entry = data
        for key in field[:-1]:
            entry = entry[key]
        entry[field[-1]] = value
        (folder / kind).mkdir(parents=True, exist_ok=True)
        (folder / kind / "mine.yaml").write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")

    def value(spec) -> float:
        for key in field:
            spec = getattr(spec, key)
        return spec

    write(tmp_path / "one", 1e-5)
    write(tmp_path / "two", 2e-5)
    monkeypatch.setenv(registry.CONFIG_DIR_ENV, str(tmp_path / "one"))
    assert value(loader("mine")) == 1e-5 and value(loader("MY-ALIAS")) == 1e-5
    monkeypatch.setenv(registry.CONFIG_DIR_ENV, str(tmp_path / "two"))
    assert value(loader("my-alias")) == 2e-5
    monkeypatch.delenv(registry.CONFIG_DIR_ENV)
    with pytest.raises(InputError, match="unknown"):
        loader("mine")


# --- rows solved and runs replayed in worker processes --------------------------------------------

def test_a_validation_relaxes_the_garbage_collector_only_while_it_runs():
    import gc

    from simulator.validation import pool

    before = gc.get_threshold()
    with pool.relaxed_collection():
        assert gc.get_threshold() == pool.COLLECTOR_THRESHOLDS != before
    assert gc.get_threshold() == before
    with pytest.raises(RuntimeError), pool.relaxed_collection():
        raise RuntimeError("a validation that fails")
    assert gc.get_threshold() == before


def test_a_validation_over_processes_is_the_validation_in_one(tmp_path, monkeypatch):
    """Every fit (in sample, each fold), prediction and the count of runs: the same with two processes as with one."""
    from simulator.validation import replay

    rows = load_table(SMALL)
    with Replayer() as replayer:
        one = cross_validate(rows, replayer)
    monkeypatch.setattr(replay, "PARALLEL_MIN_RUNS", 1)
    said: list[str] = []
    with Replayer() as replayer:
        two = cross_validate(rows, replayer, workers=2, progress=said.append)
    assert [(s.in_sample, s.out_of_sample, s.role) for s in two.scored] == [
        (s.in_sample, s.out_of_sample, s.role) for s in one.scored]
    assert two.in_sample_fit == one.in_sample_fit and two.in_sample_fit.classes == one.in_sample_fit.classes
    assert list(two.fold_fits) == list(one.fold_fits)
    for source, fold in one.fold_fits.items():
        assert two.fold_fits[source] == fold and two.fold_fits[source].classes == fold.classes
        assert (two.fold_fits[source].expert, two.fold_fits[source].host) == (fold.expert, fold.host)
    assert two.engine_runs == one.engine_runs > 0
    assert any(m.startswith("fold ") for m in said) and said[-1].startswith("predicting")


ROW = {"id": "1", "source_id": "s", "engine": "vllm", "engine_version": "", "model": "llama2-7b", "gpu": "a100",
       "tp": "1", "replicas": "1", "weights": "fp16", "kv": "fp16", "mode": "static", "regime": "decode_b1",
       "batch": "1", "input_tokens": "128", "output_tokens": "128", "input_dist": "fixed", "output_dist": "fixed",
       "request_rate": "", "num_prompts": "", "max_num_seqs": "", "max_batched_tokens": "", "chunked_prefill": "",
       "metric": "tpot_seconds", "measured": "0.01", "unit": "seconds", "quote": "", "source": "test",
       "link": "-", "notes": "", "explanation": ""}
"""A static TPOT row of the published.csv schema, as text."""


def _rows(folder: Path, *changes: dict) -> list:
    """The rows of a table of :data:`ROW` with each of ``changes`` (numbered 1, 2, ...)."""
    path = folder / "t.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(COLUMNS))
        writer.writeheader()
        writer.writerows([dict(ROW, id=str(number), **change) for number, change in enumerate(changes, start=1)])
    return load_table(path)


def test_a_row_of_another_gpu_is_replayed_for_its_own_gpu(tmp_path):
    """Two rows alike but for the GPU, through one replayer: each gets its own GPU's run."""
    a100, h100 = _rows(tmp_path, {}, {"gpu": "h100"})
    eff = Efficiencies(0.7, 0.8)
    with Replayer() as shared:
        together = [shared.predict(r, replace(eff, compute=c)).value for c in (0.7, 0.5) for r in (a100, h100)]
    alone = []
    for c in (0.7, 0.5):
        for r in (a100, h100):
            with Replayer() as own:
                alone.append(own.predict(r, replace(eff, compute=c)).value)
    assert together == alone and together[0] != together[1]


def test_a_row_of_another_release_is_replayed_with_its_own_profile(tmp_path):
    """A row's profile is worked out once per row: the same row at vLLM 0.5 (before 0.6: the synchronous V0 loop,
    ``vllm-v0``) replays with that profile, and its TPOT differs from the current engine's."""
    current, older = _rows(tmp_path, {"batch": "8"}, {"batch": "8", "engine_version": "0.5.0"})
    assert current.profile[0] == "vllm" and older.profile[0] == "vllm-v0"
    assert replace(older, engine_version="").profile == current.profile  # a changed row works its profile out again
    assert current.run_key() != older.run_key()
    with Replayer() as replayer:
        eff = Efficiencies(0.7, 0.8)
        assert replayer.predict(current, eff).value != replayer.predict(older, eff).value
