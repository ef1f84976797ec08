"""Datasets as workloads: prompt and output lengths sampled, in pairs, from a lengths file.

``--dataset`` names a file of (input_tokens, output_tokens) pairs, one request each:

- ``sharegpt``: the shipped ShareGPT sample, ``validation/lengths/sharegpt-vllm-lambda.csv`` (the 320
  pairs of vLLM's ShareGPT_V3 benchmark sample recorded in Lambda's result JSON; validation/SOURCES.md);
- ``NAME``: another shipped file, ``validation/lengths/NAME.csv`` (``simulate`` lists them in its error);
- ``PATH``: a CSV file of your own with the columns ``input_tokens,output_tokens`` (other columns ignored,
  ``#`` comment lines skipped).

**Rows the engines would not send.** vLLM's benchmark (``vllm/benchmarks/datasets.py``,
``ShareGPTDataset.sample``, at vllm-project/vllm 0056b87) keeps a ShareGPT conversation only when
``is_valid_sequence(prompt_len, output_len)`` holds (``vllm/benchmarks/dataset_utils.py``): prompt and
output of at least ``min_len = 4`` tokens each (the output check is skipped when ``--sharegpt-output-len``
fixes the output length), prompt <= 1,024 and prompt + output <= 2,048. The same minimum is applied here:
rows with fewer than :data:`MIN_TOKENS` prompt or output tokens, the zero-output rows (empty
completions) among them, are dropped, and the run's notes say how many; with ``output_tokens`` given the
output minimum is skipped, as vLLM's. vLLM's two upper caps are not applied: they select short
conversations from the raw ShareGPT set, while a lengths file here is already the sample to run (and
may be a long-context one); each length is clipped to the model's context instead, as every workload is.

**Sampling** follows vLLM's too: the kept rows are shuffled (seeded) and the first ``n`` taken, so a run
of as many requests as the file has rows sends each row once; beyond that, rows are drawn again at
random (vLLM's ``maybe_oversample_requests``). Prompt and output stay paired.

Units: tokens.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from simulator.engine.workload import Workload
from simulator.errors import InputError
from simulator.files import is_file, read_csv_rows
from simulator.model.registry import validation_file

MIN_TOKENS = 4
"""vLLM's ``is_valid_sequence`` ``min_len``: the fewest prompt (and output) tokens of a row it sends."""

ALIASES = {"sharegpt": "sharegpt-vllm-lambda"}
"""Short names of shipped files."""


@dataclass(frozen=True)
class Dataset:
    """The rows of a lengths file a benchmark would send, and what was dropped."""

    name: str
    prompt_tokens: np.ndarray
    """int64 prompt lengths, tokens, one per kept row"""
    output_tokens: np.ndarray
    """int64 output lengths, tokens, paired with ``prompt_tokens``"""
    rows: int
    """rows in the file"""
    dropped: int
    """rows dropped for fewer than MIN_TOKENS prompt or output tokens"""


def shipped_names() -> list[str]:
    """Names ``--dataset`` accepts for shipped files (aliases first)."""
    folder = validation_file("lengths")
    stems = sorted(p.stem for p in folder.glob("*.csv")) if folder.is_dir() else []
    return [*ALIASES, *stems]


def dataset_path(spec: str) -> Path:
    """The file ``spec`` (``sharegpt``, NAME or PATH) names; InputError listing what is allowed."""
    text = str(spec).strip()
    if not text:
        raise InputError(f"--dataset: empty; allowed: {', '.join(shipped_names())} or a CSV path")
    name = ALIASES.get(text.lower(), text)
    if "/" not in name and "\\" not in name and not name.lower().endswith(".csv"):
        if name in shipped_names():  # matched against the listing: no OS call on an arbitrary name
            return validation_file("lengths", f"{name}.csv")
        shown = text if len(text) <= 60 else text[:57] + "..."
        raise InputError(f"--dataset: no shipped dataset {shown!r}; allowed: {', '.join(shipped_names())} "
                         "or the path of a CSV file with columns input_tokens,output_tokens")
    if not is_file(name, "--dataset"):
        raise InputError(f"--dataset: no file {name!r} (a CSV with columns input_tokens,output_tokens; or a shipped "
                         f"name: {', '.join(shipped_names())})")
    return Path(name)


@functools.lru_cache(maxsize=16)
def _read(path: Path, stamp: float, skip_output_check: bool) -> Dataset:
    header, body = read_csv_rows(path, "--dataset")
    if "input_tokens" not in header or "output_tokens" not in header:
        raise InputError(f"--dataset: {path}: expected the columns input_tokens,output_tokens in its first line "
                         f"(got {', '.join(header) or 'nothing'})")
    columns = header.index("input_tokens"), header.index("output_tokens")
    pairs = []
    for number, cells in enumerate(body, start=1):
        try:
            prompt, output = (int(cells[c].strip()) for c in columns)
        except (ValueError, IndexError):
            raise InputError(f"--dataset: {path}: data row {number}: expected whole token counts in input_tokens and "
                             "output_tokens") from None
        if prompt < 0 or output < 0 or max(prompt, output) >= 2**31:
            raise InputError(f"--dataset: {path}: data row {number}: token counts must be in [0, 2^31) "
                             f"(got {prompt}, {output})")
        pairs.append((prompt, output))
    if not pairs:
        raise InputError(f"--dataset: {path}: no rows")
    array = np.asarray(pairs, dtype=np.int64)
    keep = (array[:, 0] >= MIN_TOKENS) & (skip_output_check | (array[:, 1] >= MIN_TOKENS))
    if not keep.any():
        raise InputError(f"--dataset: {path}: every row has fewer than {MIN_TOKENS} prompt or output tokens "
                         "(vLLM's benchmark sends none of them)")
    name = next((alias for alias, stem in ALIASES.items() if stem == path.stem), path.stem)
    return Dataset(name, array[keep, 0], array[keep, 1], len(array), int((~keep).sum()))


def read_dataset(spec: str, skip_output_check: bool = False) -> Dataset:
    """The dataset ``spec`` names, its short rows dropped (see the module docstring); InputError on any problem."""
    path = dataset_path(spec)
    return _read(path, path.stat().st_mtime, skip_output_check)


def sample_rows(n: int, rows: int, seed: int) -> np.ndarray:
    """Row indices of ``n`` requests from ``rows`` rows: a seeded shuffle, its first ``n``, then random draws."""
    # A stream of its own (the fifth child of the run's seed; the first three are the arrivals and lengths, the
    # fourth the client path's jitter, simulator.engine.closed_loop), so the rows drawn do not follow the jitter.
    rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(5)[4])
    order = rng.permutation(rows)
    if n <= rows:
        return order[:n]
    return np.concatenate([order, rng.integers(0, rows, size=n - rows)])


def with_dataset(workload_: Workload, dataset: Dataset, seed: int, max_tokens: int,
                 keep_outputs: bool = False) -> Workload:
    """``workload_`` with its lengths drawn, in pairs, from ``dataset``; its arrivals (or clients) unchanged.

    ``keep_outputs``: keep the workload's own output lengths (``--output-tokens`` given) and take only the prompts.
    """
    n = len(workload_)
    index = sample_rows(n, len(dataset.prompt_tokens), seed)
    prompts = np.clip(dataset.prompt_tokens[index], 1, max_tokens)
    outputs = workload_.output_tokens if keep_outputs else np.clip(dataset.output_tokens[index], 1, max_tokens)
    note = ([f"--dataset {dataset.name}: {dataset.dropped} of {dataset.rows} rows dropped for fewer than {MIN_TOKENS} "
             "prompt or output tokens, as vLLM's benchmark drops them (is_valid_sequence)"] if dataset.dropped else [])
    rows = f"dataset {dataset.name} ({len(dataset.prompt_tokens)} rows)"
    given = workload_.description.split(", output ")[-1] if keep_outputs else ""
    lengths = f"prompt lengths from {rows}, output {given}" if keep_outputs else f"lengths from {rows}"
    description = workload_.description.split(", prompt ")[0] + f", {lengths}"
    return replace(workload_, prompt_tokens=prompts.astype(np.int64), output_tokens=np.asarray(outputs, dtype=np.int64),
                   description=description, notes=(*workload_.notes, *note))
