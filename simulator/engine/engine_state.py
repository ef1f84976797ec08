"""The state one serving run shares: the per-request columns and every attribute the engine's parts read and write.

:class:`EngineState` only declares (annotates) that state, so that each part of the engine (the request window,
sequence life, admission, decode stretches, and :class:`~simulator.engine.engine.Engine` itself, which sets it all in
``__init__``) can be written as a class of its own that mypy checks against the same attributes. It holds no code.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import numpy as np

from simulator.engine.engine_result import Totals
from simulator.engine.kvcache import BlockAllocator
from simulator.engine.metrics import Columns
from simulator.engine.prefix_cache import PrefixCache
from simulator.engine.records import RecordFiles
from simulator.engine.scheduler import SchedulerConfig
from simulator.engine.workload import Workload
from simulator.model.step import Step

if TYPE_CHECKING:
    from simulator.cost.pipeline import PipelineSystem
    from simulator.cost.system import System

PER_REQUEST: dict[str, type] = {
    "arrival": np.float64, "prompt": np.int64, "output": np.int64, "prefix_id": np.int64, "prefix_blocks": np.int64,
    "shared": np.int64, "status": np.int8, "reject_reason": np.int8, "first_scheduled": np.float64,
    "first_token": np.float64, "finish": np.float64, "last_token": np.float64, "join_time": np.float64,
    "preemptions": np.int32, "queued_mark": np.int64, "waited_for_kv": np.bool_, "emitted": np.int64,
    "target": np.int64, "prefilled": np.int64, "held": np.int64, "base_cached": np.int64, "base_clock": np.int64,
    "finish_clock": np.int64, "admit_serial": np.int64, "cached_tokens": np.int64,
}
"""The engine's per-request state (name: dtype of the result array), kept as Python lists during a run: an
element of a list is read and written several times faster than one of a numpy array."""


@dataclass(frozen=True)
class InFlight:
    """A decode stretch under way: tick end times, blocks in use during each tick, and the tick index at which
    each finishing decoder is gone (see :class:`~simulator.engine.stretch.Stretch`); numpy arrays or lists."""

    ends: np.ndarray | list[float]
    used: np.ndarray | list[int]
    leave_at: np.ndarray | list[int]


class EngineState:
    """The attributes of one serving run (set by :class:`~simulator.engine.engine.Engine`'s ``__init__``)."""

    # Per-request state (PER_REQUEST), indexed by local request id (set by __init__ from _new_requests).
    arrival: list[float]
    prompt: list[int]
    output: list[int]
    prefix_id: list[int]
    prefix_blocks: list[int]
    shared: list[int]
    status: list[int]
    reject_reason: list[int]
    first_scheduled: list[float]
    first_token: list[float]
    finish: list[float]
    last_token: list[float]
    join_time: list[float]
    preemptions: list[int]
    queued_mark: list[int]
    waited_for_kv: list[bool]
    emitted: list[int]
    target: list[int]
    prefilled: list[int]
    held: list[int]
    base_cached: list[int]
    base_clock: list[int]
    finish_clock: list[int]
    admit_serial: list[int]
    cached_tokens: list[int]
    # Set up by Engine.__init__ (see there) and _client_arrivals (simulator.engine.request_window).
    system: System | PipelineSystem
    workload: Workload
    config: SchedulerConfig
    total: int
    bs: int
    incremental: bool
    fit_admission: bool
    chunked: bool
    alloc: BlockAllocator
    progress: Callable[[int, int], None] | None
    prefixes: PrefixCache | None
    load_due: float
    grow: bool
    follower: list[int] | None
    sends_on_finish: bool
    released: list[tuple[float, int]]
    think: list[float]
    roots: int
    response: float
    concurrency: int | None
    _pre: list[float]
    sent: list[float]
    next_send: int
    handed: float
    _prompts: np.ndarray
    _outputs: np.ndarray
    _reasons: np.ndarray
    _arrivals: np.ndarray
    kv_refusals: int
    records: RecordFiles | None
    window: int
    offset: int
    n: int
    # The running set and the decode clock.
    clock: int
    decoding: int
    decode_cached: int
    phase_counts: list[int]
    finish_heap: list[tuple[int, int, int]]
    admission_order: list[tuple[int, int]]
    serial: int
    waiting: deque[int]
    partials: list[int]
    running: int
    max_running: int
    next_arrival: int
    last_tick: float
    pending_joins: dict[float, int]
    done: int
    last_decode_seconds: float
    in_flight: InFlight | None
    _now: float
    # What the run records and charges.
    log: Columns
    itl: Columns
    totals: Totals
    cost_cache: dict[tuple, tuple]
    tick_costs: dict[int, Callable[[float], tuple[float, ...]] | None]
    tick_memo: dict[int, dict[float, tuple[float, ...]]]
    tick_memo_entries: list[int]
    measured_ticks: bool
    first_prefill_step: Step | None
    first_decode: list[tuple | None]
    last_decode: list[tuple | None]
