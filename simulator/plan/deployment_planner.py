"""Choosing a deployment: build the System at the requested (or smallest fitting) tensor-parallel degree."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from simulator.cost.deployment import Deployment
from simulator.cost.memory import no_fit_error, plan_memory, tensor_parallel_candidates
from simulator.cost.system import System
from simulator.errors import InputError
from simulator.model.architecture import ModelSpec, load_model, with_attention, with_full_attention
from simulator.model.engine_profile import IDEAL, EngineProfile, load_engine_profile
from simulator.model.gpu import GPUSpec, load_gpu
from simulator.model.kernel_ceilings import with_ceilings
from simulator.model.operators import AttentionKernel, Fusion
from simulator.model.precision import Precision, parse_precision

SYSTEMS_KEPT = 4
"""Systems remembered by :func:`_system` (a sweep's points mostly share one: its cost memo and traced
decode ticks then carry over from point to point)."""

_SYSTEMS: OrderedDict[tuple, System] = OrderedDict()


def _system(model: ModelSpec, gpu: GPUSpec, precision: Precision, tp: int, attention_kernel: AttentionKernel,
            fusion: Fusion, ep: int, routing_skew: float, engine: EngineProfile, collectives: str,
            kernel_efficiency: str, dp_attention: bool = False, kernels: str = "roofline",
            kernel_table: str | None = None) -> System:
    """``System(...)`` of these settings, the same object for the same settings (Systems are immutable; the
    configs are compared by their JSON, as pydantic models do not hash)."""
    key = (model.model_dump_json(), gpu.model_dump_json(), precision.model_dump_json(), tp, attention_kernel, fusion,
           ep, routing_skew, engine.model_dump_json(), collectives, kernel_efficiency, dp_attention, kernels, kernel_table)
    system = _SYSTEMS.get(key)
    if system is None:
        system = _SYSTEMS[key] = System(model, gpu, precision, tp, attention_kernel, fusion, ep, routing_skew,
                                        engine=engine, collectives=collectives, kernel_efficiency=kernel_efficiency,
                                        dp_attention=dp_attention, kernels=kernels, kernel_table=kernel_table)
        while len(_SYSTEMS) > SYSTEMS_KEPT:
            _SYSTEMS.popitem(last=False)
    _SYSTEMS.move_to_end(key)
    return system


def plan_deployment(
    model: ModelSpec,
    gpu: GPUSpec,
    precision: Precision,
    batch: int,
    context_tokens: int,
    tp: int | None = None,
    attention_kernel: AttentionKernel = "flash",
    fusion: Fusion = "elementwise",
    require_fit: bool = True,
    ep: int | None = None,
    routing_skew: float = 0.0,
    engine: EngineProfile = IDEAL,
    collectives: str = "ring",
    kernel_efficiency: str = "flat",
    dp_attention: bool = False,
    kernels: str = "roofline",
    kernel_table: str | None = None,
) -> Deployment:
    """The System for ``batch`` sequences reaching ``context_tokens`` each.

    With ``tp`` given, that degree is used and (when ``require_fit``) an InputError names the
    GiB needed vs available if it does not fit. With ``tp`` None, the smallest power of two
    dividing the heads and KV heads that fits is chosen. ``ep`` (expert parallelism, MoE
    models; None: 1) splits the routed experts over the tensor-parallel GPUs, so it is 1 or
    equal to tp; with ``tp`` None and ``ep`` > 1, tp = ep. ``routing_skew``: Zipf-like exponent
    of expert popularity (0: uniform; simulator.model.routing). ``engine``, ``collectives`` and
    ``kernel_efficiency`` and ``kernels`` are the System's time-model settings (defaults: the plain roofline;
    :func:`deployment_from_options` defaults to the realistic ones). ``dp_attention``: attention
    data-parallel over the tp GPUs (simulator.model.layers.check_attention_data_parallel). An engine
    that does not honour sliding windows (``EngineProfile.honours_sliding_window``) runs the model
    with full attention in every layer, for time and for memory.
    """
    ep_degree = 1 if ep is None else ep
    if not engine.honours_sliding_window:
        model = with_full_attention(model)
    if batch < 1:
        raise InputError(f"--batch: must be >= 1 (got {batch})")
    if context_tokens < 1:
        raise InputError(f"--ctx: must be >= 1 (got {context_tokens})")
    if context_tokens > model.max_context:
        raise InputError(
            f"--ctx: {context_tokens} tokens exceeds the maximum context of {model.name} ({model.max_context} tokens)"
        )

    def build(degree: int) -> Deployment:
        system = _system(model, gpu, precision, degree, attention_kernel, fusion, ep_degree, routing_skew, engine,
                         collectives, kernel_efficiency, dp_attention, kernels, kernel_table)
        plan = plan_memory(model, precision, gpu, degree, batch, context_tokens, system.operators,
                           dp_attention=dp_attention)
        return Deployment(system, plan, auto_tp=tp is None)

    implied = tp is None and ep_degree > 1
    if implied:
        tp = ep_degree
    if tp is not None:
        try:
            deployment = build(tp)
        except InputError as exc:
            raise (as_ep_error(exc, ep_degree) if implied else exc) from None
        if require_fit and not deployment.memory.fits:
            raise InputError(f"{model.name} on {tp}x {gpu.name} does not fit: {deployment.memory.shortfall_message()}")
        return deployment
    candidates = tensor_parallel_candidates(model, gpu, ep_degree, dp_attention)
    largest: Deployment | None = None
    for degree in candidates:
        largest = build(degree)
        if largest.memory.fits:
            return largest
    assert largest is not None  # tp = 1 is always a candidate
    if require_fit:
        raise no_fit_error(model, gpu, largest.memory, candidates)
    return largest


DEPLOYMENT_KEYS = (
    "model", "gpu", "weights", "kv", "group_size", "attention", "tp", "ep", "dp_attention", "routing_skew",
    "attention_kernel", "fusion",
    "compute_efficiency", "memory_efficiency", "expert_efficiency", "kernel_overlap", "link_efficiency", "launch_overhead",
    "engine", "collectives", "kernel_efficiency", "kernels", "kernel_table", "ceilings", "enforce_eager", "num_scheduler_steps", "sampling",
)

# The realistic time model for runs from options (docs/time-model.md): the engine most users run,
# that engine's own all-reduce choice, efficiency by kernel shape, CUDA graphs as the engine does.
DEFAULT_ENGINE = "vllm"
DEFAULT_COLLECTIVES = "auto"
DEFAULT_KERNEL_EFFICIENCY = "shape"
DEFAULT_KERNELS = "roofline"


def engine_from_options(options: dict[str, Any]) -> EngineProfile:
    """The engine profile named by ``engine`` (default vLLM), eager when ``enforce_eager`` is set."""
    engine = options.get("engine")
    profile = engine if isinstance(engine, EngineProfile) else load_engine_profile(str(engine or DEFAULT_ENGINE))
    if options.get("gpu") is not None:
        # The engine's scheduler defaults may depend on the GPU (vLLM on GPUs of 70 GiB or more).
        gpu = load_gpu(options["gpu"])
        profile = profile.for_gpu(gpu.name, gpu.hbm_bytes)
    profile = profile.with_scheduler_steps(int(options.get("num_scheduler_steps") or 1))
    profile = profile.with_sampling(bool(options.get("sampling")))
    return profile.eager() if options.get("enforce_eager") else profile


def weights_format(model: ModelSpec, weights: str | None) -> str:
    """The weight format asked for, else the checkpoint's own (its quantization_config), else fp16."""
    return weights or model.default_weights or "fp16"


def gpu_from_options(options: dict[str, Any]) -> GPUSpec:
    """The GPU named by ``gpu``, its ceilings from ``ceilings`` (--ceilings), then every efficiency override."""
    return with_ceilings(load_gpu(options["gpu"]), options.get("ceilings")).with_efficiency(
        compute=options.get("compute_efficiency"),
        memory=options.get("memory_efficiency"),
        expert=options.get("expert_efficiency"),
        overlap=options.get("kernel_overlap"),
        link=options.get("link_efficiency"),
        kernel_launch_seconds=options.get("launch_overhead"),
    )


def as_ep_error(exc: InputError, ep: int) -> InputError:
    """A ``--tp`` error where the user gave ``--ep`` and no ``--tp`` (the degree is then ep's): named as --ep's."""
    text = str(exc)
    if not text.startswith("--tp: "):
        return exc
    return InputError(f"--ep {ep} (with no --tp the tensor-parallel degree is the expert-parallel one): "
                      f"{text.removeprefix('--tp: ')}")


def deployment_from_options(options: dict[str, Any], batch: int, ctx: int, require_fit: bool = True) -> Deployment:
    """Load configs named by the options and plan the deployment for ``batch`` x ``ctx``."""
    if not options.get("model"):
        raise InputError("--model is required (e.g. --model llama2-70b; `simulate models` lists them)")
    if not options.get("gpu"):
        raise InputError("--gpu is required (e.g. --gpu a100; `simulate gpus` lists them)")
    model = with_attention(load_model(options["model"]), options.get("attention"))
    gpu = gpu_from_options(options)
    precision = parse_precision(weights_format(model, options.get("weights")), options.get("kv") or "fp16",
                                options.get("group_size") or 128)
    engine = engine_from_options(options)
    return plan_deployment(
        model,
        gpu,
        precision,
        batch=batch,
        context_tokens=ctx,
        tp=options.get("tp"),
        # An engine's default kernel is for head attention; an MLA model runs its own (layers.latent_attention), and
        # so does DeepSeek-V4's compressed attention (compressed_attention_layers).
        attention_kernel=options.get("attention_kernel")
        or ("flash" if model.is_mla or model.compress_ratios else engine.attention_kernel),
        fusion=options.get("fusion") or engine.fusion,
        require_fit=require_fit,
        ep=options.get("ep"),
        routing_skew=float(options.get("routing_skew") or 0.0),
        engine=engine,
        collectives=str(options.get("collectives") or DEFAULT_COLLECTIVES),
        kernel_efficiency=str(options.get("kernel_efficiency") or DEFAULT_KERNEL_EFFICIENCY),
        dp_attention=bool(options.get("dp_attention")),
        kernels=str(options.get("kernels") or DEFAULT_KERNELS),
        kernel_table=str(options["kernel_table"]) if options.get("kernel_table") else None,
    )
