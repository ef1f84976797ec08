"""Workload, scheduler, KV-cache and SLO options of the main command, and its progress bar.

Every option defaults to None here so that :func:`simulator.plan.run.run_from_options` applies
one set of defaults (``simulator.plan.run.ENGINE_DEFAULTS``) for the CLI and sweeps alike.
"""

from __future__ import annotations

import sys
import time
from typing import Callable

import click

from simulator.engine.scheduler import SCHEDULERS

ENGINE_OPTIONS = [
    click.option("--requests", type=int, default=None, help="Requests to simulate. [default: 1000 with --qps, else --batch]"),
    click.option("--qps", type=float, default=None, help="Open-loop arrivals at this many requests/s (else a closed batch at t=0)."),
    click.option("--arrival", type=click.Choice(["poisson", "gamma"]), default=None, help="Inter-arrival distribution with --qps. [default: poisson]"),
    click.option("--burstiness", type=float, default=None, help="Gamma arrivals: squared coefficient of variation of the gaps (1 = Poisson, >1 burstier). [default: 1]"),
    click.option("--trace", type=click.Path(dir_okay=False), default=None, help="CSV/JSONL trace: arrival time, prompt and output tokens per request (Azure LLM trace CSV read as published)."),
    click.option("--trace-speedup", type=float, default=None, help="Replay the trace this many times faster. [default: 1]"),
    click.option("--prompt-tokens", metavar="SPEC", default=None, help="Prompt lengths: N, uniform:LO:HI or normal:MEAN:STD. [default: ctx - gen, or the trace's]"),
    click.option("--output-tokens", metavar="SPEC", default=None, help="Output lengths: N, uniform:LO:HI or normal:MEAN:STD. [default: gen, or the trace's]"),
    click.option("--scheduler", type=click.Choice(SCHEDULERS), default=None, help="static batches, continuous (Orca/vLLM) or chunked prefill (Sarathi). [default: continuous]"),
    click.option("--max-num-seqs", type=int, default=None, help="Most sequences running at once. [default: 256]"),
    click.option("--max-batched-tokens", type=int, default=None, help="Token budget per iteration. [default: 2048 chunked, none continuous]"),
    click.option("--block-size", type=int, default=None, help="Tokens per KV-cache block. [default: 16]"),
    click.option("--gpu-memory-utilization", type=float, default=None, help="Fraction of GPU memory the server may use. [default: 0.9]"),
    click.option("--kv-blocks", type=int, default=None, help="Override the KV-cache capacity, in blocks (what-if)."),
    click.option("--slo-ttft", type=float, default=None, help="TTFT objective in seconds (for goodput)."),
    click.option("--slo-tpot", type=float, default=None, help="TPOT objective in seconds (for goodput)."),
    click.option("--seed", type=int, default=None, help="Seed of arrivals and sampled lengths. [default: 0]"),
    click.option("--per-request", type=click.Path(dir_okay=False, writable=True), default=None, help="Write one CSV row per request to this file."),
    click.option("--quiet", "-q", is_flag=True, help="No progress bar."),
]


class ProgressBar:
    """A click progress bar on stderr that appears only after a second of wall time, on a TTY, unless quiet."""

    def __init__(self, quiet: bool, delay_seconds: float = 1.0) -> None:
        self.enabled = not quiet and sys.stderr.isatty()
        self.start = time.perf_counter()
        self.delay = delay_seconds
        self.bar = None

    def callback(self) -> Callable[[int, int], None] | None:
        return self.update if self.enabled else None

    def update(self, done: int, total: int) -> None:
        """``done`` of ``total`` requests finished (completed or rejected)."""
        if self.bar is None:
            if time.perf_counter() - self.start < self.delay:
                return
            self.bar = click.progressbar(length=total, label="simulating requests", file=sys.stderr)
            self.bar.__enter__()
        self.bar.update(done - self.bar.pos)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None
