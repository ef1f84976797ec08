"""Numeric formats: bytes per element and the rule that derives the compute dtype.

Compute-dtype rule (documented in README):
- fp32, fp16, bf16 weights: compute in the weight dtype; activations in the same dtype.
- fp8 weights: W8A8 as in TensorRT-LLM's FP8 mode, GEMMs run on fp8 tensor cores
  (the GPU must have an fp8 peak); activations are stored as fp16.
- int8 / int4 weights: weight-only quantisation (W8A16 / W4A16 as in AWQ/GPTQ/Marlin):
  weights are dequantised to fp16 inside the GEMM and the GEMM runs at the fp16 peak.
  Each group of ``group_size`` weights carries one fp16 scale.
- Attention (QK^T, softmax, PV) always computes in the activation dtype, whatever the KV dtype.
- Embedding and LM head stay in the activation dtype when weights are quantised (fp8/int8/int4),
  as the common quantisation toolkits do.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from simulator.errors import InputError

DType = Literal["fp32", "tf32", "fp16", "bf16", "fp8", "int8", "int4"]
WeightDType = Literal["fp32", "fp16", "bf16", "fp8", "int8", "int4"]
KVDType = Literal["fp16", "bf16", "fp8", "int8"]

WEIGHT_DTYPES: tuple[str, ...] = ("fp32", "fp16", "bf16", "fp8", "int8", "int4")
KV_DTYPES: tuple[str, ...] = ("fp16", "bf16", "fp8", "int8")

DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "tf32": 4.0,
    "fp16": 2.0,
    "bf16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
}

WEIGHT_ONLY_QUANT: frozenset[str] = frozenset({"int8", "int4"})

# Integer-pipe operations to turn one quantised weight into an fp16 value inside a GEMM:
# int8: convert + scale multiply; int4: shift, mask, convert, scale multiply.
DEQUANT_OPS_PER_WEIGHT: dict[str, float] = {"int8": 2.0, "int4": 4.0}


class Precision(BaseModel):
    """Weight, KV-cache and compute formats of one run.

    ``group_size``: weights sharing one fp16 scale (int8/int4 only).
    ``dequant_tile_tokens``: tokens per GEMM row tile; weight-only kernels dequantise every
    weight tile once per row tile (the fp16 copy lives in registers, never in HBM), so
    dequantisation work grows with ceil(tokens / dequant_tile_tokens). Default 16, the
    row tile of Marlin-style W4A16 kernels.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    weights: WeightDType = "fp16"
    kv: KVDType = "fp16"
    group_size: int = Field(default=128, ge=1)
    dequant_tile_tokens: int = Field(default=16, ge=1)

    @property
    def weight_only_quant(self) -> bool:
        return self.weights in WEIGHT_ONLY_QUANT

    @property
    def compute_dtype(self) -> str:
        """Dtype whose tensor-core peak the GEMMs run at (see module docstring)."""
        if self.weights in WEIGHT_ONLY_QUANT:
            return "fp16"
        return self.weights

    @property
    def activation_dtype(self) -> str:
        """Dtype of activations in HBM and of the attention computation."""
        if self.weights in ("fp32", "bf16"):
            return self.weights
        return "fp16"

    @property
    def weight_bytes_per_element(self) -> float:
        return DTYPE_BYTES[self.weights]

    @property
    def kv_bytes_per_element(self) -> float:
        return DTYPE_BYTES[self.kv]

    @property
    def activation_bytes_per_element(self) -> float:
        return DTYPE_BYTES[self.activation_dtype]

    @property
    def scale_bytes_per_weight(self) -> float:
        """Bytes of fp16 scales carried per quantised weight (0 unless int8/int4)."""
        if self.weights in WEIGHT_ONLY_QUANT:
            return DTYPE_BYTES["fp16"] / self.group_size
        return 0.0

    @property
    def dequant_ops_per_weight(self) -> float:
        return DEQUANT_OPS_PER_WEIGHT.get(self.weights, 0.0)

    def label(self) -> str:
        return f"weights {self.weights}, kv {self.kv}, compute {self.compute_dtype}"


def parse_precision(weights: str, kv: str, group_size: int = 128) -> Precision:
    """Build a Precision from CLI strings, with a clear error for an unknown dtype."""
    if weights not in WEIGHT_DTYPES:
        raise InputError(f"--weights: unknown dtype '{weights}'; allowed: {', '.join(WEIGHT_DTYPES)}")
    if kv not in KV_DTYPES:
        raise InputError(f"--kv: unknown dtype '{kv}'; allowed: {', '.join(KV_DTYPES)}")
    if group_size < 1:
        raise InputError(f"--group-size: must be >= 1 (got {group_size})")
    return Precision(weights=weights, kv=kv, group_size=group_size)
