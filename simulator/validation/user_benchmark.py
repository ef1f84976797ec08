"""Calibrating on a user's own benchmark results (``simulate calibrate --from-benchmark FILE``).

Accepted files:

- a vLLM ``benchmark_serving`` result JSON (``--save-result``): one serving run. Its rate
  (``request_rate``, ``inf`` = all at once), request count (``completed``), per-request lengths
  (``input_lens``/``output_lens``, else the mean lengths from the token totals) and its
  summaries (``mean_/median_/p99_`` ``ttft``/``tpot``/``itl``/``e2el`` in ms, and the
  throughputs) become rows of the published.csv schema. A run with ``max_concurrency`` (a
  closed-loop client) keeps only its TPOT/ITL and throughput rows: the engine simulates an
  open queue, whose TTFT would count the client-side wait;
- a vLLM ``benchmark_throughput`` JSON (``--output-json``: ``elapsed_time``, ``num_requests``,
  ``total_num_tokens``, ``requests_per_second``, ``tokens_per_second``): an offline run of
  ``num_requests`` at once; it states no lengths, so ``--input-tokens``/``--output-tokens`` must;
- a CSV in the published.csv schema (model, GPU, ... in each row).

The deployment (model, GPU, TP, dtypes, engine profile) of a JSON comes from the command line.
The fit is :func:`simulator.validation.crossval.fit` with serving rows allowed to calibrate, and the
base GPU's own efficiencies where no row calibrates a parameter. The error reported beside
the in-sample one is cross-validated: leave one run (file) out when there are several, else
leave one row out.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import yaml

from simulator.errors import InputError
from simulator.files import load_json
from simulator.model import load_gpu, load_model
from simulator.model.gpu_family import family_of
from simulator.validation.crossval import ErrorSummary, Validation, cross_validate, summarise
from simulator.validation.replay import Efficiencies, Replayer
from simulator.validation.table import MEASURED_MIN, Row, load_table


@dataclass(frozen=True)
class BenchmarkSetup:
    """What a benchmark JSON does not say: the deployment it ran on."""

    model: str | None = None
    gpu: str | None = None
    tp: int = 1
    weights: str = "fp16"
    kv: str = "fp16"
    engine: str = "vllm"
    input_tokens: int | None = None
    output_tokens: int | None = None


SERVING_SUMMARIES = {
    # vLLM key stem -> our metric stem; statistics mean/median/p99 -> mean/p50/p99
    "ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e",
}


def _read_json(path: Path) -> dict[str, Any]:
    data = load_json(path, "--from-benchmark")
    if not isinstance(data, dict):
        raise InputError(f"--from-benchmark: {path}: expected a JSON object (a vLLM benchmark result)")
    return data


# Bounds on a benchmark's fields, checked before any work: a day-long trace is 10^6-10^7 requests and
# no model takes more than a few million tokens of context, so anything past these is a typo.
MAX_REQUESTS = 10**7
MAX_TOKENS_PER_REQUEST = 10**7
MAX_CONCURRENCY = 10**6


def _refuse(path: Path, key: str, value: Any, allowed: str) -> InputError:
    shown = repr(value) if not isinstance(value, (list, dict)) else f"a {type(value).__name__}"
    return InputError(f"--from-benchmark: {path}: '{key}' is {shown[:60]}; allowed: {allowed}")


def _number(data: dict[str, Any], key: str, path: Path, *, low: float = 0.0, high: float = math.inf,
            whole: bool = False, inf_ok: bool = False) -> float:
    """``data[key]`` as a float in [low, high] (an integer when ``whole``); InputError naming file, field, value.

    vLLM writes an unbounded ``request_rate`` as the string ``"inf"``; only where ``inf_ok`` is
    that (or any infinite value) allowed. Text, booleans, null, lists and NaN are refused.
    """
    value = data.get(key)
    kind = "a whole number" if whole else "a number"
    shown = (lambda x: f"{x:.0f}") if whole else (lambda x: f"{x:g}")
    span = f">= {shown(low)}" if math.isinf(high) else f"in [{shown(low)}, {shown(high)}]"
    allowed = f"a finite {kind[2:]} {span}" + (' or "inf"' if inf_ok else "")
    if inf_ok and isinstance(value, str) and value.strip().lower() in ("inf", "infinity"):
        return math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _refuse(path, key, value, allowed)
    if isinstance(value, int) and abs(value) > 2**62:  # before float(): a 400-digit integer overflows it
        raise _refuse(path, key, value, allowed)
    number = float(value)
    if math.isinf(number) and inf_ok and number > 0:
        return math.inf
    if not math.isfinite(number) or not low <= number <= high or (whole and not number.is_integer()):
        raise _refuse(path, key, value, allowed)
    return number


def _lengths(data: dict[str, Any], key: str, path: Path) -> list[int] | None:
    """``data[key]``, a list of per-request token counts, each a whole number in [0, MAX_TOKENS_PER_REQUEST]."""
    values = data.get(key)
    if values is None:
        return None
    allowed = f"a list of at most {MAX_REQUESTS} whole numbers in [0, {MAX_TOKENS_PER_REQUEST}]"
    if not isinstance(values, list) or len(values) > MAX_REQUESTS:
        raise _refuse(path, key, values, allowed)
    for index, value in enumerate(values):
        if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
                or not 0 <= value <= MAX_TOKENS_PER_REQUEST or not float(value).is_integer()):
            raise _refuse(path, f"{key}[{index}]", value, f"a whole number in [0, {MAX_TOKENS_PER_REQUEST}]")
    return [int(value) for value in values]


def _setup_needs(setup: BenchmarkSetup, path: Path) -> tuple[str, str]:
    if not setup.model or not setup.gpu:
        raise InputError(f"--from-benchmark: {path} does not say where it ran: give --model and --base (the GPU)")
    # Both load before any replay: an unknown name is bad input, not every row skipped.
    load_model(setup.model)
    try:
        load_gpu(setup.gpu)
    except InputError as exc:
        raise InputError(re.sub(r"^--gpu:", "--base:", str(exc))) from None
    return setup.model, setup.gpu


def _row(setup: BenchmarkSetup, source: str, number: int, **fields: Any) -> Row:
    model, gpu = setup.model or "", setup.gpu or ""
    base: dict[str, Any] = {
        "id": f"{source}#{number}", "source_id": source, "engine": setup.engine, "model": model, "gpu": gpu,
        "tp": setup.tp, "weights": setup.weights, "kv": setup.kv, "mode": "serving", "regime": "serving",
        "batch": None, "source": source, "unit": "",
    }
    base.update(fields)
    return Row(**base)


def rows_from_serving(data: dict[str, Any], path: Path, setup: BenchmarkSetup, workdir: Path) -> list[Row]:
    """Rows of one vLLM benchmark_serving result (see the module docstring)."""
    _setup_needs(setup, path)
    if data.get("completed") == 0:
        raise InputError(f"--from-benchmark: {path}: no request completed")
    completed = int(_number(data, "completed", path, low=1, high=MAX_REQUESTS, whole=True))
    rate = _number(data, "request_rate", path, low=1e-9, inf_ok=True) if "request_rate" in data else math.inf
    input_lens, output_lens = _lengths(data, "input_lens", path), _lengths(data, "output_lens", path)
    if input_lens and output_lens and len(input_lens) == len(output_lens):
        pairs = [(i, o) for i, o in zip(input_lens, output_lens) if o >= 1]
        if not pairs:
            raise InputError(f"--from-benchmark: {path}: every request has an output length of 0")
        name = f"bench-{path.stem}".replace(" ", "_")
        (workdir / f"{name}.csv").write_text(
            "input_tokens,output_tokens\n" + "".join(f"{max(i, 1)},{o}\n" for i, o in pairs), encoding="utf-8"
        )
        mean_in = round(sum(i for i, _ in pairs) / len(pairs))
        mean_out = round(sum(o for _, o in pairs) / len(pairs))
        dists = {"input_dist": f"dataset:{name}", "output_dist": f"dataset:{name}"}
    else:
        most = float(completed * MAX_TOKENS_PER_REQUEST)
        mean_in = round(_number(data, "total_input_tokens", path, high=most, whole=True) / completed)
        mean_out = round(_number(data, "total_output_tokens", path, high=most, whole=True) / completed)
        dists = {"input_dist": "fixed", "output_dist": "fixed"}
    # null or 0: an open-loop run; else the number of clients of a closed loop
    closed_loop = data.get("max_concurrency") not in (None, 0)
    concurrency = int(_number(data, "max_concurrency", path, low=1, high=MAX_CONCURRENCY, whole=True)) if closed_loop else None
    common = dict(
        input_tokens=max(mean_in, 1), output_tokens=max(mean_out, 1), request_rate=rate, num_prompts=completed,
        max_num_seqs=concurrency, lengths_dirs=(workdir,), **dists,
    )
    rows: list[Row] = []
    source = path.name
    for stem, ours in SERVING_SUMMARIES.items():
        if closed_loop and ours in ("ttft", "e2e"):
            continue
        for stat, our_stat in (("mean", "mean"), ("median", "p50"), ("p99", "p99")):
            key = f"{stat}_{stem}_ms"
            if key in data and data[key] is not None:
                value = _number(data, key, path) / 1e3
                if value >= MEASURED_MIN:  # 0 (or a subnormal) is no measurement: the summary had no such gaps
                    rows.append(_row(setup, source, len(rows) + 1, metric=f"{ours}_{our_stat}_seconds", measured=value,
                                     unit="seconds", **common))
    for key, metric in (("output_throughput", "output_tokens_per_second"), ("total_token_throughput", "total_tokens_per_second"),
                        ("request_throughput", "request_throughput")):
        if key in data and data[key] is not None and (value := _number(data, key, path)) >= MEASURED_MIN:
            rows.append(_row(setup, source, len(rows) + 1, metric=metric, measured=value, unit="per second", **common))
    return rows


def rows_from_throughput(data: dict[str, Any], path: Path, setup: BenchmarkSetup) -> list[Row]:
    """Rows of one vLLM benchmark_throughput JSON (needs --input-tokens and --output-tokens)."""
    _setup_needs(setup, path)
    if setup.input_tokens is None or setup.output_tokens is None:
        raise InputError(f"--from-benchmark: {path} (benchmark_throughput) states no lengths: give --input-tokens and --output-tokens")
    requests = int(_number(data, "num_requests", path, low=1, high=MAX_REQUESTS, whole=True))
    for key in ("requests_per_second", "tokens_per_second"):
        _number(data, key, path, low=MEASURED_MIN)
    common = {"input_tokens": setup.input_tokens, "output_tokens": setup.output_tokens, "request_rate": math.inf,
                  "num_prompts": requests}
    source = path.name
    return [
        _row(setup, source, 1, metric="request_throughput", measured=_number(data, "requests_per_second", path),
             unit="requests/s", **common),
        # vLLM's benchmark_throughput counts prompt and output tokens in tokens_per_second
        _row(setup, source, 2, metric="total_tokens_per_second", measured=_number(data, "tokens_per_second", path),
             unit="tokens/s", **common),
    ]


def rows_from_benchmark(path: Path, setup: BenchmarkSetup, workdir: Path) -> list[Row]:
    """Rows of one benchmark file (see the module docstring)."""
    if path.suffix.lower() == ".csv":
        try:
            return load_table(path)
        except InputError as exc:  # the table reader names its own option (validate --csv); this file came here
            raise InputError(re.sub(r"^--csv:? ", "--from-benchmark: ", str(exc))) from None
    data = _read_json(path)
    if "ttfts" in data or "mean_ttft_ms" in data or "completed" in data:
        return rows_from_serving(data, path, setup, workdir)
    if "requests_per_second" in data and "num_requests" in data:
        return rows_from_throughput(data, path, setup)
    raise InputError(
        f"--from-benchmark: {path}: not a vLLM benchmark_serving result (mean_ttft_ms, completed, ...) "
        "nor a benchmark_throughput JSON (requests_per_second, num_requests, ...), nor a .csv in the published.csv schema"
    )


@dataclass(frozen=True)
class UserCalibration:
    """The fitted efficiencies of one GPU and the errors on the user's rows."""

    gpu: str
    base: Efficiencies
    fitted: Efficiencies
    compute_rows: tuple[str, ...]
    memory_rows: tuple[str, ...]
    validation: Validation
    cross_validation: str

    @property
    def in_sample(self) -> ErrorSummary:
        return summarise(s.error_in for s in self.validation.scored)

    @property
    def out_of_sample(self) -> ErrorSummary:
        return summarise(s.error_out for s in self.validation.scored)


def calibrate_rows(rows: list[Row], replayer: Replayer) -> UserCalibration:
    """Fit compute and memory on ``rows`` (one GPU) and cross-validate (see the module docstring)."""
    if not rows:
        raise InputError("--from-benchmark: the files hold no measurement")
    gpus = {load_gpu(row.gpu).name for row in rows}
    if len(gpus) != 1:
        raise InputError(f"--from-benchmark: the rows name several GPUs ({', '.join(sorted(gpus))}); calibrate one GPU at a time")
    gpu = load_gpu(rows[0].gpu)
    if family_of(gpu.name) is None:
        raise InputError(f"--from-benchmark: {gpu.name} belongs to no GPU family the fit knows")
    base = Efficiencies(gpu.efficiency.compute, gpu.efficiency.memory, gpu.efficiency.expert)
    runs = {row.source_id for row in rows}
    if len(runs) > 1:
        group, how = (lambda row: row.source_id), f"leave one run out ({len(runs)} runs)"
    else:
        group, how = (lambda row: row.id), f"leave one row out ({len(rows)} rows)"
    validation = cross_validate(rows, replayer, group=group, include_serving=True, fallback=base)
    family = validation.in_sample_fit[family_of(gpu.name)]  # type: ignore[index]
    return UserCalibration(gpu.name, base, family.efficiencies, family.compute_rows, family.memory_rows, validation, how)


def overlay_text(calibration: UserCalibration, base_name: str, files: list[Path]) -> str:
    """The overlay YAML: ``base`` + the fitted ``efficiency`` block, with where it came from."""
    overlay = {
        "base": base_name,
        "name": f"{calibration.gpu} (calibrated on benchmarks)",
        "measured": {
            "date": date.today().isoformat(),
            "method": "simulate calibrate --from-benchmark: median per-row efficiencies (docs/readme-validation.md)",
            "files": ", ".join(str(f) for f in files),
            "compute_rows": ", ".join(calibration.compute_rows) or "none (base value kept)",
            "memory_rows": ", ".join(calibration.memory_rows) or "none (base value kept)",
            "error_in_sample_median": _pct(calibration.in_sample.median),
            "error_cross_validated_median": _pct(calibration.out_of_sample.median),
        },
        "efficiency": {"compute": calibration.fitted.compute, "memory": calibration.fitted.memory},
    }
    header = (
        f"# Calibrated overlay on {base_name}: written by `simulate calibrate --from-benchmark` on {date.today().isoformat()}.\n"
        "# compute / memory are the efficiency ceilings that make the engine replay reproduce the benchmark rows\n"
        "# (median of per-row solutions). Load with --gpu PATH.\n"
    )
    return header + yaml.safe_dump(overlay, sort_keys=False, default_flow_style=False)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"
