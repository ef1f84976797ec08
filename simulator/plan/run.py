"""Run one simulation from its settings: the engine run behind the API, the CLI and sweeps.

:func:`simulate_settings` takes a :class:`~simulator.plan.settings.RunSettings` (or a dict of its
field names, validated into one) and returns an :class:`EngineRun`: what was simulated and
what came out. :func:`run_from_options` returns the ``--json`` contract instead.

Without ``qps`` or ``trace`` the workload is a closed batch of ``batch`` (or ``requests``)
requests at t = 0, each a prompt of ``ctx - gen`` tokens generating ``gen``. The deployment
(tensor-parallel degree, memory plan) is planned for that many sequences of ``ctx`` tokens;
the KV cache then holds what memory allows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from simulator.engine.workload import check_held_in_memory
from simulator.errors import InputError
from simulator.plan.disaggregated_run import simulate_disaggregated
from simulator.plan.engine_run import EngineRun, as_settings, prepare, simulate_prepared
from simulator.plan.result import engine_run_dict
from simulator.plan.settings import RunSettings
from simulator.plan.speculative_run import simulate_speculative


def simulate_settings(
    settings: RunSettings | dict[str, Any], progress: Callable[[int, int], None] | None = None,
    records: Path | str | None = None,
) -> EngineRun:
    """Prepare and run the engine; ``progress(finished, total requests)`` is called now and then.

    ``records``: a folder to stream the per-request records and the iteration log to, so a run of
    10^7 requests holds only a window of them in memory (simulator.engine.records; one replica,
    no speculative decoding or disaggregation).
    """
    settings = as_settings(settings)
    if records is not None and (settings.disaggregate is not None or settings.speculative is not None):
        raise InputError("--records: streams a plain engine run; not with --disaggregate or --speculative")
    # Disaggregated prefill/decode and speculative decoding run in their own modules (h10).
    if settings.disaggregate is not None:
        return simulate_disaggregated(settings, progress)
    prep = prepare(settings)
    if records is None:
        check_held_in_memory(len(prep.workload))
    if settings.speculative is not None:
        return simulate_speculative(prep, progress)
    return simulate_prepared(prep, progress, records)


# The dict-keyed entry points of earlier releases; both validate through RunSettings.
simulate_from_options = simulate_settings


def run_from_options(options: RunSettings | dict[str, Any]) -> dict[str, Any]:
    """Simulate and return the ``--json`` contract; InputError on bad input or no fit."""
    return engine_run_dict(simulate_settings(options))
