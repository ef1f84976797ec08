"""memwall: a transformer inference cost simulator.

Data flows one way: configs (``model/``) -> cost model (``cost/``) -> serving engine
(``engine/``) -> plans, sweeps, validation (``plan/``) -> reports (``report/``), with the
Python API in ``api.py`` and the command line in ``cli/``. All quantities inside the package
are SI base units (seconds, bytes, FLOPs, FLOP/s, bytes/s).

>>> import simulator
>>> result = simulator.simulate(model="llama2-70b", gpu="a100", batch=64, ctx=4096)
>>> result.ttft.p50
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_API = ("simulate", "sweep", "settings", "Deployment", "Workload", "RunSettings", "SimulationResult", "InputError")

if TYPE_CHECKING:
    from simulator.api import (  # noqa: F401  (re-exported lazily by __getattr__)
        Deployment,
        InputError,
        RunSettings,
        SimulationResult,
        Workload,
        settings,
        simulate,
        sweep,
    )


def __getattr__(name: str) -> Any:
    # The API is imported on first use, so `import simulator` stays cheap for tools that only need a submodule.
    if name in _API:
        from simulator import api

        return getattr(api, name)
    raise AttributeError(f"module 'simulator' has no attribute {name!r}")


__all__ = ["__version__", *_API]
