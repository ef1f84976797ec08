"""The settings of one run: one pydantic model shared by the Python API, the CLI and scenario files.

Every value that enters a run is checked here, once: its type, that it is finite, its range
and its allowed values. A problem is an :class:`InputError` whose first words say where the
value came from (``--batch`` on the command line, ``base.batch`` in a scenario, ``batch`` in
the API) and then what is wrong and what is allowed.

Field names are the main command's long options with underscores (``--attention-kernel`` is
``attention_kernel``). Units: seconds, tokens, requests, requests per second; fractions in
(0, 1]. Each field's ``description`` is the CLI help text, so the two cannot drift apart.

vLLM's benchmark spellings are accepted as aliases with one meaning each (see
:data:`VLLM_ALIASES`): ``input_len`` -> ``prompt_tokens``, ``output_len`` ->
``output_tokens``, ``num_prompts`` -> ``requests``, ``request_rate`` -> ``qps`` (``inf``: all
requests at t = 0, a closed batch), ``max_num_batched_tokens`` -> ``max_batched_tokens``,
``tensor_parallel_size`` -> ``tp``, ``kv_cache_dtype`` -> ``kv`` (``auto`` keeps the default,
``fp8_e4m3``/``fp8_e5m2`` are ``fp8``), ``enable_chunked_prefill`` -> ``scheduler: chunked``,
``enable_prefix_caching`` -> ``prefix_caching``,
``goodput`` (``ttft:MS tpot:MS e2el:MS``, milliseconds) -> ``slo_ttft``/``slo_tpot``/``slo_e2e``
(seconds).

Why this module is over 600 lines: DESIGN.md asks for one settings model in which every value is
checked once; its field groups (deployment, shape, serving, speculative, disaggregation) are the
classes here, each small, and the error wording they share is in this module's helpers.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Callable, Literal, TypeVar

import pydantic
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from simulator.cost.speculation import MAX_SPECULATIVE_TOKENS, parse_acceptance, parse_method
from simulator.engine.datasets import read_dataset
from simulator.engine.kv_offload import parse_offload
from simulator.engine.scheduler import SCHEDULERS
from simulator.engine.workload import MAX_REQUESTS, parse_length_spec
from simulator.errors import InputError
from simulator.model.operators import ATTENTION_KERNELS, FUSIONS, AttentionKernel, Fusion
from simulator.model.precision import KV_DTYPES, parse_precision

# Bounds that keep every run finite and within a machine's memory; each is far beyond any
# real deployment, so a value outside is a typo or a fuzzer, never a plan.
MAX_BATCH = 1 << 20
MAX_CONTEXT_TOKENS = 1 << 24
MAX_KV_BLOCKS = 1 << 40
MAX_SECONDS = 1e6
MAX_QPS = 1e7
"""Highest arrival rate a run takes, requests/s."""


def _reject_bool(value: Any) -> Any:
    # YAML and JSON spell true as a number in some tools; a flag is never a count.
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {value!r}")
    return value


def _integral(value: Any) -> Any:
    value = _reject_bool(value)
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise ValueError(f"expected an integer, got {value!r}")
        return int(value)
    return value


Int = Annotated[int, BeforeValidator(_integral)]
Float = Annotated[float, BeforeValidator(_reject_bool), Field(allow_inf_nan=False)]


def _checked_by(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """An after-validator running ``check``; its InputError becomes the field's error message."""

    def run(value: Any) -> Any:
        if value is None:
            return value
        try:
            check(value)
        except InputError as exc:
            raise ValueError(re.sub(r"^--[\w-]+: ", "", str(exc))) from None
        return value

    return run


def _length_spec(value: Any) -> str:
    text = str(_integral(value)).strip()
    _checked_by(lambda spec: parse_length_spec(spec, "--spec"))(text)
    return text


def _weights(value: str) -> str:
    parse_precision(value, "fp16", 128)
    return value


_ATTENTION = re.compile(r"^(mha|mqa|gqa:\d+)$")


def _attention(value: str) -> str:
    text = value.strip().lower()
    if not _ATTENTION.match(text):
        raise InputError(f"unknown variant '{value}'; allowed: mha, mqa, gqa:N")
    return text


def _name(value: str) -> str:
    if not value.strip():
        raise InputError("must not be empty")
    return value


LengthSpecText = Annotated[str, BeforeValidator(_length_spec)]


class DeploymentSettings(BaseModel):
    """What runs where: model, GPU, precision, parallelism, kernels and efficiency overrides."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: Annotated[str, AfterValidator(_checked_by(_name))] = Field(
        description="Shipped model name (see `simulate models`), a model YAML, or a HuggingFace config.json.",
        json_schema_extra={"flags": ["--model", "-m"], "metavar": "NAME|PATH"},
    )
    gpu: Annotated[str, AfterValidator(_checked_by(_name))] = Field(
        description="Shipped GPU name or alias (see `simulate gpus`), or a GPU YAML (e.g. a measured overlay).",
        json_schema_extra={"flags": ["--gpu", "-g"], "metavar": "NAME|PATH"},
    )
    weights: Annotated[str | None, AfterValidator(_checked_by(_weights))] = Field(
        default=None,
        description="Weight format: fp32, fp16, bf16, fp8, int8, int4, fp4, mxfp4, or per module (bf16,mlp=fp8). "
        "int8/int4 are weight-only (fp16 compute); fp8/fp4 compute on their tensor cores where the GPU has them. "
        "[default: the checkpoint's quantization_config, else fp16]",
        json_schema_extra={"metavar": "FORMAT"},
    )
    kv: Literal["fp16", "bf16", "fp8", "int8"] = Field(
        default="fp16", description="KV-cache dtype.",
    )
    group_size: Annotated[Int, Field(ge=1, le=1 << 20)] = Field(default=128, description="Weights per fp16 scale for int8/int4.")
    attention: Annotated[str | None, AfterValidator(_checked_by(_attention))] = Field(
        default=None, description="Turn the model into its MHA, MQA or GQA-N variant.",
        json_schema_extra={"metavar": "mha|mqa|gqa:N"},
    )
    tp: Annotated[Int | None, Field(ge=1, le=1024)] = Field(
        default=None, description="Tensor-parallel degree. Default: smallest power of two that fits.",
        json_schema_extra={"flags": ["--tp", "-tp", "--tensor-parallel-size"]},
    )
    attention_kernel: AttentionKernel | None = Field(
        default=None, description="flash keeps scores in SRAM; naive writes the score matrix to HBM; per-head is "
        "flash for prefill and, for decode, one thread block per query head, so each head of a GQA group repeats the "
        "group's K/V work (TensorRT-LLM's masked MHA, before XQA in 0.8). Default: the "
        "engine profile's (flash; naive for llama.cpp, whose 2024 builds run without -fa by default).",
    )
    fusion: Fusion | None = Field(
        default=None, description="Operator fusion: none, kernels (norms, rotary and activation as kernels of their "
        "own, the residual add inside the norm: vLLM, SGLang, TGI), elementwise (into GEMMs: TensorRT-LLM), full "
        "(also the attention block). Default: the engine profile's.",
    )
    compute_efficiency: Annotated[Float | None, Field(ge=1e-3, le=1.0)] = Field(
        default=None, description="Override the GPU's achievable fraction of peak FLOP/s, in [0.001, 1].",
    )
    memory_efficiency: Annotated[Float | None, Field(ge=1e-3, le=1.0)] = Field(
        default=None, description="Override the GPU's achievable fraction of HBM bandwidth, in [0.001, 1].",
    )
    expert_efficiency: Annotated[Float | None, Field(ge=1e-3, le=1.0)] = Field(
        default=None, description="Override the fraction of the compute and memory efficiencies that a mixture-of-"
        "experts model's routed-expert GEMMs reach, in [0.001, 1] (default: the GPU's, 1 unless calibrated).",
    )
    kernel_overlap: Annotated[Float | None, Field(ge=0.0, le=1.0)] = Field(
        default=None, description="Override the fraction of a kernel's shorter time (its real rows' MMAs or its "
        "loads) hidden under the longer, in [0, 1]: 0 runs them in series (the GPU's default under the shape "
        "kernel model), 1 is the roofline's max. The flat kernel model always takes the max.",
    )
    link_efficiency: Annotated[Float | None, Field(ge=1e-3, le=1.0)] = Field(
        default=None, description="Override the achievable fraction of interconnect bandwidth, in [0.001, 1].",
    )
    launch_overhead: Annotated[Float | None, Field(ge=0.0, le=1e-2)] = Field(
        default=None, description="Override the fixed cost per kernel, in seconds (0 to 0.01).",
    )
    engine: Annotated[str | None, AfterValidator(_checked_by(_name))] = Field(
        default=None, description="Serving-engine profile: vllm, sglang, trtllm, llamacpp, ideal (no overhead); `simulate engines` lists every one; or a profile YAML. [default: vllm]",
        json_schema_extra={"metavar": "NAME|PATH"},
    )
    pp: Annotated[Int | None, Field(ge=1, le=256)] = Field(
        default=None,
        description="Pipeline-parallel stages, each a tensor-parallel group of --tp GPUs. Default: 1, or with --tp "
        "left out the fewest stages that fit once TP fills a node.",
        json_schema_extra={"flags": ["--pp", "--pipeline-parallel-size"]},
    )
    ep: Annotated[Int | None, Field(ge=1, le=1024)] = Field(
        default=None, description="Expert-parallel degree for mixture-of-experts models (experts split over GPUs).",
    )
    dp_attention: bool = Field(
        default=False,
        description="Attention data-parallel over the --tp GPUs (MoE models): each GPU runs attention with all heads "
        "for 1/tp of the sequences and holds only their KV cache; the MoE layers see every token, experts split "
        "(--ep tp) or sliced (--ep 1) over the same GPUs (SGLang's --enable-dp-attention, TensorRT-LLM's "
        "enable_attention_dp; DeepSeek's MLA cache is then not replicated).",
    )
    routing_skew: Annotated[Float, Field(ge=0.0, le=10.0)] = Field(
        default=0.0, description="MoE routing skew: Zipf-like exponent of expert popularity (0 = uniform routing).",
    )
    enforce_eager: bool = Field(
        default=False, description="Run decode without CUDA graphs (every kernel pays its launch), as vLLM's --enforce-eager.",
        json_schema_extra={"flag": True},
    )
    num_scheduler_steps: Annotated[Int, Field(ge=1, le=256)] = Field(
        default=1, description="Decode steps per scheduler pass (vLLM 0.6-0.7's multi-step scheduling, "
        "--num-scheduler-steps): a decode-only iteration pays 1/N of the engine's host work.",
    )
    sampling: bool = Field(
        default=False, description="Requests sample their next token (temperature, top-k/top-p; TGI's do_sample) "
        "instead of taking the argmax; engines that sample one sequence at a time from Python (TGI) pay more "
        "host time per sequence. Default: greedy, as vLLM's and TGI's benchmarks.",
        json_schema_extra={"flag": True},
    )
    collectives: Literal["auto", "nccl", "ring", "tree", "one-shot", "two-shot", "off"] = Field(
        default="auto", description="All-reduce algorithm: auto picks as the engines do (custom one-/two-shot for small messages, NCCL otherwise); off makes collectives free (pure roofline).",
    )
    kernel_efficiency: Literal["shape", "flat"] = Field(
        default="shape", description="GEMM efficiency from tile and wave quantisation of each shape (shape) or one flat factor per GPU (flat).",
    )
    kernels: Literal["auto", "measured", "roofline"] = Field(
        default="roofline", description="What times each operator: measured (kernel latencies measured on this GPU "
        "under this engine, from NVIDIA AIConfigurator's database: pip install 'memwall[measured]'; an error where "
        "none exist), roofline (the roofline model for every operator), or auto (measured where tables exist, "
        "else roofline). Operators no table measures are always timed by the roofline; the report says which.",
    )
    ceilings: Literal["end-to-end", "kernels"] = Field(
        default="end-to-end", description="Where the roofline's GEMM ceilings come from: end-to-end (the GPU "
        "config's, fitted on the validation table's whole runs, so they also hold what the time model misses) or "
        "kernels (fitted on NVIDIA's measured GEMM kernels only: validation/kernel_ceilings.json, "
        "docs/kernel-accuracy.md; what the kernels alone take). --compute-efficiency and friends override either.",
    )
    kernel_table: Annotated[str | None, AfterValidator(_checked_by(_name))] = Field(
        default=None, description="A memwall kernel-table file (what simulate calibrate --kernel-table-out writes: "
        "measured GEMM latencies of this GPU) that times the operators it covers, in place of --kernels.",
    )


class ShapeSettings(BaseModel):
    """The size of the closed batch the deployment is planned for: sequences and tokens each reaches."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    batch: Annotated[Int, Field(ge=1, le=MAX_BATCH)] = Field(
        default=1, description="Sequences in the closed batch (all present at t=0).",
        json_schema_extra={"flags": ["--batch", "-b"]},
    )
    ctx: Annotated[Int, Field(ge=2, le=MAX_CONTEXT_TOKENS)] = Field(
        default=2048, description="Context tokens each sequence reaches at the end (prompt + generated).",
        json_schema_extra={"flags": ["--ctx", "-c"]},
    )
    gen: Annotated[Int, Field(ge=1, le=MAX_CONTEXT_TOKENS)] = Field(
        default=128, description="Output tokens per sequence (prompt = ctx - gen).",
    )

    @model_validator(mode="after")
    def _gen_within_ctx(self) -> "ShapeSettings":
        if self.gen >= self.ctx:
            raise ValueError(f"gen: {self.gen} output tokens leave no prompt within ctx {self.ctx}; gen must be < ctx")
        return self


class StepSettings(ShapeSettings, DeploymentSettings):
    """A deployment and the batch shape of one step (``simulate layers``, ``explain``, ``roofline``)."""


def _offload(value: str) -> str:
    """--kv-offload: readable by simulator.engine.kv_offload.parse_offload."""
    parse_offload(value)
    return value.strip()


class ServingSettings(BaseModel):
    """The serving workload, the scheduler, the KV cache and the objectives of an engine run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests: Annotated[Int | None, Field(ge=1, le=MAX_REQUESTS)] = Field(
        default=None, description="Requests to simulate (with --trace alone: its first N, at most the trace's). "
        "[default: 1000 with --qps, the trace's with --trace, else --batch]",
        json_schema_extra={"flags": ["--requests", "--num-prompts"]},
    )
    qps: Annotated[Float | None, Field(ge=1e-6, le=MAX_QPS)] = Field(
        default=None, description="Open-loop arrivals at this many requests/s (else a closed batch at t=0).",

    )
    arrival: Literal["poisson", "gamma"] = Field(default="poisson", description="Inter-arrival distribution with --qps.")
    burstiness: Annotated[Float, Field(ge=1e-3, le=1e3)] = Field(
        default=1.0,
        description="Gamma arrivals: shape of the gamma distribution of gaps, as vLLM's --burstiness (1 = Poisson, < 1 burstier, > 1 more regular).",
    )
    trace: Annotated[str | None, AfterValidator(_checked_by(_name))] = Field(
        default=None, description="CSV/JSONL trace: arrival time, prompt and output tokens per request (Azure, Vidur, BurstGPT and vLLM formats read by their column names).",
        json_schema_extra={"metavar": "PATH"},
    )
    trace_speedup: Annotated[Float, Field(ge=1e-6, le=1e6)] = Field(default=1.0, description="Replay the trace this many times faster.")
    trace_start: Annotated[Float, Field(ge=0.0, le=1e12)] = Field(
        default=0.0, description="Replay the trace from this many seconds after its first arrival (arrivals rebased to it).",
    )
    trace_duration: Annotated[Float | None, Field(gt=0.0, le=1e12)] = Field(
        default=None, description="Replay only this many seconds of the trace (from --trace-start). [default: to its end]",
    )
    prompt_tokens: LengthSpecText | None = Field(
        default=None, description="Prompt lengths: N, uniform:LO:HI or normal:MEAN:STD. [default: ctx - gen, or the trace's]",
        json_schema_extra={"flags": ["--prompt-tokens", "--input-len"], "metavar": "SPEC"},
    )
    output_tokens: LengthSpecText | None = Field(
        default=None, description="Output lengths: N, uniform:LO:HI or normal:MEAN:STD. [default: gen, or the trace's]",
        json_schema_extra={"flags": ["--output-tokens", "--output-len"], "metavar": "SPEC"},
    )
    dataset: Annotated[str | None, AfterValidator(_checked_by(lambda v: read_dataset(v, skip_output_check=True)))] = Field(
        default=None, description="Prompt and output lengths drawn in pairs from a lengths file: sharegpt (the shipped "
        "ShareGPT sample), a shipped NAME, or a CSV PATH with columns input_tokens,output_tokens; rows under 4 prompt "
        "or output tokens dropped, as vLLM's benchmark does. Arrivals from --qps/--max-concurrency, else a closed "
        "batch. [default: none]",
        json_schema_extra={"metavar": "NAME|PATH"},
    )
    scheduler: Literal["static", "continuous", "chunked", "prefill-first"] | None = Field(
        default=None, description="static batches, continuous (Orca/vLLM V0: prefill first, no token budget), chunked "
        "prefill under a token budget mixed with decodes (Sarathi, vLLM V1, SGLang --enable-mixed-chunk) or "
        "prefill-first (SGLang's default: prompts in budget-sized chunks run alone, decodes wait). "
        "[default: the engine profile's; vllm: chunked]",
    )
    max_num_seqs: Annotated[Int | None, Field(ge=1, le=MAX_BATCH)] = Field(
        default=None, description="Most sequences running at once. [default: the engine profile's on the GPU; vllm: "
        "256, 1,024 on GPUs of 70 GiB or more but A100 (H100, H200, B200, MI300X), as `vllm serve`]",
    )
    max_batched_tokens: Annotated[Int | None, Field(ge=1, le=MAX_CONTEXT_TOKENS)] = Field(
        default=None, description="Token budget per iteration (static: prompts prefill in passes of at most this "
        "many). [default: the engine profile's for its own scheduler on the GPU (vllm: 2048, 8192 on GPUs of 70 GiB or "
        "more but A100); 2048 for chunked otherwise, 8192 for "
        "prefill-first; none for continuous and static, but a profile's pass size (llamacpp: 512) caps static, chunked "
        "and prefill-first]",
        json_schema_extra={"flags": ["--max-batched-tokens", "--max-num-batched-tokens"]},
    )
    block_size: Annotated[Int | None, Field(ge=1, le=4096)] = Field(
        default=None, description="Tokens per KV-cache block. [default: the engine profile's; vllm: 16]",
    )
    kv_admission: Literal["incremental", "reserve", "fit"] | None = Field(
        default=None, description="When a request may start: incremental (its prompt's KV blocks fit; blocks grow as it "
        "decodes and the newest request is preempted when they run out: vLLM, SGLang) or reserve (its prompt plus its "
        "maximum output fit and are reserved at once, never preempted: TensorRT-LLM's GUARANTEED_NO_EVICT) or fit (blocks "
        "grow as with incremental, but a request starts only when every output still to come fits as requests finish: "
        "SGLang's check for requests that ignore EOS without a prefix cache). "
        "[default: the engine profile's; vllm: incremental, trtllm: reserve]",
    )
    gpu_memory_utilization: Annotated[Float, Field(gt=0.0, le=1.0)] = Field(
        default=0.9, description="Fraction of GPU memory the server may use, in (0, 1].",
    )
    kv_blocks: Annotated[Int | None, Field(ge=1, le=MAX_KV_BLOCKS)] = Field(
        default=None, description="Override the KV-cache capacity, in blocks (what-if).",
    )
    slo_ttft: Annotated[Float | None, Field(gt=0.0, le=MAX_SECONDS)] = Field(
        default=None, description="TTFT objective in seconds (for goodput).",
    )
    slo_tpot: Annotated[Float | None, Field(gt=0.0, le=MAX_SECONDS)] = Field(
        default=None, description="TPOT objective in seconds (for goodput).",
    )
    slo_e2e: Annotated[Float | None, Field(gt=0.0, le=MAX_SECONDS)] = Field(
        default=None, description="End-to-end latency objective in seconds (for goodput).",
    )
    seed: Annotated[Int, Field(ge=0, le=2**32 - 1)] = Field(default=0, description="Seed of arrivals and sampled lengths.")
    max_concurrency: Annotated[Int | None, Field(ge=1, le=MAX_BATCH)] = Field(
        default=None, description="Closed loop: this many clients, each sending its next request as soon as its last "
        "one finishes (vllm bench serve --max-concurrency); --num-prompts counts the scored requests. [default: none]",
    )
    warmup_requests: Annotated[Int, Field(ge=0, le=MAX_REQUESTS)] = Field(
        default=0, description="With --max-concurrency: requests sent first through the same clients and not scored "
        "(genai-perf --warmup-request-count).",
    )
    client_path: Literal["on", "off"] = Field(
        default="on", description="Charge the engine profile's client path (HTTP and hand-off to the engine core, "
        "tokenisation, first streamed chunk) to TTFT and end-to-end latency, as a benchmark client measures them; off: "
        "the bare engine.",
    )
    replicas: Annotated[Int, Field(ge=1, le=1024)] = Field(
        default=1,
        description="Data-parallel copies of the deployment (each tp x pp GPUs) behind one router; GPUs in all = replicas x tp x pp.",
    )
    router: Literal["round_robin", "least_outstanding", "least_kv", "prefix"] = Field(
        default="round_robin",
        description="How requests are spread over replicas: round_robin, least_outstanding (fewest in flight), least_kv (lowest KV-cache load), prefix (cached prefix and load, as llm-d's and Dynamo's KV-aware routers).",
    )
    router_staleness: Annotated[Float, Field(ge=0.0, le=MAX_SECONDS)] = Field(
        default=0.0, description="With --router prefix: seconds between refreshes of the router's view of the replicas' caches (0: live).",
    )
    prefix_caching: bool = Field(
        default=False,
        description="Keep and reuse the KV blocks of shared prompt prefixes (vLLM's automatic prefix caching, SGLang's RadixAttention; both on by default there).",
    )
    prefix_cache_warm: bool = Field(
        default=False,
        description="With --prefix-caching: start with every prompt prefix of the workload already cached, as on a "
        "server that has just served the same prompts (a benchmark re-sending its prompts, a warmed-up system prompt).",
    )
    shared_prefix_tokens: Annotated[Int | None, Field(ge=1, le=MAX_CONTEXT_TOKENS)] = Field(
        default=None, description="Put a shared system prompt of this many tokens before the prompts (see --shared-prefix-ratio).",
    )
    shared_prefix_ratio: Annotated[Float, Field(gt=0.0, le=1.0)] = Field(
        default=1.0, description="Share of the requests whose prompt starts with the shared system prompt, in (0, 1].",
    )
    sessions: Annotated[Int | None, Field(ge=1, le=MAX_REQUESTS)] = Field(
        default=None, description="A workload of this many multi-turn sessions: each turn's prompt is the conversation so "
        "far plus --turn-tokens new tokens, sent --think-time seconds after the previous answer (see docs/sessions.md).",
    )
    turns: Annotated[Int, Field(ge=1, le=100_000)] = Field(default=4, description="With --sessions: turns per session.")
    think_time: Annotated[Float, Field(ge=0.0, le=MAX_SECONDS)] = Field(
        default=0.0, description="With --sessions: seconds between a turn's answer and the next turn.",
    )
    turn_tokens: Annotated[Int | None, Field(ge=1, le=MAX_CONTEXT_TOKENS)] = Field(
        default=None, description="With --sessions: new prompt tokens per turn. [default: ctx - gen]",
    )
    kv_offload: Annotated[str | None, AfterValidator(_checked_by(_offload))] = Field(
        default=None, description="With --prefix-caching: an offload tier for evicted prefix blocks, cpu:SIZE_GIB (host "
        "DRAM over PCIe, or NVLink-C2C on Grace systems) or nvme:SIZE_GIB (local SSD), per replica; :GBPS after the size "
        "overrides the link's bandwidth (vLLM's offloading connector, LMCache, SGLang HiCache).",
        json_schema_extra={"metavar": "cpu:GIB|nvme:GIB"},
    )


def _speculative(value: str) -> str:
    parse_method(value)
    return value.strip()


def _acceptance(value: Any) -> Any:
    """A rate or a per-position list (number, list, or "0.8,0.7,0.6") as canonical text, each rate in [0, 1]."""
    if value is None:
        return value
    value = _reject_bool(value)
    parts = [str(part).strip() for part in value] if isinstance(value, (list, tuple)) else str(value).split(",")
    text = ",".join(part.strip() for part in parts)
    _checked_by(lambda spec: parse_acceptance(spec, len(parts)))(text)
    return text


_RATIO = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*$")


def _ratio(value: Any) -> Any:
    if value is None:
        return value
    if not isinstance(value, str):
        # YAML 1.1 reads an unquoted 1:3 as the sexagesimal number 63, so a number here is never what was meant.
        raise ValueError(f"got the number {value!r}; give P:D as text, quoted in YAML ('1:3')")
    match = _RATIO.match(value)
    if not match or min(int(match.group(1)), int(match.group(2))) < 1 or max(int(match.group(1)), int(match.group(2))) > 1024:
        raise ValueError(f"cannot read {value!r}; give prefill:decode replicas as P:D with 1 <= P, D <= 1024 (e.g. 1:3)")
    return f"{int(match.group(1))}:{int(match.group(2))}"


class SpeculativeSettings(BaseModel):
    """Speculative decoding (simulator.cost.speculation): the draft, the tokens it drafts, how often they are accepted."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    speculative: Annotated[str | None, AfterValidator(_checked_by(_speculative))] = Field(
        default=None,
        description="Speculative decoding: draft:MODEL (a smaller model with the same tokenizer), eagle (an EAGLE "
        "draft head) or mtp (DeepSeek's multi-token prediction head); both heads are one extra decoder layer.",
        json_schema_extra={"metavar": "draft:MODEL|eagle|mtp"},
    )
    num_speculative_tokens: Annotated[Int | None, Field(ge=1, le=MAX_SPECULATIVE_TOKENS)] = Field(
        default=None, description="Tokens drafted per iteration, k (vLLM's num_speculative_tokens). [default: the "
        "length of an --acceptance list]",
    )
    acceptance: Annotated[str | None, BeforeValidator(_acceptance)] = Field(
        default=None,
        description="Acceptance rate of a drafted token, in [0, 1], or one per position (0.8,0.7,0.6); measure it "
        "on your traffic (vLLM logs it; DeepSeek-V3 reports 0.85-0.90 for its MTP head). Needed with --speculative.",
        json_schema_extra={"metavar": "RATE|R1,R2,..."},
    )

    @model_validator(mode="after")
    def _speculation_complete(self) -> "SpeculativeSettings":
        if self.speculative is None:
            for name in ("num_speculative_tokens", "acceptance"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name}: applies only with speculative")
            return self
        if self.acceptance is None:
            raise ValueError("acceptance: needed with speculative (the rate at which drafted tokens are accepted, "
                             "e.g. 0.7, or one per position 0.8,0.7,0.6)")
        try:
            parse_acceptance(self.acceptance, self.num_speculative_tokens)
        except InputError as exc:
            raise ValueError(re.sub(r"^--([\w-]+)", lambda m: m.group(1).replace("-", "_"), str(exc))) from None
        return self

    @property
    def acceptance_rates(self) -> tuple[float, ...]:
        """Per-position acceptance a_1 .. a_k (empty without speculation)."""
        if self.speculative is None or self.acceptance is None:
            return ()
        return parse_acceptance(self.acceptance, self.num_speculative_tokens)


POOL_LAYOUT: tuple[str, ...] = ("gpu", "tp", "ep", "dp_attention")
"""The deployment settings a disaggregated pool may set for itself (``prefill_<name>`` / ``decode_<name>``); each
left out takes the run's own."""

POOL_SETTINGS: tuple[str, ...] = tuple(f"{role}_{name}" for role in ("prefill", "decode") for name in POOL_LAYOUT)


class DisaggregationSettings(BaseModel):
    """Disaggregated prefill and decode (simulator.engine.disaggregated): two pools of replicas and the KV link."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    disaggregate: Annotated[str | None, BeforeValidator(_ratio)] = Field(
        default=None,
        description="Prefill and decode on separate replicas, P:D (e.g. 1:3): P prefill replicas hand each "
        "request's KV cache over NVLink or InfiniBand to D decode replicas (Splitwise, DistServe, Mooncake; "
        "vLLM and SGLang P/D). Each replica is --tp GPUs unless --prefill-tp/--decode-tp say otherwise; "
        "--prefill-ep/--decode-ep and --prefill-dp-attention/--decode-dp-attention give a pool its own layout.",
        json_schema_extra={"metavar": "P:D"},
    )
    prefill_gpu: Annotated[str | None, AfterValidator(_checked_by(_name))] = Field(
        default=None, description="GPU of the prefill replicas. [default: --gpu]", json_schema_extra={"metavar": "NAME|PATH"},
    )
    decode_gpu: Annotated[str | None, AfterValidator(_checked_by(_name))] = Field(
        default=None, description="GPU of the decode replicas. [default: --gpu]", json_schema_extra={"metavar": "NAME|PATH"},
    )
    prefill_tp: Annotated[Int | None, Field(ge=1, le=1024)] = Field(
        default=None, description="Tensor-parallel degree of a prefill replica. [default: --tp, else the smallest that fits]",
    )
    decode_tp: Annotated[Int | None, Field(ge=1, le=1024)] = Field(
        default=None, description="Tensor-parallel degree of a decode replica. [default: --tp, else the smallest that fits]",
    )
    prefill_ep: Annotated[Int | None, Field(ge=1, le=1024)] = Field(
        default=None, description="Expert-parallel degree of a prefill replica (MoE models; 1 or its tensor-parallel "
        "degree, as --ep). [default: --ep]",
    )
    decode_ep: Annotated[Int | None, Field(ge=1, le=1024)] = Field(
        default=None, description="Expert-parallel degree of a decode replica (MoE models; 1 or its tensor-parallel "
        "degree, as --ep). [default: --ep]",
    )
    prefill_dp_attention: bool | None = Field(
        default=None, description="Attention data-parallel over a prefill replica's GPUs (as --dp-attention). "
        "[default: --dp-attention]",
    )
    decode_dp_attention: bool | None = Field(
        default=None, description="Attention data-parallel over a decode replica's GPUs (as --dp-attention). "
        "[default: --dp-attention]",
    )

    @model_validator(mode="after")
    def _pools(self) -> "DisaggregationSettings":
        if self.disaggregate is None:
            for name in POOL_SETTINGS:
                if getattr(self, name) is not None:
                    raise ValueError(f"{name}: applies only with disaggregate")
            return self
        if getattr(self, "replicas", 1) != 1:
            raise ValueError("replicas: with disaggregate the replicas are the P:D pools; give one or the other")
        return self

    @property
    def pools(self) -> tuple[int, int] | None:
        """(prefill replicas, decode replicas), or None when prefill and decode share the replicas."""
        if self.disaggregate is None:
            return None
        prefill, decode = self.disaggregate.split(":")
        return int(prefill), int(decode)

    def pool_layout(self, role: str) -> dict[str, Any]:
        """What the ``role`` pool ('prefill' or 'decode') sets for itself, by :data:`POOL_LAYOUT` name (only those given)."""
        given = {name: getattr(self, f"{role}_{name}") for name in POOL_LAYOUT}
        return {name: value for name, value in given.items() if value is not None}


def _vllm_goodput(value: Any) -> dict[str, float]:
    """vLLM's ``--goodput ttft:MS tpot:MS e2el:MS`` (milliseconds) -> SLO fields in seconds."""
    given = [value] if isinstance(value, str) else list(value)
    items = [part for item in given for part in str(item).split()]
    names = {"ttft": "slo_ttft", "tpot": "slo_tpot", "e2el": "slo_e2e"}
    out: dict[str, float] = {}
    for item in items:
        key, _, number = str(item).partition(":")
        if key not in names or not number:
            raise InputError(f"goodput: cannot read {item!r}; use ttft:MS, tpot:MS or e2el:MS (milliseconds)")
        try:
            ms = float(number)
        except ValueError:
            raise InputError(f"goodput: {item!r}: {number!r} is not a number of milliseconds") from None
        if not math.isfinite(ms) or ms <= 0:
            raise InputError(f"goodput: {item!r}: milliseconds must be finite and > 0")
        out[names[key]] = ms / 1e3
    return out


def _vllm_kv_dtype(value: Any) -> dict[str, Any]:
    text = str(value).lower()
    if text == "auto":
        return {}
    if text in ("fp8_e4m3", "fp8_e5m2"):
        return {"kv": "fp8"}
    return {"kv": text}


def _request_rate(value: Any) -> float:
    """vLLM's --request-rate: requests/s, or inf (every request at t = 0)."""
    try:
        rate = float(_reject_bool(value))
    except (TypeError, ValueError):
        rate = math.nan
    if not rate > 0:  # NaN too
        raise InputError(f"request_rate: expected requests/s > 0 or inf (got {value!r})")
    return rate


def _vllm_request_rate(value: Any) -> dict[str, Any]:
    rate = _request_rate(value)
    return {} if rate == math.inf else {"qps": rate}


def _vllm_chunked(value: Any) -> dict[str, Any]:
    return {"scheduler": "chunked"} if value else {}


# vLLM benchmark spelling -> function of its value giving this model's fields.
VLLM_ALIASES: dict[str, Callable[[Any], dict[str, Any]]] = {
    "input_len": lambda v: {"prompt_tokens": v},
    "output_len": lambda v: {"output_tokens": v},
    "num_prompts": lambda v: {"requests": v},
    "request_rate": _vllm_request_rate,
    "max_num_batched_tokens": lambda v: {"max_batched_tokens": v},
    "tensor_parallel_size": lambda v: {"tp": v},
    "pipeline_parallel_size": lambda v: {"pp": v},
    "kv_cache_dtype": _vllm_kv_dtype,
    "enable_chunked_prefill": _vllm_chunked,
    "enable_prefix_caching": lambda v: {"prefix_caching": v},
    "goodput": _vllm_goodput,
}


def resolve_aliases(data: dict[str, Any]) -> dict[str, Any]:
    """Translate vLLM spellings into field names; the same field given twice, differently, is an error."""
    out = {key: value for key, value in data.items() if key not in VLLM_ALIASES}
    for alias, translate in VLLM_ALIASES.items():
        if alias not in data or data[alias] is None:
            continue
        if alias == "request_rate" and out.get("qps") is not None and _request_rate(data[alias]) == math.inf:
            # inf means no arrival rate at all (a closed batch at t = 0), which a qps contradicts as much as 3 would
            raise InputError(f"request_rate: inf sends every request at t = 0, but qps is also given as "
                             f"{out['qps']!r}; give one")
        for key, value in translate(data[alias]).items():
            if key in out and out[key] is not None and out[key] != value:
                raise InputError(f"{alias}: sets {key} to {value!r}, but {key} is also given as {out[key]!r}; give one")
            out[key] = value
    return out


def _fixed_length(spec: str | None) -> int | None:
    return int(spec) if spec is not None and spec.isdigit() else None


class RunSettings(DisaggregationSettings, SpeculativeSettings, ServingSettings, StepSettings):
    """Everything one engine run needs (see the module docstring for names, units and aliases).

    Workload rules, one meaning each:

    - Without ``qps`` or ``trace`` the run is a closed batch at t = 0 of ``batch`` requests;
      ``requests`` says the same thing (give one, or both equal).
    - With ``qps`` or ``trace``, ``batch`` does not apply (it is an error to set it): the load
      is the arrival rate or the trace, and ``requests`` counts them.
    - Fixed ``prompt_tokens`` P and ``output_tokens`` O with ``ctx``/``gen`` left out set
      ``ctx = P + O`` and ``gen = O``, so the deployment is planned for the requests it runs.
    """

    @model_validator(mode="before")
    @classmethod
    def _derive(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = {key: value for key, value in data.items() if value is not None}
        prompt, output = data.get("prompt_tokens"), data.get("output_tokens")
        if "ctx" not in data and "gen" not in data and prompt is not None and output is not None:
            p, o = _fixed_length(str(prompt).strip()), _fixed_length(str(output).strip())
            if p is not None and o is not None and p >= 1 and o >= 1:
                data["ctx"], data["gen"] = p + o, o
        return data

    @model_validator(mode="after")
    def _one_meaning(self) -> "RunSettings":
        closed = self.qps is None and self.trace is None
        given = self.model_fields_set
        if closed and "batch" in given and self.requests is not None and self.requests != self.batch:
            raise ValueError(
                f"requests: {self.requests} and batch {self.batch} both size the closed batch; give one "
                "(or add qps/trace for arrivals over time)"
            )
        if not closed and "batch" in given:
            source = "qps" if self.qps is not None else "trace"
            raise ValueError(f"batch: sizes a closed batch at t=0; with {source} the load is set by {source} and requests")
        if self.qps is not None and self.trace is not None and self.requests is None:
            pass  # qps over a trace's lengths: the trace's count is the default
        for name in ("trace_speedup", "trace_start", "trace_duration"):
            if self.trace is None and name in given:
                raise ValueError(f"{name}: applies only with trace")
        if self.qps is not None and given & {"trace_speedup", "trace_start", "trace_duration"}:
            raise ValueError("qps: with a trace, qps draws new arrivals from the trace's lengths; a window or speed-up of the trace's own times does not apply")
        if self.arrival != "poisson" and self.qps is None:
            raise ValueError(f"arrival: {self.arrival} arrivals need qps")
        if self.dataset is not None:
            for name, clash in (("trace", self.trace is not None), ("prompt_tokens", self.prompt_tokens is not None),
                                ("sessions", getattr(self, "sessions", None) is not None)):
                if clash:
                    raise ValueError(f"dataset: draws the prompt lengths itself; it does not apply with {name} "
                                     "(output_tokens may replace its output lengths)")
        if "shared_prefix_ratio" in given and self.shared_prefix_tokens is None:
            raise ValueError("shared_prefix_ratio: applies only with shared_prefix_tokens")
        if self.max_concurrency is not None:
            # A closed loop's load is its clients: one meaning each for the settings that also set a load.
            if self.qps is not None:
                raise ValueError("max_concurrency: a closed loop sends each request when one finishes; it does not "
                                 "apply with qps (give one or the other)")
            if given & {"trace_speedup", "trace_start", "trace_duration"}:
                raise ValueError("max_concurrency: a closed loop takes only the trace's lengths (in order), not its "
                                 "times; a window or speed-up of the trace does not apply")
            if "batch" in given:
                raise ValueError("batch: sizes a closed batch at t=0; with max_concurrency the load is the clients "
                                 "(max_concurrency) and requests counts what they send")
            for name, other in (("replicas", self.replicas != 1), ("disaggregate", self.disaggregate is not None),
                                ("speculative", self.speculative is not None)):
                if other:
                    raise ValueError(f"max_concurrency: a closed loop runs on one replica without {name}; "
                                     f"drop {name} or max_concurrency")
        elif self.warmup_requests:
            raise ValueError("warmup_requests: applies only with max_concurrency (warm-up requests go through the "
                             "closed loop's clients)")
        if self.sessions is not None:
            for name, clash in (("qps", self.qps is not None), ("trace", self.trace is not None),
                                ("max_concurrency", self.max_concurrency is not None),
                                ("shared_prefix_tokens", self.shared_prefix_tokens is not None),
                                ("disaggregate", self.disaggregate is not None),
                                ("speculative", self.speculative is not None), ("batch", "batch" in given),
                                ("requests", self.requests is not None)):
                if clash:
                    raise ValueError(f"sessions: a session workload sends its own turns; it does not apply with {name}")
        else:
            for name in ("turns", "think_time", "turn_tokens"):
                if name in given:
                    raise ValueError(f"{name}: applies only with sessions")
        if self.kv_offload is not None and not self.prefix_caching:
            raise ValueError("kv_offload: applies only with prefix_caching (the tier holds evicted prefix blocks)")
        if "router_staleness" in given and self.router != "prefix":
            raise ValueError("router_staleness: applies only with router prefix")
        if self.prefix_cache_warm and not self.prefix_caching:
            raise ValueError("prefix_cache_warm: applies only with prefix_caching (a warm cache is the prefix cache's)")
        return self

    @property
    def closed_batch_size(self) -> int:
        """Requests of the closed batch (``requests`` or ``batch``); only meaningful without qps/trace."""
        return self.requests if self.requests is not None else self.batch


class ExplainSettings(SpeculativeSettings, StepSettings):
    """``simulate explain``: a step's settings, and the speculative decoding to measure as a lever."""


def field_flag(name: str) -> str:
    """The CLI flag of a settings field: ``attention_kernel`` -> ``--attention-kernel``."""
    return "--" + name.replace("_", "-")


def _problem(err: Any) -> str:
    """One pydantic error as words: 'must be >= 1 (got 0)'."""
    message = err["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, "):]
    message = re.sub(r"^Input should be ", "must be ", message)
    message = re.sub(r", unable to parse string as an? \w+$", "", message)
    for words, sign in (("greater than or equal to", ">="), ("less than or equal to", "<="), ("greater than", ">"), ("less than", "<")):
        message = message.replace(words, sign)
    value = err.get("input")
    if err["type"] not in ("value_error", "missing", "extra_forbidden") and not isinstance(value, (dict, list)):
        message += f" (got {value!r})"
    return message


def validation_error(exc: pydantic.ValidationError, where: Callable[[str], str]) -> InputError:
    """The first problem of a ValidationError as one line: '<where(field)>: <what> (got <value>)'."""
    err = exc.errors()[0]
    loc = [str(part) for part in err["loc"] if not str(part).startswith(("function-", "constrained-"))]
    field = loc[0] if loc else ""
    message = _problem(err)
    if not field and ":" in message.split(" ")[0]:
        # A model validator names its field at the start of its message ('gen: ...').
        field, _, message = message.partition(": ")
    if err["type"] == "extra_forbidden":
        return InputError(f"{where(field)}: unknown setting")
    if err["type"] == "missing":
        return InputError(f"{where(field)}: is required")
    return InputError(f"{where(field) if field else 'settings'}: {message}")


def value_problem(exc: pydantic.ValidationError) -> str:
    """What is wrong with a single value (no field name): 'must be >= 1 (got 0)'."""
    return _problem(exc.errors()[0])


SettingsT = TypeVar("SettingsT", bound=BaseModel)


def parse_settings(cls: type[SettingsT], data: dict[str, Any], where: Callable[[str], str] = str) -> SettingsT:
    """``cls`` validated from ``data`` (vLLM aliases resolved); InputError naming the field via ``where``."""
    try:
        if cls is RunSettings:
            data = resolve_aliases(data)
        unknown = sorted(set(data) - set(cls.model_fields))
        if unknown:
            from simulator.model.loader import suggest

            name = unknown[0]
            raise InputError(f"{where(name)}: unknown setting{suggest(name, list(cls.model_fields))}")
        return cls.model_validate(data)
    except pydantic.ValidationError as exc:
        raise validation_error(exc, where) from None


def check_field(cls: type[BaseModel], name: str, value: Any) -> Any:
    """One field's value validated and converted on its own (scenario axes); ValueError text on failure."""
    # The field's type with its constraints (Annotated[type, *metadata]), as pydantic rebuilds it.
    return pydantic.TypeAdapter(cls.model_fields[name].rebuild_annotation()).validate_python(value)


__all__ = [
    "DeploymentSettings", "DisaggregationSettings", "ExplainSettings", "RunSettings", "ServingSettings", "ShapeSettings",
    "SpeculativeSettings", "StepSettings", "POOL_LAYOUT", "POOL_SETTINGS",
    "VLLM_ALIASES", "check_field", "field_flag", "parse_settings", "resolve_aliases", "validation_error", "value_problem",
    "KV_DTYPES", "SCHEDULERS", "ATTENTION_KERNELS", "FUSIONS",
]
