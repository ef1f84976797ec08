"""The one way user files are read and output files written.

Every reader (model/GPU configs, scenarios, measurement tables, calibration timings, sweep
results for --resume, traces) goes through :func:`read_text` or :func:`read_mapping`, so
every bad file becomes one :class:`InputError` line naming the file and what is wrong:
missing, a folder, unreadable, too large, not UTF-8 (with the byte offset), malformed
YAML/JSON (with the line), nested too deeply, or a YAML tag whose value does not convert
(``!!float abc``). A UTF-8 byte-order mark is accepted and dropped.

Outputs are checked with :func:`check_output_path` before any work starts (so a long run is
never lost at the end) and written with :func:`atomic_write` (a temporary file in the same
folder, then a rename: a failure leaves neither a partial file nor the temporary behind).
"""

from __future__ import annotations

import csv
import json
import math
import os
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from simulator.errors import InputError

# A config or scenario is a few KiB; 16 MiB leaves room for a calibration timings file.
MAPPING_LIMIT_BYTES = 16 * 2**20
# Data tables (traces, sweep results, measurement tables): a day-long trace of 10^6 requests
# is ~40 MB as CSV, so 1 GiB is far above anything real and below what would exhaust memory.
TEXT_LIMIT_BYTES = 2**30
# Configs nest 3-4 levels; 64 is generous and far below Python's recursion limit (1000),
# which deep documents would otherwise hit inside the parsers or pydantic.
MAX_NESTING = 64
# YAML aliases may expand exponentially ("billion laughs"); configs need none.
MAX_YAML_ALIASES = 100

_BOM = b"\xef\xbb\xbf"

# The process's umask, read once (reading it means setting it; doing that per write would race threads).
_UMASK = os.umask(0o022)
os.umask(_UMASK)


def _where(what: str, path: Path | str) -> str:
    return f"{what} {path}".strip() if what else str(path)


def path_kind(path: str | Path, what: str = "") -> str | None:
    """What ``path`` names: ``'file'``, ``'folder'``, ``'other'`` (a device, a pipe) or None when nothing is there.

    The one place a user's path-like option (a model or GPU name that may be a file, --trace,
    --engine, a scenario's paths) is looked at before it is read. ``Path.is_file()`` and
    friends raise OSError for a name the file system refuses (over 255 bytes: ENAMETOOLONG,
    a path through a file, a loop of links); here that is one InputError line naming
    ``what`` and the path, and a NUL in the name (no file system holds one) is None.
    """
    text = str(path)
    if text.strip() == "" or "\x00" in text:
        return None
    try:
        info = os.stat(text)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        shown = text if len(text) <= 80 else f"{text[:60]}...({len(text)} characters)"
        raise InputError(f"{_where(what, '')}{': ' if what else ''}cannot use '{shown}': {exc.strerror or exc}") from None
    except ValueError:  # a name the OS call cannot even be given (e.g. surrogates)
        return None
    if stat.S_ISDIR(info.st_mode):
        return "folder"
    return "file" if stat.S_ISREG(info.st_mode) else "other"


def is_file(path: str | Path, what: str = "") -> bool:
    """``path`` is a regular file; a name the OS refuses is an InputError (see :func:`path_kind`)."""
    return path_kind(path, what) == "file"


def is_folder(path: str | Path, what: str = "") -> bool:
    """``path`` is a folder; a name the OS refuses is an InputError (see :func:`path_kind`)."""
    return path_kind(path, what) == "folder"


def read_bytes(path: str | Path, what: str = "", max_bytes: int = TEXT_LIMIT_BYTES) -> bytes:
    """The file's bytes; InputError (one line, naming ``what`` and the path) for anything unreadable."""
    if str(path).strip() == "":
        raise InputError(f"{what or 'file'}: empty path; give a file name")
    path = Path(path)
    where = _where(what, path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise InputError(f"{where}: no such file") from None
    except OSError as exc:
        raise InputError(f"{where}: cannot read ({exc.strerror or exc})") from None
    if path.is_dir():
        raise InputError(f"{where}: is a folder; give a file")
    if info.st_size > max_bytes:
        raise InputError(f"{where}: {info.st_size} bytes, larger than the {max_bytes}-byte limit for this file")
    try:
        with open(path, "rb") as handle:
            # Read one byte past the limit: a pipe or special file reports no size.
            data = handle.read(max_bytes + 1)
    except OSError as exc:
        raise InputError(f"{where}: cannot read ({exc.strerror or exc})") from None
    if len(data) > max_bytes:
        raise InputError(f"{where}: larger than the {max_bytes}-byte limit for this file")
    return data


def decode_utf8(data: bytes, source: str) -> str:
    """UTF-8 text (a leading byte-order mark dropped); InputError with the offending byte's offset."""
    data = data.removeprefix(_BOM)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise InputError(
            f"{source}: not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start} (line {line}); "
            "save the file as UTF-8"
        ) from None


def read_text(path: str | Path, what: str = "", max_bytes: int = TEXT_LIMIT_BYTES) -> str:
    """A UTF-8 text file (with or without BOM) as a string; every failure is one InputError line."""
    return decode_utf8(read_bytes(path, what, max_bytes), _where(what, path))


def read_csv_rows(path: str | Path, what: str = "") -> tuple[list[str], list[list[str]]]:
    """A CSV file's header (names stripped and lower-cased) and data rows, blank lines and ``#`` comment lines
    skipped; a file that cannot be read is one InputError line (:func:`read_text`)."""
    text = read_text(path, what)
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    reader = csv.reader(lines)
    header = [h.strip().lower() for h in next(reader, [])]
    return header, list(reader)


# ---------------------------------------------------------------------------------------
# YAML and JSON


class _ConstructFailure(Exception):
    """A YAML node whose tag could not build its value (``!!float abc``), with where it is."""

    def __init__(self, mark: Any, problem: str) -> None:
        super().__init__(problem)
        self.mark = mark
        self.problem = problem


class _SafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that reports a failing tag constructor with the node's line.

    SafeLoader's constructors raise plain ValueError/TypeError/OverflowError for values their
    tag cannot hold (``!!int x``, ``!!float abc``, an int of 5000 digits), and IndexError for an
    empty one (``!!int ""``, ``!!int +``: the sign is stripped, then the first digit looked up);
    those carry no line.
    """

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except _ConstructFailure:
            raise
        except (ValueError, TypeError, OverflowError, ArithmeticError, LookupError) as exc:
            tag = node.tag.rsplit(":", 1)[-1]
            value = getattr(node, "value", "")
            shown = f" {value!r}" if isinstance(value, str) else ""
            raise _ConstructFailure(node.start_mark, f"cannot read{shown} as {tag} ({exc})") from None


_FastLoader: type | None = None
if getattr(yaml, "__with_libyaml__", False):
    class _FastLoader(yaml.CSafeLoader):  # type: ignore[no-redef]
        """libyaml's parser with SafeLoader's constructors and resolver: the same values, read about 16x as
        fast (the 134 shipped YAML files: 0.03 s against 0.53 s), which is most of a run's start-up."""


def _check_yaml_events(text: str, source: str, loader: type = yaml.SafeLoader) -> None:
    """Nesting depth and alias count from the event stream (the parser itself does not recurse)."""
    depth = aliases = 0
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_NESTING:
                line = event.start_mark.line + 1 if event.start_mark else "?"
                raise InputError(f"{source}:{line}: nested more than {MAX_NESTING} levels deep; a config is a few levels")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1
        elif isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_YAML_ALIASES:
                raise InputError(f"{source}: more than {MAX_YAML_ALIASES} YAML aliases (*name); write the values out")


def parse_yaml(text: str, source: str) -> Any:
    """A YAML document (safe types only); malformed input -> InputError with ``source:line``.

    Read by libyaml where PyYAML has it; a document it cannot read is read again by the pure-Python parser,
    whose error (and line) is the one reported, so the messages do not depend on how PyYAML was built. libyaml
    reads a few documents the pure-Python parser refuses, all valid YAML (a tab between flow items, ``[1,<tab>2]``);
    every shipped file reads to the same values either way (tests/test_files.py).
    """
    if _FastLoader is not None:
        try:
            _check_yaml_events(text, source, _FastLoader)
            return yaml.load(text, Loader=_FastLoader)
        except Exception:  # noqa: BLE001 - any failure is read again below, where it is reported
            pass
    try:
        _check_yaml_events(text, source)
        return yaml.load(text, Loader=_SafeLoader)
    except _ConstructFailure as exc:
        raise InputError(f"{source}:{exc.mark.line + 1}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(f"{where}: malformed YAML: {problem}") from None
    except RecursionError:
        raise InputError(f"{source}: nested too deeply to read") from None


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range")
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows; use null for a missing value")


def parse_json(text: str, source: str) -> Any:
    """Strict JSON: no NaN/Infinity, no number that overflows to inf; errors give ``source:line``."""
    try:
        data = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise InputError(f"{source}:{exc.lineno}: malformed JSON: {exc.msg}") from None
    except ValueError as exc:  # parse_constant / parse_float / an integer over Python's digit limit
        raise InputError(f"{source}: malformed JSON: {exc}") from None
    except RecursionError:
        raise InputError(f"{source}: nested more than {MAX_NESTING} levels deep") from None
    check_depth(data, source)
    return data


def check_depth(data: Any, source: str, limit: int = MAX_NESTING) -> None:
    """InputError when lists/dicts nest deeper than ``limit`` (walked without recursion)."""
    stack: list[tuple[Any, int]] = [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            if depth >= limit:
                raise InputError(f"{source}: nested more than {limit} levels deep; a config is a few levels")
            children: Iterable[Any] = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)


def load_yaml(path: str | Path, what: str = "", max_bytes: int = MAPPING_LIMIT_BYTES) -> Any:
    """Read and parse a YAML file (see :func:`parse_yaml`)."""
    return parse_yaml(read_text(path, what, max_bytes), _where(what, path))


def load_json(path: str | Path, what: str = "", max_bytes: int = MAPPING_LIMIT_BYTES) -> Any:
    """Read and parse a strict JSON file (see :func:`parse_json`)."""
    return parse_json(read_text(path, what, max_bytes), _where(what, path))


def read_mapping(path: str | Path, what: str = "", max_bytes: int = MAPPING_LIMIT_BYTES) -> dict[str, Any]:
    """A YAML or JSON file (by suffix: ``.json`` is JSON) whose top level is a mapping."""
    path = Path(path)
    data = load_json(path, what, max_bytes) if path.suffix.lower() == ".json" else load_yaml(path, what, max_bytes)
    if not isinstance(data, dict):
        kind = "an empty file" if data is None else f"a {type(data).__name__}"
        raise InputError(f"{_where(what, path)}: expected a mapping of fields at the top level, got {kind}")
    return data


# ---------------------------------------------------------------------------------------
# Outputs


def _output_name(path: str | Path, what: str, give: str) -> Path:
    """``path`` as a Path, refused when empty or holding a NUL (no file system takes one); ``give`` names what is wanted."""
    if str(path).strip() == "":
        raise InputError(f"{what}: empty path; give {give}")
    if "\x00" in str(path):
        raise InputError(f"{what}: {str(path)!r} holds a NUL character, which no file name may hold")
    return Path(path)


@contextmanager
def _os_errors(what: str, path: str | Path) -> Iterator[None]:
    """Looking at a path the OS refuses (a name too long for the file system) is an InputError, not a traceback."""
    try:
        yield
    except OSError as exc:
        raise InputError(f"{what}: cannot use '{path}': {exc.strerror}") from None


def _check_writable_folder(folder: Path, path: str | Path, what: str) -> None:
    if not folder.is_dir():
        raise InputError(f"{what}: folder '{folder}' of '{path}' does not exist; create it or choose another path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(f"{what}: folder '{folder}' is not writable")


def check_output_path(path: str | Path, what: str, suffixes: Iterable[str] | None = None) -> Path:
    """The output path, checked before any work: not empty, not a folder, right suffix, folder exists and is writable.

    ``suffixes`` are the allowed endings, lower case with the dot (``('.png', '.svg')``);
    None allows any.
    """
    out = _output_name(path, what, "a file name")
    allowed = tuple(suffixes) if suffixes is not None else None
    if allowed is not None and out.suffix.lower() not in allowed:
        raise InputError(f"{what}: '{path}' must end in one of {', '.join(allowed)}")
    with _os_errors(what, path):
        if out.is_dir():
            raise InputError(f"{what}: '{path}' is a folder; give a file path")
        _check_writable_folder(out.parent, path, what)
        if out.exists() and not os.access(out, os.W_OK):
            raise InputError(f"{what}: '{path}' exists and is not writable")
    return out


def check_output_folder(path: str | Path, what: str) -> Path:
    """An output folder, checked before any work: not empty, not a file, its parent exists and it is writable.

    The folder itself may exist (its files of the same names are replaced) or is created by the writer.
    """
    out = _output_name(path, what, "a folder")
    with _os_errors(what, path):
        if out.exists() and not out.is_dir():
            raise InputError(f"{what}: '{path}' is a file; give a folder")
        _check_writable_folder(out if out.is_dir() else out.parent, path, what)
    return out


def atomic_write(path: str | Path, write: Callable[[Any], None] | str, what: str = "", binary: bool = False) -> None:
    """Write a file whole or not at all.

    ``write`` is the text to write, or a function given the open handle (text handle, UTF-8,
    newline='' so CSV writers control line ends; a binary handle when ``binary``). The data
    goes to a temporary file in the same folder, is flushed to disk, then renamed over
    ``path``; on any failure (full disk, permission, an exception in ``write``) the
    temporary file is removed, ``path`` is left as it was, and OSError becomes InputError.
    """
    out = Path(path)
    where = what or str(out)
    try:
        handle_fd, temporary = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent or Path("."))
    except OSError as exc:
        raise InputError(f"{where}: cannot write {out} ({exc.strerror or exc})") from None
    try:
        mode = "wb" if binary else "w"
        options: dict[str, Any] = {} if binary else {"encoding": "utf-8", "newline": ""}
        with os.fdopen(handle_fd, mode, **options) as handle:
            if callable(write):
                write(handle)
            else:
                handle.write(write)
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp creates the file 0600; give it the permissions a plain open() would.
        os.chmod(temporary, 0o666 & ~_UMASK)
        os.replace(temporary, out)
    except OSError as exc:
        _remove_quietly(temporary)
        raise InputError(f"{where}: cannot write {out} ({exc.strerror or exc})") from None
    except BaseException:
        _remove_quietly(temporary)
        raise


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
