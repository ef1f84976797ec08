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

import csv
import functools
import math
import multiprocessing
import os
import re
import tempfile
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Self

import numpy as np
import yaml

from simulator.engine.metrics import Aggregates
from simulator.errors import InputError
from simulator.files import read_text
from simulator.model import Efficiency, ModelSpec, load_model
from simulator.model.engine_profile import load_engine_profile
from simulator.model.gpu_family import _gpu, family_of
from simulator.model.registry import validation_file


def default_table() -> Path:
    """The table ``simulate validate`` replays when no ``--csv`` is given."""
    return validation_file("published.csv")


COLUMNS: tuple[str, ...] = (
    "id", "source_id", "engine", "engine_version", "model", "gpu", "tp", "replicas", "weights", "kv", "mode",
    "regime", "batch", "input_tokens", "output_tokens", "input_dist", "output_dist", "request_rate", "num_prompts",
    "max_num_seqs", "max_batched_tokens", "chunked_prefill", "prompts_cached", "dp_attention", "ep", "num_scheduler_steps",
    "sampling", "metric", "measured",
    "unit", "quote", "source", "link", "notes", "explanation",
)
REQUIRED_COLUMNS: tuple[str, ...] = (
    "id", "source_id", "engine", "model", "gpu", "tp", "weights", "kv", "mode", "regime", "batch",
    "input_tokens", "output_tokens", "metric", "measured",
)
MODES = ("static", "serving")
REGIMES = ("decode_b1", "decode_batch", "long_context", "prefill", "serving")

STATIC_METRICS: tuple[str, ...] = (
    "ttft_seconds", "tpot_seconds", "e2e_seconds", "output_tokens_per_second", "total_tokens_per_second",
    "decode_tokens_per_second_per_sequence", "request_throughput",
)
SERVING_METRICS: tuple[str, ...] = tuple(
    f"{what}_{stat}_seconds" for what in ("ttft", "tpot", "itl", "e2e") for stat in ("mean", "p50", "p99")
) + ("output_tokens_per_second", "total_tokens_per_second", "request_throughput")

MAX_PROMPTS = 1000
"""Most requests simulated for a row whose requests all arrive at once (or two waves of its ``max_num_seqs``)."""

MAX_RATE_PROMPTS = 250_000
"""Most requests simulated per replica for a row at a request rate: the source's whole run, up to this.

Latencies near capacity depend on how long the queue had to grow: a run cut to its first thousand
requests ends before the source's did (MLPerf's Server runs last 2,400 s or more) and reports a queue that
never built up. The largest run at a rate in the shipped table is 110,592 requests per replica (MLPerf
v5.0 B200 Server: 884,736 over 8 replicas), which the engine replays in seconds."""

SCALE_TOLERANCE = 0.01
"""A ``dataset:`` file's lengths are scaled to the row's stated mean when the two differ by more than this."""

SEED = 0
"""Seed of every sampled arrival and length: the same table gives the same predictions."""

# Engines without a shipped profile -> the closest one (the row's notes say so).
# lmdeploy's TurboMind is a C++ server with host overhead like TensorRT-LLM's C++ executor;
# TGI and DeepSpeed-FastGen batch continuously from a Python/Rust scheduler like vLLM.
ENGINE_PROFILE_FOR: dict[str, str] = {
    "vllm": "vllm", "sglang": "sglang", "trtllm": "trtllm", "ideal": "ideal", "llamacpp": "llamacpp",
    "lmdeploy": "trtllm-v0", "tgi": "vllm", "deepspeed-fastgen": "vllm",
}

PROFILE_BY_VERSION_WORDS: dict[str, tuple[tuple[tuple[str, ...], str, str], ...]] = {
    "trtllm": ((("harness", "NIM"), "trtllm-v0", "TensorRT engines, C++ executor"),),
    "lmdeploy": ((("PyTorch engine",), "vllm", "a Python engine"),),
}
"""engine -> ((words of the version cell, profile, what it is), ...): a version cell naming a deployment or
backend picks its profile whatever the release. NVIDIA's MLPerf harness and NIM run TensorRT engines with the
C++ executor whatever their date; LMDeploy's PyTorch engine (``--backend pytorch``) batches from a Python loop,
unlike its C++ TurboMind."""
DEFAULT_PROFILE = "vllm"

# Releases whose scheduler is the V0 kind (prefill iterations of their own, no chunked prefill,
# a synchronous Python loop): vLLM before 0.8, where V1 became the default engine (vLLM 0.8.0
# release notes, March 2025), without CUDA graphs before 0.2.6 (PR #1926; vllm-v0.2.yaml), with
# output processing overlapping the next step from 0.6.0 (the asynchronous output processor,
# vllm-project/vllm PR #7049; vllm-v0.6.yaml); TGI before 3.0, which introduced prefill chunking
# (TGI v3.0.0 release notes, December 2024: "chunking"), and without CUDA graphs before 2.0 (TGI
# PR #1703 made them the default; tgi-v1.yaml, tgi-v2.yaml); TensorRT-LLM before 1.0, whose
# executor was C++ (1.0 made the PyTorch backend and its Python executor the default; trtllm-v0.yaml).
# engine -> ((first version NOT replayed with this profile, profile, what it is), ...), oldest first.
OLDER_SCHEDULER_BEFORE: dict[str, tuple[tuple[tuple[int, ...], str, str], ...]] = {
    "vllm": (((0, 2, 6), "vllm-v0.2", "no CUDA graphs, NCCL all-reduce, no chunked prefill, synchronous loop"),
             ((0, 6), "vllm-v0", "no chunked prefill, synchronous loop"),
             ((0, 8), "vllm-v0.6", "no chunked prefill, synchronous loop but output processing overlapped")),
    "tgi": (((2, 0), "tgi-v1", "no CUDA graphs, NCCL all-reduce, no chunked prefill, synchronous loop"),
            ((3, 0), "tgi-v2", "CUDA graphs up to 32 sequences, NCCL all-reduce, no chunked prefill, synchronous loop")),
    "trtllm": (((1, 0), "trtllm-v0", "the C++ executor"),),
}

# Releases whose decode attention kernel is not the profile's: TensorRT-LLM before 0.8 decodes GQA models with
# its masked MHA kernel, one thread block per query head (XQA, which groups the query heads of a K/V head,
# "will be included in the v0.8 releases": TensorRT-LLM blog "New XQA-kernel provides 2.4x more Llama-70B
# throughput within the same latency budget", January 2024; simulator.model.layers, ``per-head``).
# engine -> ((first version NOT replayed with this kernel, kernel, what it is), ...), oldest first.
ATTENTION_KERNEL_BEFORE: dict[str, tuple[tuple[tuple[int, ...], str, str], ...]] = {
    "trtllm": (((0, 8), "per-head", "masked MHA decode, one thread block per query head, no XQA"),),
}

V0_ENGINE_PROFILE = "vllm-v0.6"
"""The profile of a vLLM row of 0.8 or later that runs the V0 engine: it states --num-scheduler-steps (V1 has no
multi-step scheduling), or its version cell names the V0 engine (:data:`V0_ENGINE_WORDS`)."""

V0_ENGINE_WORDS = "V0 engine"
"""Words of a vLLM version cell of 0.8 or later whose source ran (or is read as having run) the V0 engine, which
0.8.x still ships behind ``VLLM_USE_V1=0``; the row's notes say why."""






def metric_kind(metric: str) -> str:
    """The class of a metric for error bands: ttft, tpot (TPOT and ITL), e2e or throughput."""
    if metric.startswith("ttft"):
        return "ttft"
    if metric.startswith(("tpot", "itl")):
        return "tpot"
    if metric.startswith("e2e"):
        return "e2e"
    return "throughput"


def is_time_metric(metric: str) -> bool:
    """Seconds (a higher efficiency lowers it) rather than a rate (a higher efficiency raises it)."""
    return metric.endswith("_seconds")


@dataclass(frozen=True)
class Row:
    """One published figure and the run that produced it (SI units; see the module docstring)."""

    id: str
    source_id: str
    engine: str
    model: str
    gpu: str
    tp: int
    weights: str
    kv: str
    mode: str
    regime: str
    batch: int | None
    input_tokens: int
    output_tokens: int
    metric: str
    measured: float
    engine_version: str = ""
    replicas: int = 1
    input_dist: str = "fixed"
    output_dist: str = "fixed"
    request_rate: float | None = None
    num_prompts: int | None = None
    max_num_seqs: int | None = None
    max_batched_tokens: int | None = None
    chunked_prefill: bool | None = None
    prompts_cached: bool = False
    """the server had just served the same prompts with prefix caching on: each prompt starts in its KV cache"""
    dp_attention: bool = False
    """attention ran data-parallel over the tp GPUs (DEP, SGLang's --enable-dp-attention)"""
    ep: int | None = None
    """expert-parallel degree the source states (MoE models: whole experts split over the GPUs); None: not stated"""
    num_scheduler_steps: int = 1
    """decode steps per scheduler pass (vLLM V0's multi-step scheduling, --num-scheduler-steps)"""
    sampling: bool = False
    """the requests sampled their next token (the source states temperature, top-k/top-p or do_sample); else greedy"""
    unit: str = ""
    quote: str = ""
    source: str = ""
    link: str = ""
    notes: str = ""
    explanation: str = ""
    lengths_dirs: tuple[Path, ...] = field(default=(), compare=False, hash=False, repr=False)
    """where ``dataset:NAME`` files are looked for (the table's own ``lengths/`` first)"""

    @property
    def family(self) -> str | None:
        return family_of(self.gpu)

    @property
    def kind(self) -> str:
        return metric_kind(self.metric)

    @property
    def runtime(self) -> str:
        """The engine as the calibration classes tell engines apart: its name, and the profile it replays with when
        that is not the engine's own (``vllm:vllm-v0``, ``tgi:tgi-v1``, ``lmdeploy:trtllm-v0``; ``llamacpp``).

        Releases a profile separates run other code (vLLM's V0 and V1 loops, TensorRT-LLM's C++ and Python executors,
        TGI without and with CUDA graphs), and their kernels reach other fractions of a GPU's peaks; an engine
        replayed with another engine's profile keeps its own name, since its kernels are its own."""
        profile = self.profile[0]
        return self.engine if profile == self.engine else f"{self.engine}:{profile}"

    @property
    def profile(self) -> tuple[str, str]:
        """(engine profile, note) the row replays with: its engine at its stated version (:func:`engine_profile`)."""
        profile, note = engine_profile(self.engine, self.engine_version)
        # Multi-step scheduling exists only in the V0 engine: vLLM 0.8's engine arguments fall back to V0
        # for --num-scheduler-steps (vllm/engine/arg_utils.py, _is_v1_supported_oracle).
        why_v0 = ("multi-step scheduling runs on the V0 engine only" if self.num_scheduler_steps > 1
                  else "the V0 engine, as the version cell says" if V0_ENGINE_WORDS in self.engine_version else "")
        if why_v0 and profile == "vllm":
            return V0_ENGINE_PROFILE, (f"engine {self.engine} {self.engine_version} simulated with the "
                                       f"{V0_ENGINE_PROFILE} profile ({why_v0})")
        return profile, note

    @property
    def attention_kernel(self) -> tuple[str | None, str]:
        """(attention kernel, note) of the row's release where it is not its profile's (None: the profile's);
        :data:`ATTENTION_KERNEL_BEFORE`."""
        if deployment_profile(self.engine, self.engine_version) is not None:
            return None, ""  # a deployment (a harness, NIM) names no release of the engine
        older = older_release(ATTENTION_KERNEL_BEFORE, self.engine, release(self.engine_version))
        if older is None:
            return None, ""
        first_new, kernel, what = older
        return kernel, f"attention kernel {kernel} (engine {self.engine} before {'.'.join(map(str, first_new))}: {what})"

    @property
    def is_static_batch(self) -> bool:
        """One batch of fixed lengths at t = 0, run by the static scheduler (see the module docstring)."""
        return (
            self.mode == "static" and self.batch is not None and self.num_prompts in (None, self.batch)
            and self.input_dist == "fixed" and self.output_dist == "fixed"
            and self.max_num_seqs in (None, self.batch) and self.request_rate in (None, math.inf)
        )

    def run_key(self) -> tuple:
        """Everything that defines the simulated run (rows differing only in metric share one run)."""
        return (
            self.engine, self.model, self.gpu, self.tp, self.replicas, self.weights, self.kv, self.mode,
            self.batch, self.input_tokens, self.output_tokens, self.input_dist, self.output_dist, self.request_rate,
            self.num_prompts, self.max_num_seqs, self.max_batched_tokens, self.chunked_prefill, self.lengths_dirs,
            self.profile[0], self.prompts_cached, self.dp_attention, self.num_scheduler_steps, self.ep, self.sampling,
            self.attention_kernel[0],
        )


# --- reading the table -------------------------------------------------------------------------

def load_table(path: Path | None = None) -> list[Row]:
    """Rows of a table in the published.csv schema; InputError names the file, line, column and what is allowed."""
    path = default_table() if path is None else Path(path)
    text = read_text(path, "--csv")
    reader = csv.DictReader(text.splitlines())
    header = [name.strip() for name in (reader.fieldnames or [])]
    reader.fieldnames = header
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise InputError(f"--csv: {path}: missing column(s) {', '.join(missing)}; the schema is: {','.join(COLUMNS)}")
    dirs = (path.resolve().parent / "lengths", validation_file("lengths"))
    rows = [_row(raw, f"{path}:{line}", dirs) for line, raw in enumerate(reader, start=2)]
    seen: dict[str, int] = {}
    for line, row in enumerate(rows, start=2):
        if row.id in seen:
            raise InputError(f"{path}:{line}: column 'id': {row.id!r} repeats line {seen[row.id]}; ids must be unique")
        seen[row.id] = line
    return rows


def _int(raw: str, column: str, where: str, minimum: int, optional: bool) -> int | None:
    if not raw:
        if optional:
            return None
        raise InputError(f"{where}: column '{column}': is empty; expected an integer >= {minimum}")
    try:
        value = float(raw)
    except ValueError:
        raise InputError(f"{where}: column '{column}': expected an integer (got {raw!r})") from None
    if not math.isfinite(value) or value != int(value) or value >= 2**31:
        raise InputError(f"{where}: column '{column}': expected an integer (got {raw!r})")
    if value < minimum:
        raise InputError(f"{where}: column '{column}': must be >= {minimum} (got {raw})")
    return int(value)


def _row(raw: dict[str, str | None], where: str, lengths_dirs: tuple[Path, ...]) -> Row:
    cell = {name: (raw.get(name) or "").strip() for name in COLUMNS}
    mode, regime, metric = cell["mode"].lower(), cell["regime"].lower(), cell["metric"]
    if mode not in MODES:
        raise InputError(f"{where}: column 'mode': {cell['mode']!r}; allowed: {', '.join(MODES)}")
    if regime not in REGIMES:
        raise InputError(f"{where}: column 'regime': {cell['regime']!r}; allowed: {', '.join(REGIMES)}")
    allowed = STATIC_METRICS if mode == "static" else SERVING_METRICS
    if metric not in allowed:
        raise InputError(f"{where}: column 'metric': {metric!r} is not a {mode} metric; allowed: {', '.join(allowed)}")
    try:
        measured = float(cell["measured"])
    except ValueError:
        raise InputError(f"{where}: column 'measured': expected a number (got {cell['measured']!r})") from None
    if not (math.isfinite(measured) and measured > 0):
        raise InputError(f"{where}: column 'measured': must be finite and > 0 (got {cell['measured']})")
    rate: float | None = None
    if cell["request_rate"]:
        try:
            rate = float(cell["request_rate"])
        except ValueError:
            raise InputError(f"{where}: column 'request_rate': expected requests/s or inf (got {cell['request_rate']!r})") from None
        if math.isnan(rate) or rate <= 0:
            raise InputError(f"{where}: column 'request_rate': must be > 0 requests/s or inf (got {cell['request_rate']})")
    chunked = {"": None, "true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}
    for column in ("chunked_prefill", "prompts_cached", "dp_attention", "sampling"):
        if cell[column].lower() not in chunked:
            raise InputError(f"{where}: column '{column}': {cell[column]!r}; allowed: true, false or blank")
    for column in ("input_dist", "output_dist"):
        _check_dist(cell[column] or "fixed", f"{where}: column '{column}'")
    row = Row(
        id=cell["id"], source_id=cell["source_id"] or cell["source"] or "unknown", engine=cell["engine"].lower(),
        model=cell["model"], gpu=cell["gpu"],
        tp=_int(cell["tp"], "tp", where, 1, False),  # type: ignore[arg-type]
        weights=cell["weights"].lower(), kv=cell["kv"].lower(), mode=mode, regime=regime,
        batch=_int(cell["batch"], "batch", where, 1, True),
        input_tokens=max(1, _int(cell["input_tokens"], "input_tokens", where, 0, False) or 1),
        output_tokens=_int(cell["output_tokens"], "output_tokens", where, 1, False),  # type: ignore[arg-type]
        metric=metric, measured=measured, engine_version=cell["engine_version"],
        replicas=_int(cell["replicas"], "replicas", where, 1, True) or 1,
        input_dist=(cell["input_dist"] or "fixed").lower(), output_dist=(cell["output_dist"] or "fixed").lower(),
        request_rate=rate, num_prompts=_int(cell["num_prompts"], "num_prompts", where, 1, True),
        max_num_seqs=_int(cell["max_num_seqs"], "max_num_seqs", where, 1, True),
        max_batched_tokens=_int(cell["max_batched_tokens"], "max_batched_tokens", where, 1, True),
        chunked_prefill=chunked[cell["chunked_prefill"].lower()],
        prompts_cached=bool(chunked[cell["prompts_cached"].lower()]),
        dp_attention=bool(chunked[cell["dp_attention"].lower()]),
        num_scheduler_steps=_int(cell["num_scheduler_steps"], "num_scheduler_steps", where, 1, True) or 1,
        ep=_int(cell["ep"], "ep", where, 1, True),
        sampling=bool(chunked[cell["sampling"].lower()]),
        unit=cell["unit"], quote=cell["quote"], source=cell["source"], link=cell["link"], notes=cell["notes"],
        explanation=cell["explanation"], lengths_dirs=lengths_dirs,
    )
    if mode == "static" and row.batch is None and row.num_prompts is None:
        raise InputError(f"{where}: a static row needs column 'batch' (or 'num_prompts')")
    return row


def _check_dist(text: str, where: str) -> None:
    kind, _, rest = text.lower().partition(":")
    allowed = "fixed, uniform:LO:HI, normal:MEAN:STD, random_ratio:R, dataset:NAME or dataset:NAME:MAX"
    try:
        if kind == "fixed" and not rest:
            return
        if kind == "uniform":
            lo, hi = (int(v) for v in rest.split(":"))
            if 1 <= lo <= hi:
                return
        if kind == "normal":
            mean, std = (float(v) for v in rest.split(":"))
            if math.isfinite(mean) and math.isfinite(std) and mean >= 1 and std >= 0:
                return
        if kind == "random_ratio":
            ratio = float(rest)
            if 0 <= ratio <= 1:
                return
        if kind == "dataset":
            name, cap = dataset_spec(text.lower())
            if name and "/" not in name and "\\" not in name and name not in (".", "..") and (cap is None or cap >= 1):
                return
    except ValueError:
        pass
    raise InputError(f"{where}: cannot read {text!r}; allowed: {allowed}")


# --- lengths -------------------------------------------------------------------------------------

def dataset_spec(dist: str) -> tuple[str, int | None]:
    """(NAME, MAX) of a ``dataset:NAME`` or ``dataset:NAME:MAX`` distribution (MAX: the source's cap on that
    side's tokens, e.g. a benchmark's max_new_tokens; None: none). Raises ValueError for a MAX that is not an
    integer."""
    name, _, cap = dist.partition(":")[2].partition(":")
    return name, int(cap) if cap else None


@dataclass(frozen=True)
class LengthData:
    """A ``validation/lengths/NAME.csv`` file: paired samples, a histogram, or summary statistics."""

    name: str
    pairs: np.ndarray | None = None
    """(n, 2) integer array of (input, output) token counts"""
    histogram: np.ndarray | None = None
    """(k, 3) array of bucket_low, bucket_high, count"""
    statistics: dict[str, dict[str, float]] | None = None
    """{"input_tokens": {"mean": ..., "median": ...}, "output_tokens": {...}}"""

    def sample(self, side: str, n: int, rng: np.random.Generator, index: np.ndarray | None) -> np.ndarray:
        """``n`` lengths of one side (``input_tokens``/``output_tokens``); ``index`` picks paired rows."""
        if self.pairs is not None:
            column = 0 if side == "input_tokens" else 1
            return self.pairs[index if index is not None else rng.integers(0, len(self.pairs), n), column]
        if self.histogram is not None:
            counts = self.histogram[:, 2].astype(float)
            bucket = rng.choice(len(counts), size=n, p=counts / counts.sum())
            low, high = self.histogram[bucket, 0], self.histogram[bucket, 1]
            return np.floor(low + rng.random(n) * (high - low + 1)).astype(np.int64)
        stats = (self.statistics or {}).get(side, {})
        return _from_statistics(stats, n, rng, f"dataset:{self.name} {side}")

    def mean(self, side: str) -> float | None:
        """The file's mean length of one side in tokens (a histogram: of its bucket midpoints), None if unknown."""
        if self.pairs is not None:
            return float(self.pairs[:, 0 if side == "input_tokens" else 1].mean())
        if self.histogram is not None:
            counts = self.histogram[:, 2]
            return float(((self.histogram[:, 0] + self.histogram[:, 1]) / 2 * counts).sum() / counts.sum())
        return (self.statistics or {}).get(side, {}).get("mean")


def _from_statistics(stats: dict[str, float], n: int, rng: np.random.Generator, what: str) -> np.ndarray:
    """Lengths from summary statistics: a log-normal matched to (mean, median) or (mean, std), else the mean.

    Request lengths of chat datasets are right-skewed (mean above median); a log-normal is the
    two-parameter law that keeps both figures: median = e^mu, mean = e^(mu + sigma^2 / 2).
    """
    mean, median, std = stats.get("mean"), stats.get("median", stats.get("p50")), stats.get("std")
    if mean is None and median is None:
        raise InputError(f"{what}: the statistics give neither a mean nor a median")
    if mean is not None and median is not None and mean > median > 0:
        mu, sigma = math.log(median), math.sqrt(2 * math.log(mean / median))
    elif mean is not None and std is not None and mean > 0 and std > 0:
        sigma = math.sqrt(math.log(1 + (std / mean) ** 2))
        mu = math.log(mean) - sigma**2 / 2
    else:
        return np.full(n, round(mean if mean is not None else median), dtype=np.int64)  # type: ignore[arg-type]
    return np.rint(rng.lognormal(mu, sigma, n)).astype(np.int64)


@functools.cache
def load_lengths(path: Path) -> LengthData:
    """Read a lengths file by its header; InputError naming the file, line and what is allowed."""
    text = read_text(path, "lengths file")
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    reader = csv.reader(lines)
    header = [h.strip().lower() for h in next(reader, [])]
    body = list(reader)
    name = path.stem

    def numbers(columns: list[str]) -> np.ndarray:
        index = [header.index(c) for c in columns]
        out = np.empty((len(body), len(columns)))
        for i, cells in enumerate(body):
            try:
                out[i] = [float(cells[j]) for j in index]
            except (ValueError, IndexError):
                raise InputError(f"{path}:{i + 2}: expected numbers in columns {', '.join(columns)}") from None
        if not np.all(np.isfinite(out)) or np.any(out < 0):
            raise InputError(f"{path}: every value must be a finite number >= 0")
        return out

    if {"input_tokens", "output_tokens"} <= set(header) and "statistic" not in header:
        pairs = numbers(["input_tokens", "output_tokens"]).astype(np.int64)
        if len(pairs) == 0:
            raise InputError(f"{path}: no samples")
        return LengthData(name, pairs=np.maximum(pairs, 1))
    if {"bucket_low", "bucket_high", "count"} <= set(header):
        hist = numbers(["bucket_low", "bucket_high", "count"])
        if len(hist) == 0 or hist[:, 2].sum() <= 0 or np.any(hist[:, 1] < hist[:, 0]):
            raise InputError(f"{path}: a histogram needs buckets with bucket_low <= bucket_high and counts summing > 0")
        hist[:, 0] = np.maximum(hist[:, 0], 1)
        return LengthData(name, histogram=hist)
    if "statistic" in header:
        stats: dict[str, dict[str, float]] = {"input_tokens": {}, "output_tokens": {}}
        for i, cells in enumerate(body):
            record = dict(zip(header, (c.strip() for c in cells)))
            key = record.get("statistic", "").lower()
            for side, values in stats.items():
                if record.get(side):
                    try:
                        values[key] = float(record[side])
                    except ValueError:
                        raise InputError(f"{path}:{i + 2}: column '{side}': expected a number (got {record[side]!r})") from None
        return LengthData(name, statistics=stats)
    raise InputError(
        f"{path}: unknown lengths file; expected columns input_tokens,output_tokens (a sample), "
        "bucket_low,bucket_high,count (a histogram) or statistic,input_tokens,output_tokens (summary statistics)"
    )


def find_lengths(name: str, dirs: tuple[Path, ...]) -> LengthData:
    for folder in dirs or (validation_file("lengths"),):
        path = folder / f"{name}.csv"
        if path.is_file():
            return load_lengths(path)
    raise InputError(f"dataset:{name}: no lengths file {name}.csv in {', '.join(str(d) for d in dirs)}")


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




def release(version: str) -> tuple[int, ...] | None:
    """The leading dotted number of an ``engine_version`` cell ('0.7.3 (ROCm 6.3.1)' -> (0, 7, 3)); None if none."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    return tuple(int(part) for part in match.group(1).split(".")) if match else None


def older_release(table: dict[str, tuple[tuple[tuple[int, ...], str, str], ...]], engine: str,
                  stated: tuple[int, ...] | None) -> tuple[tuple[int, ...], str, str] | None:
    """The first entry of ``table`` (:data:`OLDER_SCHEDULER_BEFORE`, :data:`ATTENTION_KERNEL_BEFORE`) whose release
    comes after ``engine``'s ``stated`` one: (first version not concerned, what applies, why); None if none or
    the release is not stated."""
    if stated is None:
        return None
    return next((entry for entry in table.get(engine, ()) if stated < entry[0]), None)


def deployment_profile(engine: str, version: str) -> tuple[str, str] | None:
    """(profile, note) where the version cell names a deployment or backend (:data:`PROFILE_BY_VERSION_WORDS`);
    None where it does not."""
    for words, named, what in PROFILE_BY_VERSION_WORDS.get(engine, ()):
        if any(word in version for word in words):
            return named, f"engine {engine} ({version}) simulated with the {named} profile ({what})"
    return None


def engine_profile(engine: str, version: str = "") -> tuple[str, str]:
    """(profile name, note) for a row's engine and version: its own profile, or the closest one with a note.

    A stated release older than :data:`OLDER_SCHEDULER_BEFORE` gives the V0-style profile; an
    unstated version keeps the engine's current one.
    """
    profile = ENGINE_PROFILE_FOR.get(engine, DEFAULT_PROFILE)
    named = deployment_profile(engine, version)
    if named is not None:
        return named
    stated = release(version)
    entry = older_release(OLDER_SCHEDULER_BEFORE, engine, stated)
    if entry is not None and stated is not None:
        first_new, older, what = entry
        return older, f"engine {engine} {'.'.join(map(str, stated))} simulated with the {older} profile " \
                      f"(before {'.'.join(map(str, first_new))}: {what})"
    if profile == engine:
        return profile, ""
    return profile, f"engine {engine} simulated with the {profile} profile"


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


def _replay_in_worker(job: tuple[Row, Efficiencies, str, int, int]) -> Replayed:
    """One run in a pool worker, with a replayer of its own (trace files under the parent's folder)."""
    global _WORKER_REPLAYER
    row, eff, folder, max_prompts, max_rate_prompts = job
    if _WORKER_REPLAYER is None:
        workdir = Path(folder) / f"worker-{os.getpid()}"
        workdir.mkdir(exist_ok=True)
        _WORKER_REPLAYER = Replayer(workdir, max_prompts, max_rate_prompts)
    return _WORKER_REPLAYER.run(row, eff)


def _profile_scheduler(profile: str, gpu: str | None = None) -> Any:
    """The engine profile's scheduler defaults on ``gpu`` (kind, max_num_seqs, max_batched_tokens, block_size), or None."""
    try:
        engine = load_engine_profile(profile)
        if gpu is not None:
            spec = _gpu(gpu)
            engine = engine.for_gpu(spec.name, spec.hbm_bytes)
        return engine.scheduler
    except InputError:
        return None


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
                 max_rate_prompts: int = MAX_RATE_PROMPTS) -> None:
        self._own = tempfile.TemporaryDirectory(prefix="memwall-validate-") if workdir is None else None
        self.workdir = Path(self._own.name) if self._own is not None else Path(workdir)  # type: ignore[arg-type]
        self.max_prompts = max_prompts
        self.max_rate_prompts = max_rate_prompts
        self._runs: dict[tuple, Replayed] = {}
        self._traces: dict[tuple, ReplayTrace] = {}
        self.engine_runs = 0

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
            self._runs[key] = self._simulate(row, eff)
        return self._runs[key]

    def prefetch(self, pairs: Iterable[tuple[Row, Efficiencies]], workers: int = 1) -> None:
        """Simulate the runs ``pairs`` need that are not remembered yet, in ``workers`` processes.

        Runs are independent, so they are spread over a process pool (fork, where the platform
        has it); each worker writes its trace files under this replayer's folder. Results are
        the same as running them here, one by one.
        """
        todo: dict[tuple, tuple[Row, Efficiencies]] = {}
        for row, eff in pairs:
            key = (row.run_key(), eff)
            if key not in self._runs:
                todo.setdefault(key, (row, eff))
        if workers <= 1 or len(todo) < PARALLEL_MIN_RUNS:
            for row, eff in todo.values():
                self.run(row, eff)
            return
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
        jobs = [(row, eff, str(self.workdir), self.max_prompts, self.max_rate_prompts) for row, eff in todo.values()]
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            for key, replayed in zip(todo, pool.map(_replay_in_worker, jobs, chunksize=4)):
                self._runs[key] = replayed
                self.engine_runs += replayed.metrics is not None

    def _simulate(self, row: Row, eff: Efficiencies) -> Replayed:
        from simulator.plan.run import simulate_settings

        if row.replicas > 1 and row.is_static_batch:
            return Replayed(None, skipped=f"replicas = {row.replicas} with a static batch: how the batch was split is not stated")
        try:
            model = _model(row.model)
            _gpu(row.gpu)
        except InputError as exc:
            return Replayed(None, skipped=str(exc))
        profile, profile_note = row.profile
        notes = [profile_note] if profile_note else []
        scale = 1.0
        engine = profile if eff.host_per_sequence is None else self._engine_with_host(profile, eff.host_per_sequence)
        options: dict[str, Any] = {
            "model": row.model, "gpu": row.gpu, "tp": row.tp, "weights": row.weights, "kv": row.kv, "engine": engine,
            "compute_efficiency": eff.compute, "memory_efficiency": eff.memory, "expert_efficiency": eff.expert,
            "seed": SEED,
        }
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
                static = dict(options, scheduler="static", max_num_seqs=batch,
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
                scheduler = scheduler_settings(row, profile)
                # All at once, the engine runs up to max_num_seqs together: simulate at least two such waves,
                # or the capped run would measure a smaller batch than the source's
                if at_once:
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
        self.engine_runs += 1
        return Replayed(result.metrics, requests, notes=tuple(notes), fits=fits, replicas=row.replicas,
                        throughput_scale=scale)

    def _engine_with_host(self, profile: str, per_sequence_seconds: float) -> str:
        """A profile file in this replayer's folder: ``profile`` with its host seconds per sequence replaced."""
        path = self.workdir / f"engine-{profile}-host-{per_sequence_seconds:.4e}.yaml"
        if not path.exists():
            base = load_engine_profile(profile)
            cpu = base.cpu.model_copy(update={"per_sequence_seconds": per_sequence_seconds})
            data = base.model_copy(update={"cpu": cpu, "aliases": []}).model_dump(mode="json")
            path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        return str(path)

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
