"""Numeric formats: bytes per element, per-module weight formats and the rule that derives the compute dtype.

Compute-dtype rule (documented in README):
- fp32, fp16, bf16 weights: compute in the weight dtype; activations in the same dtype.
- fp8 weights: W8A8 as in TensorRT-LLM's FP8 mode, GEMMs run on fp8 tensor cores
  (the GPU must have an fp8 peak); activations are stored as fp16 (bf16 when the default
  format is bf16). ``fp8_block`` > 0 adds one fp32 scale per ``fp8_block`` x ``fp8_block``
  block of weights (DeepSeek-V3's 128 x 128 block-wise format); 0 is per-tensor (one scale).
- int8 / int4 weights: weight-only quantisation (W8A16 / W4A16 as in AWQ/GPTQ/Marlin):
  weights are dequantised to the activation dtype inside the GEMM, which runs at that peak.
  Each group of ``group_size`` weights carries one fp16 scale.
- fp4 weights (NVFP4: blocks of 16 values sharing one fp8 E4M3 scale, 0.5 + 1/16 bytes per
  weight; NVIDIA, "Introducing NVFP4", 2025) and mxfp4 weights (OCP Microscaling v1.0: blocks
  of 32 values sharing one 8-bit E8M0 scale, 0.5 + 1/32 bytes per weight): on a GPU with an
  ``fp4`` peak (Blackwell) the GEMM runs on FP4 tensor cores; elsewhere they are weight-only
  like int4 (dequantised to the activation dtype, 4 vector operations per weight), as vLLM's
  Marlin MXFP4 path does on Hopper. :meth:`Precision.on_gpu` resolves which.
- Attention (QK^T, softmax, PV) always computes in the activation dtype, whatever the KV dtype.
- Embedding, LM head and MoE router stay in the activation dtype when weights are quantised,
  as the common quantisation toolkits do, unless a per-module format names them.

Per-module formats: ``weights`` is the default; ``modules`` overrides it for ``attention``
(QKV/MLA projections and the output projection), ``mlp`` (dense MLP layers), ``experts``
(routed and shared experts of MoE layers; falls back to ``mlp``), ``router``, ``embedding``
and ``lm_head``. The text form ``bf16,mlp=fp8`` is read by :func:`parse_precision`;
a checkpoint's ``quantization_config`` gives the model's default (see :mod:`simulator.model.hf_config`).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from simulator.errors import InputError

DType = Literal["fp32", "tf32", "fp16", "bf16", "fp8", "int8", "int4", "fp4", "mxfp4"]
WeightDType = Literal["fp32", "fp16", "bf16", "fp8", "int8", "int4", "fp4", "mxfp4"]
KVDType = Literal["fp16", "bf16", "fp8", "int8"]
Module = Literal["attention", "mlp", "experts", "router", "embedding", "lm_head"]

WEIGHT_DTYPES: tuple[str, ...] = ("fp32", "fp16", "bf16", "fp8", "int8", "int4", "fp4", "mxfp4")
KV_DTYPES: tuple[str, ...] = ("fp16", "bf16", "fp8", "int8")
MODULES: tuple[str, ...] = ("attention", "mlp", "experts", "router", "embedding", "lm_head")

# Bytes per stored element, scales excluded (see Precision.scale_bytes_per_weight).
# "fp4" is also the key of a GPU's FP4 tensor-core peak (NVFP4 and MXFP4 run at the same rate).
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "tf32": 4.0,
    "fp16": 2.0,
    "bf16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
    "fp4": 0.5,
    "mxfp4": 0.5,
}

WEIGHT_ONLY_QUANT: frozenset[str] = frozenset({"int8", "int4"})
FP4_FORMATS: frozenset[str] = frozenset({"fp4", "mxfp4"})

# Values sharing one scale and the scale's bytes: NVFP4 16 values / fp8 scale; MXFP4 32 values / E8M0 scale.
FP4_BLOCK: dict[str, tuple[int, float]] = {"fp4": (16, 1.0), "mxfp4": (32, 1.0)}

# Integer-pipe operations to turn one quantised weight into a 16-bit value inside a GEMM:
# int8: convert + scale multiply; int4 and fp4 formats: shift, mask, convert, scale multiply.
DEQUANT_OPS_PER_WEIGHT: dict[str, float] = {"int8": 2.0, "int4": 4.0, "fp4": 4.0, "mxfp4": 4.0}

# Where a module without its own format takes it from (None: the default ``weights``).
_FALLBACK: dict[str, str | None] = {"experts": "mlp", "mlp": None, "attention": None}
_UNQUANTISED_BY_DEFAULT = ("router", "embedding", "lm_head")


class Precision(BaseModel):
    """Weight, KV-cache and compute formats of one run.

    ``group_size``: weights sharing one fp16 scale (int8/int4 only).
    ``dequant_tile_tokens``: tokens per GEMM row tile; weight-only kernels dequantise every
    weight tile once per row tile (the 16-bit copy lives in registers, never in HBM), so
    dequantisation work grows with ceil(tokens / dequant_tile_tokens). Default 16, the
    row tile of Marlin-style W4A16 kernels.
    ``modules``: (module, format) overrides of ``weights`` (see module docstring).
    ``activations``: the activation dtype; None derives it from ``weights``.
    ``fp4_tensor_cores``: fp4/mxfp4 GEMMs run on FP4 tensor cores (False: weight-only); set by :meth:`on_gpu`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    weights: WeightDType = "fp16"
    kv: KVDType = "fp16"
    group_size: int = Field(default=128, ge=1)
    dequant_tile_tokens: int = Field(default=16, ge=1)
    modules: tuple[tuple[Module, WeightDType], ...] = ()
    activations: Literal["fp32", "fp16", "bf16"] | None = None
    fp8_block: int = Field(default=0, ge=0)
    fp4_tensor_cores: bool = True

    @model_validator(mode="after")
    def _one_format_per_module(self) -> Precision:
        names = [name for name, _ in self.modules]
        if len(names) != len(set(names)):
            raise ValueError(f"a module is given two formats: {names}")
        return self

    def module_weights(self, module: str) -> str:
        """The weight format of ``module`` (one of :data:`MODULES`)."""
        named = dict(self.modules)
        while True:
            if module in named:
                return named[module]
            if module in _UNQUANTISED_BY_DEFAULT:
                return self.weights if DTYPE_BYTES[self.weights] >= 2 else self.activation_dtype
            fallback = _FALLBACK.get(module)
            if fallback is None:
                return self.weights
            module = fallback

    def for_module(self, module: str) -> Precision:
        """A uniform Precision with ``module``'s weight format and this run's activations and KV cache."""
        if not self.modules and module not in _UNQUANTISED_BY_DEFAULT:
            return self
        return self.model_copy(
            update={"weights": self.module_weights(module), "modules": (), "activations": self.activation_dtype}
        )

    def on_gpu(self, peaks: Collection[str]) -> Precision:
        """This precision on a GPU with tensor-core peaks for ``peaks``: fp4 formats run on FP4 tensor cores or not."""
        has_fp4 = "fp4" in peaks
        if has_fp4 == self.fp4_tensor_cores:
            return self
        return self.model_copy(update={"fp4_tensor_cores": has_fp4})

    @property
    def formats(self) -> tuple[str, ...]:
        """Every weight format in use (the default and the per-module ones)."""
        return tuple(dict.fromkeys([self.weights, *(fmt for _, fmt in self.modules)]))

    @property
    def weight_only_quant(self) -> bool:
        """The main (MLP/expert) GEMMs dequantise weights to the activation dtype."""
        return self.for_module("experts")._weight_only

    @property
    def _weight_only(self) -> bool:
        return self.weights in WEIGHT_ONLY_QUANT or (self.weights in FP4_FORMATS and not self.fp4_tensor_cores)

    @property
    def compute_dtype(self) -> str:
        """Dtype whose tensor-core peak the MLP/expert GEMMs (most weights and FLOPs) run at."""
        uniform = self.for_module("experts")
        if uniform._weight_only:
            return uniform.activation_dtype
        if uniform.weights in FP4_FORMATS:
            return "fp4"
        return uniform.weights

    @property
    def compute_dtypes(self) -> tuple[str, ...]:
        """Every dtype some GEMM of this precision runs at (each needs a peak on the GPU)."""
        dtypes = [self.for_module(m).compute_dtype for m in MODULES]
        return tuple(dict.fromkeys([*dtypes, self.activation_dtype]))

    @property
    def activation_dtype(self) -> str:
        """Dtype of activations in HBM and of the attention computation."""
        if self.activations is not None:
            return self.activations
        if self.weights in ("fp32", "bf16"):
            return self.weights
        return "fp16"

    @property
    def weight_bytes_per_element(self) -> float:
        """Bytes per weight of the default format, scales excluded."""
        return DTYPE_BYTES[self.weights]

    @property
    def kv_bytes_per_element(self) -> float:
        return DTYPE_BYTES[self.kv]

    @property
    def activation_bytes_per_element(self) -> float:
        return DTYPE_BYTES[self.activation_dtype]

    @property
    def scale_bytes_per_weight(self) -> float:
        """Bytes of scales carried per weight of the default format.

        int8/int4: one fp16 scale per ``group_size`` weights; fp4: one fp8 scale per 16;
        mxfp4: one 8-bit scale per 32; fp8 block-wise: one fp32 scale per ``fp8_block``² weights.
        """
        if self.weights in WEIGHT_ONLY_QUANT:
            return DTYPE_BYTES["fp16"] / self.group_size
        if self.weights in FP4_BLOCK:
            values, scale_bytes = FP4_BLOCK[self.weights]
            return scale_bytes / values
        if self.weights == "fp8" and self.fp8_block:
            return DTYPE_BYTES["fp32"] / self.fp8_block**2
        return 0.0

    @property
    def dequant_ops_per_weight(self) -> float:
        """Vector operations per weight to dequantise it (0 unless weight-only)."""
        return DEQUANT_OPS_PER_WEIGHT.get(self.weights, 0.0) if self._weight_only else 0.0

    def label(self) -> str:
        weights = self.weights + "".join(f",{m}={fmt}" for m, fmt in self.modules)
        return f"weights {weights}, kv {self.kv}, compute {self.compute_dtype}"

    def text(self) -> str:
        """The ``--weights`` text that parses back to these weight formats."""
        parts = [self.weights, *(f"{m}={fmt}" for m, fmt in self.modules)]
        if self.fp8_block:
            parts.append(f"fp8_block={self.fp8_block}")
        return ",".join(parts)


def _weight_dtype(text: str, where: str) -> str:
    if text not in WEIGHT_DTYPES:
        raise InputError(f"--weights: unknown dtype '{text}'{where}; allowed: {', '.join(WEIGHT_DTYPES)}")
    return text


def _positive_int(key: str, value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise InputError(f"--weights: {key} needs a positive integer (got '{value}')")
    return number


def parse_precision(weights: str, kv: str, group_size: int = 128) -> Precision:
    """Build a Precision from CLI strings, with a clear error for an unknown dtype or module.

    ``weights`` is a format (``fp8``) or a comma-separated list: a default format and
    ``module=format`` overrides (``bf16,mlp=fp8``; modules: attention, mlp, experts, router,
    embedding, lm_head), plus ``fp8_block=N`` (fp8 scales per N x N block) and
    ``group_size=N`` (int8/int4 weights per scale). Without a bare default, modules not
    named use bf16 when some entry is bf16, else fp16.
    """
    if kv not in KV_DTYPES:
        raise InputError(f"--kv: unknown dtype '{kv}'; allowed: {', '.join(KV_DTYPES)}")
    default: str | None = None
    modules: dict[str, str] = {}
    fp8_block = 0
    for entry in (part.strip() for part in str(weights).split(",")):
        if not entry:
            raise InputError(f"--weights: empty entry in '{weights}'")
        key, sep, value = entry.partition("=")
        key, value = key.strip(), value.strip()
        if not sep:
            if default is not None:
                raise InputError(f"--weights: two default formats ('{default}', '{key}') in '{weights}'")
            default = _weight_dtype(key, "")
        elif key == "fp8_block":
            fp8_block = _positive_int(key, value)
        elif key == "group_size":
            group_size = _positive_int(key, value)
        elif key in MODULES:
            if key in modules:
                raise InputError(f"--weights: module '{key}' given twice in '{weights}'")
            modules[key] = _weight_dtype(value, f" for module '{key}'")
        else:
            raise InputError(
                f"--weights: unknown module '{key}' in '{weights}'; allowed: {', '.join(MODULES)}, fp8_block, group_size"
            )
    if default is None:
        if not modules:
            raise InputError(f"--weights: no format in '{weights}'; allowed: {', '.join(WEIGHT_DTYPES)}")
        default = "bf16" if "bf16" in modules.values() else "fp16"
    if group_size < 1:
        raise InputError(f"--group-size: must be >= 1 (got {group_size})")
    activations = None
    if modules and DTYPE_BYTES[default] < 2:
        activations = "bf16" if "bf16" in modules.values() else "fp16"
    # Every value was checked against WEIGHT_DTYPES / KV_DTYPES / MODULES above; pydantic checks again.
    return Precision.model_validate({
        "weights": default,
        "kv": kv,
        "group_size": group_size,
        "modules": tuple(modules.items()),
        "activations": activations,
        "fp8_block": fp8_block,
    })
