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
    # The scored requests: a closed loop's warm-up requests are not in the result's per-request arrays, and
    # vLLM's benchmark leaves them out of num_prompts and the per-request lists too.
    s, m, workload = run.settings, run.metrics, run.result.workload
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
        "max_concurrency": s.max_concurrency,
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


ENGINES = ("vllm", "sglang")

# Where the printed commands listen: worker i of a kind on BASE + i, the router in front on ROUTER_PORT. Ports only
# need to differ on one host; on several hosts, replace localhost with each worker's address.
VLLM_WORKER_PORT, VLLM_PREFILL_PORT, VLLM_DECODE_PORT = 8000, 8100, 8200
SGLANG_WORKER_PORT, SGLANG_PREFILL_PORT, SGLANG_DECODE_PORT = 30010, 30100, 30200
NIXL_SIDE_CHANNEL_PORT = 5600  # vLLM's default VLLM_NIXL_SIDE_CHANNEL_PORT; each worker on a host needs its own
SGLANG_BOOTSTRAP_PORT = 8998  # SGLang's default --disaggregation-bootstrap-port; one per prefill worker on a host
ROUTER_PORT = 30000

# The simulated router's policy in the routers' words (vllm-router and sglang_router take the same names); the
# two load-aware policies have no exact match: power_of_two (the less loaded of two random workers) is nearest;
# cache_aware keeps a prefix tree per worker and balances load, as --router prefix does.
ROUTER_POLICIES = {"round_robin": "round_robin", "least_outstanding": "power_of_two", "least_kv": "power_of_two",
                   "prefix": "cache_aware"}


def served_model(model: Any) -> tuple[str, str]:
    """(the checkpoint to serve, a comment line to print before the commands or ''): the model's Hugging Face id,
    else its config name with a comment saying no id is known."""
    if model.hf_id:
        return model.hf_id, ""
    return model.name, (f"# no Hugging Face id is known for {model.name} (its config has no hf_id): "
                        "replace it with the checkpoint to serve\n")


def _draft_id(draft: str) -> str:
    """A draft model's Hugging Face id when it is a shipped model that has one, else the name given."""
    from simulator.model import load_model

    try:
        return load_model(draft).hf_id or draft
    except InputError:
        return draft


def _vllm_args(system: Any, pp: int, config: Any, s: Any) -> list[str]:
    """``vllm serve``'s flags for one replica of ``system`` (the model and port are the caller's)."""
    # vLLM runs attention data-parallel as --data-parallel-size N with --enable-expert-parallel
    width = f"--tensor-parallel-size 1 --data-parallel-size {system.tp}" if system.dp_attention else \
        f"--tensor-parallel-size {system.tp}"
    parts = [width, f"--max-num-seqs {config.max_num_seqs}"]
    if system.ep > 1:
        parts.append("--enable-expert-parallel")
    if config.max_batched_tokens is not None:
        parts.append(f"--max-num-batched-tokens {config.max_batched_tokens}")
    parts.append("--enable-chunked-prefill" if config.scheduler == "chunked" else "--no-enable-chunked-prefill")
    if pp > 1:
        parts.append(f"--pipeline-parallel-size {pp}")
    parts.append("--enable-prefix-caching" if config.prefix_caching else "--no-enable-prefix-caching")
    parts.append(f"--kv-cache-dtype {'fp8' if s.kv == 'fp8' else 'auto'}")
    if s.weights == "fp8":
        parts.append("--quantization fp8")
    parts += [f"--block-size {config.block_size}", f"--gpu-memory-utilization {s.gpu_memory_utilization:g}"]
    spec = _speculation_of(s)
    if spec is not None:
        method, draft, k = spec
        # vLLM's --speculative-config: method eagle/mtp take a head checkpoint; a draft model is named.
        target = f', "model": "{_draft_id(draft)}"' if draft else ', "model": "<draft head checkpoint>"'
        parts.append(f"--speculative-config '{{\"method\": \"{'draft_model' if draft else method}\"{target}, "
                     f"\"num_speculative_tokens\": {k}}}'")
    return parts


def _sglang_args(system: Any, pp: int, config: Any, s: Any) -> list[str]:
    """``sglang.launch_server``'s flags for one replica of ``system`` (the model and port are the caller's)."""
    parts = [f"--tp {system.tp}", f"--max-running-requests {config.max_num_seqs}"]
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
    if pp > 1:
        parts.append(f"--pp-size {pp}")
    if not config.prefix_caching:
        parts.append("--disable-radix-cache")
    parts.append(f"--mem-fraction-static {s.gpu_memory_utilization:g}")
    spec = _speculation_of(s)
    if spec is not None:
        method, draft, k = spec
        algorithm = {"eagle": "EAGLE", "mtp": "EAGLE", "draft": "STANDALONE"}[method]  # SGLang runs MTP through EAGLE
        parts.append(f"--speculative-algorithm {algorithm} --speculative-num-steps {k} "
                     f"--speculative-num-draft-tokens {k + 1}"
                     + (f" --speculative-draft-model-path {_draft_id(draft)}" if draft else ""))
    return parts


def _speculation_of(s: Any) -> tuple[str, str | None, int] | None:
    """(method, draft model or None, k) of speculative settings, else None."""
    if s.speculative is None:
        return None
    method, draft = parse_method(s.speculative)
    return method, draft, len(s.acceptance_rates)


def _join(parts: list[str]) -> str:
    return " \\\n    ".join(parts)


class _Gpus:
    """Hands out CUDA_VISIBLE_DEVICES ranges to the workers when they all fit one node (else each worker has a
    host of its own and takes its GPUs from 0)."""

    def __init__(self, total: int, per_node: int) -> None:
        self.one_node, self.next = total <= per_node, 0

    def hosts_note(self) -> str:
        """A first comment line when the workers need more than one node."""
        return "" if self.one_node else "# more GPUs than one node has: run each worker on its own host and " \
            "replace localhost with its address\n"

    def take(self, count: int) -> str:
        if not self.one_node:
            return ""
        first, self.next = self.next, self.next + count
        return f"CUDA_VISIBLE_DEVICES={','.join(str(i) for i in range(first, first + count))} "


def _worker(engine: str, served: str, args: list[str], port: int, prefix: str = "") -> list[str]:
    if engine == "vllm":
        return [f"{prefix}vllm serve {served} --port {port}", *args]
    return [f"{prefix}python -m sglang.launch_server --model-path {served} --port {port}", *args]


def _replicated_commands(run: "EngineRun", engine: str, served: str) -> str:
    """``replicas`` colocated workers and the router in front of them (the simulated policy)."""
    dep, config, s = run.deployment, run.config, run.settings
    system, replicas = dep.system, s.replicas
    gpus = _Gpus(replicas * dep.gpus, system.gpu.max_gpus_per_node)
    args = _vllm_args(system, dep.pp, config, s) if engine == "vllm" else _sglang_args(system, dep.pp, config, s)
    base = VLLM_WORKER_PORT if engine == "vllm" else SGLANG_WORKER_PORT
    blocks = []
    for index in range(replicas):
        blocks.append(f"# replica {index + 1} of {replicas} ({dep.gpus} GPU{'s' if dep.gpus > 1 else ''})\n"
                      + _join(_worker(engine, served, args, base + index, gpus.take(dep.gpus))))
    policy = ROUTER_POLICIES[s.router]
    urls = " ".join(f"http://localhost:{base + index}" for index in range(replicas))
    note = "" if policy == s.router else f"; the simulated {s.router} router's nearest policy is {policy}"
    router = (f"vllm-router --policy {policy} --worker-urls {urls} --port {ROUTER_PORT}" if engine == "vllm" else
              f"python -m sglang_router.launch_router --policy {policy} --worker-urls {urls} --port {ROUTER_PORT}")
    install = "pip install vllm-router" if engine == "vllm" else "pip install sglang-router"
    blocks.append(f"# router in front of the {replicas} replicas ({install}){note}\n{router}")
    return gpus.hosts_note() + "\n\n".join(blocks)


def kv_transfer_flags(engine: str, role: str) -> list[str]:
    """A disaggregated ``role`` worker's KV-transfer flags (vLLM: NixlConnector as kv_producer for prefill, kv_consumer
    for decode; SGLang: --disaggregation-mode), each as the command line writes it."""
    if engine == "vllm":
        kv_role = "kv_producer" if role == "prefill" else "kv_consumer"
        return [f"--kv-transfer-config '{{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"{kv_role}\"}}'"]
    return [f"--disaggregation-mode {role}"]


def _disaggregated_commands(run: "EngineRun", engine: str, served: str) -> str:
    """Every command of a ``--disaggregate P:D`` deployment: P prefill and D decode workers, each told its role and
    the KV transfer (vLLM: NixlConnector with kv_producer / kv_consumer; SGLang: --disaggregation-mode), and the
    router that sends each request to a prefill worker and then a decode worker."""
    prefill, decode = run.result.extra["pools"]
    s = run.settings
    pools = ((prefill, "prefill"), (decode, "decode"))
    per_node = min(pool.deployment.system.gpu.max_gpus_per_node for pool, _ in pools)
    gpus = _Gpus(prefill.gpus + decode.gpus, per_node)
    blocks: list[str] = []
    urls: dict[str, list[str]] = {"prefill": [], "decode": []}
    side_channel = NIXL_SIDE_CHANNEL_PORT
    for pool, role in pools:
        dep = pool.deployment
        config = run.config
        if engine == "vllm":
            args = [*_vllm_args(dep.system, dep.pp, config, s), *kv_transfer_flags(engine, role)]
            base = VLLM_PREFILL_PORT if role == "prefill" else VLLM_DECODE_PORT
        else:
            args = [*_sglang_args(dep.system, dep.pp, config, s), *kv_transfer_flags(engine, role)]
            base = SGLANG_PREFILL_PORT if role == "prefill" else SGLANG_DECODE_PORT
        for index in range(pool.replicas):
            port = base + index
            prefix = gpus.take(dep.gpus)
            worker_args = list(args)
            if engine == "vllm":
                prefix += f"VLLM_NIXL_SIDE_CHANNEL_PORT={side_channel} "
                side_channel += 1
                urls[role].append(f"--{role} http://localhost:{port}")
            elif role == "prefill":
                worker_args.append(f"--disaggregation-bootstrap-port {SGLANG_BOOTSTRAP_PORT + index}")
                urls[role].append(f"--prefill http://localhost:{port} {SGLANG_BOOTSTRAP_PORT + index}")
            else:
                urls[role].append(f"--decode http://localhost:{port}")
            blocks.append(f"# {role} worker {index + 1} of {pool.replicas} ({dep.gpus} GPU{'s' if dep.gpus > 1 else ''} "
                          f"of {dep.system.gpu.name})\n" + _join(_worker(engine, served, worker_args, port, prefix)))
    routes = [*urls["prefill"], *urls["decode"]]
    if engine == "vllm":
        router = _join([f"vllm-router --policy round_robin --vllm-pd-disaggregation --port {ROUTER_PORT}", *routes])
        install = "pip install vllm-router"
    else:
        router = _join([f"python -m sglang_router.launch_router --pd-disaggregation --port {ROUTER_PORT}", *routes])
        install = "pip install sglang-router"
    blocks.append(f"# router: each request to a prefill worker, then its KV and the request to a decode worker ({install})"
                  f"\n{router}")
    return gpus.hosts_note() + "\n\n".join(blocks)


def launch_command(run: "EngineRun", engine: str) -> str:
    """The commands that start this deployment on ``engine`` (vllm or sglang), with the scheduler settings simulated
    (prefix caching spelled out: both engines turn it on by default): one server for one replica; for several
    replicas or disaggregated prefill/decode pools, every worker and the router in front of them."""
    if engine not in ENGINES:
        raise InputError(f"--launch-command: unknown engine {engine!r}; allowed: {', '.join(ENGINES)}")
    system, config, s = run.deployment.system, run.config, run.settings
    served, unknown = served_model(system.model)
    # An --attention variant is a what-if with no checkpoint to serve: say so rather than print a model that does not exist.
    note = (f"# {system.model.name} is a what-if variant (--attention); serve a checkpoint with that attention\n"
            if s.attention else "") + unknown
    if run.result.extra.get("pools") is not None:
        return note + _disaggregated_commands(run, engine, served)
    if s.replicas > 1:
        return note + _replicated_commands(run, engine, served)
    if engine == "vllm":
        return note + _join([f"vllm serve {served}", *_vllm_args(system, run.deployment.pp, config, s)])
    return note + _join([f"python -m sglang.launch_server --model-path {served}",
                         *_sglang_args(system, run.deployment.pp, config, s)])
