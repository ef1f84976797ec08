"""memwall's own kernel-table file: measured GEMM latencies as CSV, what ``simulate calibrate`` writes.

A user's GPU (AMD included, or one NVIDIA's database lacks) joins the measured path with one file,
given as ``--kernel-table FILE``. The file is plain text:

    # memwall kernel table 1
    # gpu: MI300X
    # engine: torch
    # version: 2.13.0
    # includes: CUDA/HIP event time of back-to-back calls; weights rotated past the L2
    op,dtype,m,n,k,seconds
    gemm,bf16,1,8192,8192,5.1e-05

``#`` lines before the header name the origin (``gpu``, ``engine``, ``version`` and ``includes``,
what each latency holds); every row is one GEMM of ``m`` rows (tokens), ``n`` output and ``k``
input features in a format of :data:`simulator.cost.kernel_tables.table.GEMM_DTYPES`, timed in
seconds. Rows of other operator classes are refused by name until memwall reads them.
"""

from __future__ import annotations

import csv
import functools
import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from simulator.cost.kernel_tables.table import GEMM_DTYPES, GemmTable, TableOrigin, gemm_table
from simulator.errors import InputError
from simulator.files import atomic_write

MAGIC = "# memwall kernel table 1"
COLUMNS = ("op", "dtype", "m", "n", "k", "seconds")
ORIGIN_KEYS = ("gpu", "engine", "version", "includes")


def kernel_table_text(origin: TableOrigin, rows: Iterable[tuple[str, int, int, int, float]]) -> str:
    """The file's text for GEMM ``rows`` of (dtype, m, n, k, seconds)."""
    lines = [MAGIC, *(f"# {key}: {getattr(origin, key)}" for key in ORIGIN_KEYS if getattr(origin, key)),
             ",".join(COLUMNS)]
    for dtype, m, n, k, seconds in rows:
        lines.append(f"gemm,{dtype},{int(m)},{int(n)},{int(k)},{float(seconds):.6e}")
    return "\n".join(lines) + "\n"


def write_kernel_table(path: Path, origin: TableOrigin, rows: Iterable[tuple[str, int, int, int, float]]) -> None:
    """Write GEMM ``rows`` of (dtype, m, n, k, seconds) to ``path`` atomically (nothing half-written on a crash)."""
    atomic_write(Path(path), kernel_table_text(origin, rows))


@functools.lru_cache(maxsize=16)
def read_kernel_table(path: str) -> dict[str, GemmTable]:
    """The GEMM tables of a memwall kernel-table file, by format; InputError naming the file, line and field."""
    where = f"--kernel-table: {path}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{where}: cannot read ({exc.__class__.__name__}: {exc})") from None
    lines = text.splitlines()
    if not lines or lines[0].strip() != MAGIC:
        raise InputError(f"{where}: line 1 must be '{MAGIC}' (a file written by simulate calibrate --kernel-table-out)")
    origin = {"gpu": "", "engine": "", "version": "", "includes": ""}
    body = 1
    while body < len(lines) and lines[body].startswith("#"):
        key, _, value = lines[body][1:].partition(":")
        if key.strip() in origin:
            origin[key.strip()] = value.strip()
        body += 1
    if not origin["gpu"]:
        raise InputError(f"{where}: no '# gpu: NAME' line before the header (the GPU the latencies were measured on)")
    reader = csv.reader(lines[body:])
    header = next(reader, None)
    if header is None or tuple(h.strip() for h in header) != COLUMNS:
        raise InputError(f"{where}: line {body + 1}: the header must be {','.join(COLUMNS)}")
    by_dtype: dict[str, list[tuple[int, int, int, float]]] = {}
    for number, fields in enumerate(reader, start=body + 2):
        if not fields or not "".join(fields).strip():
            continue
        if len(fields) != len(COLUMNS):
            raise InputError(f"{where}: line {number}: {len(fields)} fields, expected {len(COLUMNS)} ({','.join(COLUMNS)})")
        op, dtype = fields[0].strip(), fields[1].strip()
        if op != "gemm":
            raise InputError(f"{where}: line {number}: op '{op}': only gemm rows are read (allowed: gemm)")
        if dtype not in GEMM_DTYPES:
            raise InputError(f"{where}: line {number}: dtype '{dtype}' is not one of {', '.join(GEMM_DTYPES)}")
        try:
            m, n, k = (int(fields[i]) for i in (2, 3, 4))
            seconds = float(fields[5])
        except ValueError:
            raise InputError(f"{where}: line {number}: m, n, k must be integers and seconds a number") from None
        if min(m, n, k) < 1 or not math.isfinite(seconds) or seconds <= 0:
            raise InputError(f"{where}: line {number}: m, n, k must be >= 1 and seconds finite and > 0")
        by_dtype.setdefault(dtype, []).append((m, n, k, seconds))
    if not by_dtype:
        raise InputError(f"{where}: no gemm rows")
    table_origin = TableOrigin(origin["gpu"], origin["engine"] or "unstated", origin["version"] or "unstated",
                               path, origin["includes"])
    out = {}
    for dtype, rows in by_dtype.items():
        columns = np.array(rows, dtype=float).T
        out[dtype] = gemm_table(table_origin, dtype, columns[0], columns[1], columns[2], columns[3])
    return out
