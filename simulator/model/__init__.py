"""Configuration data: GPUs, models and precisions, validated by pydantic."""

from simulator.model.architecture import (
    ModelSpec,
    list_models,
    load_model,
    with_attention,
)
from simulator.model.gpu import Efficiency, GPUSpec, list_gpus, load_gpu
from simulator.model.precision import DTYPE_BYTES, Precision

__all__ = [
    "DTYPE_BYTES",
    "Efficiency",
    "GPUSpec",
    "ModelSpec",
    "Precision",
    "list_gpus",
    "list_models",
    "load_gpu",
    "load_model",
    "with_attention",
]
