"""Which engine profile, scheduler and attention kernel replay a validation row, chosen by the engine and its release."""

from __future__ import annotations

import re
from typing import Any

from simulator.errors import InputError
from simulator.model.engine_profile import load_engine_profile
from simulator.model.gpu_family import _gpu

# Engines without a shipped profile -> the closest one (the row's notes say so).
# lmdeploy's TurboMind is a C++ server with host overhead like TensorRT-LLM's C++ executor;
# TGI and DeepSpeed-FastGen batch continuously from a Python/Rust scheduler like vLLM.
ENGINE_PROFILE_FOR: dict[str, str] = {
    "vllm": "vllm", "sglang": "sglang", "trtllm": "trtllm", "ideal": "ideal", "llamacpp": "llamacpp",
    "lmdeploy": "trtllm-v0", "tgi": "vllm", "deepspeed-fastgen": "vllm",
}


PROFILE_BY_VERSION_WORDS: dict[str, tuple[tuple[tuple[str, ...], str, str], ...]] = {
    "trtllm": ((("harness", "NIM"), "trtllm-v0", "TensorRT engines, C++ executor"),),
    "lmdeploy": ((("PyTorch engine",), "vllm", "a Python engine"),),
}
"""engine -> ((words of the version cell, profile, what it is), ...): a version cell naming a deployment or
backend picks its profile whatever the release. NVIDIA's MLPerf harness and NIM run TensorRT engines with the
C++ executor whatever their date; LMDeploy's PyTorch engine (``--backend pytorch``) batches from a Python loop,
unlike its C++ TurboMind."""


DEFAULT_PROFILE = "vllm"


# Releases whose scheduler is the V0 kind (prefill iterations of their own, no chunked prefill,
# a synchronous Python loop): vLLM before 0.8, where V1 became the default engine (vLLM 0.8.0
# release notes, March 2025), without CUDA graphs before 0.2.6 (PR #1926; vllm-v0.2.yaml), with
# output processing overlapping the next step from 0.6.0 (the asynchronous output processor,
# vllm-project/vllm PR #7049; vllm-v0.6.yaml); TGI before 3.0, which introduced prefill chunking
# (TGI v3.0.0 release notes, December 2024: "chunking"), and without CUDA graphs before 2.0 (TGI
# PR #1703 made them the default; tgi-v1.yaml, tgi-v2.yaml); TensorRT-LLM before 1.0, whose
# executor was C++ (1.0 made the PyTorch backend and its Python executor the default; trtllm-v0.yaml).
# engine -> ((first version NOT replayed with this profile, profile, what it is), ...), oldest first.
OLDER_SCHEDULER_BEFORE: dict[str, tuple[tuple[tuple[int, ...], str, str], ...]] = {
    "vllm": (((0, 2, 6), "vllm-v0.2", "no CUDA graphs, NCCL all-reduce, no chunked prefill, synchronous loop"),
             ((0, 6), "vllm-v0", "no chunked prefill, synchronous loop"),
             ((0, 8), "vllm-v0.6", "no chunked prefill, synchronous loop but output processing overlapped")),
    "tgi": (((2, 0), "tgi-v1", "no CUDA graphs, NCCL all-reduce, no chunked prefill, synchronous loop"),
            ((3, 0), "tgi-v2", "CUDA graphs up to 32 sequences, NCCL all-reduce, no chunked prefill, synchronous loop")),
    "trtllm": (((1, 0), "trtllm-v0", "the C++ executor"),),
}


# Releases whose decode attention kernel is not the profile's: TensorRT-LLM before 0.8 decodes GQA models with
# its masked MHA kernel, one thread block per query head (XQA, which groups the query heads of a K/V head,
# "will be included in the v0.8 releases": TensorRT-LLM blog "New XQA-kernel provides 2.4x more Llama-70B
# throughput within the same latency budget", January 2024; simulator.model.layers, ``per-head``).
# engine -> ((first version NOT replayed with this kernel, kernel, what it is), ...), oldest first.
ATTENTION_KERNEL_BEFORE: dict[str, tuple[tuple[tuple[int, ...], str, str], ...]] = {
    "trtllm": (((0, 8), "per-head", "masked MHA decode, one thread block per query head, no XQA"),),
}


def release(version: str) -> tuple[int, ...] | None:
    """The leading dotted number of an ``engine_version`` cell ('0.7.3 (ROCm 6.3.1)' -> (0, 7, 3)); None if none."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", version)
    return tuple(int(part) for part in match.group(1).split(".")) if match else None


def older_release(table: dict[str, tuple[tuple[tuple[int, ...], str, str], ...]], engine: str,
                  stated: tuple[int, ...] | None) -> tuple[tuple[int, ...], str, str] | None:
    """The first entry of ``table`` (:data:`OLDER_SCHEDULER_BEFORE`, :data:`ATTENTION_KERNEL_BEFORE`) whose release
    comes after ``engine``'s ``stated`` one: (first version not concerned, what applies, why); None if none or
    the release is not stated."""
    if stated is None:
        return None
    return next((entry for entry in table.get(engine, ()) if stated < entry[0]), None)


def deployment_profile(engine: str, version: str) -> tuple[str, str] | None:
    """(profile, note) where the version cell names a deployment or backend (:data:`PROFILE_BY_VERSION_WORDS`);
    None where it does not."""
    for words, named, what in PROFILE_BY_VERSION_WORDS.get(engine, ()):
        if any(word in version for word in words):
            return named, f"engine {engine} ({version}) simulated with the {named} profile ({what})"
    return None


def engine_profile(engine: str, version: str = "") -> tuple[str, str]:
    """(profile name, note) for a row's engine and version: its own profile, or the closest one with a note.

    A stated release older than :data:`OLDER_SCHEDULER_BEFORE` gives the V0-style profile; an
    unstated version keeps the engine's current one.
    """
    profile = ENGINE_PROFILE_FOR.get(engine, DEFAULT_PROFILE)
    named = deployment_profile(engine, version)
    if named is not None:
        return named
    stated = release(version)
    entry = older_release(OLDER_SCHEDULER_BEFORE, engine, stated)
    if entry is not None and stated is not None:
        first_new, older, what = entry
        return older, f"engine {engine} {'.'.join(map(str, stated))} simulated with the {older} profile " \
                      f"(before {'.'.join(map(str, first_new))}: {what})"
    if profile == engine:
        return profile, ""
    return profile, f"engine {engine} simulated with the {profile} profile"


def _profile_scheduler(profile: str, gpu: str | None = None) -> Any:
    """The engine profile's scheduler defaults on ``gpu`` (kind, max_num_seqs, max_batched_tokens, block_size), or None."""
    try:
        engine = load_engine_profile(profile)
        if gpu is not None:
            spec = _gpu(gpu)
            engine = engine.for_gpu(spec.name, spec.hbm_bytes)
        return engine.scheduler
    except InputError:
        return None


V0_ENGINE_PROFILE = "vllm-v0.6"
"""The profile of a vLLM row of 0.8 or later that runs the V0 engine: it states --num-scheduler-steps (V1 has no
multi-step scheduling), or its version cell names the V0 engine (:data:`V0_ENGINE_WORDS`)."""


V0_ENGINE_WORDS = "V0 engine"
"""Words of a vLLM version cell of 0.8 or later whose source ran (or is read as having run) the V0 engine, which
0.8.x still ships behind ``VLLM_USE_V1=0``; the row's notes say why."""
