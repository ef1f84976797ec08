"""Profiles of today's engine releases (issue 33 item 6): vLLM V1 0.11-0.13 and 0.14-0.24, SGLang 0.5, TensorRT-LLM 1.x.

Every number asserted here is the engine's own default as its source gives it (quoted beside each), not the
simulator's output: the profile must reproduce the source.
"""

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from simulator.cli import main
from simulator.model import load_gpu
from simulator.model.engine_profile import SchedulerDefaults, load_engine_profile
from simulator.plan.deployment_planner import engine_from_options

NEW_PROFILES = ("vllm-v0.11", "vllm-v0.14", "sglang-v0.5", "trtllm")


@pytest.mark.parametrize("name", NEW_PROFILES)
def test_each_release_profile_loads(name):
    assert load_engine_profile(name).name == name


@pytest.mark.parametrize(("alias", "name"), [
    ("vllm-0.11", "vllm-v0.11"), ("vllm-0.13", "vllm-v0.11"),
    ("vllm-0.14", "vllm-v0.14"), ("vllm-0.24", "vllm-v0.14"),
    ("sglang-0.5", "sglang-v0.5"), ("trtllm-1.3", "trtllm"),
])
def test_releases_are_found_by_version(alias, name):
    assert load_engine_profile(alias).name == name


def _defaults(engine, gpu):
    profile = engine_from_options({"engine": engine, "gpu": gpu})
    return profile.scheduler.max_num_seqs, profile.scheduler.max_batched_tokens, profile.graphs.max_batch


# vllm/engine/arg_utils.py, EngineArgs._set_default_args (0.11) / get_batch_defaults (later), `vllm serve`
# (UsageContext.OPENAI_API_SERVER):
#     if device_memory >= 70 * GiB_bytes and "a100" not in device_name:
#         default_max_num_batched_tokens = {..., UsageContext.OPENAI_API_SERVER: 8192}
#         default_max_num_seqs = {..., UsageContext.OPENAI_API_SERVER: 1024}
#     else:
#         default_max_num_batched_tokens = {..., UsageContext.OPENAI_API_SERVER: 2048}
#         default_max_num_seqs = {..., UsageContext.OPENAI_API_SERVER: 256}
# CUDA graphs: max_cudagraph_capture_size = min(max_num_seqs * 2, 512) -> 512 on both (vllm/config/vllm.py).
@pytest.mark.parametrize("engine", ["vllm-v0.11", "vllm-v0.14"])
@pytest.mark.parametrize(("gpu", "expected"), [
    ("h100", (1024, 8192, 512)),    # H100 80 GB: 81,559 MiB >= 70 GiB, not an A100
    ("h200", (1024, 8192, 512)),
    ("l4", (256, 2048, 512)),       # L4 24 GB: below 70 GiB
    ("a100", (256, 2048, 512)),     # A100 80 GB: "a100" in the device name (PR #17885)
])
def test_vllm_batch_defaults_by_gpu_memory(engine, gpu, expected):
    assert _defaults(engine, gpu) == expected


def test_vllm_async_scheduling_from_0_14():
    # vllm/config/scheduler.py (0.11): `async_scheduling: bool = False`; vLLM v0.14.0 release notes: "Async
    # scheduling is now enabled by default" (PR #27614): the scheduler runs one step ahead of the GPU.
    assert load_engine_profile("vllm-v0.11").cpu.overlap == 0.0
    assert load_engine_profile("vllm-v0.14").cpu.overlap == 1.0


def test_vllm_chunked_prefill_and_mixed_graphs():
    # "V1 uses chunked prefills and prefix caching by default" (_set_default_args); cudagraph_mode
    # FULL_AND_PIECEWISE replays mixed prefill/decode steps piecewise.
    for name in ("vllm-v0.11", "vllm-v0.14"):
        profile = load_engine_profile(name)
        assert profile.scheduler.kind == "chunked"
        assert profile.graphs.mixed


# sglang/srt/server_args.py, ServerArgs._handle_gpu_memory_settings(gpu_mem), gpu_mem in MiB, TP < 4:
#     gpu_mem < 35 * 1024:  chunked_prefill_size = 2048;  cuda_graph_max_bs = 24
#     gpu_mem < 60 * 1024:  chunked_prefill_size = 4096;  cuda_graph_max_bs = 32
#     gpu_mem < 90 * 1024:  chunked_prefill_size = 8192;  cuda_graph_max_bs = 256   # H100, A100
#     gpu_mem < 160 * 1024: chunked_prefill_size = 8192;  cuda_graph_max_bs = 256   # H20, H200
#     else:                 chunked_prefill_size = 16384; cuda_graph_max_bs = 512   # B200, MI300
# max_running_requests: min(max(tokens / context_len * 512, 2048), 4096) -> 2048 with a KV pool under 4 contexts.
@pytest.mark.parametrize(("gpu", "expected"), [
    ("l4", (2048, 2048, 24)),       # 23,034 MiB
    ("l40s", (2048, 4096, 32)),     # 46,068 MiB
    ("a100-sxm4-40gb", (2048, 4096, 32)),
    ("h100", (2048, 8192, 256)),    # 81,559 MiB
    ("a100", (2048, 8192, 256)),    # 81,920 MiB: SGLang has no A100 exception
    ("h200", (2048, 8192, 256)),    # 143,771 MiB
    ("b200", (2048, 16384, 512)),   # 183,359 MiB
    ("mi300x", (2048, 16384, 512)),
])
def test_sglang_defaults_by_gpu_memory(gpu, expected):
    assert _defaults("sglang-v0.5", gpu) == expected


def test_sglang_tier_bounds_are_sglang_mib_thresholds():
    # `gpu_mem < 20 * 1024` (MiB): one MiB under 20 GiB is the smallest tier (cuda_graph_max_bs 8), 20 GiB is not.
    profile = load_engine_profile("sglang-v0.5")
    assert profile.for_gpu("T4", 20 * 2**30 - 2**20).graphs.max_batch == 8
    assert profile.for_gpu("T4", 20 * 2**30).graphs.max_batch == 24
    assert profile.for_gpu("X", 160 * 2**30).scheduler.max_batched_tokens == 16384


def test_sglang_overlap_scheduler_and_decode_graphs():
    # ServerArgs: disable_overlap_schedule = False; enable_piecewise_cuda_graph = False (decode-only graphs).
    profile = load_engine_profile("sglang-v0.5")
    assert profile.cpu.overlap == 1.0
    assert not profile.graphs.mixed


# tensorrt_llm/llmapi/llm_args.py (1.x): BaseLlmArgs.max_batch_size = Field(default=2048), max_num_tokens =
# Field(default=8192); TorchLlmArgs.disable_overlap_scheduler = Field(default=False); CudaGraphConfig: "If neither
# is provided, a default max_batch_size of 128 is used" (decode-only graphs). The same on every GPU.
@pytest.mark.parametrize("gpu", ["h100", "l4", "b200"])
def test_trtllm_1x_defaults(gpu):
    assert _defaults("trtllm-1.3", gpu) == (2048, 8192, 128)
    profile = load_engine_profile("trtllm-1.3")
    assert profile.cpu.overlap == 1.0 and not profile.graphs.mixed


def test_gpu_memory_tiers_must_ascend_and_not_mix_with_large_gpu():
    with pytest.raises(ValidationError, match="strictly increasing"):
        SchedulerDefaults(by_gpu_memory=[{"below_hbm_bytes": 2e10}, {"below_hbm_bytes": 1e10}])
    with pytest.raises(ValidationError, match="not both"):
        SchedulerDefaults(by_gpu_memory=[{"below_hbm_bytes": 2e10}],
                          large_gpu={"min_hbm_bytes": 7e10, "max_num_seqs": 1024})


def test_gpu_without_a_tier_keeps_the_profile():
    h100 = load_gpu("h100")
    trt = load_engine_profile("trtllm")
    assert trt.for_gpu(h100.name, h100.hbm_bytes) == trt


@pytest.mark.parametrize("engine", ["vllm-v0.11", "vllm-v0.14", "sglang-v0.5", "trtllm-1.3"])
def test_simulate_runs_with_each_release(engine):
    result = CliRunner().invoke(main, ["--model", "llama3-8b", "--gpu", "h100", "--engine", engine,
                                       "--qps", "2", "--requests", "50"])
    assert result.exit_code == 0, result.output
