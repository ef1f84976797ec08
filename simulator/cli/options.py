"""Options shared by the commands that build a deployment (main, layers, ...)."""

from __future__ import annotations

import functools
from typing import Any, Callable

import click

from simulator.errors import InputError
from simulator.model.layers import ATTENTION_KERNELS, FUSIONS
from simulator.model.precision import KV_DTYPES, WEIGHT_DTYPES


class CLIInputError(click.ClickException):
    """Bad input: printed as one line, exit code 2."""

    exit_code = 2


def reports_input_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn InputError raised anywhere below a command into a one-line error and exit 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except InputError as exc:
            raise CLIInputError(str(exc)) from None

    return wrapper


MODEL_OPTIONS = [
    click.option("--model", "-m", metavar="NAME|PATH", help="Shipped model name (see `simulate models`), a model YAML, or a HuggingFace config.json."),
    click.option("--gpu", "-g", metavar="NAME|PATH", help="Shipped GPU name or alias (see `simulate gpus`), or a GPU YAML (e.g. a measured overlay)."),
    click.option("--weights", type=click.Choice(WEIGHT_DTYPES), default="fp16", show_default=True, help="Weight dtype. int8/int4 are weight-only (fp16 compute); fp8 computes on fp8 tensor cores."),
    click.option("--kv", type=click.Choice(KV_DTYPES), default="fp16", show_default=True, help="KV-cache dtype."),
    click.option("--group-size", type=click.IntRange(min=1), default=128, show_default=True, help="Weights per fp16 scale for int8/int4."),
    click.option("--attention", "attention", metavar="mha|mqa|gqa:N", default=None, help="Turn the model into its MHA, MQA or GQA-N variant."),
    click.option("--tp", type=int, default=None, help="Tensor-parallel degree. Default: smallest power of two that fits."),
    click.option("--attention-kernel", type=click.Choice(ATTENTION_KERNELS), default="flash", show_default=True, help="flash keeps scores in SRAM; naive writes the score matrix to HBM."),
    click.option("--fusion", type=click.Choice(FUSIONS), default="elementwise", show_default=True, help="Operator fusion: none, elementwise (into GEMMs), full (also the attention block)."),
    click.option("--compute-efficiency", type=click.FloatRange(0, 1, min_open=True), default=None, help="Override the GPU's achievable fraction of peak FLOP/s."),
    click.option("--memory-efficiency", type=click.FloatRange(0, 1, min_open=True), default=None, help="Override the GPU's achievable fraction of HBM bandwidth."),
    click.option("--link-efficiency", type=click.FloatRange(0, 1, min_open=True), default=None, help="Override the achievable fraction of interconnect bandwidth."),
    click.option("--launch-overhead", type=click.FloatRange(min=0), default=None, help="Override the fixed cost per kernel, in seconds."),
]

WORKLOAD_OPTIONS = [
    click.option("--batch", "-b", type=int, default=1, show_default=True, help="Sequences in the batch."),
    click.option("--ctx", "-c", "ctx_tokens", type=int, default=2048, show_default=True, help="Context tokens each sequence reaches at the end (prompt + generated)."),
    click.option("--gen", type=int, default=128, show_default=True, help="Output tokens per sequence (prompt = ctx - gen)."),
]


def apply_options(options: list[Callable[..., Any]]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            func = option(func)
        return func

    return decorate
