"""What an operator does in one step (:class:`Work`), the FLOPs per element of the elementwise ones, and the
scalar-or-array helpers the operators share.

Split from :mod:`simulator.model.operators` so that the operators of
:mod:`simulator.model.sparse_linear_operators` use the same ``Work`` without a circle of imports.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simulator.model.step import Number

# Approximate vector FLOPs per element of the elementwise operators (they are always
# memory-bound, so these only matter for FLOP totals): RMSNorm/LayerNorm ~4 (square,
# sum, scale, weight), rotary 3 (two multiplies and an add), residual add 1,
# activation 4 (SiLU/GELU: exp, add, divide, multiply), softmax 5 (max, subtract, exp, sum, divide).
NORM_FLOPS_PER_ELEMENT = 4.0


ROTARY_FLOPS_PER_ELEMENT = 3.0


ADD_FLOPS_PER_ELEMENT = 1.0


ACTIVATION_FLOPS_PER_ELEMENT = 4.0


SOFTMAX_FLOPS_PER_SCORE = 5.0

# The FLOP constants above live here, not in simulator.model.operators (which re-exports them), so that the operator
# modules it imports (compressed_attention_operators) share them without a circle of imports.


class Work(NamedTuple):
    """What an operator computes and moves in one step, on one GPU, per instance.

    A NamedTuple rather than a dataclass: the engine builds ~15 of these per simulated
    iteration, and tuple construction is several times cheaper.
    """

    flops: Number
    weight_bytes: Number = 0.0
    kv_read_bytes: Number = 0.0
    kv_write_bytes: Number = 0.0
    activation_bytes: Number = 0.0
    link_bytes: Number = 0.0
    launches: Number = 0.0
    dequant_ops: Number = 0.0
    """weight-only dequantisation operations (CUDA-core work, not model FLOPs)"""
    padding_flops: Number = 0.0
    """tensor-core FLOPs spent on the padding rows of grouped GEMMs (time, not model FLOPs)"""


def maximum(a: Number, b: Number) -> Number:
    """np.maximum, without its per-call overhead (~1 us) when both are plain numbers (the engine's scalar steps)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.maximum(a, b)
    return a if a >= b or a != a else b


def minimum(a: Number, b: Number) -> Number:
    """np.minimum, without its per-call overhead when both are plain numbers."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.minimum(a, b)
    return a if a <= b or a != a else b


def active(tokens: Number) -> Number:
    """1 where a step has tokens for this operator, else 0 (a kernel that does not run costs nothing)."""
    return 1.0 * (tokens > 0)
