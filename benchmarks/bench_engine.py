"""Engine speed: simulated iterations and requests per second for a Poisson trace.

Run: python -m benchmarks.bench_engine [--out benchmarks/results.json] [--sizes 100000 1000000]
LLaMA-3-8B on one H100, continuous batching, Poisson arrivals at 10 requests/s (the
default request is 1920 prompt + 128 output tokens; capacity is ~11.7 requests/s, so the
server runs near capacity). Each size runs in its own process so peak memory (max RSS) is
that run's alone. Targets on 2 cores: >= 50,000 iterations/s; 10^6 requests in < 60 s;
10^5 -> 10^6 takes <= 11x the time; peak memory of the 10^6 run <= 2 GB.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from benchmarks.common import machine, report, write_results

CHILD = """
import json, resource, sys, time
from simulator.plan.run import run_from_options
options = dict(model="llama3-8b", gpu="h100", qps=10.0, requests=int(sys.argv[1]), scheduler="continuous", seed=1)
start = time.perf_counter()
result = run_from_options(options)
seconds = time.perf_counter() - start
print(json.dumps({
    "seconds": seconds,
    "iterations": result["time"]["iterations"],
    "requests": result["requests"]["completed"],
    "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
}))
"""


def run_size(requests: int) -> dict:
    completed = subprocess.run([sys.executable, "-c", CHILD, str(requests)], capture_output=True, text=True, check=True)
    return json.loads(completed.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", help="merge figures into this JSON file")
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    args = parser.parse_args()
    print(f"engine benchmark on {machine()['cpu_count']} CPUs")
    figures = []
    runs = {}
    for size in args.sizes:
        run = runs[size] = run_size(size)
        figures.append(report(f"{size:,} requests: wall time", run["seconds"], "s", "< 60 s for 10^6" if size == 10**6 else ""))
        figures.append(report(f"{size:,} requests: simulated iterations/s", run["iterations"] / run["seconds"], "iterations/s", ">= 50,000"))
        figures.append(report(f"{size:,} requests: simulated requests/s", run["requests"] / run["seconds"], "requests/s"))
        figures.append(report(f"{size:,} requests: peak memory", run["max_rss_bytes"] / 1e6, "MB", "<= 2,000 MB for 10^6" if size == 10**6 else ""))
    if len(args.sizes) >= 2:
        small, large = min(args.sizes), max(args.sizes)
        ratio = runs[large]["seconds"] / runs[small]["seconds"]
        figures.append(report(f"time ratio {large:,} / {small:,} requests", ratio, "x", f"<= {1.1 * large / small:.0f}x"))
    write_results(args.out, "engine", figures)


if __name__ == "__main__":
    main()
