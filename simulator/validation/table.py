"""The validation table: its schema (:data:`COLUMNS`), one :class:`Row` per published figure, and the loader that checks it."""

from __future__ import annotations

import csv
import functools
import math
from dataclasses import dataclass, field
from pathlib import Path

from simulator.errors import InputError
from simulator.files import read_text
from simulator.model.gpu_family import family_of
from simulator.model.registry import validation_file
from simulator.validation.lengths import dataset_spec
from simulator.validation.profiles import (
    ATTENTION_KERNEL_BEFORE,
    V0_ENGINE_PROFILE,
    V0_ENGINE_WORDS,
    deployment_profile,
    engine_profile,
    older_release,
    release,
)


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


CLOSED_LOOP_WORDS = ("concurren", "closed loop", "virtual users")
"""Words with which a row states that its ``max_num_seqs`` is a closed loop's clients (:attr:`Row.concurrency`)."""


REGIMES = ("decode_b1", "decode_batch", "long_context", "prefill", "serving")

MEASURED_MIN = 1e-9
"""The smallest measured value read, in the table's units (seconds, tokens/s, requests/s): no serving
measurement lies below a nanosecond or a token in 30 years, so a smaller value is a unit slip; it also keeps
every relative error (predicted - measured) / measured finite (a subnormal measurement overflows it)."""


STATIC_METRICS: tuple[str, ...] = (
    "ttft_seconds", "tpot_seconds", "e2e_seconds", "output_tokens_per_second", "total_tokens_per_second",
    "decode_tokens_per_second_per_sequence", "request_throughput",
)


SERVING_METRICS: tuple[str, ...] = tuple(
    f"{what}_{stat}_seconds" for what in ("ttft", "tpot", "itl", "e2e") for stat in ("mean", "p50", "p99")
) + ("output_tokens_per_second", "total_tokens_per_second", "request_throughput")


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

    @functools.cached_property
    def profile(self) -> tuple[str, str]:
        """(engine profile, note) the row replays with: its engine at its stated version (:func:`engine_profile`;
        a function of the row's fields alone, worked out once: every replay of the row reads it)."""
        profile, note = engine_profile(self.engine, self.engine_version)
        # Multi-step scheduling exists only in the V0 engine: vLLM 0.8's engine arguments fall back to V0
        # for --num-scheduler-steps (vllm/engine/arg_utils.py, _is_v1_supported_oracle).
        why_v0 = ("multi-step scheduling runs on the V0 engine only" if self.num_scheduler_steps > 1
                  else "the V0 engine, as the version cell says" if V0_ENGINE_WORDS in self.engine_version else "")
        if why_v0 and profile == "vllm":
            return V0_ENGINE_PROFILE, (f"engine {self.engine} {self.engine_version} simulated with the "
                                       f"{V0_ENGINE_PROFILE} profile ({why_v0})")
        return profile, note

    @functools.cached_property
    def attention_kernel(self) -> tuple[str | None, str]:
        """(attention kernel, note) of the row's release where it is not its profile's (None: the profile's);
        :data:`ATTENTION_KERNEL_BEFORE` (a function of the row's fields alone, worked out once)."""
        if deployment_profile(self.engine, self.engine_version) is not None:
            return None, ""  # a deployment (a harness, NIM) names no release of the engine
        older = older_release(ATTENTION_KERNEL_BEFORE, self.engine, release(self.engine_version))
        if older is None:
            return None, ""
        first_new, kernel, what = older
        return kernel, f"attention kernel {kernel} (engine {self.engine} before {'.'.join(map(str, first_new))}: {what})"

    @property
    def concurrency(self) -> int | None:
        """The clients of a closed loop the row states, or None.

        The table encodes a benchmark's closed loop (``--max-concurrency N``, N concurrent client threads, k6
        virtual users) as ``request_rate`` inf with ``max_num_seqs`` = N, and says so in its words: a serving row
        so encoded whose quote or notes speak of concurrency, concurrent clients, virtual users or a closed loop
        is replayed as a closed loop of ``max_num_seqs`` clients (simulator.engine.closed_loop)."""
        if self.mode != "serving" or self.max_num_seqs is None or self.request_rate not in (None, math.inf):
            return None
        words = f"{self.quote} {self.notes}".lower()
        return self.max_num_seqs if any(w in words for w in CLOSED_LOOP_WORDS) else None

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
    if not (math.isfinite(measured) and measured >= MEASURED_MIN):
        raise InputError(f"{where}: column 'measured': must be finite and at least {MEASURED_MIN:g} in the row's unit "
                         f"(seconds, tokens/s or requests/s; got {cell['measured']})")
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
        input_tokens=_int(cell["input_tokens"], "input_tokens", where, 1, False),  # type: ignore[arg-type]
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
