"""Reading YAML/JSON config files and resolving shipped config names.

Everything is read locally with ``yaml.safe_load`` / ``json.load``; nothing is fetched.
Errors become :class:`InputError` naming the file, the line or field, and what is allowed.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
from pathlib import Path
from typing import Any

import pydantic
import yaml

from simulator.errors import InputError

_CONFIG_DIR_ENV = "MEMWALL_CONFIG_DIR"


def config_root() -> Path:
    """The folder holding ``models/`` and ``gpus/``: $MEMWALL_CONFIG_DIR or the repo's ``configs/``."""
    override = os.environ.get(_CONFIG_DIR_ENV)
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[2] / "configs"


def read_mapping(path: Path) -> dict[str, Any]:
    """Parse a YAML or JSON file into a dict; malformed files raise InputError with file and line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read ({exc.strerror})") from None
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{exc.lineno}: malformed JSON: {exc.msg}") from None
    else:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
            problem = getattr(exc, "problem", None) or str(exc)
            raise InputError(f"{where}: malformed YAML: {problem}") from None
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a mapping of fields at the top level, got {type(data).__name__}")
    return data


def format_validation_error(source: str, exc: pydantic.ValidationError) -> str:
    """One line per problem: ``source: field 'a.b': message (got value)``."""
    problems = []
    for err in exc.errors():
        field = ".".join(str(part) for part in err["loc"]) or "(top level)"
        got = err.get("input")
        shown = "" if isinstance(got, dict) or got is None else f" (got {got!r})"
        problems.append(f"{source}: field '{field}': {err['msg']}{shown}")
    return "; ".join(problems)


def validate(model_cls: type[pydantic.BaseModel], data: dict[str, Any], source: str) -> Any:
    """Build ``model_cls`` from ``data``, turning validation errors into InputError."""
    try:
        return model_cls.model_validate(data)
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
    return validate(model_cls, read_mapping(Path(path)), path)
