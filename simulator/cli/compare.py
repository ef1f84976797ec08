"""``simulate compare``: MHA / GQA / MQA side by side across context lengths."""

from __future__ import annotations

from typing import Any

import click

from simulator.cli.options import (
    apply_options,
    one_output_format,
    reports_input_errors,
    settings_from_cli,
    settings_options,
)
from simulator.model import load_model
from simulator.model.precision import parse_precision
from simulator.plan.deployment_planner import gpu_from_options, weights_format
from simulator.plan.settings import DeploymentSettings
from simulator.report.compare import (
    Comparison,
    compare_attention,
    parse_contexts,
    parse_list,
    text_table,
)
from simulator.tabular import to_csv, to_json
from simulator.units import fmt_bytes, fmt_rate, fmt_seconds

EPILOG = """\b
Examples:
  simulate compare --model llama2-70b --gpu a100 --attention mha,gqa:8,mqa --ctx 512,4096,32768
  simulate compare --model llama2-7b --gpu h100 --attention mha,gqa:4,mqa --ctx 2048 --kv fp8
  simulate compare --model llama2-70b --gpu a100 --attention mha,mqa --ctx 4096 --tp 8 --json

\b
Contexts beyond the model's trained maximum (4096 for Llama 2) are evaluated
analytically and flagged with '*': the memory and bandwidth arithmetic holds, but the
model would need RoPE scaling or fine-tuning to use such a context well.
"""



# compare takes a list for --attention, so the shared single-variant option is replaced.
COMPARE_OPTIONS = settings_options(DeploymentSettings, exclude=("attention",)) + [
    click.option("--attention", "attention", metavar="LIST", default="mha,gqa:8,mqa", show_default=True,
                 help="Comma-separated attention variants: mha, mqa, gqa:N."),
]


def comparison_text(comparison: Comparison) -> str:
    model, gpu, precision = comparison.model, comparison.gpu, comparison.precision
    batch = comparison.rows[0].batch
    tp_note = ""
    if comparison.tp_auto:
        tp_note = (" (the largest degree tried: not every row fits one sequence even there)"
                   if any(row.max_batch == 0 for row in comparison.rows)
                   else " (smallest degree at which every row fits one sequence)")
    lines = [
        f"memwall compare: {model.name} on {comparison.tp}x {gpu.name}{tp_note}",
        f"{precision.label()}; decode step at batch {batch}, and at the largest batch that fits",
        "",
    ]
    headers = ["attention", "KV heads", "ctx", "KV/token", "KV/sequence", f"step @{batch}",
               "max batch", "step @max", "decode tokens/s @max"]
    rows = []
    for r in comparison.rows:
        rows.append([
            r.attention_kind,
            str(r.kv_heads),
            f"{r.ctx}{'*' if r.beyond_max_context else ''}",
            fmt_bytes(r.kv_bytes_per_token),
            fmt_bytes(r.kv_bytes_per_sequence),
            fmt_seconds(r.decode_step_seconds) + ("" if r.fits_batch else " (no fit)"),
            str(r.max_batch) if r.max_batch else "does not fit",
            fmt_seconds(r.max_batch_step_seconds) if r.max_batch_step_seconds else "-",
            fmt_rate(r.max_batch_tokens_per_second, "") if r.max_batch_tokens_per_second else "-",
        ])
    lines += text_table(headers, rows, align_right={1, 2, 3, 4, 5, 6, 7, 8})
    if comparison.beyond_max_context:
        lines += ["", f"* beyond the {model.max_context}-token context {model.name} was trained for: "
                      "evaluated analytically (needs RoPE scaling or a long-context fine-tune to be usable)"]
    lines += ["", "KV/token covers all layers (2 x layers x KV heads x head dim x bytes); memory per GPU = "
                  "weights + KV cache + workspace + runtime reserve (see `simulate --help`)."]
    return "\n".join(lines)


@click.command("compare", epilog=EPILOG)
@apply_options(COMPARE_OPTIONS)
@click.option("--ctx", "-c", "contexts", metavar="LIST", default="512,4096,32768", show_default=True,
              help="Comma-separated context lengths (tokens per sequence) to compare.")
@click.option("--batch", "-b", type=click.IntRange(min=1), default=1, show_default=True,
              help="Batch for the 'step @batch' column.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object (SI units).")
@click.option("--csv", "as_csv", is_flag=True, help="Print one CSV row per cell.")
@reports_input_errors
def compare_command(contexts: str, batch: int, as_json: bool, as_csv: bool, **options: Any) -> None:
    """Compare attention variants: KV bytes, decode step, max batch, throughput.

    Each variant in --attention turns the model into its MHA, GQA-N or MQA form with
    everything else equal; each is evaluated at every --ctx. All rows use one
    tensor-parallel degree (--tp, or the smallest at which every row fits one sequence).
    """
    one_output_format(as_json, as_csv)
    variants = options.pop("attention")
    settings = settings_from_cli(DeploymentSettings, options)
    model = load_model(settings.model)
    gpu = gpu_from_options(settings.model_dump())
    precision = parse_precision(weights_format(model, settings.weights), settings.kv, settings.group_size)
    attention = parse_list(variants, "--attention")
    comparison = compare_attention(
        model, gpu, precision, attention, parse_contexts(contexts), batch=batch, tp=settings.tp,
        attention_kernel=settings.attention_kernel or "flash", fusion=settings.fusion or "elementwise",
    )
    rows = [r.as_dict() for r in comparison.rows]
    if as_json:
        click.echo(to_json({"model": model.name, "gpu": gpu.name, "tp": comparison.tp,
                               "max_context": model.max_context, "precision": precision.model_dump(),
                               "rows": rows}, indent=2))
    elif as_csv:
        click.echo(to_csv(rows), nl=False)
    else:
        click.echo(comparison_text(comparison))
