"""Scenario files: base options, sweep axes, SLO, searches, cost and output, validated.

A scenario is YAML (read by ``simulator.files``: safe YAML, size and depth limits), checked by pydantic for its shape, then
every option value is checked by the run's settings model
(:class:`simulator.plan.settings.RunSettings`), the same model the CLI and the Python API
use, so a scenario accepts exactly the settings a run does, checked the same way. Errors name the file, the field path (``sweep.grid.batch[2]``)
and the problem, and are raised as :class:`InputError`.

Units: SLO limits in seconds, prices in US dollars per GPU-hour.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from simulator.errors import InputError
from simulator.files import is_folder
from simulator.model import load_gpu, load_model
from simulator.model.loader import read_mapping, suggest
from simulator.plan.settings import MAX_QPS, VLLM_ALIASES, RunSettings, check_field, value_problem

# Example on-demand prices in US dollars per GPU-hour, keyed by the GPU config's name.
# Illustrative round figures in the range of 2024-25 public cloud / GPU-marketplace list
# prices for one GPU of an 8-GPU node; real prices vary by provider, region and commitment,
# so set your own under ``cost.usd_per_gpu_hour`` in a scenario.
DEFAULT_USD_PER_GPU_HOUR: dict[str, float] = {
    "V100-SXM2-32GB": 0.90,
    "A10G": 1.00,
    "L4": 0.80,
    "L40S": 1.40,
    "A100-SXM4-40GB": 1.50,
    "A100-SXM4-80GB": 1.80,
    "H100-PCIe-80GB": 2.50,
    "H100-SXM5-80GB": 3.00,
    "H200-SXM-141GB": 3.70,
    "B200": 5.50,
    "MI300X": 2.50,
}


# ---------------------------------------------------------------------------------------
# The file's shape (pydantic)


MAX_POINTS = 1_000_000
"""Most points one scenario may list (each is at least one simulation; a grid of three 10^5-value ranges would
name 10^15 and never start)."""

class _Strict(BaseModel):
    # No NaN or infinity anywhere in a scenario's blocks (SLO limits, search bounds, ranges).
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_flag_as_a_number(cls, value: Any) -> Any:
        # pydantic reads true as 1 for a number (a 1 s limit, $1 an hour); no field of these blocks is a flag.
        if isinstance(value, bool):
            raise ValueError("expected a number, not a true/false flag")
        return value


class SweepBlock(_Strict):
    grid: dict[str, Any] = Field(default_factory=dict, description="Axes crossed as a cartesian product.")
    zipped: dict[str, Any] = Field(default_factory=dict, alias="zip", description="Axes of equal length, taken in step.")


class SLO(_Strict):
    """Service-level objectives on p99 latencies, in seconds; unset limits are not checked."""

    ttft_p99_seconds: float | None = Field(default=None, gt=0)
    tpot_p99_seconds: float | None = Field(default=None, gt=0)
    e2e_p99_seconds: float | None = Field(default=None, gt=0)
    confidence: float | None = Field(
        default=None, gt=0, le=1,
        description="Meet the limits with at least this chance, given the error band of each point's class "
                    "(simulator.sweep.confidence); unset: the predicted p99s must meet them (the point estimate).")

    def limits(self) -> dict[str, float]:
        """{'ttft': seconds, ...} for the limits that are set."""
        named = {"ttft": self.ttft_p99_seconds, "tpot": self.tpot_p99_seconds, "e2e": self.e2e_p99_seconds}
        return {name: value for name, value in named.items() if value is not None}


class QPSSearch(_Strict):
    """Bisection on the arrival rate (requests/s) between ``low`` and ``high``."""

    low: float = Field(default=0.1, gt=0)
    high: float = Field(default=100.0, gt=0)
    tolerance: float = Field(default=0.02, gt=0, lt=1, description="Stop when (high - low) / high is below this.")


class BatchSearch(_Strict):
    """Bisection on the integer batch size between ``low`` and ``high``."""

    low: int = Field(default=1, ge=1)
    high: int = Field(default=1024, ge=1)


class GPUsForQPS(_Strict):
    qps: float = Field(gt=0, description="Target arrival rate, requests/s.")


class SearchBlock(_Strict):
    max_qps_under_slo: QPSSearch | None = None
    max_batch_under_slo: BatchSearch | None = None
    min_gpus_for_qps: GPUsForQPS | None = None

    @model_validator(mode="before")
    @classmethod
    def _named_means_wanted(cls, data: Any) -> Any:
        # ``max_qps_under_slo:`` with nothing after it asks for the search at its default bounds, not for none.
        if isinstance(data, dict):
            return {key: ({} if value is None and key != "min_gpus_for_qps" else value) for key, value in data.items()}
        return data


class CostBlock(_Strict):
    usd_per_gpu_hour: dict[str, Annotated[float, Field(gt=0, le=1e6)]] = Field(default_factory=dict)

    @field_validator("usd_per_gpu_hour", mode="before")
    @classmethod
    def _no_flag_as_a_price(cls, value: Any) -> Any:
        if isinstance(value, dict):
            for gpu, price in value.items():
                if isinstance(price, bool):
                    raise ValueError(f"{gpu}: expected dollars per GPU-hour, not a true/false flag")
        return value


class OutputBlock(_Strict):
    path: str | None = None
    format: Literal["csv", "jsonl"] | None = None


class ScenarioFile(_Strict):
    name: str | None = None
    description: str | None = None
    base: dict[str, Any] = Field(default_factory=dict)
    sweep: SweepBlock
    slo: SLO | None = None
    search: SearchBlock | None = None
    cost: CostBlock = Field(default_factory=CostBlock)
    output: OutputBlock = Field(default_factory=OutputBlock)


class _ValuesRange(_Strict):
    values: list[Any]


class _StepRange(_Strict):
    start: float
    stop: float
    step: float


class _PowersOfTwoBounds(_Strict):
    start: float = Field(gt=0)
    stop: float = Field(gt=0)


class _PowersOfTwoRange(_Strict):
    powers_of_two: _PowersOfTwoBounds


# ---------------------------------------------------------------------------------------
# The validated scenario


@dataclass(frozen=True)
class Axis:
    """One swept option: its name (the main command's option, underscores) and its values."""

    name: str
    values: tuple[Any, ...]


@dataclass(frozen=True)
class Scenario:
    source: str
    name: str
    description: str
    base: dict[str, Any]
    grid: tuple[Axis, ...]
    zipped: tuple[Axis, ...]
    slo: SLO | None
    search: SearchBlock
    usd_per_gpu_hour: dict[str, float]
    output_path: Path
    output_format: Literal["csv", "jsonl"]
    output_is_default: bool
    extra_options: dict[str, Any] = field(default_factory=dict)

    @property
    def axes(self) -> tuple[Axis, ...]:
        return self.zipped + self.grid

    def points(self) -> list[dict[str, Any]]:
        """Every point's options, in a fixed order: zipped rows outside, grid (last axis fastest) inside."""
        zip_rows = list(zip(*(axis.values for axis in self.zipped))) if self.zipped else [()]
        grid_rows = list(itertools.product(*(axis.values for axis in self.grid)))
        points = []
        for zip_row in zip_rows:
            for grid_row in grid_rows:
                options = {**self.base, **self.extra_options}
                options.update(zip((a.name for a in self.zipped), zip_row))
                options.update(zip((a.name for a in self.grid), grid_row))
                points.append(options)
        return points


# Scenario options are the run's settings (simulator.plan.settings.RunSettings), by field name.
OPTION_NAMES: tuple[str, ...] = tuple(RunSettings.model_fields)


def format_path(parts: tuple[Any, ...] | list[Any]) -> str:
    """('sweep', 'grid', 'batch', 2) -> 'sweep.grid.batch[2]'."""
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text or "(top level)"


class FieldError(InputError):
    """A problem at a field path of a scenario; load_scenario adds the file name."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


def _without_option_prefix(message: str) -> str:
    """'--model: unknown model ...' -> 'unknown model ...' (the field path already says where)."""
    return re.sub(r"^--[\w-]+: ", "", message)


def convert_value(name: str, value: Any, path: str) -> Any:
    """Check ``value`` against the setting ``name`` (type, range, allowed values) and return it converted."""
    if value is None:
        return None  # the setting's default, as when the flag is left out
    if isinstance(value, (list, dict)):
        raise FieldError(path, f"expected a single value, got a {type(value).__name__} (axes take lists; base takes one value)")
    try:
        return check_field(RunSettings, name, value)
    except pydantic.ValidationError as exc:
        raise FieldError(path, value_problem(exc)) from None


def _check_name(name: str, path: str) -> str:
    if name in OPTION_NAMES:
        return name
    hint = suggest(name, [*OPTION_NAMES, *VLLM_ALIASES])
    raise FieldError(path, f"unknown option '{name}'{hint}; valid options: {', '.join(OPTION_NAMES)}")


def _validate_model(cls: type[BaseModel], data: Any, path: str) -> Any:
    try:
        return cls.model_validate(data)
    except pydantic.ValidationError as exc:
        err = exc.errors()[0]
        where = format_path([path, *err["loc"]]) if err["loc"] else path or "(top level)"
        message = re.sub(r" or instance of \w+", "", err["msg"])  # our class names mean nothing to a user
        if err["type"] == "extra_forbidden":
            allowed = _fields_at(cls, err["loc"][:-1])
            message = f"unknown field '{err['loc'][-1]}'{suggest(str(err['loc'][-1]), allowed)}; allowed: {', '.join(allowed)}"
        elif "input" in err and not isinstance(err["input"], (dict, list)):
            message = f"{message} (got {err['input']!r})"
        raise FieldError(where, message) from None


def _fields_at(cls: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names (YAML spelling) of the pydantic model reached by following ``loc`` from ``cls``."""
    for part in loc:
        info = cls.model_fields.get(str(part)) or next((f for f in cls.model_fields.values() if f.alias == part), None)
        annotation = info.annotation if info else None
        nested = [a for a in getattr(annotation, "__args__", (annotation,)) if isinstance(a, type) and issubclass(a, BaseModel)]
        if not nested:
            return []
        cls = nested[0]
    return [info.alias or name for name, info in cls.model_fields.items()]


def expand_values(spec: Any, path: str) -> list[Any]:
    """An axis's values: a list, a scalar, ``{values: [...]}``, ``{start, stop, step}`` or ``{powers_of_two: {start, stop}}``.

    ``stop`` is included when the steps land on it. Values keep their YAML type (an integer
    range gives integers).
    """
    if isinstance(spec, list):
        values = spec
    elif isinstance(spec, dict):
        if "values" in spec:
            values = _validate_model(_ValuesRange, spec, path).values
            path = f"{path}.values"
        elif "powers_of_two" in spec:
            bounds = _validate_model(_PowersOfTwoRange, spec, path).powers_of_two
            if bounds.stop < bounds.start:
                raise FieldError(f"{path}.powers_of_two", f"stop {bounds.stop:g} is below start {bounds.start:g}")
            exponents = range(math.ceil(math.log2(bounds.start)), math.floor(math.log2(bounds.stop)) + 1)
            values = [2**k if k >= 0 else 2.0**k for k in exponents]
            if not values:
                raise FieldError(f"{path}.powers_of_two", f"no power of two lies in [{bounds.start:g}, {bounds.stop:g}]")
        elif {"start", "stop", "step"} & set(spec):
            rng = _validate_model(_StepRange, spec, path)
            values = _step_range(spec, rng, path)
        else:
            raise FieldError(
                path,
                f"unrecognised range {sorted(spec)}; use a list, {{values: [...]}}, {{start, stop, step}} "
                "or {powers_of_two: {start, stop}}",
            )
    else:
        values = [spec]
    if not values:
        raise FieldError(path, "empty list of values")
    return values


def _step_range(spec: dict[str, Any], rng: _StepRange, path: str) -> list[Any]:
    if rng.step == 0:
        raise FieldError(f"{path}.step", "step must not be 0")
    if (rng.stop - rng.start) * rng.step < 0:
        raise FieldError(f"{path}.step", f"step {rng.step:g} never goes from start {rng.start:g} to stop {rng.stop:g}")
    span = (rng.stop - rng.start) / rng.step  # inf where the difference overflows or the step is tiny
    if not span < 100_000:
        many = f"{math.floor(span + 1e-9) + 1:,}" if math.isfinite(span) else "more than 100,000"
        raise FieldError(path, f"{many} values; at most 100,000 per axis")
    count = math.floor(span + 1e-9) + 1
    integral = all(isinstance(spec[k], int) and not isinstance(spec[k], bool) for k in ("start", "stop", "step"))
    if integral:
        return [int(spec["start"]) + i * int(spec["step"]) for i in range(count)]
    # Rounded so that 0.1 + 2 * 0.1 reads 0.3, not 0.30000000000000004.
    return [round(rng.start + i * rng.step, 12) for i in range(count)]


def _translate_alias(name: str, value: Any, path: str) -> dict[str, Any]:
    """A vLLM spelling's value as the settings it stands for (VLLM_ALIASES, the table the CLI and the API use)."""
    if isinstance(value, (list, dict)) and name != "goodput":
        raise FieldError(path, f"expected a single value, got a {type(value).__name__} (axes take lists; base takes one value)")
    try:
        return VLLM_ALIASES[name](value)
    except (InputError, ValueError, TypeError, OverflowError) as exc:
        raise FieldError(path, f"cannot read {value!r} as vLLM's {name} ({_without_option_prefix(str(exc))})") from None


def _base_options(given: dict[str, Any]) -> dict[str, Any]:
    """``base``'s options by setting name, each checked; a vLLM spelling (tensor_parallel_size, ...) translated."""
    base: dict[str, Any] = {}
    for name, value in given.items():
        path = f"base.{name}"
        if str(name) in VLLM_ALIASES:
            if value is None:
                continue  # the settings' defaults, as when the flag is left out
            for field_name, field_value in _translate_alias(str(name), value, path).items():
                if field_name in given or field_name in base:
                    raise FieldError(path, f"sets {field_name}, which base also sets; give one of them")
                base[field_name] = convert_value(field_name, field_value, path)
            continue
        base[str(name)] = convert_value(_check_name(str(name), path), value, path)
    return base


def _axes(block: dict[str, Any], where: str) -> tuple[Axis, ...]:
    axes: list[Axis] = []
    for name, spec in block.items():
        path = f"{where}.{name}"
        field_name = str(name) if str(name) in VLLM_ALIASES else _check_name(str(name), path)
        values: list[Any] = []
        for i, value in enumerate(expand_values(spec, path)):
            value_path = _value_path(spec, path, i, value)
            if str(name) in VLLM_ALIASES:
                # A vLLM spelling sweeps the one setting it stands for (tensor_parallel_size -> tp).
                translated = _translate_alias(str(name), value, value_path)
                if len(translated) != 1 or (values and next(iter(translated)) != field_name):
                    raise FieldError(value_path, f"{value!r} does not set one setting; sweep the setting it stands for "
                                                 f"({', '.join(sorted(translated)) or 'none for this value'})")
                (field_name, value), = translated.items()
            values.append(convert_value(field_name, value, value_path))
        seen = [a for a in axes if a.name == field_name]
        if seen:  # a vLLM spelling beside its setting (tensor_parallel_size and tp): two axes of one setting
            raise FieldError(path, f"sweeps {field_name}, as another axis of {where} already does; sweep it once")
        # (a zipped axis repeats values in rows that differ elsewhere: its rows are checked whole, in _build)
        counts = Counter(repr(value) for value in values) if where.endswith("grid") else Counter()
        repeated = sorted(shown for shown, count in counts.items() if count > 1)
        if repeated:
            raise FieldError(path, f"repeats {', '.join(repeated)}: a point would run twice; give each value once")
        axes.append(Axis(field_name, tuple(values)))
    return tuple(axes)


def _value_path(spec: Any, path: str, index: int, value: Any) -> str:
    """Where the index-th value of an axis came from, for error messages."""
    if isinstance(spec, list):
        return f"{path}[{index}]"
    if isinstance(spec, dict) and "values" in spec:
        return f"{path}.values[{index}]"
    if isinstance(spec, dict):
        return f"{path} (value {value!r} of the range)"
    return path


def _check_configs(base: dict[str, Any], axes: tuple[Axis, ...], zipped_names: set[str]) -> None:
    """Load every model and GPU named, so a typo fails before any point runs."""
    for option, loader in (("model", load_model), ("gpu", load_gpu)):
        if base.get(option) is not None:  # null is the option left unset
            _load_or_problem(loader, base[option], f"base.{option}")
        for axis in axes:
            if axis.name == option:
                block = "zip" if axis.name in zipped_names else "grid"
                for i, value in enumerate(axis.values):
                    _load_or_problem(loader, value, f"sweep.{block}.{option}[{i}]")
    named = {name for name, value in base.items() if value is not None} | {axis.name for axis in axes}
    for required in ("model", "gpu"):
        if required not in named:
            raise FieldError("base", f"no {required} given: set base.{required} or sweep it")


def _load_or_problem(loader: Any, value: str, path: str) -> Any:
    if not isinstance(value, str) or not value.strip():
        raise FieldError(path, f"expected a config name or a path to a config file, got {value!r}")
    try:
        return loader(value)
    except InputError as exc:
        raise FieldError(path, _without_option_prefix(str(exc))) from None


def _prices(cost: CostBlock) -> dict[str, float]:
    prices = dict(DEFAULT_USD_PER_GPU_HOUR)
    given: dict[str, str] = {}  # GPU name -> the key that priced it
    for key, price in cost.usd_per_gpu_hour.items():
        path = f"cost.usd_per_gpu_hour.{key}"
        name = _load_or_problem(load_gpu, str(key), path).name
        if name in given:
            raise FieldError(path, f"prices {name} again (as cost.usd_per_gpu_hour.{given[name]} does); price it once")
        given[name] = str(key)
        prices[name] = float(price)
    return prices


def _output(source: Path, block: OutputBlock, out: str | None) -> tuple[Path, Literal["csv", "jsonl"], bool]:
    """The results file and its format; ``--out`` beats ``output.path``; the format follows the suffix."""
    given, field_name = (out, "--out") if out is not None else (block.path, "output.path")
    if given is None:
        fmt = block.format or "csv"
        return Path("out") / f"{source.stem}.{fmt}", fmt, True
    path = Path(given)
    by_suffix: Literal["csv", "jsonl"] | None = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl"}.get(  # type: ignore[assignment]
        path.suffix.lower())
    if out is None and block.format and by_suffix and block.format != by_suffix:
        raise FieldError("output.format", f"{block.format} but output.path '{given}' ends in {path.suffix}")
    fmt = by_suffix or block.format or "csv"
    if is_folder(path, field_name):
        raise FieldError(field_name, f"'{given}' is a folder; give a file path such as {given.rstrip('/')}/results.{fmt}")
    if path.resolve() == source.resolve():
        raise FieldError(field_name, f"'{given}' is the scenario file itself; choose another results path")
    if not is_folder(path.parent, field_name):
        raise FieldError(field_name, f"folder '{path.parent}' of '{given}' does not exist; create it or choose another path")
    return path, fmt, False


def _check_search(data: ScenarioFile, axis_names: set[str], base: dict[str, Any]) -> SearchBlock:
    search = data.search or SearchBlock()
    named = axis_names | set(base)  # every option a point sets, by setting name
    wanted = [name for name in ("max_qps_under_slo", "max_batch_under_slo", "min_gpus_for_qps") if getattr(search, name)]
    if data.slo is not None and not data.slo.limits():
        raise FieldError("slo", "no limit set; give ttft_p99_seconds, tpot_p99_seconds and/or e2e_p99_seconds")
    if wanted and data.slo is None:
        raise FieldError(f"search.{wanted[0]}", "a search needs an slo block (ttft_p99_seconds, tpot_p99_seconds, e2e_p99_seconds)")
    if search.max_qps_under_slo is not None:
        qps = search.max_qps_under_slo
        if "qps" in axis_names:
            raise FieldError("search.max_qps_under_slo", "qps is swept; the search sets it itself (a qps in base sets the point's own run)")
        if qps.high <= qps.low:
            raise FieldError("search.max_qps_under_slo.high", f"must be above low ({qps.low:g}), got {qps.high:g}")
        if qps.high > MAX_QPS:
            raise FieldError("search.max_qps_under_slo.high", f"at most {MAX_QPS:g} requests/s (a run's highest), "
                                                              f"got {qps.high:g}")
        clashes = sorted(named & {"batch", "trace", "max_concurrency", "sessions"})
        if clashes:
            raise FieldError("search.max_qps_under_slo", f"its runs arrive at a rate, which {clashes[0]} (set by the "
                                                         f"scenario) does not take; drop {clashes[0]} or the search")
    if search.max_batch_under_slo is not None:
        batch = search.max_batch_under_slo
        if "batch" in axis_names:
            raise FieldError("search.max_batch_under_slo", "batch is swept; the search sets it itself (move batch to base or drop the search)")
        if batch.high < batch.low:
            raise FieldError("search.max_batch_under_slo.high", f"must be at least low ({batch.low}), got {batch.high}")
        clashes = sorted(named & {"requests", "qps", "trace", "max_concurrency", "sessions"})
        if clashes:
            raise FieldError("search.max_batch_under_slo", f"its runs are closed batches of the batch it tries, which "
                                                           f"{clashes[0]} (set by the scenario) contradicts; drop "
                                                           f"{clashes[0]} or the search")
    if search.min_gpus_for_qps is not None and search.max_qps_under_slo is None:
        raise FieldError("search.min_gpus_for_qps", "needs search.max_qps_under_slo (the capacity of one replica)")
    if search.min_gpus_for_qps is not None and "disaggregate" in named:
        raise FieldError("search.min_gpus_for_qps", "searches the number of replicas, which a disaggregated run's "
                                                    "pools fix (disaggregate, set by the scenario); drop one of them")
    return search


def _slo_options(slo: SLO | None, named: set[str]) -> dict[str, Any]:
    """Hand the SLO to the engine's goodput options when the command has them and the scenario leaves them unset."""
    if slo is None:
        return {}
    extra = {}
    for option, value in (("slo_ttft", slo.ttft_p99_seconds), ("slo_tpot", slo.tpot_p99_seconds)):
        if value is not None and option not in named:
            extra[option] = value
    return extra


def load_scenario(path: str | Path, out: str | None = None) -> Scenario:
    """Read and validate a scenario file; ``out`` overrides ``output.path`` (the ``--out`` flag)."""
    source = Path(path)
    raw = read_mapping(source)
    try:
        return _build(source, raw, out)
    except FieldError as problem:
        raise InputError(f"{source}: {problem.path}: {problem.message}") from None


def _build(source: Path, raw: dict[str, Any], out: str | None) -> Scenario:
    data = _validate_model(ScenarioFile, raw, "")
    base = _base_options(data.base)
    # Counted before any value is checked (a check costs about a millisecond: 3 x 10^5 values take minutes).
    lengths = {block: [len(expand_values(spec, f"sweep.{block}.{name}")) for name, spec in axes.items()]
               for block, axes in (("zip", data.sweep.zipped), ("grid", data.sweep.grid))}
    points = (lengths["zip"][0] if lengths["zip"] else 1) * math.prod(lengths["grid"])
    if points > MAX_POINTS:
        raise FieldError("sweep", f"{points:,} points; at most {MAX_POINTS:,} (each is a simulation): sweep fewer values")
    zipped = _axes(data.sweep.zipped, "sweep.zip")
    grid = _axes(data.sweep.grid, "sweep.grid")
    if not zipped and not grid:
        raise FieldError("sweep", "empty sweep: give at least one axis under sweep.grid or sweep.zip")
    for axis in grid:
        if axis.name in {a.name for a in zipped}:
            raise FieldError(f"sweep.grid.{axis.name}", "also under sweep.zip; sweep an option in one place")
    for block, axes in (("zip", zipped), ("grid", grid)):
        for axis in axes:
            if axis.name in base:
                raise FieldError(f"sweep.{block}.{axis.name}", f"also set in base.{axis.name}; set it in one place")
    if zipped:
        first = zipped[0]
        for axis in zipped[1:]:
            if len(axis.values) != len(first.values):
                raise FieldError(
                    f"sweep.zip.{axis.name}",
                    f"{len(axis.values)} value(s) but sweep.zip.{first.name} has {len(first.values)}; zipped axes go in step",
                )
    first_of: dict[str, int] = {}  # a zipped row (its repr) -> the first index it appears at
    for index, row in enumerate(zip(*(axis.values for axis in zipped))):
        earlier = first_of.setdefault(repr(row), index)
        if earlier != index:
            raise FieldError("sweep.zip", f"row {index} repeats row {earlier} in every zipped axis: a point would run "
                                          "twice; give each row once")
    axis_names = {axis.name for axis in zipped + grid}
    _check_configs(base, zipped + grid, {a.name for a in zipped})
    search = _check_search(data, axis_names, base)
    output_path, output_format, output_is_default = _output(source, data.output, out)
    return Scenario(
        source=str(source),
        name=data.name or source.stem,
        description=(data.description or "").strip(),
        base=base,
        grid=grid,
        zipped=zipped,
        slo=data.slo,
        search=search,
        usd_per_gpu_hour=_prices(data.cost),
        output_path=output_path,
        output_format=output_format,
        output_is_default=output_is_default,
        extra_options=_slo_options(data.slo, set(base) | axis_names),
    )
