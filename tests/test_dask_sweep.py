"""Sweeps on a real Dask cluster (a LocalCluster of two worker processes): the same rows as in process, and a
sweep whose worker is killed mid-run resumes (the results file's --resume) to the same rows."""

from __future__ import annotations

import os
import signal

import pytest
from click.testing import CliRunner

from simulator.cli import main
from simulator.cli.sweep import local_workers
from simulator.errors import InputError
from simulator.sweep.scenario import load_scenario
from simulator.sweep.sweep import InlineExecutor, run_sweep

distributed = pytest.importorskip("dask.distributed")
dask = pytest.importorskip("dask")

# Ten open-loop points of about 0.1 s each: long enough that a worker is killed while it runs one.
SCENARIO = """\
base: {model: llama2-7b, gpu: a100, qps: 5, requests: 200, gen: 64}
sweep: {grid: {ctx: {start: 128, stop: 1280, step: 128}}}
"""
POINTS = (1280 - 128) // 128 + 1  # 10


@pytest.fixture(scope="module")
def cluster():
    # allowed-failures 0: a task whose worker dies fails at once (KilledWorker) instead of being retried elsewhere,
    # so the test sees the sweep stop as it does when a cluster loses workers for good.
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as local:
            yield local


def in_process(tmp_path):
    path = tmp_path / "scenario.yaml"
    path.write_text(SCENARIO)
    scenario = load_scenario(path, out=str(tmp_path / "in-process.csv"))
    assert len(scenario.points()) == POINTS == 10
    run_sweep(scenario, InlineExecutor())
    return path, (tmp_path / "in-process.csv").read_text()


def test_rows_on_a_two_worker_local_cluster_equal_the_in_process_rows(tmp_path, cluster):
    path, expected = in_process(tmp_path)
    result = CliRunner().invoke(main, ["sweep", str(path), "--dask", cluster.scheduler_address, "--out", str(tmp_path / "dask.csv")])
    assert result.exit_code == 0, result.output
    assert f"Dask cluster at {cluster.scheduler_address} (2 threads)" in result.output
    assert (tmp_path / "dask.csv").read_text() == expected
    assert expected.count("\n") == POINTS + 1  # header + 10 rows


def test_a_sweep_whose_worker_is_killed_resumes_to_the_same_rows(tmp_path, cluster):
    path, expected = in_process(tmp_path)
    out = tmp_path / "killed.csv"
    scenario = load_scenario(path, out=str(out))
    with distributed.Client(cluster) as client:
        pids = client.run(os.getpid)  # {worker address: pid}
        finished = []

        def kill_a_busy_worker() -> None:
            finished.append(1)
            if len(finished) == 3:
                # A busy worker if the scheduler sees one; on a fast run every point may already be computed and
                # waiting to be gathered, and then any worker holds results that Dask must compute again.
                busy = [address for address, keys in client.processing().items() if keys] or list(pids)
                os.kill(pids[busy[0]], signal.SIGKILL)

        # The scheduler's view of which worker is busy can be a moment old: when the killed worker held only
        # finished results (not yet gathered), Dask recomputes them elsewhere and the sweep completes instead of
        # stopping. Both are right; either way the rows on disk must resume to the in-process rows.
        try:
            run_sweep(scenario, client.get_executor(pure=False), in_flight=4, on_point=kill_a_busy_worker)
            stopped = False
        except distributed.KilledWorker:
            stopped = True
        assert len(finished) >= 3  # the kill was made
        rows_kept = out.read_text().count("\n") - 1 if out.exists() else 0
        if stopped:  # three rows were on disk when the worker was killed
            assert 3 <= rows_kept < POINTS
        else:
            assert rows_kept == POINTS and out.read_text() == expected

        client.wait_for_workers(2, timeout=60)  # the nanny restarts the killed worker
        outcome = run_sweep(load_scenario(path, out=str(out)), client.get_executor(pure=False), resume=True, in_flight=4)
    assert outcome.resumed == rows_kept and outcome.resumed + outcome.ran == POINTS
    assert out.read_text() == expected


def test_local_n_starts_a_local_cluster_of_n_workers(tmp_path):
    # One worker process (starting it is most of the cost; the two-worker cluster is the fixture's), two points.
    path = tmp_path / "two.yaml"
    path.write_text("base: {model: llama2-7b, gpu: a100, batch: 4, gen: 4}\nsweep: {grid: {ctx: [256, 512]}}\n")
    run_sweep(load_scenario(path, out=str(tmp_path / "in-process.csv")), InlineExecutor())
    result = CliRunner().invoke(main, ["sweep", str(path), "--dask", "local:1", "--out", str(tmp_path / "local.csv")])
    assert result.exit_code == 0, result.output
    assert "on Dask LocalCluster of 1 worker (1 thread)" in result.output
    assert (tmp_path / "local.csv").read_text() == (tmp_path / "in-process.csv").read_text()


@pytest.mark.parametrize("address", ["local:0", "local:x", "local:", "local:-1", "local:1025"])
def test_a_bad_local_worker_count_is_one_line(address):
    with pytest.raises(InputError, match="give local:N with N worker processes, 1 to 1024"):
        local_workers(address)
    assert local_workers("local:3") == 3 and local_workers("tcp://host:8786") is None
