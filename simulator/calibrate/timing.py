"""Timing one call of a function on a device: warm-up, several repeats, the median.

On CUDA the calls are captured in a CUDA graph and timed with CUDA events around the graph's
replay, so the time is the device's and not Python's launch rate (eager launches are
timed instead when a capture fails). On CPU, ``time.perf_counter`` around the calls.
A timer is any callable ``timer(fn) -> seconds per call``; tests pass fakes.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol


class Timer(Protocol):
    def __call__(self, fn: Callable[[], Any]) -> float:
        """Median seconds of one call of ``fn``."""


def calls_per_repeat(one_call_seconds: float, target_seconds: float, most: int) -> int:
    """Calls timed together so that one repeat lasts about ``target_seconds`` (1 to ``most``).

    Short kernels are timed in groups because one event pair cannot resolve a few microseconds.
    """
    if one_call_seconds <= 0:
        return most
    return int(max(1, min(most, -(-target_seconds // one_call_seconds))))


@dataclass
class CpuTimer:
    """``time.perf_counter`` around groups of calls; the median group, divided by its size."""

    warmup: int = 2
    repeats: int = 5
    target_seconds: float = 1e-3
    most_calls: int = 16
    method: str = "time.perf_counter"

    def __call__(self, fn: Callable[[], Any]) -> float:
        for _ in range(self.warmup):
            fn()
        start = time.perf_counter()
        fn()
        inner = calls_per_repeat(time.perf_counter() - start, self.target_seconds, self.most_calls)
        samples = []
        for _ in range(self.repeats):
            start = time.perf_counter()
            for _ in range(inner):
                fn()
            samples.append((time.perf_counter() - start) / inner)
        return statistics.median(samples)


@dataclass
class CudaTimer:
    """CUDA events around the replay of a CUDA graph of ``inner`` calls; the median replay / inner."""

    torch: Any
    warmup: int = 3
    repeats: int = 10
    target_seconds: float = 2e-3
    most_calls: int = 64
    use_graphs: bool = True
    graph_failures: int = 0
    method: str = "CUDA events around CUDA-graph replays"
    failures: list[str] = field(default_factory=list)

    def _elapsed(self, run: Callable[[], Any]) -> float:
        cuda = self.torch.cuda
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3  # elapsed_time is in milliseconds

    def _graph(self, fn: Callable[[], Any], inner: int) -> Callable[[], Any] | None:
        cuda = self.torch.cuda
        try:
            # Libraries allocate workspaces on first use; do that on a side stream before capture.
            side = cuda.Stream()
            side.wait_stream(cuda.current_stream())
            with cuda.stream(side):
                fn()
            cuda.current_stream().wait_stream(side)
            graph = cuda.CUDAGraph()
            with cuda.graph(graph):
                for _ in range(inner):
                    fn()
        except Exception as exc:  # a case that cannot be captured is timed eagerly
            self.graph_failures += 1
            self.failures.append(f"{type(exc).__name__}: {str(exc)[:120]}")
            cuda.synchronize()
            return None
        return graph.replay

    def __call__(self, fn: Callable[[], Any]) -> float:
        for _ in range(self.warmup):
            fn()
        self.torch.cuda.synchronize()
        inner = calls_per_repeat(self._elapsed(fn), self.target_seconds, self.most_calls)
        run = self._graph(fn, inner) if self.use_graphs else None
        if run is None:
            def run() -> None:
                for _ in range(inner):
                    fn()
        run()
        samples = [self._elapsed(run) / inner for _ in range(self.repeats)]
        return statistics.median(samples)


def make_timer(torch: Any, device: str, warmup: int, repeats: int, target_seconds: float) -> Timer:
    """The timer for ``device`` ('cuda' or 'cpu')."""
    if device == "cuda":
        return CudaTimer(torch, warmup=warmup, repeats=repeats, target_seconds=target_seconds)
    return CpuTimer(warmup=warmup, repeats=repeats, target_seconds=target_seconds)
