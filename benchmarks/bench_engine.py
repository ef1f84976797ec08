"""Engine speed: a Poisson trace on LLaMA-3-8B / one H100 near capacity, 10^5 to 10^7 requests.

Run: python -m benchmarks.bench_engine [--out benchmarks/results.json] [--sizes 100000 1000000 [10000000]]
                                       [--scheduler continuous|chunked|prefill-first] [--lengths fixed|varied]
                                       [--kernels roofline|auto|measured|compare] [--ceilings end-to-end|kernels]

Poisson arrivals at 10 requests/s; the default request is 1920 prompt + 128 output tokens (``--lengths
varied``: uniform 1000-2840 and 64-192, the same means), ``--scheduler continuous`` (vLLM V0 style, no
token budget; capacity ~11.7 requests/s, so the server runs near capacity). Each size runs in its own
process, so peak memory (max RSS) is that run's alone; wall and CPU seconds cover planning, the engine,
the aggregates and the --json dict. Sizes of 10^7 and more stream their per-request records, iteration
log and inter-token gaps to a temporary folder (simulator.engine.records) instead of holding them.

Targets on 2 cores: 10^6 requests in < 30 s wall and <= 1 GB peak; >= 100,000 simulated iterations/s;
each tenfold size takes <= 11x the time. The default sizes (10^5, 10^6) take a few minutes at most.

``--kernels`` times the operators by the roofline (the default) or by AIConfigurator's measured tables
(``auto``/``measured``: the H100's vLLM 0.24 tables, which the ``measured`` extra installs); ``compare``
runs each size both ways and prints the ratio of the measured run's time to the roofline run's (issue 33:
<= 1.25x at 10^5 requests). The measured kernels change what is simulated (faster steps, smaller
batches, about 2.7x the iterations at 10^5 requests), so it also prints the ratio of the CPU time per
simulated iteration. ``--ceilings kernels`` gives both runs the roofline parameters fitted on measured GEMM
kernels (simulator.model.kernel_ceilings): the roofline run's steps then take about what the measured run's
do, so the two simulate nearly the same work (a like-for-like comparison of the engine's speed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from benchmarks.common import machine, report, write_results
from simulator.model.kernel_ceilings import CEILING_SOURCES, END_TO_END

STREAM_FROM = 10_000_000
"""Sizes from which the records stream to disk."""

CHILD = """
import json, os, resource, sys, tempfile, time
from simulator.plan.run import prepare, run_from_options
from simulator.engine.engine import simulate
from simulator.engine.metrics import aggregate
from simulator.plan.result import engine_run_dict
from simulator.cost.kernel_tables.source import source_of

n, scheduler, lengths, stream, kernels, ceilings = (int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] == "1",
                                                    sys.argv[5], sys.argv[6])
options = dict(model="llama3-8b", gpu="h100", qps=10.0, requests=n, scheduler=scheduler, seed=1, kernels=kernels,
               ceilings=ceilings)
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
    tables = source_of(system)
    source = tables.describe() if tables is not None else "roofline"
else:
    out = run_from_options(options)
    iterations, completed = out["time"]["iterations"], out["requests"]["completed"]
    source = out["kernels"]["source"]
print(json.dumps({
    "source": source,
    "seconds": time.perf_counter() - start,
    "cpu_seconds": time.process_time() - cpu,
    "iterations": iterations,
    "requests": completed,
    "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    "load_before": load,
    "load_after": os.getloadavg()[0],
}))
"""


def run_size(requests: int, scheduler: str, lengths: str, kernels: str = "roofline", ceilings: str = END_TO_END) -> dict:
    stream = "1" if requests >= STREAM_FROM else "0"
    completed = subprocess.run([sys.executable, "-c", CHILD, str(requests), scheduler, lengths, stream, kernels, ceilings],
                               capture_output=True, text=True, check=True)
    return json.loads(completed.stdout.strip().splitlines()[-1])


def size_figures(name: str, run: dict, size: int) -> list[dict]:
    return [
        report(f"{name}: wall time", run["seconds"], "s", "< 30 s for 10^6" if size == 10**6 else ""),
        report(f"{name}: CPU time", run["cpu_seconds"], "s"),
        report(f"{name}: simulated iterations/s (wall)", run["iterations"] / run["seconds"], "iterations/s",
               ">= 100,000"),
        report(f"{name}: simulated iterations/s (CPU)", run["iterations"] / run["cpu_seconds"], "iterations/s"),
        report(f"{name}: simulated requests/s (wall)", run["requests"] / run["seconds"], "requests/s"),
        report(f"{name}: peak memory", run["max_rss_bytes"] / 1e6, "MB", "<= 1,000 MB for 10^6" if size == 10**6 else ""),
        report(f"{name}: load average before/after", run["load_after"], "", f"before {run['load_before']:.1f}"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="merge figures into this JSON file")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--scheduler", default="continuous", choices=["continuous", "chunked", "prefill-first", "static"])
    parser.add_argument("--lengths", default="fixed", choices=["fixed", "varied"])
    parser.add_argument("--kernels", default="roofline", choices=["roofline", "auto", "measured", "compare"])
    parser.add_argument("--ceilings", default=END_TO_END, choices=CEILING_SOURCES)
    args = parser.parse_args()
    modes = ["roofline", "auto"] if args.kernels == "compare" else [args.kernels]
    label = f"{args.scheduler}, {args.lengths} lengths" + ("" if modes == ["roofline"] else f", kernels {args.kernels}")
    label += "" if args.ceilings == END_TO_END else f", ceilings {args.ceilings}"
    print(f"engine benchmark on {machine()['cpu_count']} CPUs ({label}; load average {os.getloadavg()[0]:.1f})")
    figures = []
    runs: dict[str, dict[int, dict]] = {mode: {} for mode in modes}
    for size in sorted(args.sizes):
        for mode in modes:
            run = runs[mode][size] = run_size(size, args.scheduler, args.lengths, mode, args.ceilings)
            streamed = " (streamed)" if size >= STREAM_FROM else ""
            name = f"{size:,} requests{streamed}" + ("" if len(modes) == 1 else f", {mode}")
            if mode != "roofline":
                print(f"  timed by: {run['source']}")
            figures += size_figures(name, run, size)
        if len(modes) == 2:
            measured, roofline = runs["auto"][size], runs["roofline"][size]
            for key, what in (("seconds", "wall"), ("cpu_seconds", "CPU")):
                figures.append(report(f"{size:,} requests: measured / roofline {what} time", measured[key] / roofline[key],
                                      "x", "<= 1.25x"))
            # The measured kernels change what is simulated (other step times, so other batches and another number
            # of iterations): the CPU time per simulated iteration separates the engine's speed from the workload's.
            per_iteration = [run["cpu_seconds"] / run["iterations"] for run in (measured, roofline)]
            figures.append(report(f"{size:,} requests: iterations simulated, measured / roofline",
                                  measured["iterations"] / roofline["iterations"], "x"))
            figures.append(report(f"{size:,} requests: CPU per iteration, measured / roofline",
                                  per_iteration[0] / per_iteration[1], "x"))
    for mode in modes:
        sizes = sorted(runs[mode])
        for small, large in zip(sizes, sizes[1:]):
            for key, what in (("seconds", "wall"), ("cpu_seconds", "CPU")):
                ratio = runs[mode][large][key] / runs[mode][small][key]
                suffix = "" if len(modes) == 1 else f", {mode}"
                figures.append(report(f"{what} time ratio {large:,} / {small:,} requests{suffix}", ratio, "x",
                                      f"<= {1.1 * large / small:.0f}x"))
    write_results(args.out, f"engine ({label})", figures)

if __name__ == "__main__":
    main()
