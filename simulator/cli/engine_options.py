"""Presentation options of the main command (output files, formats) and its progress bar."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Callable

import click

if TYPE_CHECKING:
    # What click.progressbar returns; click exports it only from this private module.
    from click._termui_impl import ProgressBar as ClickProgressBar

PRESENTATION_OPTIONS = [
    click.option("--top", type=click.IntRange(min=1, max=1000), default=6, show_default=True, help="Operators shown per phase in the report."),
    click.option("--json", "as_json", is_flag=True, help="Print one JSON object (SI units) instead of the report."),
    click.option("--csv", "as_csv", is_flag=True, help="Print a header and one CSV row (flattened keys)."),
    click.option("--result-format", type=click.Choice(["memwall", "vllm"]), default="memwall", show_default=True,
                 help="vllm: print the result block of vLLM's benchmark_serving, to diff against a measured run."),
    click.option("--save-result", metavar="PATH", default=None,
                 help="Write the result as JSON with vLLM benchmark_serving's keys (times in ms) to PATH."),
    click.option("--metric-percentiles", metavar="LIST", default="99",
                 help="Percentiles of TTFT/TPOT/ITL/E2EL in the vLLM block and --save-result, e.g. 50,90,99. [default: 99]"),
    click.option("--percentile-metrics", metavar="LIST", default="ttft,tpot,itl", show_default=True,
                 help="Latencies with percentile lines in the vLLM block: any of ttft, tpot, itl, e2el."),
    click.option("--launch-command", type=click.Choice(["vllm", "sglang"]), default=None,
                 help="Also print the command that launches this deployment on that engine."),
    click.option("--deploy", nargs=2, type=(click.Choice(["k8s", "llm-d", "dynamo"]), str), default=None,
                 metavar="PLATFORM DIR",
                 help="Also write the manifests that deploy this configuration to DIR: k8s (Deployment + Service), "
                      "llm-d (model servers, InferencePool, endpoint picker) or dynamo (DynamoGraphDeployment)."),
    click.option("--html", "html_path", metavar="PATH", default=None,
                 help="Also write a self-contained HTML report with interactive charts (latency distributions, batch "
                      "and KV use over time, step time by term) to PATH (.html; needs plotly: pip install 'memwall[html]')."),
    click.option("--per-request", metavar="PATH", default=None, help="Write one CSV row per request to this file."),
    click.option("--records", metavar="DIR", default=None,
                 help="Stream the per-request records and the iteration log to binary columns in DIR while the run "
                      "goes, holding only a window of requests in memory (for 10^6-10^7 requests; one replica)."),
    click.option("--quiet", "-q", is_flag=True, help="No progress bar."),
]


class ProgressBar:
    """A click progress bar on stderr that appears only after a second of wall time, on a TTY, unless quiet."""

    def __init__(self, quiet: bool, delay_seconds: float = 1.0) -> None:
        self.enabled = not quiet and sys.stderr.isatty()
        self.start = time.perf_counter()
        self.delay = delay_seconds
        self.bar: ClickProgressBar[int] | None = None

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
