"""The ``simulate`` command line (click).

``simulate --model M --gpu G --batch B --ctx T`` prints the report of one run; sub-commands
list configs, show per-operator tables, and so on. Bad input exits with code 2 and one line.
"""

from __future__ import annotations

from typing import Any

import click

from simulator.cli.calibrate import calibrate_command
from simulator.cli.compare import compare_command
from simulator.cli.engine_options import PRESENTATION_OPTIONS, ProgressBar
from simulator.cli.explain import explain_command
from simulator.cli.layers import layers_command
from simulator.cli.listing import engines_command, gpus_command, models_command
from simulator.cli.options import (
    VLLM_OPTIONS,
    apply_options,
    one_output_format,
    reports_input_errors,
    settings_from_cli,
    settings_options,
)
from simulator.cli.roofline import roofline_command
from simulator.cli.sweep import sweep_command
from simulator.cli.validate import validate_command
from simulator.errors import InputError
from simulator.files import atomic_write, check_output_folder, check_output_path
from simulator.plan.result import engine_run_dict
from simulator.plan.run import simulate_settings
from simulator.plan.settings import RunSettings
from simulator.report.deploy import check_deployable, deployment_text, write_deployment
from simulator.report.html import check_html_path
from simulator.report.html.run import write_run_html
from simulator.report.run_report import engine_run_text, write_per_request_csv
from simulator.report.vllm_format import (
    launch_command,
    parse_metrics,
    parse_percentiles,
    vllm_result_block,
    vllm_result_json,
)
from simulator.tabular import flatten, to_csv, to_json

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
  simulate models ; simulate gpus ; simulate engines
"""


@click.group(invoke_without_command=True, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@apply_options(settings_options(RunSettings) + VLLM_OPTIONS + PRESENTATION_OPTIONS)
@click.version_option(package_name="memwall")
@click.pass_context
@reports_input_errors
def main(click_ctx: click.Context, **values: Any) -> None:
    """Simulate transformer inference: latency, throughput and memory of MODEL on GPU.

    Each operator is charged roofline time, max(FLOPs / achievable FLOP/s, bytes /
    achievable bandwidth), plus what a weight-streaming kernel cannot overlap of the
    shorter (loads and MMAs in series), kernel launch and tensor-parallel all-reduce costs.
    Efficiency factors are shown in the report and can be overridden.

    Requests are served by a discrete-event engine: a closed batch of --batch requests
    at t=0 by default, or open-loop arrivals (--qps) or a trace (--trace); a scheduler
    (--scheduler) forms each iteration, a paged KV cache limits admission, and every
    iteration is charged by the cost model. Latencies are reported as mean/p50/p90/p99.

    vLLM's benchmark flags are accepted with their vLLM meaning (--input-len, --output-len,
    --num-prompts, --request-rate, --max-num-batched-tokens, -tp/--tensor-parallel-size,
    --kv-cache-dtype, --enable-chunked-prefill, --goodput); --result-format vllm prints
    vLLM's result block and --save-result writes its JSON keys.
    """
    if click_ctx.invoked_subcommand is not None:
        return
    shown = {name: values.pop(name) for name in PRESENTATION_NAMES}
    if not values.get("model") and not values.get("gpu"):
        if any(value not in (None, False, ()) for value in values.values()) or shown["as_json"] or shown["as_csv"]:
            # Options without a model and GPU are a mistake, not a request for help (and --json must stay JSON).
            raise InputError("--model and --gpu are required (e.g. --model llama2-70b --gpu a100; "
                             "`simulate models` and `simulate gpus` list them)")
        click.echo(click_ctx.get_help())
        return
    one_output_format(shown["as_json"], shown["as_csv"])
    percentiles = parse_percentiles(shown["metric_percentiles"])
    for option, path, suffixes in (("--per-request", shown["per_request"], (".csv",)), ("--save-result", shown["save_result"], (".json",))):
        if path:
            check_output_path(path, option, suffixes)
    if shown["records"]:
        check_output_folder(shown["records"], "--records")
    if shown["html_path"]:
        check_html_path(shown["html_path"])  # before the run, as the other output paths
    if shown["deploy"]:
        check_output_folder(shown["deploy"][1], "--deploy")  # before the run: a long run is never lost to a bad folder
    settings = settings_from_cli(RunSettings, values)
    if shown["deploy"]:
        check_deployable(settings, shown["deploy"][0])
    progress = ProgressBar(shown["quiet"])
    try:
        run = simulate_settings(settings, progress.callback(), records=shown["records"])
    finally:
        progress.close()
    for note in run.notes:
        click.echo(f"warning: {note}", err=True)
    if shown["per_request"]:
        try:
            write_per_request_csv(run, shown["per_request"])
        except OSError as exc:
            raise InputError(f"--per-request: cannot write {shown['per_request']}: {exc.strerror}") from None
    if shown["save_result"]:
        atomic_write(shown["save_result"], to_json(vllm_result_json(run, percentiles)), "--save-result")
    if shown["html_path"]:
        write_run_html(run, shown["html_path"])
    if shown["as_json"]:
        click.echo(to_json(engine_run_dict(run), indent=2))
    elif shown["as_csv"]:
        click.echo(to_csv([flatten(engine_run_dict(run))]), nl=False)
    elif shown["result_format"] == "vllm":
        click.echo(vllm_result_block(run, percentiles, parse_metrics(shown["percentile_metrics"])))
    else:
        click.echo(engine_run_text(run, shown["top"]))
    if shown["launch_command"]:
        # After --json/--csv the command goes to stderr: stdout stays one parseable document.
        machine = shown["as_json"] or shown["as_csv"]
        click.echo("", err=machine)
        click.echo(launch_command(run, shown["launch_command"]), err=machine)
    if shown["deploy"]:
        platform, folder = shown["deploy"]
        written, notes = write_deployment(run, platform, folder)
        # Beside the launch commands; on stderr after --json/--csv, as they are.
        click.echo(deployment_text(platform, written, notes), err=shown["as_json"] or shown["as_csv"])


PRESENTATION_NAMES = (
    "top", "as_json", "as_csv", "result_format", "save_result", "metric_percentiles", "percentile_metrics", "launch_command",
    "per_request", "quiet", "records", "deploy", "html_path",
)


for command in (
    layers_command,
    models_command,
    gpus_command,
    engines_command,
    compare_command,
    roofline_command,
    explain_command,
    sweep_command,
    validate_command,
    calibrate_command,
):
    main.add_command(command)
