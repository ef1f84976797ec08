"""Collective latency from a measured table: one curve in the message size per GPU count.

NVIDIA AIConfigurator times each engine's all-reduce kernel (TensorRT-LLM's, vLLM's and SGLang's
custom all-reduce, falling back to NCCL as the engine does) on 2, 4 and 8 GPUs of one node, for
messages of 128 to 2^29 bf16 elements, inside a CUDA graph (``collector/network/collect_all_reduce.py``
of ai-dynamo/aiconfigurator): the latency is the device time of one all-reduce, the GPU-side launch
included and no host launch.

Between measured sizes the latency is interpolated linearly in (log bytes, log seconds). Beyond
them the α–β shape of a collective holds: below the smallest message the time is the smallest's
(latency-bound: a few hundred bytes move in far less than the kernel's fixed cost), above the
largest it grows in proportion to the bytes (bandwidth-bound).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.cost.kernel_tables.table import mean_grid, suffix_minimum
from simulator.model.step import Number


@dataclass(frozen=True)
class MessageCurve:
    """Measured seconds of one collective on one group size, by message bytes per GPU."""

    gpus: int
    log_bytes: np.ndarray
    log_seconds: np.ndarray

    @property
    def first_bytes(self) -> float:
        return float(np.exp(self.log_bytes[0]))

    @property
    def last_bytes(self) -> float:
        return float(np.exp(self.log_bytes[-1]))

    def seconds(self, message_bytes: Number) -> Number:
        """Seconds of one collective of ``message_bytes`` per GPU (0 for an empty message)."""
        b = np.asarray(message_bytes, dtype=float)
        clipped = np.clip(b, self.first_bytes, self.last_bytes)
        inside = np.exp(np.interp(np.log(clipped), self.log_bytes, self.log_seconds))
        out = np.where(b > self.last_bytes, inside * b / self.last_bytes, inside)
        out = np.where(b > 0, out, 0.0)
        return float(out) if out.ndim == 0 else out


def message_curve(gpus: int, message_bytes: np.ndarray, seconds: np.ndarray) -> MessageCurve | None:
    """The curve of one group size from rows (bytes, seconds): duplicates averaged, then no message slower than
    a larger one (a smaller message can always run as a larger one: the excess is a kernel choice's noise).
    None with fewer than two distinct sizes."""
    (sizes,), mean = mean_grid(seconds, np.asarray(message_bytes, dtype=float))
    if len(sizes) < 2:
        return None
    smoothed, _ = suffix_minimum(mean)
    return MessageCurve(gpus, np.log(sizes), np.log(smoothed))
