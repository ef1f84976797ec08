"""The Python API: simulate a run, sweep a scenario.

>>> from simulator import simulate
>>> result = simulate(model="llama2-70b", gpu="a100", batch=64, ctx=4096)
>>> result.ttft.p99, result.tpot.p50          # seconds
>>> result.to_dict()                           # the `simulate --json` contract
>>> result.per_request["ttft_seconds"]         # numpy arrays, one element per request

Settings are the main command's options with underscores (``attention_kernel``,
``max_num_seqs``, ...; vLLM's spellings such as ``request_rate`` and ``num_prompts`` work
too) and are validated by the same model as the CLI and scenario files
(:class:`~simulator.plan.settings.RunSettings`). They can be passed as keywords, or grouped as
a :class:`Deployment` (what runs where) and a :class:`Workload` (what it serves):

>>> from simulator import Deployment, Workload
>>> simulate(Deployment(model="llama3-8b", gpu="h100"), Workload(qps=10, requests=2000))

Bad input raises :class:`~simulator.errors.InputError` with one line saying what is wrong, naming
settings by their keywords (``tp``, ``gpu_memory_utilization``), never by the command line's flags.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, Callable

import pydantic
from pydantic import BaseModel

from simulator.errors import InputError
from simulator.plan.result import SimulationResult
from simulator.plan.run import simulate_settings
from simulator.plan.settings import (
    VLLM_ALIASES,
    DeploymentSettings,
    RunSettings,
    ServingSettings,
    ShapeSettings,
    field_flag,
    parse_settings,
    resolve_aliases,
    validation_error,
)
from simulator.sweep.scenario import Scenario, load_scenario
from simulator.sweep.sweep import InlineExecutor, SweepOutcome, run_sweep


class _Group(BaseModel):
    """A group of run settings; vLLM spellings accepted, problems raised as InputError naming the setting."""

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**resolve_aliases(data))
        except pydantic.ValidationError as exc:
            raise validation_error(exc, str) from None


class Deployment(_Group, DeploymentSettings):
    """What runs where: ``model``, ``gpu``, precision, parallelism, kernels (see RunSettings for every field)."""


class Workload(_Group, ShapeSettings, ServingSettings):
    """What the deployment serves: a closed batch (``batch``, ``ctx``, ``gen``) or arrivals (``qps``, ``trace``)."""


@functools.lru_cache(maxsize=1)
def _setting_of_flag() -> dict[str, str]:
    """Each long flag of a setting (``--tp``, ``--tensor-parallel-size``, ``--gpu-memory-utilization``) -> its
    keyword (``tp``, ``gpu_memory_utilization``); vLLM's spellings -> theirs (``max_num_batched_tokens``)."""
    names = {}
    for name, info in RunSettings.model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        for flag in [*(extra.get("flags") or []), field_flag(name)]:  # type: ignore[misc]
            if str(flag).startswith("--"):
                names[str(flag)] = name
    for alias in VLLM_ALIASES:
        names.setdefault(field_flag(alias), alias)
    return names


_FLAG = re.compile(r"--[a-z][a-z0-9-]*")


def _in_api_words(exc: InputError) -> InputError:
    """``exc`` with every setting's CLI flag replaced by its keyword: the layers below phrase errors for the
    command line (``--tp: 3 does not divide ...``); a Python caller gave ``tp=3``. Other flags stay as they are."""
    names = _setting_of_flag()
    error = InputError(_FLAG.sub(lambda match: names.get(match.group(0), match.group(0)), str(exc)))
    return error


def _given(part: BaseModel | None) -> dict[str, Any]:
    return {} if part is None else part.model_dump(exclude_unset=True)


def settings(deployment: Deployment | None = None, workload: Workload | None = None, **options: Any) -> RunSettings:
    """The validated RunSettings of a deployment, a workload and keyword options (keywords win)."""
    try:
        return parse_settings(RunSettings, {**_given(deployment), **_given(workload), **options})
    except InputError as exc:
        raise _in_api_words(exc) from None


def simulate(
    deployment: Deployment | None = None,
    workload: Workload | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
    **options: Any,
) -> SimulationResult:
    """Simulate one run through the serving engine and return its result (seconds, tokens, bytes)."""
    checked = settings(deployment, workload, **options)
    try:
        return SimulationResult(simulate_settings(checked, progress))
    except InputError as exc:
        raise _in_api_words(exc) from None


def sweep(scenario: str | Path | Scenario, out: str | Path | None = None, resume: bool = False) -> SweepOutcome:
    """Run every point of a scenario file in this process; rows are written to the results file as they finish."""
    loaded = scenario if isinstance(scenario, Scenario) else load_scenario(scenario, None if out is None else str(out))
    return run_sweep(loaded, InlineExecutor(), resume=resume)


__all__ = ["Deployment", "InputError", "RunSettings", "SimulationResult", "Workload", "settings", "simulate", "sweep"]
