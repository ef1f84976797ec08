"""Derive sglang's host time per kernel launch (``graphs.eager_launch_seconds``) from SGLang PR #1401.

sgl-project/sglang PR #1401 ("Support cuda graph in the triton attention backend", September 2024,
SGLang 0.3.1) timed ``python3 -m sglang.bench_latency --model meta-llama/Meta-Llama-3-8B
--batch-size 1 --input 128 --output 8`` with and without ``--disable-cuda-graph``, for the triton
and the flashinfer attention backends; "Decode. median latency", seconds per decode step:

    triton      with CUDA graphs 0.00706   without 0.00928
    flashinfer  with CUDA graphs 0.00735   without 0.00823

The GPU is not stated. It is taken as an H100 SXM: one decode step reads Llama-3-8B's 16 GB of
weights, which takes 7.9 ms at an A100's full 2.04 TB/s, longer than the 7.06 ms measured with
graphs, and 4.8 ms at an H100's 3.35 TB/s.

SGLang replays decode batches from CUDA graphs and runs everything else (prefill batches, decode
batches above ``cuda_graph_max_bs``) eagerly: each kernel then waits for Python to launch it, and
where that host work is longer than the kernels it sets the step's time
(simulator.cost.step_cost: the GPU waits ``max(0, host - kernels)``). The runs without graphs are
eager decode steps; this script replays them through the simulator with the ``sglang`` profile
made eager (``--enforce-eager``, as ``--disable-cuda-graph``) and solves for the host seconds per
launch that reproduce each. Their median is the shipped value (configs/engines/sglang.yaml). The
runs with graphs, which no launch cost enters, are checks of the GPU assumed.

The simulator counts one attention kernel per layer for either backend (triton's decode kernel
runs in two stages, flashinfer's in one or two): the two solutions differ by that and by each
backend's own Python, and their median stands for SGLang's eager path.

The source is not in validation/published.csv: the value is fitted on it, so its rows would be
scored in sample. The table's SGLang rows (the SGLang cookbook, DataCrunch, the attention-backend
benchmark, LMSYS and the B200 sweep) are independent of it.

    python validation/derivations/sglang_host_launch.py     # about a minute on two cores
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from launch_solver import profile_with_launch, solve_launch

from simulator import simulate

MODEL, GPU = "llama3-8b", "h100"
PROMPT_TOKENS, OUTPUT_TOKENS = 128, 8
EAGER_SECONDS_PER_STEP = {"triton": 9.28e-3, "flashinfer": 8.23e-3}
GRAPH_SECONDS_PER_STEP = {"triton": 7.06e-3, "flashinfer": 7.35e-3}


def decode_step_seconds(folder: Path, launch_seconds: float, eager: bool) -> float:
    """The replayed request's mean time per output token after the first (bench_latency's decode step)."""
    result = simulate(model=MODEL, gpu=GPU, engine=profile_with_launch(folder, "sglang", launch_seconds), batch=1,
                      input_len=PROMPT_TOKENS, output_len=OUTPUT_TOKENS, enforce_eager=eager).to_dict()
    return result["latency"]["tpot_seconds"]["mean"]


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        kernels_only = decode_step_seconds(folder, 0.0, eager=True)
        print(f"{MODEL} on {GPU}, batch 1, {PROMPT_TOKENS} in / {OUTPUT_TOKENS} out: "
              f"replayed decode step, kernels alone {kernels_only * 1e3:.2f} ms")
        solved = []
        for backend, measured in EAGER_SECONDS_PER_STEP.items():
            launch = solve_launch(lambda x: decode_step_seconds(folder, x, eager=True), measured)
            solved.append(launch)
            print(f"  {backend:10s} without CUDA graphs: measured {measured * 1e3:.2f} ms per step; "
                  f"{launch * 1e6:.1f} us per launch reproduces it")
        value = round(statistics.median(solved), 7)
        print(f"median over {len(solved)} runs: {value * 1e6:.1f} us per launch")
        print("checks (runs with CUDA graphs: no launch cost enters):")
        graphed = decode_step_seconds(folder, value, eager=False)
        for backend, measured in GRAPH_SECONDS_PER_STEP.items():
            print(f"  {backend:10s} with CUDA graphs: measured {measured * 1e3:.2f} ms per step, replayed "
                  f"{graphed * 1e3:.2f} ms ({100 * (graphed / measured - 1):+.0f}%)")


if __name__ == "__main__":
    main()
