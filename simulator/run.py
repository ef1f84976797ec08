"""Run one simulation from a flat dict of options: the API behind the CLI and sweeps.

Keys are the main command's option names with underscores (``model``, ``gpu``, ``batch``,
``ctx``, ``gen``, ``weights``, ``kv``, ``tp``, ...); the result is the ``--json`` dict.
"""

from __future__ import annotations

from typing import Any

from simulator.analytic import run_batch
from simulator.cli.options import deployment_from_options
from simulator.report import batch_run_dict

DEFAULTS: dict[str, Any] = {"batch": 1, "ctx": 2048, "gen": 128}


def run_from_options(options: dict[str, Any]) -> dict[str, Any]:
    """Simulate with ``options`` (missing ones take the CLI defaults); InputError on bad input or no fit."""
    merged = {**DEFAULTS, **options}
    batch, ctx, gen = int(merged.pop("batch")), int(merged.pop("ctx")), int(merged.pop("gen"))
    deployment = deployment_from_options(merged, batch, ctx)
    return batch_run_dict(run_batch(deployment, batch, ctx, gen))
