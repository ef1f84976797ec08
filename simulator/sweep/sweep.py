"""Running a scenario: every point through an Executor, one row each, searches, cost, summary.

A point is evaluated by :func:`simulator.plan.run.run_from_options` (the main command's JSON as
a dict), flattened into one row. A point that does not fit memory is a row with
``fits=False`` and the reason. Searches run on top of each point:

- ``max_batch_under_slo``: the largest batch meeting the SLO (bisection on integers);
- ``max_qps_under_slo``: the largest arrival rate meeting the SLO (geometric bisection);
- ``min_gpus_for_qps``: the fewest replicas of the point's deployment (behind its router) whose
  run at the target rate meets the SLO, times the GPUs of one replica. The search starts at
  ceil(target / max QPS of the point) x the point's replicas and runs the cluster itself at each
  count it tries (``replicas`` setting, :mod:`simulator.engine.cluster`), with the same number of
  requests per replica as the point.

"Meets the SLO" is the predicted p99s within the limits, or, with the SLO's ``confidence`` (``--confidence``),
a chance of at least that much that the measured ones are, given the error band of the run's class
(:mod:`simulator.sweep.confidence`); every row gives those chances (``slo.probability*``, and per search).
Bisection assumes latency grows with batch and with arrival rate, as it does in the model.
Units: seconds, requests/s, tokens/s, US dollars.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from dataclasses import dataclass, field
from typing import Any, Callable

from simulator.errors import InputError
from simulator.sweep.confidence import slo_chances
from simulator.sweep.results_file import ResultsFile
from simulator.sweep.scenario import Scenario
from simulator.tabular import flatten

LATENCY_METRICS = ("ttft", "tpot", "e2e")
THROUGHPUT_KEY = "throughput.output_tokens_per_second"
COST_KEY = "cost.usd_per_million_output_tokens"


# ---------------------------------------------------------------------------------------
# One point


@dataclass(frozen=True)
class PointTask:
    """What a worker needs to evaluate one point (plain data: it travels to other processes)."""

    index: int
    options: dict[str, Any]
    slo: dict[str, float] = field(default_factory=dict)  # {'ttft': seconds, 'tpot': ..., 'e2e': ...}
    search: dict[str, Any] = field(default_factory=dict)  # the scenario's search block as a dict
    usd_per_gpu_hour: dict[str, float] = field(default_factory=dict)
    confidence: float | None = None  # meet the SLO with at least this chance (None: the point estimate)


def is_no_fit(exc: InputError) -> bool:
    return "does not fit" in str(exc)


def run_point(options: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """(result, '') or (None, reason) when it does not fit memory; other bad input raises."""
    # Imported here: simulator.plan.run imports the CLI package, which imports the sweep command.
    from simulator.plan.run import run_from_options

    try:
        return run_from_options(dict(options)), ""
    except InputError as exc:
        if is_no_fit(exc):
            return None, str(exc)
        raise


def p99_seconds(result: dict[str, Any], metric: str) -> float | None:
    """p99 of 'ttft', 'tpot' or 'e2e' in seconds.

    The engine reports {mean, p50, p90, p99}; a closed batch of identical sequences reports
    one number, which is then every percentile.
    """
    value = result.get("latency", {}).get(f"{metric}_seconds")
    if isinstance(value, dict):
        value = value.get("p99")
    return None if value is None else float(value)


def meets_slo(result: dict[str, Any] | None, slo: dict[str, float], confidence: float | None = None) -> bool:
    """Whether a run meets the SLO: its predicted p99s are within the limits (``confidence`` None), or the chance
    that the measured ones are, given the error bands of their classes, is at least ``confidence``
    (:mod:`simulator.sweep.confidence`)."""
    if result is None:
        return False
    if confidence is not None:
        joint = slo_chances(result, slo, p99_seconds)[1]
        return joint is not None and joint >= confidence
    for metric, limit in slo.items():
        value = p99_seconds(result, metric)
        if value is None or value > limit:
            return False
    return True


def chance_columns(result: dict[str, Any], slo: dict[str, float], prefix: str) -> dict[str, Any]:
    """``<prefix>probability`` (all limits) and ``<prefix>probability.<metric>``: the chance the run meets the SLO."""
    chances, joint = slo_chances(result, slo, p99_seconds)
    return {prefix + "probability": joint, **{f"{prefix}probability.{m}": c for m, c in chances.items()}}


def gpus_used(result: dict[str, Any]) -> int:
    """GPUs of the whole run: tensor-parallel x pipeline-parallel degree x replicas."""
    if result.get("gpus") is not None:
        return int(result["gpus"])
    return int(result.get("tp", 1)) * int(result.get("pp", 1) or 1) * int(result.get("replicas", 1) or 1)


def bisect_min_int(passes: Callable[[int], bool], start: int, limit: int) -> int | None:
    """Smallest integer in [1, ``limit``] for which ``passes`` holds (assumed monotone), searched from ``start``.

    Steps down one at a time while the value below passes (a good ``start`` is one or two off), or
    doubles up to the first passing value and bisects back; None when ``limit`` fails too.
    """
    start = max(1, min(start, limit))
    if passes(start):
        while start > 1 and passes(start - 1):
            start -= 1
        return start
    bad, good = start, None
    while good is None:
        if bad >= limit:
            return None
        probe = min(limit, 2 * bad)
        if passes(probe):
            good = probe
        else:
            bad = probe
    return narrow(passes, good, bad)


def narrow(passes: Callable[[int], bool], good: int, bad: int) -> int:
    """Bisect between an integer where ``passes`` holds and one where it fails (either order); the last that holds."""
    while abs(good - bad) > 1:
        middle = (good + bad) // 2
        if passes(middle):
            good = middle
        else:
            bad = middle
    return good


def usd_per_million_output_tokens(usd_per_gpu_hour: float, gpus: int, output_tokens_per_second: float) -> float:
    """Cost of a million generated tokens: ($/GPU-hour x GPUs / 3600 s) / (tokens/s) x 1e6."""
    return usd_per_gpu_hour * gpus / 3600.0 / output_tokens_per_second * 1e6


def _scalar(value: Any) -> Any:
    """numpy scalars -> Python numbers (JSON and CSV want plain values)."""
    return value.item() if hasattr(value, "item") and not isinstance(value, (str, bytes)) else value


def metric_columns(result: dict[str, Any], task: PointTask) -> dict[str, Any]:
    """The derived columns of a point that fits (p99s, SLO, cost) and every flattened metric."""
    gpus = gpus_used(result)
    row: dict[str, Any] = {"gpus": gpus}
    for metric in LATENCY_METRICS:
        row[f"p99.{metric}_seconds"] = p99_seconds(result, metric)
    if task.slo:
        row["slo.met"] = meets_slo(result, task.slo, task.confidence)
        row.update(chance_columns(result, task.slo, "slo."))
        if task.confidence is not None:
            row["slo.confidence"] = task.confidence
    hourly = usd_per_hour(result, task.usd_per_gpu_hour)
    if hourly is not None:
        row["cost.usd_per_gpu_hour"] = hourly / gpus  # the mean over the run's GPUs where its pools' GPUs differ
        row["cost.usd_per_hour"] = hourly
        row[COST_KEY] = _cost_per_million(result, hourly)
    row.update({key: _scalar(value) for key, value in flatten(result).items()})
    warnings = result.get("warnings")
    if warnings:  # a list, which flatten leaves out; kept as one cell so nothing is silently lost
        row["warnings"] = "; ".join(str(w) for w in warnings)
    return row


def bisect_max_int(passes: Callable[[int], bool], low: int, high: int) -> int | None:
    """Largest integer in [low, high] for which ``passes`` holds (assumed monotone), or None."""
    if not passes(low):
        return None
    if passes(high):
        return high
    return narrow(passes, low, high)


def bisect_max_float(passes: Callable[[float], bool], low: float, high: float, tolerance: float) -> float | None:
    """Largest value in [low, high] for which ``passes`` holds, to a relative ``tolerance``, or None.

    Geometric midpoints: the search spends its steps evenly across orders of magnitude. The
    answer is a value that passed, so it never overstates the capacity.
    """
    if not passes(low):
        return None
    if passes(high):
        return high
    good, bad = low, high
    while (bad - good) / bad > tolerance:
        middle = math.sqrt(good * bad)
        if passes(middle):
            good = middle
        else:
            bad = middle
    return good


def usd_per_hour(result: dict[str, Any], usd_per_gpu_hour: dict[str, float]) -> float | None:
    """Dollars an hour of every GPU of a run, a disaggregated run's pools each at its own GPU's price; None where
    a GPU of it has no price."""
    split = result.get("disaggregation")
    pools = ([(split[role]["gpu"], int(split[role]["gpus"])) for role in ("prefill", "decode")] if split
             else [(result.get("gpu"), gpus_used(result))])
    total = 0.0
    for gpu, count in pools:
        price = usd_per_gpu_hour.get(str(gpu))
        if price is None:
            return None
        total += price * count
    return total


def _cost_per_million(result: dict[str, Any], usd_per_hour: float | None) -> float | None:
    """Dollars per million output tokens of a run that costs ``usd_per_hour`` (None: no price, no cost)."""
    tokens_per_second = result.get("throughput", {}).get("output_tokens_per_second")
    if usd_per_hour is None or not tokens_per_second:
        return None
    gpus = gpus_used(result)
    return usd_per_million_output_tokens(usd_per_hour / gpus, gpus, float(tokens_per_second))


def max_batch_columns(task: PointTask, low: int, high: int) -> dict[str, Any]:
    """search.max_batch_under_slo.*: the largest batch in [low, high] whose run fits and meets the SLO."""
    results: dict[int, dict[str, Any] | None] = {}

    def passes(batch: int) -> bool:
        results[batch] = run_point({**task.options, "batch": batch})[0]
        return meets_slo(results[batch], task.slo, task.confidence)

    best = bisect_max_int(passes, low, high)
    prefix = "search.max_batch_under_slo."
    if best is None:
        return {prefix + "batch": None}
    at_best = results[best]
    assert at_best is not None  # it passed, so it ran
    return {
        prefix + "batch": best,
        prefix + "at_bound": best == high,
        prefix + "output_tokens_per_second": at_best["throughput"]["output_tokens_per_second"],
        prefix + "usd_per_million_output_tokens": _cost_per_million(at_best, usd_per_hour(at_best, task.usd_per_gpu_hour)),
        **{prefix + f"p99_{metric}_seconds": p99_seconds(at_best, metric) for metric in LATENCY_METRICS},
        **chance_columns(at_best, task.slo, prefix + "slo_"),
    }


def max_qps_columns(task: PointTask, low: float, high: float, tolerance: float, target_qps: float | None) -> dict[str, Any]:
    """search.max_qps_under_slo.* and, with ``target_qps``, search.min_gpus_for_qps.*."""
    results: dict[float, dict[str, Any] | None] = {}

    def passes(qps: float) -> bool:
        results[qps] = run_point({**task.options, "qps": qps})[0]
        return meets_slo(results[qps], task.slo, task.confidence)

    best = bisect_max_float(passes, low, high, tolerance)
    prefix = "search.max_qps_under_slo."
    row: dict[str, Any] = {prefix + "qps": best}
    at_best = results[best] if best is not None else None
    if best is not None and at_best is not None:
        row[prefix + "at_bound"] = best == high
        row[prefix + "output_tokens_per_second"] = at_best["throughput"]["output_tokens_per_second"]
        for metric in LATENCY_METRICS:
            row[prefix + f"p99_{metric}_seconds"] = p99_seconds(at_best, metric)
        row.update(chance_columns(at_best, task.slo, prefix + "slo_"))
    if target_qps is not None:
        prefix = "search.min_gpus_for_qps."
        row[prefix + "target_qps"] = target_qps
        if best is not None and at_best is not None:
            row.update(min_replicas_columns(task, target_qps, best, at_best))
    return row


MAX_REPLICAS = 1024
"""Most replicas the min_gpus_for_qps search tries (the replicas setting's bound)."""


def min_replicas_columns(task: PointTask, target_qps: float, best_qps: float, at_best: dict[str, Any]) -> dict[str, Any]:
    """search.min_gpus_for_qps.*: the fewest replicas whose cluster run at ``target_qps`` meets the SLO."""
    from simulator.plan.engine_run import OPEN_LOOP_REQUESTS

    base = int(task.options.get("replicas") or 1)
    per_replica = (task.options.get("requests") or OPEN_LOOP_REQUESTS) / base
    results: dict[int, dict[str, Any] | None] = {}

    def passes(replicas: int) -> bool:
        options = {**task.options, "qps": target_qps, "replicas": replicas, "requests": max(1, round(per_replica * replicas))}
        results[replicas] = run_point(options)[0]
        return meets_slo(results[replicas], task.slo, task.confidence)

    estimate = math.ceil(target_qps / best_qps * base)
    replicas = bisect_min_int(passes, estimate, MAX_REPLICAS)
    prefix = "search.min_gpus_for_qps."
    if replicas is None:
        return {prefix + "replicas": None, prefix + "gpus": None, prefix + "usd_per_hour": None}
    run = results[replicas]
    assert run is not None  # it passed, so it ran
    gpus = gpus_used(run)
    price = task.usd_per_gpu_hour.get(str(at_best.get("gpu")))
    return {
        prefix + "replicas": replicas,
        prefix + "gpus": gpus,
        prefix + "usd_per_hour": None if price is None else gpus * price,
        prefix + "estimate_replicas": estimate,
        prefix + "output_tokens_per_second": run.get("throughput", {}).get("output_tokens_per_second"),
        **{prefix + f"p99_{metric}_seconds": p99_seconds(run, metric) for metric in LATENCY_METRICS},
        **chance_columns(run, task.slo, prefix + "slo_"),
    }


def search_columns(task: PointTask) -> dict[str, Any]:
    """Run the scenario's searches from this point's options."""
    row: dict[str, Any] = {}
    batch = task.search.get("max_batch_under_slo")
    if batch:
        row.update(max_batch_columns(task, batch["low"], batch["high"]))
    qps = task.search.get("max_qps_under_slo")
    if qps:
        target = (task.search.get("min_gpus_for_qps") or {}).get("qps")
        row.update(max_qps_columns(task, qps["low"], qps["high"], qps["tolerance"], target))
    return row


def evaluate_point(task: PointTask) -> dict[str, Any]:
    """One row: the point's inputs, whether it fits, its metrics, cost and search results."""
    row: dict[str, Any] = {"point": task.index}
    row.update({f"input.{name}": value for name, value in task.options.items() if value is not None})
    result, reason = run_point(task.options)
    row["fits"] = result is not None
    if result is None:
        row["reason"] = reason
        if task.slo:
            row["slo.met"] = False
    else:
        row.update(metric_columns(result, task))
    row.update(search_columns(task))
    return row


# ---------------------------------------------------------------------------------------
# The whole sweep


def point_key(options: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """A point's identity for --resume: its inputs, as text (a CSV gives text back)."""
    return tuple(sorted((name, _key_text(value)) for name, value in options.items() if value is not None))


def _key_text(value: Any) -> str:
    return str(value)


def row_key(row: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return point_key({key[len("input."):]: value for key, value in row.items() if key.startswith("input.")})


def tasks_for(scenario: Scenario) -> list[PointTask]:
    search = scenario.search.model_dump(exclude_none=True)
    slo = scenario.slo.limits() if scenario.slo else {}
    confidence = scenario.slo.confidence if scenario.slo else None
    return [
        PointTask(index, options, slo, search, dict(scenario.usd_per_gpu_hour), confidence)
        for index, options in enumerate(scenario.points())
    ]


class InlineExecutor(Executor):
    """Runs each task in this process when submitted (``--workers 1``): no pool to start."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
            future.set_exception(exc)
        return future


@dataclass
class SweepOutcome:
    rows: list[dict[str, Any]]
    total: int
    ran: int
    resumed: int
    dropped: int
    seconds: float


def describe(options: dict[str, Any], names: list[str]) -> str:
    return " ".join(f"{name}={options[name]}" for name in names if name in options)


def run_sweep(
    scenario: Scenario,
    executor: Executor,
    resume: bool = False,
    in_flight: int = 4,
    on_point: Callable[[], None] | None = None,
) -> SweepOutcome:
    """Run every point not already in the results file (with ``resume``); rows end in point order.

    At most ``in_flight`` points are submitted at a time, so rows reach the file as they
    finish even on an executor that runs tasks at submission.
    """
    started = time.monotonic()
    tasks = tasks_for(scenario)
    results = ResultsFile(scenario.output_path, scenario.output_format)
    by_key = {point_key(task.options): task for task in tasks}
    kept: dict[int, dict[str, Any]] = {}
    dropped = 0
    if resume:
        for row in results.read():
            task = by_key.get(row_key(row))
            if task is None or task.index in kept:
                dropped += 1
                continue
            kept[task.index] = {**row, "point": task.index}
    results.start(list(kept.values()))
    pending = [task for task in tasks if task.index not in kept]
    axis_names = [axis.name for axis in scenario.axes]
    running: dict[Future, PointTask] = {}
    try:
        queue = iter(pending)
        for task in queue:
            running[executor.submit(evaluate_point, task)] = task
            if len(running) >= in_flight:
                break
        while running:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                task = running.pop(future)
                try:
                    row = future.result()
                except InputError as exc:
                    raise InputError(
                        f"{scenario.source}: point {task.index} ({describe(task.options, axis_names)}): {exc}"
                    ) from None
                results.append(row)
                if on_point is not None:
                    on_point()
                next_task = next(queue, None)
                if next_task is not None:
                    running[executor.submit(evaluate_point, next_task)] = next_task
    except BaseException:
        for future in running:
            future.cancel()
        results.close()
        raise
    rows = results.finish()
    return SweepOutcome(rows, len(tasks), len(pending), len(kept), dropped, time.monotonic() - started)


# ---------------------------------------------------------------------------------------
# Summary


def cell_number(value: Any) -> float | None:
    """A results-file cell as a number: None for an empty, boolean, non-numeric or NaN cell (infinities kept)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def pareto_front(rows: list[dict[str, Any]], maximize: str, minimize: str) -> list[dict[str, Any]]:
    """Rows not beaten on both ``maximize`` and ``minimize`` by another row, by rising ``minimize``.

    Of rows equal on both, the first in point order stays.
    """
    candidates = [r for r in rows if cell_number(r.get(maximize)) is not None and cell_number(r.get(minimize)) is not None]
    candidates.sort(key=lambda r: (cell_number(r[minimize]), -cell_number(r[maximize]), int(r["point"])))  # type: ignore[operator]
    front, best = [], -math.inf
    for row in candidates:
        value = cell_number(row[maximize])
        assert value is not None
        if value > best:
            front.append(row)
            best = value
    return front


@dataclass(frozen=True)
class Objective:
    label: str
    key: str
    goal: str  # 'max' or 'min'
    under_slo: bool  # only points meeting the SLO compete
    unit: str
    tie_break: str = COST_KEY  # lower wins among equal values, then the lower point


OBJECTIVES = (
    Objective("highest output throughput", THROUGHPUT_KEY, "max", True, "tokens/s"),
    Objective("lowest p99 TTFT", "p99.ttft_seconds", "min", False, "s"),
    Objective("lowest p99 TPOT", "p99.tpot_seconds", "min", False, "s"),
    Objective("lowest p99 end-to-end latency", "p99.e2e_seconds", "min", False, "s"),
    Objective("lowest $ per million output tokens", COST_KEY, "min", True, "$"),
    Objective("largest batch under SLO", "search.max_batch_under_slo.batch", "max", False, ""),
    Objective("highest QPS under SLO", "search.max_qps_under_slo.qps", "max", False, "requests/s"),
    Objective("fewest GPUs for the target QPS", "search.min_gpus_for_qps.gpus", "min", False, "GPUs", "search.min_gpus_for_qps.usd_per_hour"),
)


def best_per_objective(rows: list[dict[str, Any]], has_slo: bool) -> list[tuple[Objective, dict[str, Any]]]:
    """(objective, best row) for each objective some row has a value for; ties go to the lower point."""
    best = []
    for objective in OBJECTIVES:
        competing = [
            r
            for r in rows
            if cell_number(r.get(objective.key)) is not None and (not (objective.under_slo and has_slo) or r.get("slo.met") is True)
        ]
        if not competing:
            continue
        sign = -1.0 if objective.goal == "max" else 1.0
        def rank(row: dict[str, Any]) -> tuple[float, float, int]:
            tie = cell_number(row.get(objective.tie_break))
            return sign * cell_number(row[objective.key]), math.inf if tie is None else tie, int(row["point"])  # type: ignore[operator]

        winner = min(competing, key=rank)
        best.append((objective, winner))
    return best
