"""The pure roofline for hand-worked tests: every efficiency 1 and no fixed cost per kernel or all-reduce,
so a time a test works out by hand (bytes / bandwidth, FLOPs / peak) is the time the simulator charges."""

from __future__ import annotations

from simulator.model import GPUSpec, load_gpu

EXACT = dict(compute=1.0, memory=1.0, link=1.0, kernel_launch_seconds=0.0, allreduce_latency_seconds=0.0)
"""``Efficiency`` fields of the pure roofline."""


def exact_gpu(name: str = "a100", **efficiency: float) -> GPUSpec:
    """GPU ``name`` at the pure roofline (``efficiency`` overrides single fields), without any measured
    per-operator overlay, which would replace the efficiencies the test counts with."""
    return load_gpu(name).with_efficiency(**{**EXACT, **efficiency}).model_copy(update={"efficiency_by_op": []})
