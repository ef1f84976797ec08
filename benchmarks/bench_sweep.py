"""Sweep speed: a grid of closed-batch points, evaluated with the machine's cores (and optionally one worker).

Run: python -m benchmarks.bench_sweep [--out benchmarks/results.json] [--points 10000] [--one-worker]
The grid is LLaMA-3-8B closed batches on H100: batch (1-25) x context x weights x KV dtype (64 generated
tokens); see grid_scenario.
Target: 10^4 points in < 60 s with the machine's cores (2 here).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import yaml

from benchmarks.common import machine, report, write_results
from simulator.sweep.scenario import load_scenario
from simulator.sweep.sweep import InlineExecutor, run_sweep


def grid_scenario(folder: Path, points: int) -> Path:
    """A scenario whose grid has ``points`` points: batches 1-25 x 4 dtype pairs x points/100 contexts.

    Contexts are spread evenly from 256 to ~6,400 tokens (within LLaMA-3-8B's 8,192): 10 for 10^3 points,
    100 for 10^4. (Before, 10^3 points were batches 1-25 x contexts 256-2,560.)
    """
    contexts = max(1, points // 100)
    step = max(1, (6400 - 256) // max(1, contexts - 1))
    data = {
        "name": "bench",
        "base": {"model": "llama3-8b", "gpu": "h100", "gen": 64},
        "sweep": {
            "grid": {
                "batch": list(range(1, 26)),
                "ctx": [256 + step * i for i in range(contexts)],
                "weights": ["fp16", "fp8"],
                "kv": ["fp16", "fp8"],
            }
        },
        "output": {"path": str(folder / "bench.csv"), "format": "csv"},
    }
    path = folder / "bench.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def points_per_second(path: Path, workers: int) -> tuple[float, int]:
    scenario = load_scenario(path)
    if scenario.output_path.exists():
        scenario.output_path.unlink()
    start = time.perf_counter()
    if workers == 1:
        outcome = run_sweep(scenario, InlineExecutor())
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            outcome = run_sweep(scenario, pool, in_flight=4 * workers)
    seconds = time.perf_counter() - start
    return outcome.total / seconds, outcome.total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", help="merge figures into this JSON file")
    parser.add_argument("--points", type=int, default=10_000)
    parser.add_argument("--one-worker", action="store_true", help="also time the sweep with one worker")
    args = parser.parse_args()
    cpus = os.cpu_count() or 1
    print(f"sweep benchmark on {machine()['cpu_count']} CPUs (load average {os.getloadavg()[0]:.1f})")
    figures = []
    with tempfile.TemporaryDirectory() as tmp:
        path = grid_scenario(Path(tmp), args.points)
        for workers in ([1] if args.one_worker else []) + [cpus]:
            start = time.perf_counter()
            rate, total = points_per_second(path, workers)
            seconds = time.perf_counter() - start
            target = "< 60 s for 10^4 points" if workers == cpus else ""
            figures.append(report(f"sweep of {total:,} points, --workers {workers}: wall time", seconds, "s", target))
            figures.append(report(f"sweep of {total:,} points, --workers {workers}", rate, "points/s"))
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    write_results(args.out, "sweep", figures)


if __name__ == "__main__":
    main()
