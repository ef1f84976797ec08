"""The ``simulate`` command line (click).

``simulate --model M --gpu G --batch B --ctx T`` prints the report of one run; sub-commands
list configs, show per-operator tables, and so on. Bad input exits with code 2 and one line.
"""

from __future__ import annotations

import json
from typing import Any

import click

from simulator.cli.calibrate import calibrate_command
from simulator.cli.compare import compare_command
from simulator.cli.engine_options import ENGINE_OPTIONS, ProgressBar
from simulator.cli.explain import explain_command
from simulator.cli.layers import layers_command
from simulator.cli.listing import gpus_command, models_command
from simulator.cli.options import (
    MODEL_OPTIONS,
    WORKLOAD_OPTIONS,
    apply_options,
    reports_input_errors,
)
from simulator.cli.roofline import roofline_command
from simulator.cli.sweep import sweep_command
from simulator.cli.validate import validate_command
from simulator.errors import InputError
from simulator.plan.result import engine_run_dict
from simulator.report.run_report import engine_run_text, write_per_request_csv
from simulator.tabular import flatten, to_csv

EPILOG = """\b
Examples:
  simulate --model llama2-70b --gpu a100 --batch 64 --ctx 4096
  simulate --model llama2-7b --gpu h100 --batch 1 --ctx 2048 --weights int4 --json
  simulate --model llama2-70b --gpu a100 --attention mha --tp 8
  simulate --model llama3-8b --gpu h100 --qps 10 --requests 2000 --scheduler chunked
  simulate --model llama3-8b --gpu h100 --qps 5 --output-tokens uniform:16:512 --slo-ttft 0.5 --slo-tpot 0.05
  simulate --model llama3-8b --gpu h100 --trace azure.csv --trace-speedup 4 --per-request out.csv
  simulate layers --model llama2-7b --gpu a100 --batch 1 --ctx 1024 --phase decode
  simulate compare --model llama2-70b --gpu a100 --attention mha,gqa:8,mqa --ctx 512,4096
  simulate explain --model llama2-70b --gpu a100 --batch 64 --ctx 4096
  simulate sweep scenarios/slo-capacity.yaml
  simulate models ; simulate gpus
"""


@click.group(invoke_without_command=True, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@apply_options(MODEL_OPTIONS + WORKLOAD_OPTIONS + ENGINE_OPTIONS)
@click.option("--top", type=click.IntRange(min=1), default=6, show_default=True, help="Operators shown per phase in the report.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (SI units) instead of the report.")
@click.option("--csv", "as_csv", is_flag=True, help="Print a header and one CSV row (flattened keys).")
@click.version_option(package_name="memwall")
@click.pass_context
@reports_input_errors
def main(
    click_ctx: click.Context, top: int, as_json: bool, as_csv: bool, batch: int, ctx_tokens: int, gen: int,
    per_request: str | None, quiet: bool, **options: Any
) -> None:
    """Simulate transformer inference: latency, throughput and memory of MODEL on GPU.

    Each operator is charged roofline time, max(FLOPs / achievable FLOP/s, bytes /
    achievable bandwidth), plus kernel launch and tensor-parallel all-reduce costs.
    Efficiency factors are shown in the report and can be overridden.

    Requests are served by a discrete-event engine: a closed batch of --batch requests
    at t=0 by default, or open-loop arrivals (--qps) or a trace (--trace); a scheduler
    (--scheduler) forms each iteration, a paged KV cache limits admission, and every
    iteration is charged by the cost model. Latencies are reported as mean/p50/p90/p99.
    """
    if click_ctx.invoked_subcommand is not None:
        return
    if not options.get("model") and not options.get("gpu"):
        click.echo(click_ctx.get_help())
        return
    from simulator.plan.run import (
        simulate_from_options,  # here: simulator.plan.run imports simulator.cli.options
    )

    settings = {**{k: v for k, v in options.items() if v is not None}, "batch": batch, "ctx": ctx_tokens, "gen": gen}
    progress = ProgressBar(quiet)
    try:
        run = simulate_from_options(settings, progress.callback())
    finally:
        progress.close()
    for note in run.workload.notes:
        click.echo(f"warning: {note}", err=True)
    if per_request:
        try:
            write_per_request_csv(run, per_request)
        except OSError as exc:
            raise InputError(f"--per-request: cannot write {per_request}: {exc.strerror}") from None
    if as_json:
        click.echo(json.dumps(engine_run_dict(run), indent=2))
    elif as_csv:
        click.echo(to_csv([flatten(engine_run_dict(run))]), nl=False)
    else:
        click.echo(engine_run_text(run, top))


for command in (
    layers_command,
    models_command,
    gpus_command,
    compare_command,
    roofline_command,
    explain_command,
    sweep_command,
    validate_command,
    calibrate_command,
):
    main.add_command(command)
