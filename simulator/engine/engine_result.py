"""What an engine run returns: per-request arrays (seconds, tokens) and the run's totals."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from simulator.engine.metrics import (
    Columns,
)
from simulator.engine.scheduler import (
    SchedulerConfig,
)
from simulator.engine.workload import Workload
from simulator.model.step import Step


@dataclass
class Totals:
    """Sums over iterations: seconds of busy time, FLOPs and HBM bytes on one GPU, time by bound."""

    busy_seconds: float = 0.0
    flops: float = 0.0
    bytes: float = 0.0
    compute_bound_seconds: float = 0.0
    memory_bound_seconds: float = 0.0
    communication_seconds: float = 0.0
    iterations: int = 0
    cost_calls: int = 0
    decode_iterations: int = 0
    """iterations with at least one decoding sequence, mixed ones (prefill chunks + decodes) included"""
    decode_flops: float = 0.0
    """FLOPs of those iterations, the prefill chunks of mixed ones included"""
    decode_bytes: float = 0.0
    """HBM bytes of those iterations, the prefill chunks of mixed ones included"""
    decode_only_iterations: int = 0
    """iterations that only decode (no prefill chunk): what a "decode step" means in the report"""
    decode_only_flops: float = 0.0
    """FLOPs of the decode-only iterations (one GPU)"""
    decode_only_bytes: float = 0.0
    """HBM bytes of the decode-only iterations (one GPU)"""


@dataclass
class EngineResult:
    """Everything a run produced; per-request arrays are indexed like the workload."""

    workload: Workload
    config: SchedulerConfig
    kv_blocks: int
    status: np.ndarray
    reject_reason: np.ndarray
    first_scheduled: np.ndarray
    first_token: np.ndarray
    finish: np.ndarray
    preemptions: np.ndarray
    log: Columns
    itl: Columns
    totals: Totals
    kv_high_water_blocks: int
    max_running: int
    first_prefill_step: Step | None = None
    first_decode_step: Step | None = None
    last_decode_step: Step | None = None
    wall_seconds: float = 0.0
    extra: dict = field(default_factory=dict)
    waited_for_kv: np.ndarray | None = None
    """bool per request: it was queued while the queue head was refused for lack of free KV blocks"""

    @property
    def total_preemptions(self) -> int:
        return int(self.preemptions.sum())
