"""Replica speed: the engine benchmark's workload over R replicas behind a router.

Run: python -m benchmarks.bench_replicas [--out benchmarks/results.json] [--requests 1000000] [--replicas 16]
                                         [--compare 100000] [--cosimulated 20000]

LLaMA-3-8B on H100s, 1920 + 128-token requests, Poisson arrivals at 10 requests/s per replica (R x 10 in
all), so each replica runs as loaded as the single server of ``bench_engine``. Round-robin (the default
router) splits the stream up front and runs each replica alone; the state-aware routers
(``least_outstanding``, ``least_kv``) co-simulate every replica in one simpy environment
(simulator.engine.cluster), which costs more per request.

Figures: the ``--requests`` run over ``--replicas`` replicas (target < 45 s for 10^6 over 16); the CPU
time per request at ``--compare`` requests over 1 and over ``--replicas`` replicas (target: nearly equal);
the same for the least-outstanding router at ``--cosimulated`` requests. Each run is its own process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from benchmarks.common import machine, report, write_results

CHILD = """
import json, os, resource, sys, time
from simulator.plan.run import run_from_options

n, replicas, router = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
options = dict(model="llama3-8b", gpu="h100", qps=10.0 * replicas, requests=n, scheduler="continuous", seed=1,
               replicas=replicas, router=router)
load = os.getloadavg()[0]
start, cpu = time.perf_counter(), time.process_time()
out = run_from_options(options)
print(json.dumps({
    "seconds": time.perf_counter() - start,
    "cpu_seconds": time.process_time() - cpu,
    "iterations": out["time"]["iterations"],
    "requests": out["requests"]["completed"],
    "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    "load": (load + os.getloadavg()[0]) / 2,
}))
"""


def run(requests: int, replicas: int, router: str) -> dict:
    completed = subprocess.run([sys.executable, "-c", CHILD, str(requests), str(replicas), router],
                               capture_output=True, text=True, check=True)
    return json.loads(completed.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="merge figures into this JSON file")
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--replicas", type=int, default=16)
    parser.add_argument("--compare", type=int, default=100_000, help="requests of the 1-vs-R cost comparison")
    parser.add_argument("--cosimulated", type=int, default=20_000, help="requests of the least-outstanding runs (0: skip)")
    args = parser.parse_args()
    r = args.replicas
    print(f"replica benchmark on {machine()['cpu_count']} CPUs (load average {os.getloadavg()[0]:.1f})")
    figures = []
    big = run(args.requests, r, "round_robin")
    name = f"{args.requests:,} requests over {r} replicas (round robin)"
    figures.append(report(f"{name}: wall time", big["seconds"], "s", "< 45 s for 10^6 over 16"))
    figures.append(report(f"{name}: CPU time", big["cpu_seconds"], "s"))
    figures.append(report(f"{name}: peak memory", big["max_rss_bytes"] / 1e6, "MB"))
    figures.append(report(f"{name}: simulated iterations/s (wall)", big["iterations"] / big["seconds"], "iterations/s"))
    figures.append(report(f"{name}: load average during the run", big["load"], ""))
    for router, size in (("round_robin", args.compare), ("least_outstanding", args.cosimulated)):
        if not size:
            continue
        one, many = run(size, 1, router), run(size, r, router)
        per_one = one["cpu_seconds"] / size * 1e6
        per_many = many["cpu_seconds"] / size * 1e6
        figures.append(report(f"{size:,} requests, {router}: CPU us/request, 1 replica", per_one, "us"))
        figures.append(report(f"{size:,} requests, {router}: CPU us/request, {r} replicas", per_many, "us"))
        figures.append(report(f"{size:,} requests, {router}: ratio {r} / 1 replicas", per_many / per_one, "x",
                              "~1 (nearly independent of replicas)" if router == "round_robin" else ""))
    write_results(args.out, "replicas", figures)


if __name__ == "__main__":
    main()
