"""Scheduler defaults that depend on the GPU (vLLM's get_batch_defaults for `vllm serve`)."""

import pytest

from simulator.model import load_gpu
from simulator.model.engine_profile import load_engine_profile
from simulator.plan.deployment_planner import engine_from_options


@pytest.mark.parametrize(("gpu", "seqs", "budget"), [
    ("h100", 1024, 8192),    # 80 GB >= 70 GiB (75,161,927,680 bytes)
    ("mi300x", 1024, 8192),  # 192 GB
    ("a100", 256, 2048),     # 80 GB, but A100 is excluded (vLLM PR #17885)
    ("l40s", 256, 2048),     # 48 GB < 70 GiB
])
def test_vllm_picks_larger_batches_on_large_gpus_other_than_a100(gpu, seqs, budget):
    scheduler = engine_from_options({"engine": "vllm", "gpu": gpu}).scheduler
    assert (scheduler.max_num_seqs, scheduler.max_batched_tokens) == (seqs, budget)


def test_engines_without_a_large_gpu_rule_keep_their_defaults():
    h100 = load_gpu("h100")
    trt = load_engine_profile("trtllm")
    assert trt.for_gpu(h100.name, h100.hbm_bytes) == trt
    # the threshold is 70 GiB exactly: one byte below keeps the ordinary defaults
    vllm = load_engine_profile("vllm")
    assert vllm.for_gpu("H100", 70 * 2**30 - 1).scheduler.max_num_seqs == 256
    assert vllm.for_gpu("H100", 70 * 2**30).scheduler.max_num_seqs == 1024
