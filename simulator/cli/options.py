"""Click options made from the settings models, and the one-line error wrapper of every command.

The options are read off :mod:`simulator.plan.settings` (names, help, choices, synonyms), so
a setting has one definition; click only parses the text, and the settings model checks the
values (ranges, finiteness, allowed values) and names the flag in its error.
"""

from __future__ import annotations

import functools
import types
import typing
from typing import Any, Callable, Literal

import click
from pydantic import BaseModel

from simulator.errors import InputError
from simulator.plan.settings import RunSettings, field_flag, parse_settings


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


def one_output_format(as_json: bool, as_csv: bool) -> None:
    """``--json`` and ``--csv`` are two formats of one output: a command prints one."""
    if as_json and as_csv:
        raise InputError("--json and --csv: choose one output format")


def _base_types(annotation: Any) -> list[Any]:
    """The concrete types inside Optional/Union/Annotated layers of a field's annotation."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _base_types(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [t for arg in typing.get_args(annotation) for t in _base_types(arg)]
    return [annotation]


def _click_type(annotation: Any) -> Any:
    kinds = [t for t in _base_types(annotation) if t is not type(None)]
    literal = next((t for t in kinds if typing.get_origin(t) is Literal), None)
    if literal is not None:
        return click.Choice([str(v) for v in typing.get_args(literal)])
    if int in kinds:
        return click.INT
    if float in kinds:
        return click.FLOAT
    return click.STRING


def flags_of(cls: type[BaseModel], name: str) -> list[str]:
    extra = cls.model_fields[name].json_schema_extra
    flags = extra.get("flags") if isinstance(extra, dict) else None
    return list(flags) if flags else [field_flag(name)]  # type: ignore[arg-type]


def settings_options(cls: type[BaseModel], exclude: tuple[str, ...] = ()) -> list[Callable[..., Any]]:
    """One click option per field of ``cls`` (default None: the settings model applies defaults)."""
    options = []
    for name, info in cls.model_fields.items():
        if name in exclude:
            continue
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        if bool in _base_types(info.annotation):  # an on/off switch: --name / --no-name
            flag = flags_of(cls, name)[0]
            default = info.get_default()
            # A switch whose default is None takes another setting's value (its description says which).
            shown = "" if default is None else f" [default: {'on' if default else 'off'}]"
            options.append(click.option(f"{flag}/--no-{flag[2:]}", name, default=None,
                                        help=(info.description or "") + shown))
            continue
        if extra.get("flag"):
            options.append(click.option(*flags_of(cls, name), name, is_flag=True, default=None, help=info.description or ""))
            continue
        kind = _click_type(info.annotation)
        default = info.get_default()
        shown = "" if default is None or info.is_required() else f" [default: {default}]"
        options.append(
            click.option(
                *flags_of(cls, name), name, type=kind, default=None,
                metavar=extra.get("metavar") or (None if isinstance(kind, click.Choice) else kind.name.upper()),
                help=(info.description or "") + shown,
            )
        )
    return options


# One step of one tensor-parallel group is what layers/explain/roofline cost; a pipeline of stages is not
# (the serving run models it), so those commands do not offer --pp rather than ignore it.
STEP_ONLY_EXCLUDED: tuple[str, ...] = ("pp",)


def _defaults_to_none(cls: type[BaseModel], name: str) -> bool:
    info = cls.model_fields.get(name)
    return info is not None and not info.is_required() and info.get_default() is None


def settings_from_cli(cls: type[BaseModel], values: dict[str, Any]) -> Any:
    """Validate the given (non-None) option values into ``cls``; errors name the flag typed."""
    # An unset switch reads as False; it is dropped unless the switch's default is None (--no-decode-dp-attention
    # then says "off" where the default would take --dp-attention's value).
    given = {key: value for key, value in values.items()
             if value is not None and (value is not False or _defaults_to_none(cls, key))}

    def where(name: str) -> str:
        if name in cls.model_fields:
            return flags_of(cls, name)[0]
        return field_flag(name)

    return parse_settings(cls, given, where)


def apply_options(options: list[Callable[..., Any]]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            func = option(func)
        return func

    return decorate


# vLLM benchmark flags whose values need translating (see simulator.plan.settings.VLLM_ALIASES).
VLLM_OPTIONS = [
    click.option("--request-rate", "request_rate", type=float, default=None,
                 help="vLLM spelling of --qps; inf = every request at t=0 (a closed batch of --num-prompts)."),
    click.option("--kv-cache-dtype", "kv_cache_dtype", type=click.Choice(["auto", "fp16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2", "int8"]),
                 default=None, help="vLLM spelling of --kv (auto: the default; fp8_e4m3/fp8_e5m2: fp8)."),
    click.option("--enable-chunked-prefill", "enable_chunked_prefill", is_flag=True, default=False,
                 help="vLLM spelling of --scheduler chunked."),
    click.option("--goodput", "goodput", multiple=True, metavar="ttft:MS|tpot:MS|e2el:MS",
                 help="vLLM spelling of the SLOs, in milliseconds (repeat or space-separate: --goodput 'ttft:500 tpot:50')."),
]

__all__ = [
    "CLIInputError", "RunSettings", "VLLM_OPTIONS", "apply_options", "flags_of", "reports_input_errors",
    "settings_from_cli", "settings_options",
]
