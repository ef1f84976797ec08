"""Engine speed: a Poisson trace on LLaMA-3-8B / one H100 near capacity, 10^5 to 10^7 requests.

Run: python -m benchmarks.bench_engine [--out benchmarks/results.json] [--sizes 100000 1000000 [10000000]]
                                       [--scheduler continuous|chunked|prefill-first] [--lengths fixed|varied]

Poisson arrivals at 10 requests/s; the default request is 1920 prompt + 128 output tokens (``--lengths
varied``: uniform 1000-2840 and 64-192, the same means), ``--scheduler continuous`` (vLLM V0 style, no
token budget; capacity ~11.7 requests/s, so the server runs near capacity). Each size runs in its own
process, so peak memory (max RSS) is that run's alone; wall and CPU seconds cover planning, the engine,
the aggregates and the --json dict. Sizes of 10^7 and more stream their per-request records, iteration
log and inter-token gaps to a temporary folder (simulator.engine.records) instead of holding them.

Targets on 2 cores: 10^6 requests in < 30 s wall and <= 1 GB peak; >= 100,000 simulated iterations/s;
each tenfold size takes <= 11x the time. The default sizes (10^5, 10^6) take a few minutes at most.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from benchmarks.common import machine, report, write_results

STREAM_FROM = 10_000_000
"""Sizes from which the records stream to disk."""

CHILD = """
import json, os, resource, sys, tempfile, time
from simulator.plan.run import prepare, run_from_options
from simulator.engine.engine import simulate
from simulator.engine.metrics import aggregate
from simulator.plan.result import engine_run_dict

n, scheduler, lengths, stream = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] == "1"
options = dict(model="llama3-8b", gpu="h100", qps=10.0, requests=n, scheduler=scheduler, seed=1)
if lengths == "varied":
    options.update(prompt_tokens="uniform:1000:2840", output_tokens="uniform:64:192")
load = os.getloadavg()[0]
start, cpu = time.perf_counter(), time.process_time()
if stream:
    prep = prepare(options)
    system = prep.deployment.system
    with tempfile.TemporaryDirectory() as folder:
        result = simulate(system, prep.workload, prep.config, prep.capacity.blocks, records=folder)
        metrics = aggregate(result, system.tp, system.peak_flops, system.gpu.hbm_bandwidth_bytes_per_second)
        iterations, completed = result.totals.iterations, metrics.completed
else:
    out = run_from_options(options)
    iterations, completed = out["time"]["iterations"], out["requests"]["completed"]
print(json.dumps({
    "seconds": time.perf_counter() - start,
    "cpu_seconds": time.process_time() - cpu,
    "iterations": iterations,
    "requests": completed,
    "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    "load_before": load,
    "load_after": os.getloadavg()[0],
}))
"""


def run_size(requests: int, scheduler: str, lengths: str) -> dict:
    stream = "1" if requests >= STREAM_FROM else "0"
    completed = subprocess.run([sys.executable, "-c", CHILD, str(requests), scheduler, lengths, stream],
                               capture_output=True, text=True, check=True)
    return json.loads(completed.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="merge figures into this JSON file")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--scheduler", default="continuous", choices=["continuous", "chunked", "prefill-first", "static"])
    parser.add_argument("--lengths", default="fixed", choices=["fixed", "varied"])
    args = parser.parse_args()
    label = f"{args.scheduler}, {args.lengths} lengths"
    print(f"engine benchmark on {machine()['cpu_count']} CPUs ({label}; load average {os.getloadavg()[0]:.1f})")
    figures = []
    runs = {}
    for size in sorted(args.sizes):
        run = runs[size] = run_size(size, args.scheduler, args.lengths)
        streamed = " (streamed)" if size >= STREAM_FROM else ""
        name = f"{size:,} requests{streamed}"
        figures.append(report(f"{name}: wall time", run["seconds"], "s", "< 30 s for 10^6" if size == 10**6 else ""))
        figures.append(report(f"{name}: CPU time", run["cpu_seconds"], "s"))
        figures.append(report(f"{name}: simulated iterations/s (wall)", run["iterations"] / run["seconds"],
                              "iterations/s", ">= 100,000"))
        figures.append(report(f"{name}: simulated iterations/s (CPU)", run["iterations"] / run["cpu_seconds"],
                              "iterations/s"))
        figures.append(report(f"{name}: simulated requests/s (wall)", run["requests"] / run["seconds"], "requests/s"))
        figures.append(report(f"{name}: peak memory", run["max_rss_bytes"] / 1e6, "MB",
                              "<= 1,000 MB for 10^6" if size == 10**6 else ""))
        figures.append(report(f"{name}: load average before/after", run["load_after"], "",
                              f"before {run['load_before']:.1f}"))
    sizes = sorted(runs)
    for small, large in zip(sizes, sizes[1:]):
        for key, what in (("seconds", "wall"), ("cpu_seconds", "CPU")):
            ratio = runs[large][key] / runs[small][key]
            figures.append(report(f"{what} time ratio {large:,} / {small:,} requests", ratio, "x",
                                  f"<= {1.1 * large / small:.0f}x"))
    write_results(args.out, f"engine ({label})", figures)


if __name__ == "__main__":
    main()
