"""Closed-loop clients at fixed concurrency, and the client path of every workload.

Published serving benchmarks mostly run a closed loop: ``vllm bench serve --max-concurrency N
--num-prompts P`` (and ``sglang.bench_serving``, genai-perf's ``--concurrency``) keep N requests
in flight; each client sends its next request as soon as its last one has finished. genai-perf's
``--warmup-request-count W`` sends W requests first that are not scored.

:func:`closed_loop` builds such a workload: W + P requests of the given lengths whose send times
are not known in advance. The engine (:class:`simulator.engine.engine.Engine`) sends the first N at
t = 0 and the next one, in order, whenever a request finishes (as the client sees it: after its
last chunk); :func:`scored` then drops the W warm-up requests from the result.

Real clients drift apart: a deterministic replay of N identical requests would keep them in
lockstep, every wave's prefills batched together. What makes them drift is the time each request
spends on the client path (HTTP, tokenisation, hand-off), which varies from request to request;
:func:`with_client_path` draws it per request (:mod:`simulator.cost.client_path`: the profile's
mean times a lognormal factor of its coefficient of variation) from the run's seed, so a run is
reproducible and its waves come apart as the real ones do.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from simulator.cost.client_path import jitter, request_seconds, response_seconds
from simulator.engine.engine_result import EngineResult
from simulator.engine.workload import MAX_LENGTH, LengthSpec, Workload, check_request_count
from simulator.errors import InputError
from simulator.model.engine_profile import ClientPath

__all__ = ["closed_loop", "scored", "with_client_path"]


def closed_loop(concurrency: int, requests: int, warmup: int, prompt: LengthSpec | np.ndarray,
                output: LengthSpec | np.ndarray, seed: int = 0, max_tokens: int = MAX_LENGTH) -> Workload:
    """``warmup`` + ``requests`` requests sent by ``concurrency`` clients, each when its previous one finishes.

    A length given as an array is taken in order (a trace's requests, their arrival times ignored), repeated
    when it holds fewer than ``warmup + requests``."""
    if concurrency < 1:
        raise InputError(f"--max-concurrency: must be >= 1 clients (got {concurrency})")
    if warmup < 0:
        raise InputError(f"--warmup-requests: must be >= 0 (got {warmup})")
    n = requests + warmup
    check_request_count(n, "--num-prompts/--warmup-requests")
    # The same streams as the other workloads (workload._generators): lengths do not move with the concurrency.
    _, prompts_seed, outputs_seed = np.random.SeedSequence(seed).spawn(3)
    def lengths(spec: LengthSpec | np.ndarray, seed_seq: np.random.SeedSequence) -> tuple[np.ndarray, str]:
        if isinstance(spec, LengthSpec):
            return spec.sample(n, np.random.default_rng(seed_seq), max_tokens), spec.describe()
        if not len(spec):
            raise InputError("--trace: the trace has no requests to take lengths from")
        return np.resize(np.asarray(spec, dtype=np.int64), n), f"from the trace ({len(spec)} requests)"

    prompts, prompt_text = lengths(prompt, prompts_seed)
    outputs, output_text = lengths(output, outputs_seed)
    warm = f" after {warmup} warm-up request{'' if warmup == 1 else 's'}" if warmup else ""
    return Workload(
        arrival_seconds=np.zeros(n),  # filled in by the engine as the clients send
        prompt_tokens=prompts,
        output_tokens=outputs,
        kind="closed-loop",
        description=(f"closed loop of {concurrency} client{'' if concurrency == 1 else 's'}: {requests} requests{warm}, "
                     f"each sent when one finishes, prompt {prompt_text}, output {output_text} tokens"),
        concurrency=concurrency,
        warmup=warmup,
    )


def with_client_path(workload: Workload, client: ClientPath, seed: int = 0) -> Workload:
    """``workload`` with each request's client-path seconds drawn (mean from the profile, lognormal jitter)."""
    if client.is_zero:
        return workload
    # A stream of its own (the fourth child of the run's seed): the client path moves no arrival or length.
    rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(4)[3])
    seconds = request_seconds(client, workload.prompt_tokens) * jitter(len(workload), client.jitter_cv, rng)
    return replace(workload, client_seconds=seconds, response_seconds=response_seconds(client))


def scored(result: EngineResult) -> EngineResult:
    """``result`` without the closed loop's warm-up requests (the first ``workload.warmup``); unchanged otherwise.

    Per-request arrays and the workload are cut; the run's totals, iteration log and inter-token gaps
    still cover the whole run, warm-up included (the engine keeps them per iteration, not per request).
    """
    warmup = result.workload.warmup
    if not warmup:
        return result
    keep = slice(warmup, None)
    workload = result.workload
    cut = replace(workload, arrival_seconds=workload.arrival_seconds[keep], prompt_tokens=workload.prompt_tokens[keep],
                  output_tokens=workload.output_tokens[keep], warmup=0,
                  client_seconds=None if workload.client_seconds is None else workload.client_seconds[keep],
                  prefix_id=None if workload.prefix_id is None else workload.prefix_id[keep],
                  prefix_tokens=None if workload.prefix_tokens is None else workload.prefix_tokens[keep])
    extra = dict(result.extra)
    if "replica" in extra:
        extra["replica"] = extra["replica"][keep]
    out = replace(result, workload=cut, status=result.status[keep], reject_reason=result.reject_reason[keep],
                  first_scheduled=result.first_scheduled[keep], first_token=result.first_token[keep],
                  finish=result.finish[keep], preemptions=result.preemptions[keep],
                  waited_for_kv=None if result.waited_for_kv is None else result.waited_for_kv[keep], extra=extra)
    if "replicas" in extra and len(extra["replicas"]) == 1:
        extra["replicas"] = [out]
    return out
