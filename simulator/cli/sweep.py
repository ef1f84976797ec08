"""``simulate sweep FILE``: run a capacity-planning scenario and summarise it."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import re
import sys
from concurrent.futures import Executor, ProcessPoolExecutor
from typing import Any, Callable

import click

from simulator.cli.options import reports_input_errors
from simulator.errors import InputError
from simulator.files import check_output_folder, check_output_path
from simulator.plan.run import simulate_settings
from simulator.report.deploy import deployment_text, write_deployment
from simulator.report.html import check_html_path
from simulator.report.html.sweep import write_sweep_html
from simulator.report.plots import check_plot_path
from simulator.report.vllm_format import launch_command as engine_launch_command
from simulator.sweep.confidence import chance_text, check_confidence
from simulator.sweep.scenario import Scenario, load_scenario
from simulator.sweep.sweep import (
    COST_KEY,
    THROUGHPUT_KEY,
    InlineExecutor,
    SweepOutcome,
    best_per_objective,
    pareto_front,
    run_sweep,
)
from simulator.units import fmt_seconds, fmt_value

PLOT_LATENCY_KEY = "p99.e2e_seconds"

EPILOG = """\b
Examples:
  simulate sweep scenarios/llama2-70b-a100-vs-h100.yaml
  simulate sweep scenarios/slo-capacity.yaml --workers 2 --out out/capacity.jsonl
  simulate sweep scenarios/slo-capacity.yaml --confidence 0.9   # meet the SLO with a 90% chance
  simulate sweep scenarios/precision.yaml --resume        # continue an interrupted sweep
  simulate sweep scenarios/gqa-vs-mha.yaml --dask local:4
  simulate sweep scenarios/gqa-vs-mha.yaml --dask tcp://scheduler:8786
  simulate sweep scenarios/llama2-70b-a100-vs-h100.yaml --plot out/tradeoff.png

\b
Each finished point is appended to the results file at once (CSV or JSON Lines, one row
per point); --resume skips the points already there, matched by their inputs. Without
--resume an existing results file is replaced. The schema of scenario files is in
docs/readme-sweeps.md.
"""


def default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@click.command("sweep", epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.argument("scenario_file", metavar="FILE", type=click.Path(dir_okay=False))
@click.option("--workers", "-w", type=click.IntRange(min=1), default=None, help="Local worker processes (default: the CPU count; 1 runs in this process).")
@click.option("--out", "-o", metavar="PATH", default=None, help="Results file (.csv or .jsonl); overrides the scenario's output.path.")
@click.option("--resume", is_flag=True, help="Keep the points already in the results file and run only the rest.")
@click.option("--dask", "dask_address", metavar="ADDRESS", default=None,
              help="Run points on Dask: local:N starts a LocalCluster of N worker processes here; tcp://host:8786 joins "
                   "a running cluster's scheduler. Needs the dask extra: pip install -e '.[dask]'.")
@click.option("--plot", "plot_path", metavar="PATH", default=None, help="Also draw throughput vs latency (and vs batch) to PATH (needs matplotlib).")
@click.option("--html", "html_path", metavar="PATH", default=None,
              help="Also write a self-contained HTML report: Pareto fronts (tokens/s per GPU vs per user, vs p99 TTFT "
                   "and TPOT) with the SLO, the chosen point and its launch commands (.html; needs plotly: "
                   "pip install 'memwall[html]').")
@click.option("--launch-command", type=click.Choice(["vllm", "sglang"]), default=None,
              help="Also print the command that launches the best point of each objective on that engine.")
@click.option("--deploy", nargs=2, type=(click.Choice(["k8s", "llm-d", "dynamo"]), str), default=None, metavar="PLATFORM DIR",
              help="Also write the manifests that deploy the best point of each objective to DIR/<objective>/ "
                   "(k8s, llm-d or dynamo; see simulate --help).")
@click.option("--confidence", type=float, default=None, metavar="P",
              help="A point meets the SLO when the chance that its measured p99s do, given the error band of its "
                   "validation class, is at least P (e.g. 0.9); the searches then pick the cheapest configuration "
                   "meeting it with that chance. [default: the scenario's slo.confidence, else none: the predicted "
                   "p99s must meet the limits (the point estimate); the chances are reported either way]")
@reports_input_errors
def sweep_command(scenario_file: str, workers: int | None, out: str | None, resume: bool, dask_address: str | None,
                  plot_path: str | None, launch_command: str | None, confidence: float | None = None,
                  deploy: tuple[str, str] | None = None, html_path: str | None = None) -> None:
    """Run every point of a scenario FILE, write one row per point, summarise the trade-offs.

    A scenario holds base options (any option of `simulate`), sweep axes (grid and zip), an
    SLO on p99 latencies, optional searches (max QPS or batch under the SLO, GPUs for a
    target QPS), GPU prices and the output file. Points that do not fit memory become rows
    with fits=false and the reason.
    """
    scenario = with_confidence(load_scenario(scenario_file, out), confidence)
    if plot_path is not None:
        check_plot_path(plot_path)  # before the sweep: a long run is never lost to a bad plot path
    plot = plot_function() if plot_path is not None else None
    if html_path is not None:
        check_html_path(html_path)  # before the sweep, as --plot
    if scenario.output_is_default:
        try:
            scenario.output_path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"cannot create folder '{scenario.output_path.parent}' for the results ({exc.strerror or exc})") from None
    check_output_path(scenario.output_path, "--out" if out is not None else "output.path")
    if deploy is not None:
        check_output_folder(deploy[1], "--deploy")  # before the sweep, as --plot
    if not resume and scenario.output_path.exists():
        click.echo(f"replacing {scenario.output_path} (use --resume to keep its points)", err=True)
    total = len(scenario.points())
    with make_executor(workers, dask_address, total) as (executor, in_flight, where):
        with progress(total) as advance:
            try:
                outcome = run_sweep(scenario, executor, resume=resume, in_flight=in_flight, on_point=advance)
            except KeyboardInterrupt:
                raise click.ClickException(
                    f"interrupted; the points finished so far are in {scenario.output_path}: rerun with --resume to continue"
                ) from None
            except Exception as exc:
                if not lost_worker(exc):
                    raise
                raise click.ClickException(
                    f"a worker died ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no message'}); "
                    f"the points finished so far are in {scenario.output_path}: rerun with --resume to continue"
                ) from None
    click.echo(summary_text(scenario, outcome, where))
    if launch_command is not None:
        click.echo(launch_text(scenario, outcome, launch_command))
    if deploy is not None:
        click.echo(deploy_text(scenario, outcome, *deploy))
    if plot is not None and plot_path is not None:
        drawn = [row for row in outcome.rows if row.get("fits") is True]
        if not drawn:
            raise InputError(f"--plot: no point of {scenario.name} fits memory; nothing to draw")
        # The p99 column is a number whatever shape the latency metrics take, and it is the
        # latency of the summary's Pareto front.
        plot(drawn, plot_path, latency_key=PLOT_LATENCY_KEY)
        click.echo(f"plot     {plot_path}: output throughput vs p99 end-to-end latency (and vs batch)")
    if html_path is not None:
        write_sweep_html(scenario, outcome.rows, html_path)
        click.echo(f"html     {html_path}: Pareto fronts, the chosen point and its launch commands")


def with_confidence(scenario: Scenario, confidence: float | None) -> Scenario:
    """The scenario with ``--confidence`` as its slo.confidence (the flag wins over the file)."""
    if confidence is None:
        return scenario
    try:
        check_confidence(confidence)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    if scenario.slo is None or not scenario.slo.limits():
        raise InputError(f"--confidence: {scenario.source} has no slo block; the confidence is of meeting its limits")
    return dataclasses.replace(scenario, slo=scenario.slo.model_copy(update={"confidence": confidence}))


def deploy_text(scenario: Scenario, outcome: SweepOutcome, platform: str, folder: str) -> str:
    """Write the manifests of the best point of each objective to folder/<objective>/ (each re-simulated from its
    settings, as launch_text does) and name the files."""
    points = scenario.points()
    has_slo = scenario.slo is not None and bool(scenario.slo.limits())
    best = best_per_objective(outcome.rows, has_slo)
    if not best:
        return "no point fits: nothing to deploy"
    root = check_output_folder(folder, "--deploy")
    try:
        root.mkdir(exist_ok=True)
    except OSError as exc:
        raise InputError(f"--deploy: cannot create folder '{root}' ({exc.strerror or exc})") from None
    lines = []
    for objective, row in best:
        settings = points[int(row["point"])]
        slug = re.sub(r"[^a-z0-9]+", "-", objective.label.lower()).strip("-")
        written, notes = write_deployment(simulate_settings(settings), platform, root / slug)
        lines += ["", f"# best {objective.label} (point {row['point']}):", deployment_text(platform, written, notes)]
    return "\n".join(lines)


def lost_worker(exc: BaseException) -> bool:
    """A worker process died under a point (killed, out of memory): Dask's KilledWorker, the process pool's
    BrokenProcessPool, a closed connection to a Dask worker. Named rather than imported: dask is optional."""
    return type(exc).__name__ in ("KilledWorker", "BrokenProcessPool", "CommClosedError")


def launch_text(scenario: Scenario, outcome: SweepOutcome, engine: str) -> str:
    """The launch command of the best point of each objective (re-simulated from its settings: a single run)."""
    points = scenario.points()
    has_slo = scenario.slo is not None and bool(scenario.slo.limits())
    lines = []
    for objective, row in best_per_objective(outcome.rows, has_slo):
        run = simulate_settings(points[int(row["point"])])
        lines += ["", f"# best {objective.label} (point {row['point']}) on {engine}:", engine_launch_command(run, engine)]
    return "\n".join(lines) if lines else "no point fits: nothing to launch"


def plot_function() -> Callable[..., Any]:
    """simulator.report.plots.plot_sweep, checked before the sweep runs so a missing piece fails fast."""
    if importlib.util.find_spec("matplotlib") is None:
        raise InputError("--plot needs matplotlib: from the clone, pip install -e '.[plot]' (or pip install 'matplotlib>=3.7')")
    try:
        plots = importlib.import_module("simulator.report.plots")
    except ModuleNotFoundError:
        plots = None
    function = getattr(plots, "plot_sweep", None)
    if function is None:
        raise InputError("--plot: this version of memwall has no sweep plots (simulator.report.plots.plot_sweep)")
    return function


LOCAL_WORKERS_LIMIT = 1024


def local_workers(address: str) -> int | None:
    """N of ``--dask local:N`` (a LocalCluster of N worker processes started here), None for a scheduler's address."""
    if not address.startswith("local:"):
        return None
    text = address[len("local:"):]
    if not text.isdigit() or not 1 <= int(text) <= LOCAL_WORKERS_LIMIT:
        raise InputError(f"--dask {address}: give local:N with N worker processes, 1 to {LOCAL_WORKERS_LIMIT} "
                         "(e.g. local:4), or a scheduler's address (tcp://host:8786)")
    return int(text)


class make_executor:
    """Context manager yielding (executor, points in flight, description) for the chosen backend."""

    def __init__(self, workers: int | None, dask_address: str | None, total: int) -> None:
        self.workers, self.dask_address, self.total = workers, dask_address, total
        self._close: list[Callable[[], Any]] = []

    def __enter__(self) -> tuple[Executor, int, str]:
        if self.dask_address:
            if self.workers is not None:
                raise InputError("--workers and --dask: choose one (the Dask cluster has its own workers)")
            return self._dask()
        workers = self.workers or default_workers()
        if workers == 1 or self.total <= 1:
            return InlineExecutor(), 1, "1 worker (in process)"
        pool = ProcessPoolExecutor(max_workers=min(workers, self.total))
        self._close.append(lambda: pool.shutdown(wait=True, cancel_futures=True))
        return pool, 2 * workers, f"{workers} worker processes"

    def _dask(self) -> tuple[Executor, int, str]:
        assert self.dask_address is not None
        local = local_workers(self.dask_address)
        try:
            from dask.distributed import Client, LocalCluster
        except ImportError:
            raise InputError("--dask needs dask.distributed: from the clone, pip install -e '.[dask]'") from None
        if local is not None:
            # One single-threaded worker process per point at a time: the simulation is Python and holds the GIL.
            cluster = LocalCluster(n_workers=local, threads_per_worker=1, processes=True, dashboard_address=":0")
            self._close.append(cluster.close)
            client = Client(cluster)
            where = f"Dask LocalCluster of {local} worker{'s' if local > 1 else ''}"
        else:
            try:
                client = Client(self.dask_address, timeout="10s")
            except (OSError, TimeoutError, ValueError) as exc:
                raise InputError(f"--dask {self.dask_address}: cannot connect to a Dask scheduler ({exc})") from None
            where = f"Dask cluster at {self.dask_address}"
        self._close.append(client.close)
        threads = sum(client.nthreads().values()) or 1
        # pure=False: a point rerun after a lost worker (--resume on the same cluster) is a new task, not the failed one.
        return client.get_executor(pure=False), 2 * threads, f"{where} ({threads} thread{'s' if threads != 1 else ''})"

    def __exit__(self, *exc: Any) -> None:
        for close in reversed(self._close):
            close()


class progress:
    """Context manager yielding a callable that advances a progress bar on stderr (only on a TTY)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self._bar: Any = None

    def __enter__(self) -> Callable[[], None]:
        if not sys.stderr.isatty():
            return lambda: None
        self._bar = click.progressbar(length=self.total, label="points", show_eta=True, show_pos=True, file=sys.stderr)
        bar = self._bar.__enter__()
        return lambda: bar.update(1)

    def __exit__(self, *exc: Any) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)


# ---------------------------------------------------------------------------------------
# The summary printed at the end


# (label, key prefix of the chance columns, key prefix of the p99 columns) of a point's own run and its searches.
_CHANCE_SOURCES = (
    ("its own run", "slo.", "p99.{metric}_seconds"),
    ("at max batch", "search.max_batch_under_slo.slo_", "search.max_batch_under_slo.p99_{metric}_seconds"),
    ("at max QPS", "search.max_qps_under_slo.slo_", "search.max_qps_under_slo.p99_{metric}_seconds"),
    ("at the GPUs for the target QPS", "search.min_gpus_for_qps.slo_", "search.min_gpus_for_qps.p99_{metric}_seconds"),
)


def chance_lines(scenario: Scenario, rows: list[dict[str, Any]]) -> list[str]:
    """Per point, the chance that each of its answers meets each limit: ``meets TTFT p99 <= 2 s: predicted 0.82 s,
    91% likely`` (simulator.sweep.confidence), for its own run and each search's answer."""
    assert scenario.slo is not None and scenario.slo.confidence is not None
    limits = scenario.slo.limits()
    axes = [axis.name for axis in scenario.axes]
    lines = ["", f"Chance of meeting the SLO (at confidence {scenario.slo.confidence:g}: the error band of each point's "
                 "class, a piecewise-linear CDF of measured/predicted through its quantiles)"]
    for row in rows:
        inputs = " ".join(f"{name}={fmt_value(row.get(f'input.{name}'), '')}" for name in axes)
        for label, prefix, p99_key in _CHANCE_SOURCES:
            if prefix + "probability" not in row:
                continue
            joint = _float_or_none(row.get(prefix + "probability"))
            parts = []
            for metric, limit in limits.items():
                predicted = row.get(p99_key.format(metric=metric))
                chance = row.get(f"{prefix}probability.{metric}")
                parts.append(chance_text(metric, limit, _float_or_none(predicted), _float_or_none(chance)))
            all_text = "no error band" if joint is None else f"{100 * joint:.0f}%"
            lines.append(f"  point {row['point']} ({inputs}) {label}: {'; '.join(parts)}; all: {all_text}")
    return lines


def _float_or_none(value: Any) -> float | None:
    """A number from a row cell (a CSV gives text back on --resume), None when empty."""
    if value is None or value == "" or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = ["  " + "  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    for row in rows:
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    return lines


def _search_cell(row: dict[str, Any], key: str) -> str:
    """A search result; '>= x' when it is the search's upper bound (the true answer may be higher)."""
    value = row.get(key)
    text = fmt_value(value, "qps" if key.endswith("qps") else "")
    at_bound = row.get(key.rsplit(".", 1)[0] + ".at_bound") is True
    return f">= {text}" if at_bound else text


def _point_cells(row: dict[str, Any], axes: list[str]) -> list[str]:
    return [str(row["point"]), *(fmt_value(row.get(f"input.{name}"), "") for name in axes)]


def _layout(row: dict[str, Any]) -> str:
    """A fitting point's parallel layout in words: ``tp 2`` or ``tp 8 x pp 2``."""
    pp = row.get("pp")
    return f"tp {row.get('tp')}" + (f" x pp {pp}" if pp not in (None, "", 1, "1") else "")


def layout_note(scenario: Scenario, rows: list[dict[str, Any]]) -> list[str]:
    """A loud line when the planner gave fitting points different tensor-parallel (or pipeline) degrees although the
    scenario set none: a precision or GPU comparison would otherwise compare different GPU counts silently."""
    named = {axis.name for axis in scenario.axes} | {name for name, value in scenario.base.items() if value is not None}
    if named & {"tp", "tensor_parallel_size", "pp", "pipeline_parallel_size"}:
        return []  # asked for: the degrees are the scenario's own
    fitting = [r for r in rows if r.get("fits") is True and r.get("tp") not in (None, "")]
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in fitting:
        groups.setdefault(_layout(row), []).append(row)
    if len(groups) < 2:
        return []
    axes = [axis.name for axis in scenario.axes]

    def points(members: list[dict[str, Any]]) -> str:
        shown = members[:4]
        inputs = "; ".join(" ".join(f"{name}={fmt_value(r.get(f'input.{name}'), '')}" for name in axes) for r in shown)
        more = f" and {len(members) - len(shown)} more" if len(members) > len(shown) else ""
        return f"point{'s' if len(members) > 1 else ''} {', '.join(str(r['point']) for r in shown)}{more} ({inputs})"

    parts = [f"{layout} at {points(members)}" for layout, members in sorted(groups.items())]
    return [f"  WARNING  the points ran at different parallel degrees: {'; '.join(parts)}. The scenario sets no tp, so "
            "each point took the smallest degree whose KV cache holds its batch; their latency and throughput compare "
            "different GPU counts. Set base.tp (or a tp axis) to compare like for like."]


def summary_text(scenario: Scenario, outcome: SweepOutcome, where: str, limit: int = 12) -> str:
    rows = outcome.rows
    axes = [axis.name for axis in scenario.axes]
    fitting = [r for r in rows if r.get("fits") is True]
    has_slo = scenario.slo is not None
    lines = [
        f"memwall sweep: {scenario.name}: {outcome.total} points ({len(fitting)} fit, "
        f"{len(rows) - len(fitting)} do not fit memory) in {outcome.seconds:.1f} s on {where}",
        f"  results  {scenario.output_path}  ({len(rows)} rows: {outcome.ran} run now, {outcome.resumed} resumed"
        + (f", {outcome.dropped} old rows not in this scenario dropped" if outcome.dropped else "")
        + ")",
    ]
    if has_slo:
        assert scenario.slo is not None
        limits = ", ".join(f"p99 {m.upper()} <= {fmt_seconds(v)}" for m, v in scenario.slo.limits().items())
        met = sum(1 for r in rows if r.get("slo.met") is True)
        confidence = scenario.slo.confidence
        chance = "" if confidence is None else f" with a chance >= {100 * confidence:g}% given its class's error band"
        lines.append(f"  SLO      {limits}  ({met} of {len(rows)} points meet it{chance})")
    lines += layout_note(scenario, rows)
    front = pareto_front(fitting, THROUGHPUT_KEY, "p99.e2e_seconds")
    if front:
        lines += ["", f"Pareto front: output throughput vs p99 end-to-end latency ({len(front)} of {len(fitting)} fitting points)"]
        headers = ["point", *axes, "tokens/s", "p99 e2e", "p99 TTFT", "p99 TPOT", "$/M tokens", *(["SLO"] if has_slo else [])]
        table = [
            _point_cells(r, axes)
            + [
                fmt_value(r.get(THROUGHPUT_KEY), "rate"),
                fmt_value(r.get("p99.e2e_seconds"), "seconds"),
                fmt_value(r.get("p99.ttft_seconds"), "seconds"),
                fmt_value(r.get("p99.tpot_seconds"), "seconds"),
                fmt_value(r.get(COST_KEY), "usd"),
                *([fmt_value(r.get("slo.met"), "bool")] if has_slo else []),
            ]
            for r in front[:limit]
        ]
        lines += _table(headers, table)
        if len(front) > limit:
            lines.append(f"  ... {len(front) - limit} more in {scenario.output_path}")
    searched = [key for key in ("search.max_batch_under_slo.batch", "search.max_qps_under_slo.qps", "search.min_gpus_for_qps.gpus") if any(key in r for r in rows)]
    if searched:
        lines += ["", "Searches (per point)"]
        labels = {
            "search.max_batch_under_slo.batch": "max batch under SLO",
            "search.max_qps_under_slo.qps": "max QPS under SLO",
            "search.min_gpus_for_qps.gpus": "GPUs for target QPS",
        }
        extra = ["$/hour"] if "search.min_gpus_for_qps.gpus" in searched else []
        headers = ["point", *axes, "GPUs", *(labels[k] for k in searched), *extra]
        table = [
            _point_cells(r, axes)
            + [fmt_value(r.get("gpus"), "")]
            + [_search_cell(r, k) for k in searched]
            + ([fmt_value(r.get("search.min_gpus_for_qps.usd_per_hour"), "usd")] if extra else [])
            for r in rows[: 3 * limit]
        ]
        lines += _table(headers, table)
        target = next((r.get("search.min_gpus_for_qps.target_qps") for r in rows if "search.min_gpus_for_qps.target_qps" in r), None)
        if target is not None:
            lines.append(f"  target QPS {target:g}; GPUs = fewest replicas whose cluster run at the target meets the SLO "
                         "(searched from ceil(target / max QPS)) x GPUs per replica")
    if has_slo and scenario.slo is not None and scenario.slo.confidence is not None:
        lines += chance_lines(scenario, rows[: 3 * limit])
    best = best_per_objective(rows, has_slo)
    if best:
        lines += ["", "Best per objective" + (" (throughput and cost among points meeting the SLO)" if has_slo else "")]
        table = []
        for objective, row in best:
            kind = {"s": "seconds", "$": "usd", "tokens/s": "rate", "requests/s": "qps"}.get(objective.unit, "")
            value = fmt_value(row.get(objective.key), kind) + ("" if kind in ("seconds", "usd") or not objective.unit else f" {objective.unit}")
            description = " ".join(f"{name}={fmt_value(row.get(f'input.{name}'), '')}" for name in axes)
            table.append([objective.label, value, f"point {row['point']}", description])
        lines += _table(["objective", "value", "point", "inputs"], table)
    unpriced = sorted({str(row.get("gpu")) for row in rows if row.get("fits") and row.get(COST_KEY) is None
                       and row.get("gpu") and row.get("throughput.output_tokens_per_second")})
    if unpriced:  # their points have no cost: the cheapest point is among the others only
        lines += ["", f"  no price for {', '.join(unpriced)}: those points have no cost and are not in the cost "
                      "objective; give cost.usd_per_gpu_hour in the scenario"]
    return "\n".join(lines)
