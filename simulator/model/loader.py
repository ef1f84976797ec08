"""Reading YAML/JSON config files and resolving shipped config names.

Everything is read locally through :mod:`simulator.files` (``read_mapping``: safe YAML,
strict JSON, size and depth limits); nothing is fetched. Errors become :class:`InputError`
naming the file, the line or field, and what is allowed.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
from pathlib import Path
from typing import Any

import pydantic

from simulator.errors import InputError
from simulator.files import read_mapping

# Where configs live (shipped package data, $MEMWALL_CONFIG_DIR) is simulator.model.registry's job.
__all__ = ["format_validation_error", "load_validated", "looks_like_path", "read_mapping", "suggest", "validate"]


def format_validation_error(source: str, exc: pydantic.ValidationError) -> str:
    """One line per problem: ``source: field 'a.b': message (got value)``."""
    problems = []
    for err in exc.errors():
        field = ".".join(str(part) for part in err["loc"]) or "(top level)"
        got = err.get("input")
        shown = "" if isinstance(got, dict) or got is None else f" (got {_short_repr(got)})"
        message = err["msg"].removeprefix("Value error, ")  # pydantic's prefix for our validators' ValueError
        message = re.sub(r" or instance of \w+", "", message)  # class names mean nothing to a user
        problems.append(f"{source}: field '{field}': {message}{shown}")
    if len(problems) > 5:  # a file of junk would otherwise give one line per junk field
        problems[5:] = [f"and {len(problems) - 5} more problem(s)"]
    return "; ".join(problems)


def _short_repr(value: Any, limit: int = 80) -> str:
    """repr(value) cut to ``limit`` characters: a message stays one readable line."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def validate(model_cls: type[pydantic.BaseModel], data: dict[str, Any], source: str, plausible: bool = False) -> Any:
    """Build ``model_cls`` from ``data``, turning validation errors into InputError.

    ``plausible`` asks the model's validators for their physical-plausibility bounds too
    (validation context ``{"plausible": True}``): on for data read from files.
    """
    try:
        return model_cls.model_validate(data, context={"plausible": plausible})
    except pydantic.ValidationError as exc:
        raise InputError(format_validation_error(source, exc)) from None


def suggest(name: str, known: list[str]) -> str:
    """A ``did you mean`` hint for a mistyped name, or an empty string."""
    close = difflib.get_close_matches(name.lower(), [k.lower() for k in known], n=1, cutoff=0.5)
    if not close:
        return ""
    original = {k.lower(): k for k in known}[close[0]]
    return f" (did you mean '{original}'?)"


def looks_like_path(name: str) -> bool:
    """A --model/--gpu value is a file path when it has a separator or a config suffix."""
    return os.sep in name or "/" in name or name.endswith((".yaml", ".yml", ".json"))


def load_validated(model_cls: type[pydantic.BaseModel], path: Path) -> Any:
    """``validate(model_cls, read_mapping(path))``, cached while the file is unchanged.

    Name lookups scan every shipped config; a sweep does that for every point, so the parsed,
    validated (frozen, hence shareable) objects are kept, keyed by the file's modification time.
    """
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        stamp = None
    return _load_validated(model_cls, str(path), stamp)


@functools.lru_cache(maxsize=256)
def _load_validated(model_cls: type[pydantic.BaseModel], path: str, stamp: int | None) -> Any:
    return validate(model_cls, read_mapping(Path(path)), path, plausible=True)
