"""What each term of the time model does to the error on validation/published.csv, by regime.

Replays every row (simulator.validation.replay.Replayer) with the GPU YAMLs' shipped efficiencies (no
fitting), turning the terms of docs/time-model.md on one at a time:

  old          the earlier model: no engine overhead, CUDA graphs everywhere, NCCL ring with a flat
               8 us per all-reduce, flat kernel efficiencies
  collectives  + all-reduce by algorithm (NCCL's latencies and protocols, the engine's custom
               one-shot/two-shot kernels)
  kernels      + efficiency by shape (GEMM tiles and waves, memory ramp, FlashAttention ceiling and
               its K/V reuse in L2), with the roofline's max of compute and memory
  in series    + a kernel's loads and its real rows' MMAs in series (efficiency.overlap 0)
  launches     + the engine's CUDA-graph capture limits and host launches outside graphs
  engine       + the engine's host CPU time per iteration
  kernels/eng  + the kernels the engine chooses: its attention kernel, quantised weights expanded in HBM,
               FP16 accumulation, its largest forward pass, sliding windows ignored (the full model,
               as runs use it; docs/time-model.md)

Run: python -m benchmarks.time_terms [--rows N]   (about 3 minutes per variant on 2 cores)
Prints, per regime, the median absolute error and the median speed error (positive: the
simulator is faster than measured).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

import yaml

from simulator.cost import step_cost
from simulator.model.engine_profile import IDEAL, load_engine_profile
from simulator.model.gpu import load_gpu
from simulator.plan import deployment_planner as deployment
from simulator.plan import placement
from simulator.validation import replay as validate

VARIANTS = ("old", "collectives", "kernels", "in series", "launches", "engine", "kernels/eng")


def _profile(name: str, level: int, folder: Path) -> str:
    """The row's engine profile with only the terms of ``level`` and below (a YAML path)."""
    real = load_engine_profile(name)
    data = IDEAL.model_dump()
    data["name"] = f"{name}-level-{level}"
    if level >= 1:
        data.update(allreduce=real.allreduce, custom_allreduce_max_bytes=real.custom_allreduce_max_bytes)
    if level >= 4:
        data.update(graphs=real.graphs.model_dump(), enforce_eager=real.enforce_eager)
    if level >= 5:
        data["cpu"] = real.cpu.model_dump()
    if level >= 6:
        data.update(attention_kernel=real.attention_kernel, naive_score_bytes=real.naive_score_bytes,
                    dequantize_above_tokens=real.dequantize_above_tokens, gemm_accumulate=real.gemm_accumulate,
                    honours_sliding_window=real.honours_sliding_window)
        data["scheduler"] = {**data["scheduler"], "pass_tokens": real.scheduler.pass_tokens}
    path = folder / f"{name}-{level}.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return str(path)


def replay(level: int, rows: list[validate.Row], folder: Path) -> dict[str, dict[str, Any]]:
    """Errors of every row that replays, with the terms of ``level`` on (the patches are undone after)."""
    saved = (validate.engine_profile, deployment.deployment_from_options, placement.deployment_from_options,
             step_cost.operator_network)
    own_engine, from_options, network = saved[0], saved[1], saved[3]

    def engine_profile(engine: str, version: str = "") -> tuple[str, str]:
        name, note = own_engine(engine, version)
        return _profile(name, level, folder), note

    def options_at_level(options: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        options = {**options, "collectives": "ring" if level == 0 else "auto",
                   "kernel_efficiency": "shape" if level >= 2 else "flat"}
        if level == 2:
            options["kernel_overlap"] = 1.0
        return from_options(options, *args, **kwargs)

    def flat_latency(op: Any, gpu: Any, model: Any) -> Any:
        return network(op, gpu.with_efficiency(allreduce_latency_seconds=8e-6), model)

    validate.engine_profile = engine_profile
    deployment.deployment_from_options = placement.deployment_from_options = options_at_level
    if level == 0:
        step_cost.operator_network = flat_latency
    errors = {}
    try:
        with validate.Replayer() as replayer:
            for row in rows:
                gpu = load_gpu(row.gpu)
                prediction = replayer.predict(row, validate.Efficiencies(gpu.efficiency.compute, gpu.efficiency.memory))
                if prediction.value is None:
                    continue
                error = (prediction.value - row.measured) / row.measured
                speed = 1.0 / (1.0 + error) - 1.0 if validate.is_time_metric(row.metric) else error
                errors[row.id] = {"regime": row.regime, "error": abs(error), "speed": speed}
    finally:
        (validate.engine_profile, deployment.deployment_from_options, placement.deployment_from_options,
         step_cost.operator_network) = saved
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, help="only the first N rows of the table")
    args = parser.parse_args()
    rows = validate.load_table()[: args.rows]
    with tempfile.TemporaryDirectory(prefix="memwall-terms-") as tmp:
        results = {name: replay(level, rows, Path(tmp)) for level, name in enumerate(VARIANTS)}
    common = set.intersection(*(set(r) for r in results.values()))
    regimes = sorted({results["old"][i]["regime"] for i in common})
    print(f"{len(common)} rows replayed in every variant; cells: median |error| (median speed error)")
    print(f"{'regime':14} {'rows':>5}  " + "  ".join(f"{v:>18}" for v in VARIANTS))
    for regime in [*regimes, "all"]:
        ids = [i for i in common if regime == "all" or results["old"][i]["regime"] == regime]
        cells = []
        for name in VARIANTS:
            errors = [results[name][i] for i in ids]
            cells.append(f"{100 * statistics.median(e['error'] for e in errors):5.1f}% "
                         f"({100 * statistics.median(e['speed'] for e in errors):+5.1f}%)")
        print(f"{regime:14} {len(ids):5}  " + "  ".join(f"{c:>18}" for c in cells))


if __name__ == "__main__":
    main()
