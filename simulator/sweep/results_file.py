"""The results file of a sweep: one row per point, CSV or JSON Lines, appended as points finish.

Each finished point is written and flushed at once, so a killed sweep keeps every point it
finished. At the end the file is rewritten in point order with a fixed column order, so the
final file does not depend on which worker finished first, nor on whether the sweep was
interrupted and resumed. Rewrites go through :func:`simulator.files.atomic_write` (a
temporary file and ``os.replace``): a kill or a full disk during a rewrite leaves the old
file whole and no temporary behind. The file is first written when the first row is ready
(or at once with rows kept by --resume), so a sweep that fails before any point finishes
leaves an earlier results file as it was and no empty one.

Rows hold scalars only; a missing value is an absent key (an empty CSV cell).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from simulator.errors import InputError
from simulator.files import atomic_write, parse_json, read_text
from simulator.tabular import finite_or_none, to_json

# Columns come in this order of groups (alphabetical within a group): the point, its inputs,
# whether it fits, then the derived figures a capacity planner reads, then the raw metrics.
_GROUPS = ("point", "input.", "fits", "reason", "gpus", "p99.", "slo.", "cost.", "search.")

_INT = re.compile(r"-?\d+")


def column_rank(key: str) -> tuple[int, str]:
    for rank, group in enumerate(_GROUPS):
        if key == group or (group.endswith(".") and key.startswith(group)):
            return rank, key
    return len(_GROUPS), key


def ordered_columns(rows: Iterable[dict[str, Any]]) -> list[str]:
    keys: set[str] = set()
    for row in rows:
        keys.update(key for key, value in row.items() if value is not None)
    return sorted(keys, key=column_rank)


def clean_row(row: dict[str, Any]) -> dict[str, Any]:
    """The row with its keys in column order and without missing (None) values."""
    return {key: row[key] for key in sorted(row, key=column_rank) if row[key] is not None}


def parse_cell(text: str) -> Any:
    """A CSV cell back to the value written: '' -> None, 'True' -> True, '4' -> 4, '0.5' -> 0.5, else text."""
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    if _INT.fullmatch(text):
        return int(text)
    try:
        return float(text)
    except ValueError:
        return text


class ResultsFile:
    """Rows of one sweep on disk; ``fmt`` is 'csv' or 'jsonl'."""

    def __init__(self, path: Path, fmt: Literal["csv", "jsonl"]) -> None:
        self.path = path
        self.fmt = fmt
        self.rows: list[dict[str, Any]] = []
        self._columns: list[str] = []
        self._handle: io.TextIOWrapper | None = None

    # reading (for --resume)

    def read(self) -> list[dict[str, Any]]:
        """The rows already in the file; a line cut short by a kill is ignored."""
        if not self.path.exists():
            return []
        text = read_text(self.path, "--resume")
        if not text.endswith("\n"):
            text = text[: text.rfind("\n") + 1]  # the last row was being written when the sweep stopped
        if self.fmt == "jsonl":
            return [self._json_row(line, number) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
        reader = csv.DictReader(io.StringIO(text))
        if reader.fieldnames and "point" not in reader.fieldnames:
            raise InputError(f"{self.path}: not a sweep results file (no 'point' column); choose another --out")
        # Cells past the header (key None) cannot come from this writer; they are left out.
        return [{key: parse_cell(value) for key, value in row.items() if key is not None and value not in ("", None)} for row in reader]

    def _json_row(self, line: str, number: int) -> dict[str, Any]:
        try:
            row = parse_json(line, f"{self.path}:{number}")
        except InputError as exc:
            raise InputError(f"{exc}; is this a sweep's jsonl output?") from None
        if not isinstance(row, dict) or "point" not in row:
            raise InputError(f"{self.path}:{number}: not a sweep row (no 'point' field)")
        return row

    # writing

    def start(self, rows: list[dict[str, Any]]) -> None:
        """Replace the file with ``rows`` (those kept by --resume) and open it for appending.

        With no rows the file is left alone until the first row (see the module docstring).
        """
        self.rows = [clean_row(row) for row in rows]
        if self.rows:
            self._rewrite()

    def append(self, row: dict[str, Any]) -> None:
        """Add one finished point and flush it to disk."""
        row = clean_row(row)
        self.rows.append(row)
        if self._handle is None or (self.fmt == "csv" and not set(row) <= set(self._columns)):
            self._rewrite()  # the first row, or a new column (e.g. the first point that fits): widen the header
            return
        try:
            self._handle.write(self._render([row]))
            self._handle.flush()
        except OSError as exc:
            self.close()
            raise InputError(f"{self.path}: cannot write ({exc.strerror or exc})") from None

    def finish(self) -> list[dict[str, Any]]:
        """Rewrite the file in point order; returns the rows in that order."""
        self.rows.sort(key=lambda row: int(row["point"]))
        self._rewrite()
        self.close()
        return self.rows

    def close(self) -> None:
        if self._handle is not None:
            handle, self._handle = self._handle, None
            try:
                handle.close()
            except OSError:  # a flush that fails here already failed (and was reported) in append
                pass

    def _render(self, rows: list[dict[str, Any]], header: bool = False) -> str:
        buffer = io.StringIO()
        if self.fmt == "jsonl":
            for row in rows:
                buffer.write(to_json(row) + "\n")
            return buffer.getvalue()
        writer = csv.DictWriter(buffer, fieldnames=self._columns, lineterminator="\n")
        if header:
            writer.writeheader()
        writer.writerows(finite_or_none(row) for row in rows)  # NaN/inf -> empty cell, never "nan"
        return buffer.getvalue()

    def _rewrite(self) -> None:
        self.close()
        self._columns = ordered_columns(self.rows)
        atomic_write(self.path, self._render(self.rows, header=bool(self._columns)), str(self.path))
        try:
            self._handle = open(self.path, "a", encoding="utf-8", newline="")  # noqa: SIM115 - held open across appends, closed by close()
        except OSError as exc:
            raise InputError(f"{self.path}: cannot open for appending ({exc.strerror or exc})") from None
