"""Derive vllm-v0.2's per-worker host work (``worker_rpc``) from vLLM PR #2221's before/after benchmark.

PR #2221 (vllm-project/vllm, "Use NCCL instead of ray for control-plane communication to remove
serialization overhead", January 2024) measured Llama-70B on 8x A100-40GB with the code before and
after it: 512 requests of 1,031 prompt and 317 output tokens, 2.48 -> 3.48 requests/s; ShareGPT,
3.01 -> 5.08 requests/s. Before it, the driver sent each worker its inputs by a Ray remote call.

This script replays both runs through the simulator with and without ``fixed + per_sequence x
sequences`` per worker per iteration (the ``vllm-v0`` profile with NCCL all-reduce, as the code
stood) and finds the pair whose time ratios match the measured ones (1.403 and 1.688). Ratios, not
rates, so the simulator's own error on those runs stays out of the figures.

    python validation/derivations/worker_rpc.py          # about a minute on two cores

It prints the ratios along the curve that matches the fixed-length run; where the ShareGPT ratio
crosses 1.688 is the shipped pair (configs/engines/vllm-v0.2.yaml).
"""

from __future__ import annotations

import csv
import random
import tempfile
from pathlib import Path

import yaml

from simulator import simulate

ROOT = Path(__file__).resolve().parents[2]
FIXED_RATIO = 3.48 / 2.48
SHAREGPT_RATIO = 5.08 / 3.01


def sharegpt_trace(folder: Path, requests: int = 1000) -> Path:
    """1,000 ShareGPT lengths at t = 0, filtered as vLLM's 2023 benchmark_throughput.py (4 <= prompt <= 1024, total <= 2048)."""
    with open(ROOT / "validation" / "lengths" / "sharegpt-vllm-lambda.csv") as f:
        lengths = [(int(r["input_tokens"]), int(r["output_tokens"])) for r in csv.DictReader(f)]
    lengths = [(i, o) for i, o in lengths if i >= 4 and o >= 4 and i <= 1024 and i + o <= 2048]
    rng = random.Random(0)
    path = folder / "sharegpt.csv"
    with open(path, "w") as f:
        f.write("arrival_seconds,prompt_tokens,output_tokens\n")
        for _ in range(requests):
            i, o = rng.choice(lengths)
            f.write(f"0,{i},{o}\n")
    return path


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        profile = yaml.safe_load(open(ROOT / "configs" / "engines" / "vllm-v0.yaml"))
        profile.update(name="vllm-pr2221", aliases=[], allreduce="nccl")
        trace = sharegpt_trace(folder)

        def requests_per_second(fixed: float, per_sequence: float, case: str) -> float:
            path = folder / f"engine-{fixed}-{per_sequence}.yaml"
            rpc = {"fixed_seconds": fixed, "per_sequence_seconds": per_sequence}
            yaml.safe_dump({**profile, "worker_rpc": rpc} if fixed or per_sequence else profile, open(path, "w"))
            if case == "fixed":
                result = simulate(model="llama2-70b", gpu="a100-40gb", tp=8, engine=str(path),
                                  input_len=1031, output_len=317, num_prompts=512)
            else:
                result = simulate(model="llama2-70b", gpu="a100-40gb", tp=8, engine=str(path), trace=str(trace))
            return result.to_dict()["throughput"]["requests_per_second"]

        base_fixed, base_sharegpt = requests_per_second(0, 0, "fixed"), requests_per_second(0, 0, "sharegpt")
        print(f"measured time ratios: fixed {FIXED_RATIO:.3f}, ShareGPT {SHAREGPT_RATIO:.3f}")
        for fixed in (1.0e-3, 1.5e-3, 2.0e-3, 2.5e-3):
            low, high = 0.0, 60e-6
            for _ in range(14):
                middle = (low + high) / 2
                if base_fixed / requests_per_second(fixed, middle, "fixed") < FIXED_RATIO:
                    low = middle
                else:
                    high = middle
            per_sequence = (low + high) / 2
            ratio = base_sharegpt / requests_per_second(fixed, per_sequence, "sharegpt")
            print(f"fixed {fixed * 1e3:.2f} ms, per sequence {per_sequence * 1e6:.1f} us: ShareGPT ratio {ratio:.3f}")


if __name__ == "__main__":
    main()
