"""A run in vLLM's words: the ``benchmark_serving`` result block and JSON, and engine launch commands.

So that a simulated run and a measured ``vllm bench serve`` / ``benchmark_serving.py`` run
can be diffed line by line: the same labels, the same layout (``{:<40} {:<10}``), the same
units (milliseconds for latencies) and the same JSON keys (``duration``, ``completed``,
``request_throughput``, ``mean_ttft_ms``, ``p99_tpot_ms``, ..., ``input_lens``, ``ttfts``).
Percentiles use numpy's linear interpolation, as vLLM does; ITL percentiles are over every
inter-token gap of every request, weighted by how many gaps each simulated sample stands for.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from simulator.cost.speculation import parse_method
from simulator.engine.metrics import DONE, completed_latencies, weighted_percentile
from simulator.errors import InputError

if TYPE_CHECKING:
    from simulator.plan.engine_run import EngineRun

METRICS = ("ttft", "tpot", "itl", "e2el")
TITLES = {
    "ttft": ("Time to First Token", "TTFT"),
    "tpot": ("Time per Output Token (excl. 1st token)", "TPOT"),
    "itl": ("Inter-token Latency", "ITL"),
    "e2el": ("End-to-end Latency", "E2EL"),
}


def parse_percentiles(text: str) -> list[float]:
    """'50,90,99' -> [50.0, 90.0, 99.0]; each in (0, 100]."""
    values = []
    for part in str(text).split(","):
        try:
            value = float(part)
        except ValueError:
            raise InputError(f"--metric-percentiles: cannot read {part.strip()!r}; give numbers like 50,90,99") from None
        if not (math.isfinite(value) and 0 < value <= 100):
            raise InputError(f"--metric-percentiles: {part.strip()} is not in (0, 100]")
        values.append(value)
    return values


def _label(p: float) -> str:
    return str(int(p)) if float(p).is_integer() else str(p)


def _stats_ms(run: "EngineRun", percentiles: list[float]) -> dict[str, dict[str, float]]:
    """{metric: {mean, median, std, p<P>...}} in milliseconds."""
    lat = completed_latencies(run.result)
    samples = {"ttft": lat.ttft_seconds, "tpot": lat.tpot_seconds[lat.multi_token], "e2el": lat.e2e_seconds}
    out: dict[str, dict[str, float]] = {}
    for name, values in samples.items():
        ms = np.asarray(values, dtype=float) * 1e3
        if len(ms) == 0:
            out[name] = {"mean": 0.0, "median": 0.0, "std": 0.0, **{f"p{_label(p)}": 0.0 for p in percentiles}}
            continue
        out[name] = {
            "mean": float(ms.mean()), "median": float(np.median(ms)), "std": float(ms.std()),
            **{f"p{_label(p)}": float(np.percentile(ms, p)) for p in percentiles},
        }
    seconds, weights = run.result.itl["seconds"], run.result.itl["weight"]
    keep = weights > 0
    seconds, weights = seconds[keep] * 1e3, weights[keep]
    if len(seconds):
        mean = float(np.sum(seconds * weights) / np.sum(weights))
        out["itl"] = {
            "mean": mean, "median": weighted_percentile(seconds, weights, 50),
            "std": float(math.sqrt(np.sum(weights * (seconds - mean) ** 2) / np.sum(weights))),
            **{f"p{_label(p)}": weighted_percentile(seconds, weights, p) for p in percentiles},
        }
    else:
        out["itl"] = {"mean": 0.0, "median": 0.0, "std": 0.0, **{f"p{_label(p)}": 0.0 for p in percentiles}}
    return out


def parse_metrics(text: str) -> list[str]:
    """vLLM's --percentile-metrics: 'ttft,tpot,itl' (its default) or any of ttft, tpot, itl, e2el."""
    names = [part.strip().lower() for part in str(text).split(",") if part.strip()]
    unknown = [name for name in names if name not in METRICS]
    if unknown or not names:
        raise InputError(f"--percentile-metrics: {', '.join(unknown) or 'nothing given'}; allowed: {', '.join(METRICS)}")
    return names


def vllm_result_block(run: "EngineRun", percentiles: list[float], metrics: tuple[str, ...] | list[str] = ("ttft", "tpot", "itl")) -> str:
    """The text vLLM's benchmark_serving prints after a run, for this simulated run."""
    m = run.metrics
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")]

    def row(label: str, value: Any) -> None:
        text = f"{value:<10.2f}" if isinstance(value, float) else f"{value:<10}"
        lines.append(f"{label:<40} {text}")

    row("Successful requests:", m.completed)
    row("Benchmark duration (s):", float(m.duration_seconds))
    row("Total input tokens:", m.input_tokens)
    row("Total generated tokens:", m.output_tokens)
    row("Request throughput (req/s):", float(m.requests_per_second))
    if any(v is not None for v in (run.settings.slo_ttft, run.settings.slo_tpot, run.settings.slo_e2e)):
        row("Request goodput (req/s):", float(m.goodput_requests_per_second))
    row("Output token throughput (tok/s):", float(m.output_tokens_per_second))
    row("Total Token throughput (tok/s):", float(m.total_tokens_per_second))
    stats = _stats_ms(run, percentiles)
    for name in METRICS:
        if name not in metrics:
            continue
        title, short = TITLES[name]
        lines.append("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        row(f"Mean {short} (ms):", stats[name]["mean"])
        row(f"Median {short} (ms):", stats[name]["median"])
        for p in percentiles:
            row(f"P{_label(p)} {short} (ms):", stats[name][f"p{_label(p)}"])
    lines.append("=" * 50)
    return "\n".join(line.rstrip() for line in lines)


def vllm_result_json(run: "EngineRun", percentiles: list[float]) -> dict[str, Any]:
    """The ``--save-result`` JSON of vLLM's benchmark_serving (its keys; latencies of requests in seconds)."""
    s, m, workload = run.settings, run.metrics, run.workload
    done = run.result.status == DONE
    lat = completed_latencies(run.result)
    data: dict[str, Any] = {
        "backend": "memwall-simulated",
        "engine_profile": s.engine or "vllm",
        "model_id": run.deployment.system.model.name,
        "gpu": run.deployment.system.gpu.name,
        "tensor_parallel_size": run.deployment.system.tp,
        "num_prompts": len(workload),
        "request_rate": "inf" if s.qps is None else s.qps,
        "burstiness": s.burstiness,
        "max_concurrency": None,
        "duration": m.duration_seconds,
        "completed": m.completed,
        "total_input_tokens": m.input_tokens,
        "total_output_tokens": m.output_tokens,
        "request_throughput": m.requests_per_second,
        "request_goodput": m.goodput_requests_per_second
        if any(v is not None for v in (s.slo_ttft, s.slo_tpot, s.slo_e2e)) else None,
        "output_throughput": m.output_tokens_per_second,
        "total_token_throughput": m.total_tokens_per_second,
        "input_lens": workload.prompt_tokens[done].tolist(),
        "output_lens": workload.output_tokens[done].tolist(),
        "ttfts": lat.ttft_seconds.tolist(),
        "errors": ["" for _ in range(int(done.sum()))],
    }
    for name, values in _stats_ms(run, percentiles).items():
        for stat, value in values.items():
            data[f"{stat}_{name}_ms"] = value
    return data


def _speculation(run: "EngineRun") -> tuple[str, str | None, int] | None:
    """(method, draft model or None, k) of a speculative run, else None."""
    s = run.settings
    if s.speculative is None:
        return None
    method, draft = parse_method(s.speculative)
    return method, draft, len(s.acceptance_rates)


def launch_command(run: "EngineRun", engine: str) -> str:
    """The command that starts one replica of this deployment on ``engine`` (vllm or sglang), with the scheduler
    settings simulated (prefix caching spelled out: both engines turn it on by default)."""
    system, config, s = run.deployment.system, run.config, run.settings
    model = system.model.name
    # An --attention variant is a what-if with no checkpoint to serve: say so rather than print a model that does not exist.
    note = f"# {model} is a what-if variant (--attention); serve a checkpoint with that attention\n" if s.attention else ""
    if engine == "vllm":
        # vLLM runs attention data-parallel as --data-parallel-size N with --enable-expert-parallel
        width = f"--tensor-parallel-size 1 --data-parallel-size {system.tp}" if system.dp_attention else \
            f"--tensor-parallel-size {system.tp}"
        parts = [f"vllm serve {model}", width, f"--max-num-seqs {config.max_num_seqs}"]
        if system.ep > 1:
            parts.append("--enable-expert-parallel")
        if config.max_batched_tokens is not None:
            parts.append(f"--max-num-batched-tokens {config.max_batched_tokens}")
        parts.append("--enable-chunked-prefill" if config.scheduler == "chunked" else "--no-enable-chunked-prefill")
        if run.deployment.pp > 1:
            parts.append(f"--pipeline-parallel-size {run.deployment.pp}")
        parts.append("--enable-prefix-caching" if config.prefix_caching else "--no-enable-prefix-caching")
        parts.append(f"--kv-cache-dtype {'fp8' if s.kv == 'fp8' else 'auto'}")
        if s.weights == "fp8":
            parts.append("--quantization fp8")
        parts += [f"--block-size {config.block_size}", f"--gpu-memory-utilization {s.gpu_memory_utilization:g}"]
        spec = _speculation(run)
        if spec is not None:
            method, draft, k = spec
            # vLLM's --speculative-config: method eagle/mtp take a head checkpoint; a draft model is named.
            target = f', "model": "{draft}"' if draft else ', "model": "<draft head checkpoint>"'
            parts.append(f"--speculative-config '{{\"method\": \"{'draft_model' if draft else method}\"{target}, "
                         f"\"num_speculative_tokens\": {k}}}'")
        return note + " \\\n    ".join(parts)
    if engine == "sglang":
        parts = [f"python -m sglang.launch_server --model-path {model}", f"--tp {system.tp}",
                 f"--max-running-requests {config.max_num_seqs}"]
        if system.ep > 1:
            parts.append(f"--ep-size {system.ep}")
        if system.dp_attention:
            parts.append(f"--enable-dp-attention --dp {system.tp}")
        if config.max_batched_tokens is not None:
            parts.append(f"--chunked-prefill-size {config.max_batched_tokens}")
        if config.scheduler == "chunked":
            # SGLang runs prefill batches alone unless told to mix decodes into them (the simulator's prefill-first).
            parts.append("--enable-mixed-chunk")
        if s.kv == "fp8":
            parts.append("--kv-cache-dtype fp8_e5m2")
        if s.weights == "fp8":
            parts.append("--quantization fp8")
        if run.deployment.pp > 1:
            parts.append(f"--pp-size {run.deployment.pp}")
        if not config.prefix_caching:
            parts.append("--disable-radix-cache")
        parts.append(f"--mem-fraction-static {s.gpu_memory_utilization:g}")
        spec = _speculation(run)
        if spec is not None:
            method, draft, k = spec
            algorithm = {"eagle": "EAGLE", "mtp": "EAGLE", "draft": "STANDALONE"}[method]  # SGLang runs MTP through EAGLE
            parts.append(f"--speculative-algorithm {algorithm} --speculative-num-steps {k} "
                         f"--speculative-num-draft-tokens {k + 1}"
                         + (f" --speculative-draft-model-path {draft}" if draft else ""))
        return note + " \\\n    ".join(parts)
    raise InputError(f"--launch-command: unknown engine {engine!r}; allowed: vllm, sglang")
