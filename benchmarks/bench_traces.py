"""Trace reading speed and memory: an Azure-format CSV of N rows, read by each CSV reader.

Run: python -m benchmarks.bench_traces [--rows 10000000] [--readers arrow python] [--out benchmarks/results.json]
The file is generated in a temporary directory (Azure 2024 layout: ``TIMESTAMP`` with a
UTC offset, ``ContextTokens``, ``GeneratedTokens``; about 45 bytes a row, so 10^7 rows is
~450 MB). Each reader runs in its own process, so its peak memory (VmHWM, which includes
the interpreter, numpy and pyarrow themselves) is that read's alone. Target: 10^7 rows in
seconds and within a few hundred MB with pyarrow.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.common import report, write_results

PEAK = """
def peak_rss_bytes():
    # VmHWM is this process's own peak; ru_maxrss would carry the parent's over exec on Linux.
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
"""

CHILD = PEAK + """
import json, sys, time
from simulator.engine.traces import read_trace
start = time.perf_counter()
trace = read_trace(sys.argv[1], reader=sys.argv[2])
seconds = time.perf_counter() - start
print(json.dumps({
    "seconds": seconds,
    "rows": len(trace),
    "max_rss_bytes": peak_rss_bytes(),
    "span_seconds": float(trace.arrival_seconds.max()),
}))
"""

BASELINE = PEAK + """
import json
import numpy, simulator.engine.traces
try:
    import pyarrow.csv
except ImportError:
    pass
print(json.dumps({"max_rss_bytes": peak_rss_bytes()}))
"""


def write_azure_csv(path: Path, rows: int, seed: int = 0) -> None:
    """``rows`` requests at ~200/s from 2024-05-10 00:00 UTC, written in blocks of 10^6 rows."""
    rng = np.random.default_rng(seed)
    start_ns = np.datetime64("2024-05-10T00:00:00", "ns").astype(np.int64)
    clock = start_ns
    with path.open("w", encoding="utf-8") as handle:
        handle.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
        for first in range(0, rows, 10**6):
            n = min(10**6, rows - first)
            stamps = clock + np.cumsum(rng.exponential(5e6, size=n)).astype(np.int64)
            clock = int(stamps[-1])
            text = np.datetime_as_string(stamps.view("datetime64[ns]"), unit="us")
            prompts = rng.integers(1, 8192, size=n)
            outputs = rng.integers(1, 1024, size=n)
            handle.writelines(
                f"{t.replace('T', ' ')}+00:00,{p},{o}\n" for t, p, o in zip(text, prompts.tolist(), outputs.tolist())
            )


def run_reader(path: Path, reader: str) -> dict:
    completed = subprocess.run([sys.executable, "-c", CHILD, str(path), reader], capture_output=True, text=True, check=True)
    return json.loads(completed.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10**7)
    parser.add_argument("--readers", nargs="+", default=["arrow", "python"], choices=["arrow", "python"])
    parser.add_argument("--out", default=None, help="merge the figures into this JSON file")
    args = parser.parse_args()
    figures = []
    baseline = json.loads(subprocess.run([sys.executable, "-c", BASELINE], capture_output=True, text=True,
                                         check=True).stdout)["max_rss_bytes"]
    figures.append(report("interpreter + numpy + pyarrow imported, max RSS", baseline / 1e6, "MB"))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "azure_2024_like.csv"
        write_azure_csv(path, args.rows)
        figures.append(report(f"generated file, {args.rows:,} rows", path.stat().st_size / 1e6, "MB"))
        for reader in args.readers:
            result = run_reader(path, reader)
            assert result["rows"] == args.rows, result
            figures.append(report(f"read_trace reader={reader}: wall time", result["seconds"], "s",
                                  "seconds" if reader == "arrow" else ""))
            figures.append(report(f"read_trace reader={reader}: rows per second", args.rows / result["seconds"], "rows/s"))
            figures.append(report(f"read_trace reader={reader}: max RSS", result["max_rss_bytes"] / 1e6, "MB",
                                  "a few hundred MB" if reader == "arrow" else ""))
    write_results(args.out, "traces", figures)


if __name__ == "__main__":
    main()
