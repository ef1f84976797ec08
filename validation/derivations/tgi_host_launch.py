"""Derive tgi-v1's host time per kernel launch (``graphs.eager_launch_seconds``) from TGI issue #1315.

huggingface/text-generation-inference issue #1315 ("Tensor Parallelism on TGI", December 2023)
timed TGI 1.2 serving codellama/CodeLlama-34b-Instruct-hf (fp16) on Kubernetes, one request at a
time, each generating about 100 tokens, with 1, 2 and 4 shards (``--num-shard``) on A100-80GB
and H100 GPUs; latency per token in ms, average over the requests:

    A100-80G  1: 46.79   2: 29.39   4: 32.06
    H100      1: 27.98   2: 28.02   4: 31.77

Two shards of an H100 read their weights in 10 ms per token at full bandwidth, and take 28 ms,
as long as one H100 (20 ms of reads) and as two A100s (16.5 ms): the GPU does not set the pace.
TGI 1.x runs no CUDA graphs (PR #1428 brought them in 1.4, PR #1703 made them the default in 2.0),
so every kernel of a decode step waits for the shard's Python to launch it; where that host
work is longer than the kernels it is the step's time (simulator.cost.step_cost: the GPU waits
``max(0, host - kernels)``). This script replays each configuration through the simulator with
the ``tgi-v1`` profile and solves for the host seconds per launch that reproduce it, on the
configurations whose kernels alone (no launch cost) explain under 70% of the measured time,
i.e. where the measurement says something about the host. Their median is the shipped value
(configs/engines/tgi-v1.yaml). The one-shard runs, bound by the GPU, are checks.

The source is not in validation/published.csv: the value is fitted on it, so its rows would be
scored in sample. The table's TGI 1.x rows (Hugging Face's SageMaker campaign, TGI 1.0.3, and
PR #1243's prefills) are independent of it.

    python validation/derivations/tgi_host_launch.py     # about a minute on two cores

Checks, not fitted: TGI issue #1129 (TGI 1.1.0, the same author, Llama-2-70B-chat on a
p4de.24xlarge, 8x A100-80GB, one request at a time) gives 39.35 ms per token on 4 GPUs (256-token
prompts, 64 tokens out) and 44.55 ms on 8 (512 in, 512 out); the script replays both at the
derived value.

The prompt length is not stated; 100 tokens is assumed (one prefill step among ~100 decode steps:
it moves the per-token figure by about 1%). The per-token latency is taken as the request's time
over its generated tokens (TGI's ``x-time-per-token`` header: inference time / tokens).
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

from launch_solver import profile_with_launch, solve_launch

from simulator import simulate

PROMPT_TOKENS = 100
OUTPUT_TOKENS = 100
MEASURED_SECONDS_PER_TOKEN = {
    ("a100-80gb", 1): 46.79e-3, ("a100-80gb", 2): 29.39e-3, ("a100-80gb", 4): 32.06e-3,
    ("h100", 1): 27.98e-3, ("h100", 2): 28.02e-3, ("h100", 4): 31.77e-3,
}
CHECKS = {  # TGI issue #1129, Llama-2-70B-chat on 8x A100-80GB: (tp, prompt, output) -> seconds per token
    (4, 256, 64): 39.35e-3, (8, 512, 512): 44.55e-3,
}
HOST_BOUND = 0.70
"""A configuration informs the host cost when its kernels alone explain less than this share of the measured time."""


def seconds_per_token(folder: Path, gpu: str, tp: int, launch_seconds: float, model: str = "codellama-34b",
                      prompt: int = PROMPT_TOKENS, output: int = OUTPUT_TOKENS) -> float:
    """The replayed request's time over its generated tokens, with ``launch_seconds`` of host time per kernel."""
    result = simulate(model=model, gpu=gpu, tp=tp, engine=profile_with_launch(folder, "tgi-v1", launch_seconds),
                      batch=1, input_len=prompt, output_len=output).to_dict()
    return result["latency"]["e2e_seconds"]["mean"] / output


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        solved = []
        for (gpu, tp), measured in MEASURED_SECONDS_PER_TOKEN.items():
            kernels_only = seconds_per_token(folder, gpu, tp, 0.0)
            line = f"{gpu:10s} tp {tp}: measured {measured * 1e3:6.2f} ms/token, kernels alone {kernels_only * 1e3:6.2f} ms"
            if kernels_only < HOST_BOUND * measured:
                launch = solve_launch(lambda x: seconds_per_token(folder, gpu, tp, x), measured)
                solved.append(launch)
                line += f"; host-bound: {launch * 1e6:.1f} us per launch reproduces it"
            print(line)
        value = statistics.median(solved)
        print(f"median over {len(solved)} host-bound configurations: {value * 1e6:.1f} us per launch")
        for (gpu, tp), measured in MEASURED_SECONDS_PER_TOKEN.items():
            predicted = seconds_per_token(folder, gpu, tp, round(value, 7))
            print(f"  at {round(value, 7) * 1e6:.1f} us: {gpu:10s} tp {tp}: {predicted * 1e3:6.2f} ms/token "
                  f"({100 * (predicted / measured - 1):+.0f}%)")
        print("checks (TGI issue #1129, Llama-2-70B-chat on A100-80GB, not fitted):")
        for (tp, prompt, output), measured in CHECKS.items():
            predicted = seconds_per_token(folder, "a100-80gb", tp, round(value, 7), "llama2-70b", prompt, output)
            print(f"  tp {tp}, {prompt} in / {output} out: measured {measured * 1e3:.2f} ms/token, replayed "
                  f"{predicted * 1e3:.2f} ms ({100 * (predicted / measured - 1):+.0f}%)")


if __name__ == "__main__":
    main()
