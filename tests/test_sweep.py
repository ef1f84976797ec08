"""Sweeps: searches, cost, Pareto front, rows of points that do not fit, resume, executors."""

import math
import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from simulator.cli import main
from simulator.sweep.scenario import load_scenario
from simulator.sweep.sweep import (
    COST_KEY,
    InlineExecutor,
    PointTask,
    best_per_objective,
    bisect_max_float,
    bisect_max_int,
    evaluate_point,
    p99_seconds,
    pareto_front,
    run_sweep,
    usd_per_million_output_tokens,
)

A100 = "A100-SXM4-80GB"


# --- pure pieces ----------------------------------------------------------------------


def test_integer_bisection_finds_the_last_passing_batch_in_logarithmic_steps():
    calls = []

    def passes(batch):
        calls.append(batch)
        return batch <= 37

    assert bisect_max_int(passes, 1, 1024) == 37
    assert len(calls) <= 2 + math.ceil(math.log2(1024 - 1))  # both ends, then halving 1023 down to 1
    assert bisect_max_int(lambda b: False, 1, 64) is None
    assert bisect_max_int(lambda b: True, 1, 64) == 64


def test_float_bisection_stays_within_tolerance_below_the_threshold():
    found = bisect_max_float(lambda q: q <= 12.5, 0.1, 100.0, 0.01)
    assert 12.5 * (1 - 0.01) <= found <= 12.5  # a rate that passed, at most 1% under the true one
    assert bisect_max_float(lambda q: False, 0.1, 100.0, 0.01) is None
    assert bisect_max_float(lambda q: True, 0.1, 100.0, 0.01) == 100.0


def test_cost_per_million_tokens_by_hand():
    # 2 GPUs at $3/h = $6/h = $1/600 per second; 500 tokens/s -> 1e6 tokens take 2000 s -> $3.33
    assert usd_per_million_output_tokens(3.0, 2, 500.0) == pytest.approx(2000 / 600)


def test_p99_reads_engine_percentiles_and_closed_batch_scalars():
    assert p99_seconds({"latency": {"ttft_seconds": {"mean": 1.0, "p50": 0.9, "p90": 1.5, "p99": 2.5}}}, "ttft") == 2.5
    assert p99_seconds({"latency": {"ttft_seconds": 0.75}}, "ttft") == 0.75
    assert p99_seconds({"latency": {}}, "tpot") is None


def test_pareto_front_keeps_points_no_other_beats_on_both():
    rows = [
        {"point": 0, "t": 100.0, "l": 1.0},
        {"point": 1, "t": 200.0, "l": 2.0},
        {"point": 2, "t": 150.0, "l": 2.5},  # beaten by point 1 on both
        {"point": 3, "t": 200.0, "l": 3.0},  # same throughput as point 1, slower
        {"point": 4, "t": 300.0, "l": 4.0},
        {"point": 5, "fits": False},
    ]
    assert [r["point"] for r in pareto_front(rows, "t", "l")] == [0, 1, 4]


def test_best_throughput_and_cost_only_among_points_meeting_the_slo():
    rows = [
        {"point": 0, "slo.met": False, "throughput.output_tokens_per_second": 900.0, COST_KEY: 1.0, "p99.tpot_seconds": 0.09},
        {"point": 1, "slo.met": True, "throughput.output_tokens_per_second": 500.0, COST_KEY: 2.0, "p99.tpot_seconds": 0.04},
        {"point": 2, "slo.met": True, "throughput.output_tokens_per_second": 400.0, COST_KEY: 1.5, "p99.tpot_seconds": 0.03},
    ]
    best = {objective.label: row["point"] for objective, row in best_per_objective(rows, has_slo=True)}
    assert best["highest output throughput"] == 1
    assert best["lowest $ per million output tokens"] == 2
    assert best["lowest p99 TPOT"] == 2


# --- searches against a model of latency worked out by hand ---------------------------


def fake_run(options):
    """TPOT p99 = batch / 1000 s; TTFT p99 = 0.2 / (1 - q / 20) s at q = qps / replicas; 100 tokens/s per sequence; tp 2."""
    batch, replicas = options.get("batch", 1), options.get("replicas", 1)
    qps = None if options.get("qps") is None else options["qps"] / replicas
    ttft = 0.2 if qps is None else (0.2 / (1 - qps / 20) if qps < 20 else math.inf)
    return {
        "gpu": A100,
        "tp": 2,
        "replicas": replicas,
        "latency": {"ttft_seconds": {"p99": ttft}, "tpot_seconds": {"p99": batch / 1000}, "e2e_seconds": {"p99": 1.0}},
        "throughput": {"output_tokens_per_second": 100.0 * batch},
    }


def test_max_batch_under_slo_with_its_throughput_and_cost(monkeypatch):
    monkeypatch.setattr("simulator.plan.run.run_from_options", fake_run)
    task = PointTask(0, {"model": "m", "gpu": "a100"}, {"tpot": 0.0405}, {"max_batch_under_slo": {"low": 1, "high": 1024}}, {A100: 1.8})
    row = evaluate_point(task)
    assert row["search.max_batch_under_slo.batch"] == 40  # batch / 1000 <= 0.0405  <=>  batch <= 40.5
    assert row["search.max_batch_under_slo.output_tokens_per_second"] == 4000.0
    # $1.8/h x 2 GPUs = $0.001 per second; / 4000 tokens/s = $2.5e-7 per token = $0.25 per million
    assert row["search.max_batch_under_slo.usd_per_million_output_tokens"] == pytest.approx(0.25)


def test_max_qps_under_slo_and_gpus_for_a_target(monkeypatch):
    monkeypatch.setattr("simulator.plan.run.run_from_options", fake_run)
    search = {"max_qps_under_slo": {"low": 0.1, "high": 100.0, "tolerance": 0.02}, "min_gpus_for_qps": {"qps": 50.0}}
    row = evaluate_point(PointTask(0, {"model": "m", "gpu": "a100"}, {"ttft": 1.0}, search, {A100: 1.8}))
    qps = row["search.max_qps_under_slo.qps"]
    assert 16 * (1 - 0.02) <= qps <= 16  # 0.2 / (1 - q/20) <= 1  <=>  q <= 16
    # 50 / 16 = 3.125: the search starts at 4 replicas. 4: 12.5/s each, TTFT 0.2 / (1 - 12.5/20) = 0.53 s passes;
    # 3: 16.7/s each, 0.2 / (1 - 16.7/20) = 1.2 s fails. 4 replicas of 2 GPUs, 8 x $1.8 = $14.4/h
    assert row["search.min_gpus_for_qps.replicas"] == 4
    assert row["search.min_gpus_for_qps.gpus"] == 8
    assert row["search.min_gpus_for_qps.usd_per_hour"] == pytest.approx(14.4)


# --- real points ----------------------------------------------------------------------


def test_a_point_that_does_not_fit_is_a_row_with_the_reason():
    # 68,976,648,192 parameters x 2 bytes = 128.5 GiB of fp16 weights > 80 GiB on one A100
    assert 68_976_648_192 * 2 / 2**30 > 80
    row = evaluate_point(PointTask(3, {"model": "llama2-70b", "gpu": "a100", "tp": 1, "ctx": 256, "gen": 4}, {"tpot": 0.05}))
    assert row["point"] == 3 and row["fits"] is False and row["slo.met"] is False
    assert "does not fit" in row["reason"]
    assert row["input.tp"] == 1 and row["input.gpu"] == "a100"


def test_a_fitting_point_has_inputs_gpus_p99s_and_cost():
    options = {"model": "llama2-7b", "gpu": "a100", "batch": 2, "ctx": 256, "gen": 4}
    row = evaluate_point(PointTask(0, options, {}, {}, {A100: 1.8}))
    assert row["fits"] is True and row["gpus"] == 1 and row["input.batch"] == 2
    assert row["gpu"] == A100 and "operators" not in str(list(row))  # flattened metrics, no lists
    tokens_per_second = row["throughput.output_tokens_per_second"]
    assert row[COST_KEY] == pytest.approx(1.8 * 1 / 3600 / tokens_per_second * 1e6)
    for metric in ("ttft", "tpot", "e2e"):
        reported = row.get(f"latency.{metric}_seconds.p99", row.get(f"latency.{metric}_seconds"))
        assert row[f"p99.{metric}_seconds"] == reported


SMALL = """\
base: {model: llama2-70b, gpu: a100, ctx: 256, gen: 4}
sweep:
  grid:
    tp: [1, 4]
    batch: [1, 8]
slo: {tpot_p99_seconds: 0.05}
"""


def small(tmp_path, name="r.csv", text=SMALL):
    path = tmp_path / "small.yaml"
    path.write_text(text)
    return load_scenario(path, out=str(tmp_path / name))


def test_rows_in_point_order_and_a_point_that_does_not_fit_does_not_stop_the_sweep(tmp_path):
    scenario = small(tmp_path)
    outcome = run_sweep(scenario, InlineExecutor())
    assert [r["point"] for r in outcome.rows] == [0, 1, 2, 3]
    assert [r["fits"] for r in outcome.rows] == [False, False, True, True]  # tp=1 cannot hold 70B
    header = scenario.output_path.read_text().splitlines()[0].split(",")
    assert header[:4] == ["point", "input.batch", "input.ctx", "input.gen"] and "throughput.output_tokens_per_second" in header


@pytest.mark.parametrize("name", ["r.csv", "r.jsonl"])
def test_resume_runs_only_the_missing_points_and_ends_with_the_same_file(tmp_path, name):
    scenario = small(tmp_path, name)
    run_sweep(scenario, InlineExecutor())
    complete = scenario.output_path.read_text()
    lines = complete.splitlines(keepends=True)
    keep = lines[:2] + lines[3:4] if name.endswith(".csv") else [lines[3], lines[0]]  # out of order, rows missing
    scenario.output_path.write_text("".join(keep) + lines[-1][:10])  # and a last line cut short by a kill
    outcome = run_sweep(scenario, InlineExecutor(), resume=True)
    assert (outcome.resumed, outcome.ran) == (2, 2)
    assert scenario.output_path.read_text() == complete


def test_killed_sweep_resumed_equals_an_uninterrupted_one(tmp_path):
    text = "base: {model: llama2-7b, gpu: a100, gen: 2}\nsweep: {grid: {ctx: {start: 64, stop: 2000, step: 48}}}\n"
    total = (2000 - 64) // 48 + 1
    assert total == 41
    uninterrupted = small(tmp_path, "whole.csv", text)
    run_sweep(uninterrupted, InlineExecutor())

    killed = tmp_path / "killed.csv"
    command = [sys.executable, "-c", "from simulator.cli import main; main()", "sweep", str(tmp_path / "small.yaml")]
    process = subprocess.Popen([*command, "--workers", "1", "--out", str(killed)], stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        while process.poll() is None and (not killed.exists() or killed.read_text().count("\n") < 4):
            time.sleep(0.005)
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.wait()
    assert process.returncode == -signal.SIGKILL, "the sweep finished before it could be killed"
    rows_left = killed.read_text().count("\n") - 1
    assert 3 <= rows_left < total

    outcome = run_sweep(load_scenario(tmp_path / "small.yaml", out=str(killed)), InlineExecutor(), resume=True)
    assert outcome.resumed >= 3 and outcome.resumed + outcome.ran == total
    assert killed.read_text() == uninterrupted.output_path.read_text()


def test_process_pool_and_dask_give_the_same_file_as_one_process(tmp_path):
    distributed = pytest.importorskip("dask.distributed")
    scenario_file = tmp_path / "small.yaml"
    scenario_file.write_text(SMALL)
    runner = CliRunner()
    one = runner.invoke(main, ["sweep", str(scenario_file), "--workers", "1", "--out", str(tmp_path / "one.csv")])
    pool = runner.invoke(main, ["sweep", str(scenario_file), "--workers", "2", "--out", str(tmp_path / "pool.csv")])
    assert one.exit_code == 0 and pool.exit_code == 0, one.output + pool.output
    with distributed.LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster:
        dask = runner.invoke(main, ["sweep", str(scenario_file), "--dask", cluster.scheduler_address, "--out", str(tmp_path / "dask.csv")])
    assert dask.exit_code == 0, dask.output
    assert "Dask cluster" in dask.output
    expected = (tmp_path / "one.csv").read_text()
    assert (tmp_path / "pool.csv").read_text() == expected
    assert (tmp_path / "dask.csv").read_text() == expected


def test_summary_names_the_pareto_front_and_best_points(tmp_path):
    scenario_file = tmp_path / "small.yaml"
    scenario_file.write_text(SMALL)
    result = CliRunner().invoke(main, ["sweep", str(scenario_file), "--workers", "1", "--out", str(tmp_path / "s.csv")])
    assert result.exit_code == 0, result.output
    assert "4 points (2 fit, 2 do not fit memory)" in result.output
    assert "Pareto front" in result.output and "Best per objective" in result.output


def test_plot_draws_the_points_that_fit(tmp_path):
    pytest.importorskip("matplotlib")
    scenario_file = tmp_path / "small.yaml"
    scenario_file.write_text(SMALL)
    plot = tmp_path / "sweep.png"
    result = CliRunner().invoke(main, ["sweep", str(scenario_file), "--workers", "1", "--out", str(tmp_path / "p.csv"), "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_how_to_install_it_before_running(tmp_path, monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real_find_spec(name, *a))
    scenario_file = tmp_path / "small.yaml"
    scenario_file.write_text(SMALL)
    out = tmp_path / "p.csv"
    result = CliRunner().invoke(main, ["sweep", str(scenario_file), "--out", str(out), "--plot", str(tmp_path / "x.png")])
    assert result.exit_code == 2 and "pip install -e '.[plot]'" in result.output
    assert not out.exists()  # refused before any point ran


def test_a_disaggregated_run_is_priced_pool_by_pool():
    from simulator.sweep.sweep import usd_per_hour

    prices = {"H100-SXM5-80GB": 1.0, "B200": 100.0}
    split = {"prefill": {"gpu": "B200", "gpus": 2}, "decode": {"gpu": "H100-SXM5-80GB", "gpus": 2}}
    assert usd_per_hour({"gpu": "H100-SXM5-80GB", "gpus": 4, "disaggregation": split}, prices) == 2 * 100.0 + 2 * 1.0
    assert usd_per_hour({"gpu": "H100-SXM5-80GB", "gpus": 4}, prices) == 4 * 1.0
    assert usd_per_hour({"gpu": "A30", "gpus": 1}, prices) is None  # no price: no cost, not a wrong one


def test_a_gpu_without_a_price_is_named_not_silently_left_out_of_the_cost_objective(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text("base: {model: llama3-8b, ctx: 512, gen: 16, batch: 4}\nsweep:\n  grid: {gpu: [a30, h100]}\n")
    out = CliRunner().invoke(main, ["sweep", str(scenario), "-w", "1", "--out", str(tmp_path / "r.csv")])
    assert out.exit_code == 0, out.output
    assert "no price for A30: those points have no cost and are not in the cost objective" in out.output
