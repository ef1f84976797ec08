"""Worker processes for a whole validation: rows solved and runs replayed in a pool that lives as long as it.

:func:`simulator.validation.crossval.cross_validate` with ``workers`` > 1 starts one
:class:`RunPool`: each worker process keeps a :class:`~simulator.validation.replay.Replayer` of its
own (its remembered runs and prepared deployments carry over from job to job) and takes two kinds of
job, both pure functions of their arguments, so which worker runs a job, and in what order, changes
no result:

- *solve*: a few rows' efficiency for a parameter with the other held
  (:func:`simulator.validation.solving.row_solution`, a dozen replays each, one after another);
- *replay*: one run at given efficiencies, or several of one row's run (what ``Replayer.prefetch`` asks for).

The workers are forked (where the platform can) when the pool starts, before the caller starts any
thread of its own.
"""

from __future__ import annotations

import gc
import math
import multiprocessing
import os
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Self

from simulator.validation.replay import MAX_PROMPTS, MAX_RATE_PROMPTS, Efficiencies, Replayed, Replayer
from simulator.validation.solving import row_solution
from simulator.validation.table import Row

COLLECTOR_THRESHOLDS = (10_000, 10, 10)
"""The cyclic garbage collector's thresholds while a validation runs (Python's: 700, 10, 10).

A validation allocates millions of short-lived objects (steps, cost tuples, per-run engine state) while it keeps
over half a million (its remembered runs, their summaries, prepared Systems), which every full pass scans again:
the shipped table in one process spent 9.1 s of its CPU time in the collector at Python's thresholds, 6.0 s at
these, for a peak memory of 1.02 GB instead of 0.89 GB (a finished run's result is freed by the collector, not by
reference counting: it lists itself among its replicas)."""


@contextmanager
def relaxed_collection() -> Iterator[None]:
    """:data:`COLLECTOR_THRESHOLDS` inside the block (and in the workers a pool forks there), Python's after."""
    before = gc.get_threshold()
    gc.set_threshold(*COLLECTOR_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*before)


_REPLAYER: Replayer | None = None
"""The worker process's own replayer (set by :func:`_start`; None in the parent)."""


def _start(folder: str, max_prompts: int, max_rate_prompts: int, kernels: str) -> None:
    global _REPLAYER
    gc.set_threshold(*COLLECTOR_THRESHOLDS)  # a spawned worker does not inherit the parent's
    workdir = Path(folder) / f"worker-{os.getpid()}"
    workdir.mkdir(exist_ok=True)
    _REPLAYER = Replayer(workdir, max_prompts, max_rate_prompts, kernels=kernels)


def _ready() -> int:
    return os.getpid()


def _worker() -> Replayer:
    assert _REPLAYER is not None, "a RunPool job ran outside a RunPool worker"
    return _REPLAYER


def _solve_job(jobs: list[tuple[Row, str, float | Efficiencies]]) -> list[tuple[float | None, list[tuple]]]:
    """For each (row, parameter, held): (the row's solution, the runs it simulated that ran: see
    ``Replayer.count_runs``), one after another in this worker."""
    replayer = _worker()
    solved = []
    for job in jobs:
        mark = replayer.mark()
        solved.append((row_solution(replayer, *job), replayer.ran_since(mark)))
    return solved


def _replay_job(jobs: list[tuple[Row, Efficiencies]]) -> list[Replayed]:
    """Runs of one row's run at several efficiencies (or host times), one after another in this worker."""
    replayer = _worker()
    return [replayer.run(row, eff) for row, eff in jobs]


def _work_estimate(row: Row) -> float:
    """A rough size of a row's run, to hand the largest out first: tokens through the engine (requests x
    tokens each; a serving run's requests as simulated, see :meth:`Replayer._simulate`)."""
    if row.is_static_batch:
        requests = float(row.batch or 1)
    else:
        stated = None if row.num_prompts is None else -(-row.num_prompts // row.replicas)
        if row.request_rate in (None, math.inf):
            cap = max(MAX_PROMPTS, 2 * (row.max_num_seqs or 0))
            requests = float(min(stated or cap, cap))
        else:
            requests = float(min(stated, MAX_RATE_PROMPTS) if stated is not None else MAX_PROMPTS)
    return requests * (row.input_tokens + row.output_tokens)


class RunPool:
    """``workers`` processes replaying runs like ``replayer`` (its folder, request caps and kernel mode)."""

    def __init__(self, replayer: Replayer, workers: int) -> None:
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
        self.workers = workers
        self._executor = ProcessPoolExecutor(
            max_workers=workers, mp_context=context, initializer=_start,
            initargs=(str(replayer.workdir), replayer.max_prompts, replayer.max_rate_prompts, replayer.kernels))
        # Under fork every worker starts with the first job: do it now, while this process has one thread.
        self._executor.submit(_ready).result()

    def solve(self, jobs: list[tuple[Row, str, float | Efficiencies]]) -> Future[list[tuple[float | None, list[tuple]]]]:
        """A worker's :func:`~simulator.validation.solving.row_solution` of each (row, parameter, held), one after
        another, each with the runs it simulated."""
        return self._executor.submit(_solve_job, jobs)

    def replay(self, pairs: Iterable[tuple[Row, Efficiencies]]) -> Iterator[tuple[int, Replayed]]:
        """(index in ``pairs``, its run) for each pair.

        The pairs of one run (rows of one ``run_key`` at other efficiencies or host times) go to one worker, which
        prepares the run once and, for host times, costs the steps they share once (``System.with_engine``); the
        largest runs first (:func:`_work_estimate`): handed out in that order, no worker is left with a long run at
        the end while the others wait."""
        jobs = list(pairs)
        groups: dict[tuple, list[int]] = {}
        for index, (row, _) in enumerate(jobs):
            groups.setdefault(row.run_key(), []).append(index)
        order = sorted(groups.values(), key=lambda group: -_work_estimate(jobs[group[0]][0]) * len(group))
        runs = self._executor.map(_replay_job, [[jobs[i] for i in group] for group in order])
        return ((index, run) for group, done in zip(order, runs) for index, run in zip(group, done))

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
