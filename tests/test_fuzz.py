"""Fuzz the command line: generated options and files, run in-process, never a traceback, hang or NaN.

Every sub-command is driven with options built from its own click parameters (tests/
fuzz_strategies.py) and generated files (configs, scenarios, traces, tables, timings), valid
and invalid. Each case must:

- exit with code 0 or 2 (bad input is "one line on stderr and exit code 2"), with no
  exception escaping but SystemExit, and on exit 2 an ``Error:`` message;
- finish within CASE_SECONDS (a hang detector: cases run in milliseconds; a case still running
  after a minute is stuck, not slow);
- on exit 0, print only finite numbers: ``--json`` parses with a parser that rejects NaN and
  Infinity, text and CSV contain no ``nan``/``inf``, and files it wrote (JSON, CSV) likewise;
- raise no numpy RuntimeWarning (overflow, division by zero, invalid value).

The bounded profile (the normal suite) runs a fixed, derandomized set of cases per command
and asserts each, so a failure shrinks to a minimal command line. ``MEMWALL_FUZZ=long`` runs
~20,000 random cases (marker ``fuzz``), records every failure instead of stopping, and writes a
summary (cases, tracebacks, hangs, non-finite outputs, distinct failures with where they
happen) to $MEMWALL_FUZZ_REPORT (default: fuzz-report.txt in the pytest temporary folder).
"""

from __future__ import annotations

import collections
import contextlib
import json
import math
import os
import re
import signal
import time
import traceback
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner
from fuzz_strategies import (
    FileFactory,
    benchmark_file,
    command_line,
    gpu_file,
    model_file,
    scenario_file,
    trace_file,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.cli import main

LONG = os.environ.get("MEMWALL_FUZZ") == "long"
CASE_SECONDS = 60
# Examples per command: bounded (the normal suite, <= 60 s together) and long (~20,000 in all).
BOUNDED = {"main": 80, "layers": 12, "compare": 12, "roofline": 12, "explain": 12, "sweep": 12, "validate": 8,
           "calibrate": 12, "models": 4, "gpus": 4, "configs": 30, "features": 40, "traces": 16, "from-benchmark": 8}
# validate replays each table row through the engine (~2 s a case): fewer of those. 33,900 cases in all.
LONG_EXAMPLES = {"main": 10000, "layers": 2000, "compare": 2000, "roofline": 1500, "explain": 2000, "sweep": 1000,
                 "validate": 300, "calibrate": 2000, "models": 300, "gpus": 300, "configs": 1500, "features": 8000,
                 "traces": 2000, "from-benchmark": 1000}

pytestmark = [pytest.mark.fuzz] if LONG else []

# A numeric token that is not finite, as text output would show it ("nan", "-inf", "inf%");
# letters around it (information, inference, infinity-fabric) make it a word, not a number.
NON_FINITE = re.compile(r"(?<![A-Za-z_])[-+]?(nan|inf|infinity)(?![A-Za-z_-])", re.IGNORECASE)


class Hang(BaseException):
    """Raised by the alarm inside a case that ran past CASE_SECONDS (BaseException: no handler swallows it)."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    def on_alarm(signum: int, frame: Any) -> None:
        raise Hang()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _strict_json(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise ValueError(f"non-finite number {name} in JSON")

    return json.loads(text, parse_constant=refuse)


@dataclass
class Failure:
    kind: str  # traceback | hang | non-finite | warning | exit-code | no-message | multi-line
    command: str
    args: list[str]
    detail: str
    where: str = ""

    def signature(self) -> tuple[str, str, str, str]:
        # Numbers and paths vary from case to case; the same fault keeps its words and its place.
        detail = re.sub(r"/\S+", "PATH", self.detail)
        detail = re.sub(r"[-+]?\d[\d.e+-]*", "N", detail)[:120]
        return self.kind, self.command, self.where, detail


@dataclass
class Tally:
    cases: collections.Counter = field(default_factory=collections.Counter)
    exits: collections.Counter = field(default_factory=collections.Counter)  # (command, exit code)
    seconds: collections.Counter = field(default_factory=collections.Counter)  # wall time per command (report only)
    failures: list[Failure] = field(default_factory=list)


TALLY = Tally()


def _innermost_simulator_frame(tb: Any) -> str:
    frames = [f for f in traceback.extract_tb(tb) if "/simulator/" in f.filename]
    if not frames:
        return "(outside simulator)"
    frame = frames[-1]
    return f"{frame.filename.split('/simulator/', 1)[1]}:{frame.lineno} {frame.name}"


def _written_files(args: list[str], root: Path) -> list[Path]:
    """Output files this case asked for under the fuzz folder (outputs are named o<N>.<suffix>), and the files
    in output folders it asked for (--deploy DIR, --records DIR)."""
    found: list[Path] = []
    for arg in args:
        path = Path(arg)
        if not (arg.startswith(str(root)) and path.name.startswith("o")):
            continue
        if path.is_file():
            found.append(path)
        elif path.is_dir():
            found.extend(sorted(p for p in path.rglob("*") if p.is_file()))
    return found


def _non_finite_in(value: Any) -> bool:
    """A float that is NaN or infinite anywhere in a parsed YAML document (walked without recursion)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _inputs_spell_non_finite(args: list[str], root: Path) -> bool:
    """Whether an argument or a generated input file (named f<N>) holds 'nan'/'inf' text the output may echo."""
    for arg in args:
        if NON_FINITE.search(arg):
            return True
        path = Path(arg)
        if (arg.startswith(str(root)) and path.name.startswith("f") and path.is_file()
                and NON_FINITE.search(path.read_text(encoding="utf-8", errors="replace"))):
            return True
    return False


def _check_finite_file(path: Path) -> str | None:
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix in (".json",):
        try:
            _strict_json(text)
        except ValueError as exc:
            return f"{path.suffix} file: {exc}"
    elif path.suffix in (".jsonl", ".ndjson"):
        for line in text.splitlines():
            if line.strip():
                try:
                    _strict_json(line)
                except ValueError as exc:
                    return f"{path.suffix} file: {exc}"
    elif path.suffix == ".csv" and NON_FINITE.search(text):
        return f"csv file has {NON_FINITE.search(text).group(0)!r}"  # type: ignore[union-attr]
    elif path.suffix in (".yaml", ".yml"):  # deployment manifests, GPU overlays
        try:
            documents = list(yaml.safe_load_all(text))
        except yaml.YAMLError:
            return None  # --out x.yaml of a sweep is its CSV rows under that name: not a YAML document
        if _non_finite_in(documents):
            return f"{path.suffix} file holds a NaN or infinite number"
    return None


def run_case(command: str, args: list[str], root: Path, env: dict[str, str] | None = None) -> list[Failure]:
    """Run ``simulate ARGS`` in-process in ``root``; the problems found (none when the case passes)."""
    runner = CliRunner()
    failures: list[Failure] = []
    full = ([] if command == "main" else [command]) + args
    old_cwd = os.getcwd()
    os.chdir(root)  # a sweep's default results folder and any relative path land here
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with time_limit(CASE_SECONDS):
                    result = runner.invoke(main, full, catch_exceptions=True, env=env)
            except Hang as hang:
                return [Failure("hang", command, args, f"still running after {CASE_SECONDS} s",
                                _innermost_simulator_frame(hang.__traceback__))]
    finally:
        os.chdir(old_cwd)
    TALLY.exits[command, result.exit_code] += 1
    exc = result.exception
    if exc is not None and not isinstance(exc, SystemExit):
        failures.append(Failure("traceback", command, args, f"{type(exc).__name__}: {exc}",
                                _innermost_simulator_frame(exc.__traceback__)))
    elif result.exit_code not in (0, 2):
        failures.append(Failure("exit-code", command, args, f"exit code {result.exit_code}: {result.output[-300:]}"))
    elif result.exit_code == 2 and "Error" not in result.output:
        failures.append(Failure("no-message", command, args, "exit code 2 without an error message"))
    elif result.exit_code == 2 and result.output.rstrip("\n").split("Error:", 1)[-1].count("\n"):
        # bad input is ONE line: "Error: <what, where, what is allowed>" (click's usage lines come before it)
        message = result.output.split("Error:", 1)[-1].strip()
        failures.append(Failure("multi-line", command, args, f"error message of {message.count(chr(10)) + 1} lines: "
                                f"{message.splitlines()[0][:160]}"))
    for warning in caught:
        if issubclass(warning.category, RuntimeWarning):
            failures.append(Failure("warning", command, args, f"{warning.category.__name__}: {warning.message}",
                                    f"{warning.filename.split('/simulator/')[-1]}:{warning.lineno}"))
    if result.exit_code == 0 and exc is None:
        if "--json" in args:
            try:
                _strict_json(result.stdout)
            except ValueError as error:
                failures.append(Failure("non-finite", command, args, f"--json: {error}"))
        elif not result.stdout.startswith("Usage:") and not _inputs_spell_non_finite(args, root):
            # (help text spells "inf" as a flag value; an input's own "nan" cell may be echoed back)
            found = NON_FINITE.search(result.stdout)
            if found:
                line = next(li for li in result.stdout.splitlines() if found.group(0) in li)
                failures.append(Failure("non-finite", command, args, f"stdout shows {found.group(0)!r}: {line.strip()[:160]}"))
        for path in _written_files(args, root):
            problem = _check_finite_file(path)
            if problem:
                failures.append(Failure("non-finite", command, args, problem))
    return failures


def check(command: str, args: list[str], root: Path, env: dict[str, str] | None = None, tally_as: str = "") -> None:
    """Bounded profile: assert the case passes. Long profile: record its failures and go on.

    ``tally_as``: the class the summary counts the case under (default: the command).
    """
    started = time.monotonic()
    failures = run_case(command, args, root, env)
    TALLY.seconds[tally_as or command] += time.monotonic() - started
    TALLY.cases[tally_as or command] += 1
    if LONG:
        TALLY.failures.extend(failures)
        return
    assert not failures, "\n".join(f"{f.kind} in {f.where or '?'}: {f.detail}\n  simulate {command} {' '.join(args)}" for f in failures)


def fuzz_settings(command: str) -> settings:
    scale = float(os.environ.get("MEMWALL_FUZZ_SCALE", "1"))  # long profile only: a quicker or longer run
    return settings(
        max_examples=max(1, round(LONG_EXAMPLES[command] * scale)) if LONG else BOUNDED[command],
        deadline=None,
        derandomize=not LONG,
        database=None,
        suppress_health_check=list(HealthCheck),
    )


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> FileFactory:
    return FileFactory(tmp_path_factory.mktemp("fuzz"))


@pytest.fixture(scope="module", autouse=True)
def summary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    yield
    if not LONG:
        return
    path = Path(os.environ.get("MEMWALL_FUZZ_REPORT") or tmp_path_factory.getbasetemp() / "fuzz-report.txt")
    path.write_text(summary_text(TALLY), encoding="utf-8")
    print(f"\nfuzz summary written to {path}")
    if TALLY.failures:  # the long profile records every failure, then fails once with the report's path
        pytest.fail(f"{len(TALLY.failures)} problems in the long fuzz profile; see {path}", pytrace=False)


def summary_text(tally: Tally) -> str:
    kinds = collections.Counter(f.kind for f in tally.failures)
    failed_cases = len({(f.command, tuple(f.args)) for f in tally.failures})
    lines = [
        f"cases: {sum(tally.cases.values())} ({', '.join(f'{k} {v}' for k, v in sorted(tally.cases.items()))})",
        "seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(tally.seconds.items())),
        "exit codes: " + ", ".join(f"{c} {code}: {n}" for (c, code), n in sorted(tally.exits.items())),
        f"failing cases: {failed_cases}; problems: " + (", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) or "none"),
        "",
        "distinct failures (count, kind, command, where, what), each with one example:",
    ]
    groups: dict[tuple[str, ...], list[Failure]] = collections.defaultdict(list)
    for failure in tally.failures:
        groups[failure.signature()].append(failure)
    for signature, members in sorted(groups.items(), key=lambda item: -len(item[1])):
        example = members[0]
        lines.append(f"{len(members):6d}  {example.kind:<10} {example.command:<9} {example.where}: {example.detail[:200]}")
        lines.append(f"        simulate {'' if example.command == 'main' else example.command + ' '}{' '.join(example.args)[:400]}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------
# One test per command


def _command(name: str) -> click.Command:
    return main if name == "main" else main.commands[name]


STEP_COMMANDS = ("layers", "roofline", "explain")
ALWAYS = ("--model", "--gpu", "--batch", "--ctx", "--gen")


# The main command's workload modes and the flags each one leaves out (a clean case obeys them).
CLOSED = ("--requests", "--qps", "--request-rate", "--trace", "--arrival", "--burstiness", "--trace-speedup")
MODES = {
    "closed": (ALWAYS, CLOSED),
    "open": (("--model", "--gpu", "--ctx", "--gen", "--qps", "--requests"), ("--batch", "--trace", "--request-rate", "--trace-speedup")),
    "trace": (("--model", "--gpu", "--trace"), ("--batch", "--qps", "--request-rate", "--arrival", "--burstiness", "--ctx", "--gen",
                                               "--prompt-tokens", "--output-tokens")),
}


@st.composite
def main_args(draw: st.DrawFn, files: FileFactory) -> list[str]:
    always, exclude = MODES[draw(st.sampled_from(sorted(MODES)))]
    return draw(command_line(main, files, always=always, most=6, exclude=exclude)) + ["--quiet"]


@pytest.mark.parametrize("command", ["main"])
def test_main_command(command: str, files: FileFactory) -> None:
    @fuzz_settings(command)
    @given(main_args(files))
    def case(args: list[str]) -> None:
        check(command, args, files.root)

    case()


# Flags added after the first fuzz test, each family in a mode of its own so that a clean case runs it deep:
# (flags always given, flags a clean case leaves out). A flag this command lacks (one not added yet) is skipped.
SERVING = ("--model", "--gpu", "--ctx", "--gen", "--qps", "--requests")
FEATURE_MODES = {
    "replicas": ((*SERVING, "--replicas", "--router", "--prefix-caching"),
                 ("--batch", "--trace", "--request-rate", "--disaggregate", "--sessions", "--max-concurrency", "--dataset")),
    "disaggregated": ((*SERVING, "--disaggregate", "--prefill-gpu", "--decode-gpu", "--prefill-tp", "--decode-tp"),
                      ("--batch", "--trace", "--request-rate", "--replicas", "--speculative", "--sessions", "--max-concurrency",
                       "--pp", "--pipeline-parallel-size", "--tp", "--tensor-parallel-size", "--dataset", "--records")),
    "speculative": (("--model", "--gpu", "--ctx", "--gen", "--batch", "--speculative", "--acceptance"),
                    ("--qps", "--trace", "--request-rate", "--disaggregate", "--requests", "--max-concurrency", "--sessions",
                     "--dataset")),
    "closed-loop": (("--model", "--gpu", "--ctx", "--gen", "--requests", "--max-concurrency", "--warmup-requests", "--client-path"),
                    ("--batch", "--qps", "--trace", "--request-rate", "--sessions", "--disaggregate", "--dataset")),
    "sessions": (("--model", "--gpu", "--ctx", "--gen", "--sessions", "--turns", "--think-time", "--turn-tokens",
                  "--prefix-caching", "--kv-offload"),
                 ("--batch", "--qps", "--trace", "--request-rate", "--requests", "--max-concurrency", "--disaggregate",
                  "--dataset", "--speculative")),
    "dataset": (("--model", "--gpu", "--dataset", "--qps", "--requests"),
                ("--batch", "--trace", "--request-rate", "--ctx", "--gen", "--prompt-tokens", "--output-tokens", "--sessions",
                 "--input-len", "--output-len")),
    "outputs": ((*ALWAYS, "--save-result", "--launch-command", "--deploy", "--html", "--kernels", "--kernel-table",
                 "--client-path", "--per-request"),
                (*CLOSED, "--disaggregate", "--sessions", "--max-concurrency", "--dataset", "--records")),
}


@st.composite
def feature_args(draw: st.DrawFn, files: FileFactory) -> list[str]:
    always, exclude = FEATURE_MODES[draw(st.sampled_from(sorted(FEATURE_MODES)))]
    return draw(command_line(main, files, always=always, most=2, exclude=exclude)) + ["--quiet"]


@pytest.mark.parametrize("command", ["features"])
def test_serving_features(command: str, files: FileFactory) -> None:
    # replicas and routers, disaggregation, speculative decoding, closed loop, sessions, datasets, outputs
    @fuzz_settings(command)
    @given(feature_args(files))
    def case(args: list[str]) -> None:
        check("main", args, files.root, tally_as=command)

    case()


TRACE_OPTIONS = ("--trace-speedup", "--trace-start", "--trace-duration", "--replicas", "--router", "--max-num-seqs",
                 "--scheduler", "--json", "--per-request", "--save-result", "--result-format")


@pytest.mark.parametrize("command", ["traces"])
def test_every_trace_format(command: str, files: FileFactory) -> None:
    # memwall, Azure 2023/2024, Vidur, BurstGPT CSV; JSON Lines; vLLM result JSON; a JSON list of rows
    allowed = click.Command("main", params=[p for p in main.params if isinstance(p, click.Option) and p.opts[0] in TRACE_OPTIONS])

    @fuzz_settings(command)
    @given(trace_file(files), st.sampled_from(("llama2-7b", "llama3-8b")), command_line(allowed, files, most=3))
    def case(trace: str, model: str, args: list[str]) -> None:
        check("main", ["--model", model, "--gpu", "a100", "--trace", trace, "--quiet", *args], files.root, tally_as=command)

    case()


FROM_BENCHMARK_OPTIONS = ("--model", "--base", "--tp", "--weights", "--kv", "--engine", "--input-tokens", "--output-tokens",
                          "--json", "--out")


@pytest.mark.parametrize("command", ["from-benchmark"])
def test_calibrate_from_benchmark(command: str, files: FileFactory) -> None:
    # vLLM serving / throughput JSON and published.csv-schema CSV, fields set to what the issue 37 fuzzer used
    calibrate = _command("calibrate")
    allowed = click.Command("calibrate", params=[p for p in calibrate.params if p.opts[0] in FROM_BENCHMARK_OPTIONS])

    clean_mostly = st.sampled_from((True, True, False))  # the benchmark file carries most of the edges
    options = clean_mostly.flatmap(lambda clean: command_line(allowed, files, always=("--model", "--base"), most=3, clean=clean))

    @fuzz_settings(command)
    @given(benchmark_file(files), st.booleans(), options)
    def case(benchmark: str, lengths: bool, args: list[str]) -> None:
        extra = ["--input-tokens", "200", "--output-tokens", "100"] if lengths else []
        check("calibrate", ["--from-benchmark", benchmark, *extra, *args], files.root, tally_as=command)

    case()


@pytest.mark.parametrize("command", STEP_COMMANDS + ("compare",))
def test_step_commands(command: str, files: FileFactory) -> None:
    always = ALWAYS if command != "compare" else ("--model", "--gpu", "--ctx")

    @fuzz_settings(command)
    @given(command_line(_command(command), files, always=always, most=5))
    def case(args: list[str]) -> None:
        check(command, args, files.root)

    case()


SWEEP_OPTIONS = ("--out", "--resume", "--plot", "--launch-command")


@pytest.mark.parametrize("command", ["sweep"])
def test_sweep(command: str, files: FileFactory) -> None:
    # One worker in this process (no pool, no Dask): the fuzz is about inputs, not executors.
    sweep = _command("sweep")
    allowed = click.Command("sweep", params=[p for p in sweep.params if isinstance(p, click.Option) and p.opts[0] in SWEEP_OPTIONS])

    @fuzz_settings(command)
    @given(scenario_file(files), command_line(allowed, files, most=2))
    def case(scenario: str, args: list[str]) -> None:
        check(command, [scenario, "--workers", "1", *args], files.root)

    case()


@pytest.mark.parametrize("command", ["validate"])
def test_validate(command: str, files: FileFactory) -> None:
    # --write-bands rewrites the shipped bands file: never fuzzed.
    validate = _command("validate")
    allowed = click.Command("validate", params=[p for p in validate.params if p.name != "write_bands"])

    @fuzz_settings(command)
    @given(command_line(allowed, files, always=("--csv",), most=2))
    def case(args: list[str]) -> None:
        if not any(a == "--csv" or a.startswith("--csv=") for a in args):
            args = ["--csv", str(Path(__file__).parent / "data" / "published_small.csv"), *args]
        check(command, args, files.root)

    case()


CALIBRATE_OPTIONS = ("--json", "--overlay", "--out", "--base", "--dtype", "--save-measurements", "--from-benchmark")


@pytest.mark.parametrize("command", ["calibrate"])
def test_calibrate_check(command: str, files: FileFactory) -> None:
    # Always from saved timings: nothing is measured (no PyTorch run).
    calibrate = _command("calibrate")
    allowed = click.Command("calibrate", params=[p for p in calibrate.params if p.opts[0] in CALIBRATE_OPTIONS])

    @fuzz_settings(command)
    @given(st.data())
    def case(data: st.DataObject) -> None:
        from fuzz_strategies import timings_file

        timings = data.draw(timings_file(files))
        args = ["--check", "--measurements", timings, *data.draw(command_line(allowed, files, most=3))]
        check(command, args, files.root)

    case()


@pytest.mark.parametrize("command", ["models", "gpus"])
def test_listings_with_a_generated_config_dir(command: str, files: FileFactory) -> None:
    # $MEMWALL_CONFIG_DIR adds a folder of configs to the shipped ones; a bad file there is bad input.
    @fuzz_settings(command)
    @given(st.data(), st.booleans())
    def case(data: st.DataObject, as_json: bool) -> None:
        folder = files.root / f"cfg{next(_folders)}"
        (folder / "models").mkdir(parents=True)
        (folder / "gpus").mkdir()
        made = data.draw(model_file(files) if command == "models" else gpu_file(files))
        suffix = Path(made).suffix if Path(made).suffix in (".yaml", ".json") else ".yaml"
        (folder / command / f"fuzz{suffix}").write_bytes(Path(made).read_bytes())
        check(command, ["--json"] if as_json else [], files.root, env={"MEMWALL_CONFIG_DIR": str(folder)})

    case()


_folders = iter(range(10**9))


@pytest.mark.parametrize("command", ["configs"])
def test_config_files_through_main(command: str, files: FileFactory) -> None:
    # Generated model and GPU files given by path to the main command (a tiny closed batch).
    @fuzz_settings(command)
    @given(model_file(files), gpu_file(files), st.booleans())
    def case(model: str, gpu: str, as_json: bool) -> None:
        args = ["--model", model, "--gpu", gpu, "--batch", "1", "--ctx", "128", "--gen", "8", "--quiet"]
        check("main", args + (["--json"] if as_json else []), files.root)

    case()
