"""Validation speed: ``simulate validate`` over the whole shipped table, in and out of sample (issue 37, item 4).

Run: python -m benchmarks.bench_validate [--out benchmarks/results.json] [--jobs N] [--csv TABLE]
                                         [--compare BEFORE.json] [--save THIS.json]

Runs ``python -m simulator validate --json`` in a child process and prints its wall time and its CPU
time (user + system, the child and its worker processes together: other programs on the machine
stretch the wall time, much less the CPU time), then the out-of-sample median / p90 / max |error|.
``--save`` keeps the run's ``--json`` output. ``--compare`` names the ``--json`` output of an earlier
run: every median / p90 / max figure of both summaries (in_sample, out_of_sample, by engine, family
and regime, serving) is compared, and the largest difference is printed in percentage points (the
speed-ups must leave them as they were); so is every row's prediction in and out of sample (with
its notes and whether it was skipped), and the fits (in sample and each fold's).

Target on 2 cores: the whole table in < 60 s wall, with every summary figure unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import machine, report, write_results


def summary_figures(document: dict[str, Any]) -> dict[tuple[str, ...], float | None]:
    """Every median / p90 / max of the ``in_sample`` and ``out_of_sample`` blocks, by its path in the document."""
    found: dict[tuple[str, ...], float | None] = {}

    def walk(node: Any, path: tuple[str, ...]) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, (*path, key))
        elif path and path[-1] in ("median", "p90", "max"):
            found[path] = node

    for block in ("in_sample", "out_of_sample"):
        walk(document[block], (block,))
    return found


def largest_difference(before: dict[str, Any], after: dict[str, Any]) -> tuple[float, int]:
    """(largest |difference| in percentage points over the summary figures, figures compared); inf when a
    figure is missing or null on one side only."""
    old, new = summary_figures(before), summary_figures(after)
    worst = 0.0
    for path in old.keys() | new.keys():
        a, b = old.get(path), new.get(path)
        if a is None or b is None:
            worst = worst if a is None and b is None else float("inf")
            continue
        worst = max(worst, 100 * abs(a - b))
    return worst, len(old.keys() | new.keys())


ROW_PREDICTION = ("predicted_in_sample", "predicted_out_of_sample", "error_in_sample", "error_out_of_sample",
                  "fits_memory", "calibrates", "skipped", "notes")
"""The fields of a ``--json`` row that the replay produces (the rest come from the table)."""


def differing_rows(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Ids of the rows whose prediction (:data:`ROW_PREDICTION`) differs, or that only one document has."""
    old = {row["id"]: row for row in before["rows"]}
    new = {row["id"]: row for row in after["rows"]}
    return sorted(i for i in old.keys() | new.keys()
                  if i not in old or i not in new or any(old[i][f] != new[i][f] for f in ROW_PREDICTION))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="merge the figures into this JSON file")
    parser.add_argument("--jobs", type=int, default=None, help="worker processes (default: the CPUs available)")
    parser.add_argument("--csv", default=None, help="measurement table (default: the shipped one)")
    parser.add_argument("--compare", default=None, help="an earlier run's --json output to compare the figures with")
    parser.add_argument("--save", default=None, help="write this run's --json output here")
    args = parser.parse_args()

    command = [sys.executable, "-m", "simulator", "validate", "--json"]
    if args.jobs is not None:
        command += ["--jobs", str(args.jobs)]
    if args.csv is not None:
        command += ["--csv", args.csv]
    with tempfile.TemporaryDirectory(prefix="bench-validate-") as folder:
        output = Path(folder) / "validation.json"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        with output.open("w", encoding="utf-8") as handle:
            subprocess.run(command, stdout=handle, check=True)
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        document = json.loads(output.read_text(encoding="utf-8"))
        if args.save:
            Path(args.save).write_text(output.read_text(encoding="utf-8"), encoding="utf-8")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"simulate validate --json, {document['rows_total']} rows ({document['rows_compared']} compared), "
          f"{args.jobs or cores} worker(s) on {cores} core(s)")
    figures = [
        report("wall time", wall, "s", "< 60 on 2 cores"),
        report("CPU time (user + system, with the workers)", cpu, "s"),
    ]
    out = document["out_of_sample"]
    for name in ("median", "p90", "max"):
        figures.append(report(f"out-of-sample |error| {name}", 100 * out[name], "%"))
    if args.compare:
        earlier = json.loads(Path(args.compare).read_text(encoding="utf-8"))
        worst, count = largest_difference(earlier, document)
        figures.append(report(f"largest change over {count} summary figures", worst, "pp", "0 (at most 0.1)"))
        print(f"  (exactly {worst!r} percentage points)")
        rows = differing_rows(earlier, document)
        figures.append(report(f"rows whose prediction changed, of {len(document['rows'])}", len(rows), "rows", "0"))
        if rows:
            print(f"  ({', '.join(rows[:20])}{', ...' if len(rows) > 20 else ''})")
        same_fits = earlier["fit"] == document["fit"]
        figures.append(report("fits (in sample and every fold) changed", 0.0 if same_fits else 1.0, "(0 or 1)", "0"))
    figures.append({"name": "machine", **machine()})
    write_results(args.out, "validate", figures)


if __name__ == "__main__":
    main()
