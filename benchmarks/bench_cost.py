"""Cost-model speed: analytic step evaluations per second, one at a time and vectorised.

Run: python benchmarks/bench_cost.py [--out benchmarks/results.json]
Targets on a 2-core machine: >= 20,000 single evaluations/s, >= 200,000 vectorised evaluations/s.
"""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks.common import best_seconds, machine, report, write_results
from simulator.cost.system import System
from simulator.model import Precision, load_gpu, load_model
from simulator.model.step import Step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", help="merge figures into this JSON file")
    args = parser.parse_args()
    print(f"cost model benchmark on {machine()['cpu_count']} CPUs")
    system = System(load_model("llama2-70b"), load_gpu("a100"), Precision(), tp=4)

    n_single = 5_000
    # Batch 64, a different context each call, as consecutive decode ticks are: the operators that
    # read only the token count come from System.step_totals' memo, attention is computed.
    singles = [Step.decode(64.0, 4096.0 + i) for i in range(n_single)]
    seconds = best_seconds(lambda: [system.step_seconds(step) for step in singles], repeats=3)
    figures = [report("single decode step (llama2-70b, tp4, batch 64) evals/s", n_single / seconds, "evals/s", ">= 20,000")]

    def cold() -> None:
        for step in singles:
            system.totals_memo.clear()
            system.step_seconds(step)

    seconds = best_seconds(cold, repeats=3)
    figures.append(report("  same, memo cleared before every call (cold) evals/s", n_single / seconds, "evals/s", ">= 20,000"))
    seconds = best_seconds(lambda: [system.step_cost(step) for step in singles[:1000]], repeats=3)
    figures.append(report("  same, full per-operator StepCost (step_cost) evals/s", 1000 / seconds, "evals/s"))

    n_vector = 100_000
    rng = np.random.default_rng(0)
    batches = rng.integers(1, 257, n_vector).astype(float)
    contexts = rng.integers(128, 4097, n_vector).astype(float)
    many = Step.decode(batches, contexts)
    seconds = best_seconds(lambda: system.step_seconds(many), repeats=3)
    figures.append(report("vectorised decode steps (10^5 per call) evals/s", n_vector / seconds, "evals/s", ">= 200,000"))
    write_results(args.out, "cost_model", figures)


if __name__ == "__main__":
    main()
