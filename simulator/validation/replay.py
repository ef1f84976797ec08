"""Validation against published measurements: the table, and each row replayed through the engine.

A row of ``validation/published.csv`` (schema: :data:`COLUMNS`) names a published run (engine,
model, GPU, tensor-parallel degree, dtypes, workload, engine settings) and one figure it
measured, in SI units. :class:`Replayer` runs the row through the serving engine
(:func:`simulator.plan.run.simulate_settings`) with a given pair of efficiency ceilings and reads
the same figure off the run's aggregates:

- a *static batch* (``mode`` static, one batch of fixed lengths, ``num_prompts`` blank or equal
  to ``batch``): ``batch`` requests at t = 0 under the static scheduler with ``max_num_seqs =
  batch``, so they prefill together (TTFT of the batch = its prefill) and decode in lockstep,
  as the vendor benchmarks ran. When the memory plan's KV cache holds fewer sequences than the
  batch (flagged ``fits=False`` with a note): if weights plus the batch's KV fit in HBM, the
  batch runs as one (the simulator's budget is stricter than the engine that ran it); if not,
  no engine could have, and the static scheduler runs it in smaller batches. When the
  deployment itself is refused for lack of memory, the batch is run with a KV cache forced to
  hold it (flagged too).
- anything else (serving at a rate, or an offline run of ``num_prompts`` requests at once):
  the requests are written to a small trace file (arrival times Poisson at ``request_rate``,
  all at t = 0 for ``inf`` or static mode; lengths drawn from ``input_dist``/``output_dist``
  with a fixed seed, a ``dataset:`` file's scaled to the row's stated means and capped at the
  ``dataset:NAME:MAX`` a source states) and replayed
  with the row's engine settings (where the source states none, the engine profile's
  scheduler defaults: :func:`scheduler_settings`). At a rate, the source's whole run is
  simulated (up to :data:`MAX_RATE_PROMPTS` requests per replica); all at once, at most
  :data:`MAX_PROMPTS` requests or two waves of ``max_num_seqs`` (a note says so when the source
  ran more). The throughputs of a capped run at a rate are the source's whole run's
  (:func:`whole_run_scale`), unless its requests drain for more than half its arrival span (no
  steady state reached: the capped run's own).

A serving row that states a closed loop (:attr:`Row.concurrency`: ``request_rate`` inf, ``max_num_seqs`` = the
clients, and the quote or notes say so) is replayed as a closed loop of that many clients
(:mod:`simulator.engine.closed_loop`), each sending its next request when its last finishes, with the engine
profile's own ``max_num_seqs``. Serving rows are charged the engine profile's client path (HTTP,
tokenisation, hand-off: :mod:`simulator.cost.client_path`); static rows, offline benchmarks that call the
engine in process, are not.

Static metrics: ``ttft_seconds`` mean TTFT, ``tpot_seconds`` mean TPOT, ``e2e_seconds`` the
whole batch's wall time, ``output_tokens_per_second``/``total_tokens_per_second`` over the run,
``decode_tokens_per_second_per_sequence`` output tokens/s divided by the batch,
``request_throughput`` completed requests/s. Serving metrics ``{ttft,tpot,itl,e2e}_{mean,p50,p99}_seconds``
are the run's summaries. With ``replicas`` R > 1 (data-parallel copies behind a router), one
replica is simulated at 1/R of the arrival rate and of the requests (random routing splits a
Poisson stream into R Poisson streams), and throughputs are multiplied by R; a static batch
with R > 1 is skipped (how it was split is not stated). A row whose model, GPU or setting the
simulator lacks is skipped with the reason, never dropped silently.

The engine profile is the row's engine where a profile of that name ships (vllm, sglang,
trtllm); other engines use the closest one (:data:`ENGINE_PROFILE_FOR`, said in each row's notes).
"""

from __future__ import annotations

import functools
import math
import multiprocessing
import os
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple, Self

import numpy as np

from simulator.engine.metrics import Aggregates
from simulator.errors import InputError
from simulator.model import Efficiency, ModelSpec, load_model
from simulator.model.gpu_family import _gpu
from simulator.model.kernel_ceilings import END_TO_END, with_ceilings
from simulator.validation.lengths import SCALE_TOLERANCE, dataset_spec, find_lengths
from simulator.validation.prepared import HOST_OPTION, PreparedRuns
from simulator.validation.profiles import (
    _profile_scheduler,
)
from simulator.validation.table import Row

MAX_PROMPTS = 1000
"""Most requests simulated for a row whose requests all arrive at once (or two waves of its ``max_num_seqs``)."""

MAX_RATE_PROMPTS = 250_000
"""Most requests simulated per replica for a row at a request rate: the source's whole run, up to this.

Latencies near capacity depend on how long the queue had to grow: a run cut to its first thousand
requests ends before the source's did (MLPerf's Server runs last 2,400 s or more) and reports a queue that
never built up. The largest run at a rate in the shipped table is 110,592 requests per replica (MLPerf
v5.0 B200 Server: 884,736 over 8 replicas), which the engine replays in seconds."""


SEED = 0
"""Seed of every sampled arrival and length: the same table gives the same predictions."""


# --- replaying rows through the engine -----------------------------------------------------------

@dataclass(frozen=True)
class Efficiencies:
    """The calibrated ceilings: fractions of peak FLOP/s and of HBM bandwidth, and the fraction of both that
    routed-expert GEMMs reach (``Efficiency.expert``; 1: as dense GEMMs)."""

    compute: float
    memory: float
    expert: float = 1.0
    host_per_sequence: float | None = None
    """host seconds per sequence per iteration of the row's engine profile, where fitted (crossval rule 8);
    None: the profile's own"""
    ceilings: str = END_TO_END
    """where the GPU config's other roofline parameters come from (``--ceilings``: its own, or ``kernels``:
    simulator.model.kernel_ceilings); ``compute`` and ``memory`` above override both"""


DEFAULT_EFFICIENCIES = Efficiencies(Efficiency().compute, Efficiency().memory, Efficiency().expert)
"""simulator/model/gpu.py's defaults (0.70 / 0.80 / 1), not fitted on any table: a family without rows keeps them."""


@dataclass(frozen=True)
class Replayed:
    """One simulated run (``metrics`` None when skipped, with the reason)."""

    metrics: Aggregates | None
    requests: int = 0
    skipped: str = ""
    replicas: int = 1
    """copies of the simulated deployment the figure is for (throughputs scale by it)"""
    notes: tuple[str, ...] = ()
    fits: bool = True
    throughput_scale: float = 1.0
    """what the run's throughputs are multiplied by to stand for the source's whole run (:func:`whole_run_scale`)"""


class ReplayTrace(NamedTuple):
    """A row's requests written as a trace file for the engine."""

    path: Path
    longest_tokens: int
    """the longest request, prompt plus output"""
    notes: tuple[str, ...]
    arrival_span_seconds: float
    """last arrival - first arrival (0 when all arrive at once)"""


@dataclass(frozen=True)
class Prediction:
    """A row's predicted figure (None when skipped) and what to know about how it was made."""

    value: float | None
    skipped: str = ""
    notes: tuple[str, ...] = ()
    fits: bool = True


@functools.cache
def _model(name: str) -> ModelSpec:
    return load_model(name)


def metric_value(metric: str, m: Aggregates, batch: int, replicas: int = 1, throughput_scale: float = 1.0) -> float:
    """The figure ``metric`` of a run (SI units; see the module docstring); throughputs of ``replicas`` copies,
    times ``throughput_scale`` (:func:`whole_run_scale`)."""
    if metric in ("output_tokens_per_second", "total_tokens_per_second"):
        return float(getattr(m, metric)) * replicas * throughput_scale
    if metric == "request_throughput":
        return m.requests_per_second * replicas * throughput_scale
    if metric == "decode_tokens_per_second_per_sequence":
        return m.output_tokens_per_second / batch
    if metric == "e2e_seconds":
        return m.duration_seconds
    what, _, stat = metric.removesuffix("_seconds").partition("_")
    summary = getattr(m, what)
    return float(getattr(summary, "mean" if stat in ("", "mean") else stat))


def whole_run_scale(simulated: int, stated: int, rate: float, arrival_span_seconds: float,
                    duration_seconds: float) -> float:
    """Factor from a run of the first ``simulated`` of ``stated`` requests at ``rate`` (requests/s) to the
    throughput of the source's whole run.

    A throughput over a run is its requests' tokens over the time from the first arrival to the last
    completion: the arrivals' span plus the drain after the last arrival. The source's ``stated``
    requests arrive over ``stated / rate`` seconds and drain as the simulated ones do, so (k = stated /
    simulated, A = the simulated arrivals' span, D = the simulated duration, D - A its drain):

        whole-run throughput = k x tokens / (stated / rate + D - A) = simulated throughput x k D / (stated / rate + D - A)

    Without it a capped replay charges its whole drain to a tenth or a hundredth of the source's
    arrivals (1,000 of MLPerf's 221,184 requests: an 18 s drain against 88 s of arrivals, -17%).
    """
    if stated <= simulated or duration_seconds <= 0 or not (0 < rate < math.inf):
        return 1.0
    drain = max(0.0, duration_seconds - arrival_span_seconds)
    return (stated / simulated) * duration_seconds / (stated / rate + drain)


PARALLEL_MIN_RUNS = 32
"""Fewer runs than this are simulated in-process (starting workers costs more than they save)."""

_WORKER_REPLAYER: Replayer | None = None


def _replay_in_worker(job: tuple[Row, Efficiencies, str, int, int, str]) -> Replayed:
    """One run in a pool worker, with a replayer of its own (trace files under the parent's folder)."""
    global _WORKER_REPLAYER
    row, eff, folder, max_prompts, max_rate_prompts, kernels = job
    if _WORKER_REPLAYER is None or _WORKER_REPLAYER.kernels != kernels:
        workdir = Path(folder) / f"worker-{os.getpid()}"
        workdir.mkdir(exist_ok=True)
        _WORKER_REPLAYER = Replayer(workdir, max_prompts, max_rate_prompts, kernels=kernels)
    return _WORKER_REPLAYER.run(row, eff)


def scheduler_settings(row: Row, profile: str) -> dict[str, Any]:
    """Scheduler settings of a non-static row: what the source states, else its engine profile's defaults.

    ``chunked_prefill`` true/false picks chunked/continuous; a token budget is passed to the
    continuous scheduler only when the source states one (it refuses longer prompts), and is
    never below ``max_num_seqs`` (every running decode takes one token of it).
    """
    defaults = _profile_scheduler(profile, row.gpu)
    out: dict[str, Any] = {}
    if row.chunked_prefill is not None:
        out["scheduler"] = "chunked" if row.chunked_prefill else "continuous"
    elif defaults is not None:
        out["scheduler"] = defaults.kind
    seqs = row.max_num_seqs
    if seqs is None and row.mode == "static" and row.batch is not None:
        seqs = row.batch
    if seqs is None and defaults is not None:
        seqs = defaults.max_num_seqs
    if seqs is not None:
        out["max_num_seqs"] = seqs
    budget = row.max_batched_tokens
    if budget is None and out.get("scheduler") == "chunked" and defaults is not None:
        budget = defaults.max_batched_tokens
    if budget is not None:
        out["max_batched_tokens"] = max(budget, seqs or 1)
    if defaults is not None:
        out["block_size"] = defaults.block_size
    return out


class Replayer:
    """Runs rows through the engine and remembers each run by (run, efficiencies): rows of one run share it."""

    def __init__(self, workdir: Path | None = None, max_prompts: int = MAX_PROMPTS,
                 max_rate_prompts: int = MAX_RATE_PROMPTS, kernels: str = "roofline") -> None:
        """``kernels``: what times the operators of every replayed run (``--kernels``: roofline, measured, auto)."""
        self._own = tempfile.TemporaryDirectory(prefix="memwall-validate-") if workdir is None else None
        self.workdir = Path(self._own.name) if self._own is not None else Path(workdir)  # type: ignore[arg-type]
        self.max_prompts = max_prompts
        self.max_rate_prompts = max_rate_prompts
        self.kernels = kernels
        self._runs: dict[tuple, Replayed] = {}
        self._traces: dict[tuple, ReplayTrace] = {}
        self._prepared: PreparedRuns | None = None
        self._ran_elsewhere: set[tuple] = set()
        """runs simulated in worker processes for this replayer and not remembered here (see :meth:`count_runs`)"""
        self._ran: list[tuple] = []
        """the keys of the runs simulated here (not skipped), in order (see :meth:`ran_since`)"""

    @property
    def engine_runs(self) -> int:
        """Distinct runs simulated (skipped ones not counted), here or in worker processes for this replayer."""
        here = {key for key, run in self._runs.items() if run.metrics is not None}
        return len(here | self._ran_elsewhere)

    def count_runs(self, keys: Iterable[tuple]) -> None:
        """Count runs that a worker process simulated for this replayer (keys from its :meth:`ran_since`)."""
        self._ran_elsewhere.update(keys)

    def mark(self) -> int:
        """A mark for :meth:`ran_since`: how many runs were simulated here so far."""
        return len(self._ran)

    def ran_since(self, mark: int) -> list[tuple]:
        """The keys of the runs simulated here (and not skipped) since ``mark``, in order."""
        return self._ran[mark:]

    def _preparations(self) -> PreparedRuns:
        """Runs that differ only in their efficiencies and host time share their preparation (simulator.validation.prepared)."""
        if self._prepared is None:
            self._prepared = PreparedRuns()
        return self._prepared

    def close(self) -> None:
        if self._own is not None:
            self._own.cleanup()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def predict(self, row: Row, eff: Efficiencies) -> Prediction:
        run = self.run(row, eff)
        if run.metrics is None:
            return Prediction(None, run.skipped, run.notes, run.fits)
        notes = list(run.notes)
        if run.metrics.completed < run.requests:
            notes.append(f"{run.requests - run.metrics.completed} of {run.requests} requests rejected by the simulator")
        if run.metrics.completed == 0:
            return Prediction(None, "no request completed in the simulation", tuple(notes), run.fits)
        value = metric_value(row.metric, run.metrics, run.requests, run.replicas, run.throughput_scale)
        if not (math.isfinite(value) and value > 0):
            return Prediction(None, f"the simulated {row.metric} is {value:g}", tuple(notes), run.fits)
        return Prediction(value, "", tuple(notes), run.fits)

    def run(self, row: Row, eff: Efficiencies) -> Replayed:
        key = (row.run_key(), eff)
        if key not in self._runs:
            run = self._runs[key] = self._simulate(row, eff)
            if run.metrics is not None:
                self._ran.append(key)
        return self._runs[key]

    def prefetch(self, pairs: Iterable[tuple[Row, Efficiencies]], workers: int = 1,
                 pool: Callable[[list[tuple[Row, Efficiencies]]], Iterable[tuple[int, Replayed]]] | None = None) -> None:
        """Simulate the runs ``pairs`` need that are not remembered yet, in ``workers`` processes.

        Runs are independent, so they are spread over a process pool (fork, where the platform
        has it); each worker writes its trace files under this replayer's folder. Results are
        the same as running them here, one by one. ``pool``: a running pool's ``replay``
        (:class:`simulator.validation.pool.RunPool`: each run's index in the list it is given, and the run)
        to use instead of starting one.
        """
        todo: dict[tuple, tuple[Row, Efficiencies]] = {}
        for row, eff in pairs:
            key = (row.run_key(), eff)
            if key not in self._runs:
                todo.setdefault(key, (row, eff))
        if pool is not None and len(todo) >= PARALLEL_MIN_RUNS:
            keys = list(todo)
            for index, replayed in pool([todo[key] for key in keys]):
                self._runs[keys[index]] = replayed
            return
        if workers <= 1 or len(todo) < PARALLEL_MIN_RUNS:
            for row, eff in todo.values():
                self.run(row, eff)
            return
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
        jobs = [(row, eff, str(self.workdir), self.max_prompts, self.max_rate_prompts, self.kernels)
                for row, eff in todo.values()]
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as executor:
            for key, replayed in zip(todo, executor.map(_replay_in_worker, jobs, chunksize=4)):
                self._runs[key] = replayed

    def _simulate(self, row: Row, eff: Efficiencies) -> Replayed:
        simulate_settings = self._preparations().simulate

        if row.replicas > 1 and row.is_static_batch:
            return Replayed(None, skipped=f"replicas = {row.replicas} with a static batch: how the batch was split is not stated")
        try:
            model = _model(row.model)
            with_ceilings(_gpu(row.gpu), eff.ceilings)  # a GPU the chosen ceilings do not cover is skipped, not fatal
        except InputError as exc:
            return Replayed(None, skipped=str(exc))
        profile, profile_note = row.profile
        notes = [profile_note] if profile_note else []
        scale = 1.0
        options: dict[str, Any] = {
            "model": row.model, "gpu": row.gpu, "tp": row.tp, "weights": row.weights, "kv": row.kv, "engine": profile,
            "compute_efficiency": eff.compute, "memory_efficiency": eff.memory, "expert_efficiency": eff.expert,
            "seed": SEED, "kernels": self.kernels,
        }
        if eff.host_per_sequence is not None:
            options[HOST_OPTION] = eff.host_per_sequence
        if eff.ceilings != END_TO_END:
            options["ceilings"] = eff.ceilings
        if row.dp_attention:
            options["dp_attention"] = True
        kernel, kernel_note = row.attention_kernel
        if kernel is not None:
            options["attention_kernel"] = kernel
            notes.append(kernel_note)
        if row.num_scheduler_steps > 1:
            options["num_scheduler_steps"] = row.num_scheduler_steps
        if row.ep is not None:
            options["ep"] = row.ep
        if row.sampling:
            options["sampling"] = True
        fits = True
        try:
            if row.is_static_batch:
                batch = int(row.batch)  # type: ignore[arg-type]
                context = row.input_tokens + row.output_tokens
                if context > model.max_context:
                    return Replayed(None, skipped=f"input + output = {context} tokens exceed {model.name}'s maximum context "
                                    f"({model.max_context}); the source's engine ran past the model's positions")
                # Static rows are offline benchmarks (benchmark_latency, trtllm-bench: the engine called in process,
                # token ids in): no HTTP, no tokeniser, no client path (simulator.cost.client_path).
                static = dict(options, scheduler="static", max_num_seqs=batch, client_path="off",
                              prompt_tokens=str(context - row.output_tokens), output_tokens=str(row.output_tokens))
                try:
                    result = simulate_settings(dict(static, batch=batch))
                except InputError as exc:
                    if "does not fit" not in str(exc):
                        raise
                    # The published batch ran; the simulator's memory plan is stricter. Run it with a cache that holds it.
                    fits = False
                    notes.append("does not fit in the simulator's memory plan; run with a KV cache that holds the batch")
                    trace = self._trace(row, batch, model.max_context, at_once=True).path
                    blocks = batch * (-(-context // 16) + 1)  # the static scheduler reserves whole requests
                    result = simulate_settings(dict(static, trace=str(trace), ctx=max(2, context), gen=1, kv_blocks=blocks,
                                                    block_size=16, prompt_tokens=None, output_tokens=None))
                if result.metrics.max_running < batch:
                    fits = False
                    kv = result.capacity
                    kv_bytes = batch * context * kv.bytes_per_block_per_gpu / kv.block_size
                    if kv.weights_bytes_per_gpu + kv_bytes <= kv.hbm_bytes_per_gpu:
                        # Weights and the batch's KV fit in HBM: the simulator's budget (utilization, workspace,
                        # reserve) is stricter than the engine that ran it, so run it as one batch
                        notes.append(f"the simulator's KV budget holds {result.metrics.max_running} of the batch's "
                                     f"{batch} sequences, HBM holds them all: run as one batch")
                        blocks = batch * (-(-context // kv.block_size) + 1)
                        result = simulate_settings(dict(static, batch=batch, kv_blocks=blocks))
                    else:
                        # No engine can run more sequences than HBM holds: smaller batches, as the static scheduler does
                        notes.append(f"the batch's KV cache exceeds HBM: the KV cache holds {result.metrics.max_running} "
                                     f"of its {batch} sequences, run in smaller batches")
                requests = batch
            else:
                replicas = row.replicas
                stated = None if row.num_prompts is None else -(-row.num_prompts // replicas)
                at_once = row.request_rate in (None, math.inf)
                clients = row.concurrency
                # A closed loop's max_num_seqs stands for its clients: the engine runs with its own default.
                scheduler = scheduler_settings(row if clients is None else replace(row, max_num_seqs=None), profile)
                if clients is not None:
                    scheduler["max_num_seqs"] = max(clients, int(scheduler.get("max_num_seqs", clients)))
                # All at once, the engine runs up to max_num_seqs together: simulate at least two such waves,
                # or the capped run would measure a smaller batch than the source's
                if clients is not None:
                    cap = max(self.max_prompts, 2 * clients)
                    n = min(stated or cap, cap)
                elif at_once:
                    cap = max(self.max_prompts, 2 * int(scheduler.get("max_num_seqs", 0)))
                    n = min(stated or cap, cap)
                else:
                    # the source's whole run; with no request count stated, as many as an all-at-once run
                    n = min(stated, self.max_rate_prompts) if stated is not None else self.max_prompts
                if replicas > 1:
                    notes.append(f"one of {replicas} replicas simulated at 1/{replicas} of the load (random routing splits "
                                 f"Poisson arrivals into {replicas} Poisson streams); throughputs x {replicas}")
                if stated is None:
                    notes.append(f"num_prompts not stated: {n} requests simulated")
                elif stated > n:
                    notes.append(f"{n} of the source's {row.num_prompts} requests simulated"
                                 + (" on one replica" if replicas > 1 else ""))
                replay = self._trace(row, n, model.max_context, at_once)
                notes.extend(replay.notes)
                serving: dict[str, Any] = dict(options, trace=str(replay.path), ctx=max(2, replay.longest_tokens), gen=1)
                serving.update(scheduler)
                if clients is not None:
                    # The source's clients, each sending its next request when its last finishes (the trace's
                    # lengths, in order; its times are not used).
                    serving.update(max_concurrency=clients, requests=n)
                    notes.append(f"closed loop of {clients} clients (the source's concurrency), each sending its next "
                                 "request when its last one finishes, with the engine profile's client path")
                if row.prompts_cached:
                    serving.update(prefix_caching=True, prefix_cache_warm=True)
                    notes.append("the source's prompts were already cached (served just before): the run starts with "
                                 "each prompt in the prefix cache")
                result = simulate_settings(serving)
                requests = n
                if stated is not None and stated > n and not at_once:
                    span, m = replay.arrival_span_seconds, result.metrics
                    drain = m.duration_seconds - span
                    if drain > 0.5 * span:
                        # Requests outlive half the arrival span: the run ends before the requests in flight
                        # stop growing (a steady state takes a few request lifetimes), so it says nothing
                        # about the source's later requests; its own completion rate is all there is.
                        notes.append(f"the simulated requests drain for {drain:.3g} s after {span:.3g} s of arrivals: "
                                     "no steady state to extrapolate, throughputs are the capped run's own")
                    else:
                        rate = float(row.request_rate) / replicas  # type: ignore[arg-type]
                        scale = whole_run_scale(n, stated, rate, span, m.duration_seconds)
                        notes.append(f"throughputs for the source's whole run: its {stated} requests arrive over "
                                     f"{stated / rate:.4g} s and drain as the simulated ones do (x {scale:.4f})")
        except InputError as exc:
            return Replayed(None, skipped=str(exc), notes=tuple(notes))
        return Replayed(result.metrics, requests, notes=tuple(notes), fits=fits, replicas=row.replicas,
                        throughput_scale=scale)

    def _trace(self, row: Row, n: int, max_context: int, at_once: bool) -> ReplayTrace:
        """A trace file of the row's requests; one per distinct workload."""
        key = (row.input_tokens, row.output_tokens, row.input_dist, row.output_dist, row.request_rate, row.replicas, n,
               row.prompts_cached,
               max_context, at_once, row.lengths_dirs)
        if key not in self._traces:
            arrivals_rng, lengths_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(SEED).spawn(2))
            prompts, outputs, notes = sample_lengths(row, n, lengths_rng, max_context)
            if at_once:
                arrivals = np.zeros(n)
            else:
                # Poisson arrivals at the stated rate (vLLM benchmark_serving's default, burstiness 1)
                rate = float(row.request_rate) / row.replicas  # type: ignore[arg-type]
                arrivals = np.cumsum(arrivals_rng.exponential(1.0 / rate, n))
            path = self.workdir / f"trace-{len(self._traces)}.csv"
            # Cached prompts: each request's whole prompt is its own prefix, resident from the start (prefix_cache_warm).
            cached = row.prompts_cached
            with path.open("w", encoding="utf-8") as handle:
                handle.write("arrival_seconds,prompt_tokens,output_tokens" + (",prefix_id,prefix_tokens\n" if cached else "\n"))
                for i, (t, p, o) in enumerate(zip(arrivals, prompts, outputs)):
                    handle.write(f"{float(t)!r},{int(p)},{int(o)}" + (f",{i},{int(p)}\n" if cached else "\n"))
            span = float(arrivals.max() - arrivals.min()) if n else 0.0
            self._traces[key] = ReplayTrace(path, int((prompts + outputs).max()), tuple(notes), span)
        return self._traces[key]


def sample_lengths(row: Row, n: int, rng: np.random.Generator, max_context: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(prompt tokens, output tokens, notes) of ``n`` requests of ``row``; prompts clipped to fit the context.

    A ``dataset:`` side is scaled to the row's length, the source's own mean, where the file's mean differs.
    """
    datasets = {dataset_spec(d)[0] for d in (row.input_dist, row.output_dist) if d.startswith("dataset:")}
    paired: dict[str, np.ndarray | None] = {}
    notes: list[str] = []
    for name in datasets:
        data = find_lengths(name, row.lengths_dirs)
        paired[name] = rng.integers(0, len(data.pairs), n) if data.pairs is not None else None
    sides = []
    for side, dist, mean in (("input_tokens", row.input_dist, row.input_tokens), ("output_tokens", row.output_dist, row.output_tokens)):
        kind, _, rest = dist.partition(":")
        if kind == "fixed":
            values = np.full(n, mean, dtype=np.int64)
        elif kind == "uniform":
            lo, hi = (int(v) for v in rest.split(":"))
            values = rng.integers(lo, hi, size=n, endpoint=True)
        elif kind == "normal":
            mu, std = (float(v) for v in rest.split(":"))
            values = np.rint(rng.normal(mu, std, n)).astype(np.int64)
        elif kind == "random_ratio":
            # vLLM's random dataset (current benchmark_serving): uniform in [L(1-R), L(1+R)] around L
            ratio = float(rest)
            values = rng.integers(max(1, int(mean * (1 - ratio))), max(1, int(mean * (1 + ratio))), size=n, endpoint=True)
        else:
            name, cap = dataset_spec(dist)
            data = find_lengths(name, row.lengths_dirs)
            values = data.sample(side, n, rng, paired.get(name))
            own = data.mean(side)
            # The row's length is the source's own mean; the file gives the shape. A source that drew its own
            # prompts from the dataset (another sample, another tokenizer) states another mean than the file's.
            if own and mean > 0 and abs(mean / own - 1) > SCALE_TOLERANCE:
                values = np.rint(values * (mean / own))
                notes.append(f"dataset:{name} {side.replace('_', ' ')} scaled by {mean / own:.2f} to the source's "
                             f"mean of {mean}")
            if cap is not None and (values > cap).any():
                notes.append(f"{int((values > cap).sum())} of {n} {side.replace('_', ' ')} capped at the source's "
                             f"{cap} (mean {values.mean():.1f} -> {np.minimum(values, cap).mean():.1f})")
                values = np.minimum(values, cap)
        sides.append(np.maximum(values.astype(np.int64), 1))
    prompts, outputs = sides
    outputs = np.minimum(outputs, max_context - 1)
    over = prompts + outputs > max_context
    if over.any():
        prompts = np.where(over, max_context - outputs, prompts)
        notes.append(f"{int(over.sum())} prompts shortened to fit the model's {max_context}-token context")
    return prompts, outputs, notes
