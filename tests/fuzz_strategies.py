"""Hypothesis strategies for the CLI fuzz test (tests/test_fuzz.py): command lines and input files.

Command lines are built from the click commands' own parameters, so a new flag is fuzzed the
day it is added. Each option's value is usually valid and small (tiny runs: llama2-7b-sized
models, batch and context small, at most 50 requests, so a case takes milliseconds) and
sometimes an edge: NaN, inf, 1e-320, 2^63, negative, empty, text where a number goes.

Files come valid and invalid: model / GPU YAML (and HF config.json), scenario YAML, trace
CSV/JSONL, the validation table (published.csv schema) and calibration timings JSON. Each is
mutated by a field set to an edge value, a field dropped, wrong types, deep nesting, YAML tags
that do not convert, random bytes, Latin-1 or a byte-order mark.
"""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path
from typing import Any

import click
import yaml
from hypothesis import strategies as st

DATA = Path(__file__).parent / "data"

MODELS = ("llama2-7b", "mistral-7b", "llama3-8b", "gptj-6b", "falcon-7b", "llama2-13b")
GPUS = ("a100", "h100", "h200", "l4", "l40s", "a10g", "v100", "mi300x", "b200", "a100-sxm4-40gb")
WEIGHTS = ("fp16", "bf16", "fp32", "fp8", "int8", "int4")

# Numbers (as text) that a parser or an arithmetic path is likely to mishandle.
EDGE_NUMBERS = (
    "nan", "NaN", "inf", "-inf", "Infinity", "1e-320", "-1e-320", "5e-324", "1e308", "1e309", "-1", "0", "-0",
    "0.0", "1e-9", "0.5", "1.5", "2147483648", "4294967296", "9223372036854775807", "9223372036854775808",
    "18446744073709551616", "1e20", "1e30", "100000000000", "abc", "", " ", "0x10", "1_000", "1e", "--", "1,5",
)
# Names over the file system's 255-byte limit (ENAMETOOLONG), bare and as paths: path-like options must refuse
# them in one line (issue 37).
LONG_NAMES = ("a" * 300, "/tmp/" + "b" * 300 + ".yaml", "c" * 300 + "/config.json", "é" * 200)
# A two-value option (--deploy PLATFORM DIR) is drawn as one text joined by this and split into its values.
DEPLOY_SEPARATOR = "\x1f"
EDGE_TEXT = ("", " ", "x", "none", "null", "::", "a:b:c", "é", "\x00", "-", "--json", "1e309", "nan", "💥", "a" * 300)


def _text_of(value: float) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def ints(low: int, high: int) -> st.SearchStrategy[str]:
    return st.integers(low, high).map(str)


def floats(low: float, high: float) -> st.SearchStrategy[str]:
    return st.floats(low, high, allow_nan=False, allow_infinity=False).map(_text_of)


def length_specs() -> st.SearchStrategy[str]:
    n = st.integers(1, 256)
    return st.one_of(
        n.map(str),
        st.tuples(n, n).map(lambda t: f"uniform:{min(t)}:{max(t)}"),
        st.tuples(n, st.integers(0, 64)).map(lambda t: f"normal:{t[0]}:{t[1]}"),
        st.sampled_from(("uniform:9", "normal:1", "uniform:5:1", "normal:-1:2", "uniform:0:0", "normal:nan:1",
                         "uniform:1:1e30", "lognormal:3:1", "uniform:1:inf", "zipf:2")),
        st.sampled_from(EDGE_NUMBERS),
    )


def attention_variants() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(("mha", "mqa", "gqa:1", "gqa:2", "gqa:4", "gqa:8", "MHA", " gqa:8 ")),
        st.sampled_from(("gqa:0", "gqa:-1", "gqa:3", "gqa:x", "gqa:", "gqa:1e3", "mla", "gqa:99999999999999999999")),
    )


class FileFactory:
    """Writes generated files under ``root`` with fresh names (configs are cached by path and mtime)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._counter = itertools.count()

    def write(self, suffix: str, content: bytes) -> str:
        path = self.root / f"f{next(self._counter)}{suffix}"
        path.write_bytes(content)
        return str(path)

    def out_path(self, suffix: str) -> str:
        return str(self.root / f"o{next(self._counter)}{suffix}")


# ---------------------------------------------------------------------------------------
# File contents


def _tiny_model() -> dict[str, Any]:
    return {
        "name": "fuzz-model", "num_layers": 2, "hidden_size": 256, "num_heads": 4, "num_kv_heads": 2,
        "ffn_size": 512, "vocab_size": 1000, "max_context": 4096,
    }


def _gpu() -> dict[str, Any]:
    return {
        "name": "fuzz-gpu", "peak_flops": {"fp32": 19.5e12, "fp16": 312e12, "bf16": 312e12}, "hbm_bytes": 80 * 2**30,
        "hbm_bandwidth_bytes_per_second": 2.039e12, "sram_bytes_per_sm": 167936, "sm_count": 108,
        "link_bandwidth_bytes_per_second": 300e9, "interconnect": "nvlink3",
    }


def _scenario(out: str, variant: int = 0) -> dict[str, Any]:
    """A valid scenario of at most four small points; ``variant`` picks its shape."""
    scenario: dict[str, Any] = {
        "name": "fuzz",
        "base": {"model": "llama2-7b", "gpu": "a100", "ctx": 256, "gen": 16},
        "sweep": {"grid": {"batch": [1, 2]}},
        "output": {"path": out},
    }
    if variant == 1:
        scenario["base"].update({"requests": 20, "qps": 5.0})
        scenario["sweep"] = {"grid": {"scheduler": ["continuous", "chunked", "prefill-first"]}}
        scenario["slo"] = {"ttft_p99_seconds": 1.0, "tpot_p99_seconds": 0.1}
    elif variant == 2:
        del scenario["base"]["ctx"], scenario["base"]["gpu"]
        scenario["sweep"] = {"zip": {"batch": [1, 4], "ctx": [128, 512]}, "grid": {"gpu": ["a100", "h100"]}}
        scenario["cost"] = {"usd_per_gpu_hour": {"a100": 2.0}}
    elif variant == 3:
        del scenario["base"]["ctx"]
        scenario["sweep"] = {"grid": {"ctx": {"powers_of_two": {"start": 128, "stop": 512}}}}
        scenario["slo"] = {"e2e_p99_seconds": 5.0}
        scenario["search"] = {"max_batch_under_slo": {"low": 1, "high": 8}}
    elif variant == 4:
        scenario["base"].update({"requests": 10})
        del scenario["base"]["gen"]
        scenario["sweep"] = {"grid": {"scheduler": ["continuous", "static"]}, "zip": {"gen": {"start": 8, "stop": 16, "step": 8}}}
        scenario["slo"] = {"ttft_p99_seconds": 2.0}
        scenario["search"] = {"max_qps_under_slo": {"low": 0.5, "high": 8.0, "tolerance": 0.25}, "min_gpus_for_qps": {"qps": 10.0}}
    elif variant == 5:  # replicas behind each router
        scenario["base"].update({"requests": 20, "qps": 8.0, "replicas": 2, "prefix_caching": True, "shared_prefix_tokens": 64})
        scenario["sweep"] = {"grid": {"router": ["round_robin", "least_outstanding", "least_kv", "prefix"]}}
    elif variant == 6:  # disaggregated prefill and decode
        scenario["base"].update({"requests": 20, "qps": 5.0, "disaggregate": "1:1"})
        scenario["sweep"] = {"grid": {"decode_tp": [1, 2]}}
    elif variant == 7:  # speculative decoding
        scenario["base"].update({"speculative": "eagle", "num_speculative_tokens": 3})
        scenario["sweep"] = {"grid": {"acceptance": [0.5, 0.8]}}
    elif variant == 8:  # vLLM's spellings, as the CLI takes them
        del scenario["base"]["gen"]
        scenario["base"].update({"enable_prefix_caching": True, "pipeline_parallel_size": 1, "num_prompts": 10,
                                 "output_len": 16, "request_rate": 4.0})
        scenario["sweep"] = {"grid": {"tensor_parallel_size": [1, 2]}}
    elif variant == 9:  # closed loop, a dataset of lengths, the client path
        del scenario["base"]["ctx"], scenario["base"]["gen"]
        scenario["base"].update({"requests": 12, "max_concurrency": 4, "dataset": "sharegpt"})
        scenario["sweep"] = {"grid": {"client_path": ["on", "off"]}}
    return scenario


def _hf_config() -> dict[str, Any]:
    return json.loads((DATA / "llama-2-7b-hf-config.json").read_text(encoding="utf-8"))


EDGE_VALUES: tuple[Any, ...] = (
    float("nan"), float("inf"), -float("inf"), 1e-320, -1, 0, 2**63, 10**30, 1e308, "abc", "", None, True, [], {},
    [1, 2], {"a": 1}, "1e309", 0.5, 10**5000,
)


def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@st.composite
def mutated_mapping(draw: st.DrawFn, base: dict[str, Any], extra_keys: tuple[str, ...] = ()) -> Any:
    """``base`` with up to three mutations: a field set to an edge value, dropped, added, or nested deep."""
    data = copy.deepcopy(base)
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(("set", "drop", "add", "deep", "nested")))
        keys = sorted(data) if isinstance(data, dict) else []
        if kind == "set" and keys:
            data[draw(st.sampled_from(keys))] = draw(st.sampled_from(EDGE_VALUES))
        elif kind == "drop" and keys:
            data.pop(draw(st.sampled_from(keys)))
        elif kind == "add":
            data[draw(st.sampled_from(("junk", *extra_keys)))] = draw(st.sampled_from(EDGE_VALUES))
        elif kind == "deep" and keys:
            data[draw(st.sampled_from(keys))] = _deep(draw(st.sampled_from((70, 1200, 5000))))
        elif kind == "nested" and keys:
            key = draw(st.sampled_from(keys))
            if isinstance(data[key], dict) and data[key]:
                inner = data[key]
                inner[draw(st.sampled_from(sorted(inner)))] = draw(st.sampled_from(EDGE_VALUES))
    return data


def _yaml_text(data: Any) -> str:
    # Edge floats as YAML spells them (.nan, .inf); huge ints and others through safe_dump.
    try:
        return yaml.safe_dump(data, sort_keys=False, width=10**6)
    except (yaml.YAMLError, RecursionError, ValueError):
        return "name: [unterminated\n"


def _json_text(data: Any) -> str:
    try:
        return json.dumps(data)  # NaN/Infinity written as JSON does not allow: the reader must refuse them
    except (RecursionError, ValueError):
        return "{\"name\": "


@st.composite
def encoded(draw: st.DrawFn, text: str) -> bytes:
    """``text`` as UTF-8, with a BOM, as Latin-1 with a non-ASCII byte, truncated, or random bytes."""
    kind = draw(st.sampled_from(("utf8", "utf8", "utf8", "bom", "latin1", "cut", "bytes", "empty", "nul")))
    if kind == "bom":
        return b"\xef\xbb\xbf" + text.encode("utf-8")
    if kind == "latin1":
        return ("# caf\xe9\n" + text).encode("latin-1", errors="replace")
    if kind == "cut":
        data = text.encode("utf-8")
        return data[: draw(st.integers(0, max(0, len(data) - 1)))]
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "empty":
        return b""
    if kind == "nul":
        return text.encode("utf-8") + b"\x00\x01"
    return text.encode("utf-8")


YAML_TRICKS = (
    "name: !!float abc\n", "num_layers: !!int x\n", "a: &x [1]\nb: *x\n", "!!python/object:os.system {}\n",
    "? [1, 2]\n: 3\n", "name: [1, 2\n", "- 1\n- 2\n", "42\n", "name: 2024-01-01\n", "name: !!binary '%%%'\n",
    "x: " + "[" * 2000 + "]" * 2000 + "\n", "lol: &a [1,1,1,1,1,1,1,1,1]\nlol2: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\n",
    "num_layers: 1e400\nhidden_size: .inf\n", "hidden_size: 99999999999999999999999999999999\n",
    "num_layers: !!int +\n", "hidden_size: !!float ''\n",
)


@st.composite
def yaml_file(draw: st.DrawFn, files: FileFactory, base: dict[str, Any], extra_keys: tuple[str, ...] = (),
              suffix: str = ".yaml") -> str:
    if draw(st.integers(0, 4)) < 2:  # clean
        return files.write(suffix, _yaml_text(base).encode("utf-8"))
    if draw(st.integers(0, 9)) == 0:
        text = draw(st.sampled_from(YAML_TRICKS))
    else:
        text = _yaml_text(draw(mutated_mapping(base, extra_keys)))
    return files.write(suffix, draw(encoded(text)))


@st.composite
def model_file(draw: st.DrawFn, files: FileFactory) -> str:
    if draw(st.booleans()):
        text = _json_text(draw(mutated_mapping(_hf_config(), ("sliding_window", "num_local_experts", "head_dim"))))
        return files.write(".json", draw(encoded(text)))
    return draw(yaml_file(files, _tiny_model(), ("head_dim", "sliding_window", "moe_experts", "moe_top_k")))


@st.composite
def gpu_file(draw: st.DrawFn, files: FileFactory) -> str:
    kind = draw(st.sampled_from(("full", "full", "overlay", "self", "cycle")))
    if kind == "overlay":
        base = {"base": draw(st.sampled_from(("a100", "h100", "nosuch", ""))), "efficiency": {"memory": 0.7}}
        return draw(yaml_file(files, base, ("hbm_bytes", "efficiency_by_op")))
    if kind == "self":
        path = files.out_path(".yaml")
        Path(path).write_text(f"base: {path}\nname: loop\n", encoding="utf-8")
        return path
    if kind == "cycle":
        first, second = files.out_path(".yaml"), files.out_path(".yaml")
        Path(first).write_text(f"base: {second}\n", encoding="utf-8")
        Path(second).write_text(f"base: {first}\n", encoding="utf-8")
        return first
    return draw(yaml_file(files, _gpu(), ("efficiency", "l2_bytes")))


@st.composite
def scenario_file(draw: st.DrawFn, files: FileFactory) -> str:
    base = _scenario(files.out_path(draw(st.sampled_from((".csv", ".jsonl")))), draw(st.integers(0, 9)))
    if draw(st.booleans()):  # clean: the points run
        return files.write(".yaml", _yaml_text(base).encode("utf-8"))
    tricks = (
        {"sweep": {"grid": {"batch": {"powers_of_two": {"start": 1, "stop": float("inf")}}}}},
        {"sweep": {"grid": {"batch": {"powers_of_two": {"start": 1, "stop": float("nan")}}}}},
        {"sweep": {"grid": {"batch": {"powers_of_two": {"start": 1e-300, "stop": 2}}}}},
        {"sweep": {"grid": {"batch": {"start": 1, "stop": 3, "step": 1e-300}}}},
        {"sweep": {"grid": {"batch": {"start": 0, "stop": float("inf"), "step": 1}}}},
        {"sweep": {"grid": {"qps": [0.5, float("nan")]}}},
        {"base": {"model": None, "gpu": "a100"}},
        {"base": {"model": "llama2-7b", "gpu": None}},
        {"base": {"model": ["llama2-7b"], "gpu": "a100"}},
        {"base": {"model": "llama2-7b", "gpu": "a100", "requests": 10, "qps": 1e-320}},
        {"slo": {"ttft_p99_seconds": float("inf")}},
        {"search": {"max_batch_under_slo": {"low": 1, "high": 4}}, "slo": {"ttft_p99_seconds": 10.0}},
        {"search": {"max_qps_under_slo": {"low": 0.1, "high": float("inf")}}, "slo": {"ttft_p99_seconds": 1.0}},
        {"cost": {"usd_per_gpu_hour": {"a100": float("nan")}}},
        {"output": {"path": ""}},
        {"output": {"path": str(files.root / "missing" / "dir" / "x.csv")}},
        {"sweep": {"zip": {"batch": [1, 2], "ctx": [256]}}},
        {"base": {"model": "a" * 300, "gpu": "a100"}},
        {"base": {"model": "llama2-7b", "gpu": "a100", "trace": "t" * 300}},
        {"base": {"model": "llama2-7b", "gpu": "a100", "speculative": "draft:" + "d" * 300, "acceptance": 0.7,
                  "num_speculative_tokens": 2}},
        {"base": {"model": "llama2-7b", "gpu": "a100", "speculative": "eagle", "acceptance": ",".join(["0.5"] * 1000)}},
        {"base": {"model": "llama2-7b", "gpu": "a100", "tp": 1, "tensor_parallel_size": 2}},
        {"base": {"model": "llama2-7b", "gpu": "a100", "request_rate": "abc"}},
        {"sweep": {"grid": {"enable_chunked_prefill": [True, False]}}},
        {"sweep": {"grid": {"request_rate": [1.0, "inf"]}}},
        {"sweep": {"grid": {"goodput": ["ttft:500", "tpot:50"]}}},
        {"base": {"model": "llama2-7b", "gpu": "a100", "disaggregate": 13}},
        {"base": {"model": "llama2-7b", "gpu": "a100", "replicas": 10**9}},
    )
    if draw(st.integers(0, 3)) == 0:
        trick = copy.deepcopy(draw(st.sampled_from(tricks)))
        for key, value in trick.items():
            base[key] = {**base[key], **value} if isinstance(base.get(key), dict) and key != "sweep" else value
        text = _yaml_text(base)
    elif draw(st.integers(0, 9)) == 0:
        text = draw(st.sampled_from(YAML_TRICKS))
    else:
        text = _yaml_text(draw(mutated_mapping(base, ("slo", "search", "cost", "description"))))
    return files.write(".yaml", draw(encoded(text)))


TRACE_HEADERS = (
    "arrival_seconds,prompt_tokens,output_tokens", "TIMESTAMP,ContextTokens,GeneratedTokens",
    "Timestamp,Request tokens,Response tokens", "arrived_at,num_prefill_tokens,num_decode_tokens",
    "time,input_tokens,generated_tokens", "a,b,c", "",
)
TRACE_CELLS = ("0", "0.5", "1", "10", "100", "-1", "nan", "inf", "1e308", "2147483648", "", "x", "1.5",
               "2023-11-16 18:15:46.6805900", "2024-05-10 00:00:00.009930+00:00", "9999-99-99", "1e-320")


# One valid row per trace format (simulator/engine/traces.py's table), by header.
TRACE_FORMATS = (
    ("arrival_seconds,prompt_tokens,output_tokens", "{t:.3f},{p},{o}"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens", "2023-11-16 18:15:{s:02d}.6805900,{p},{o}"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens", "2024-05-10 00:00:{s:02d}.009930+00:00,{p},{o}"),
    ("arrived_at,num_prefill_tokens,num_decode_tokens", "{t:.3f},{p},{o}"),
    ("num_prefill_tokens,num_decode_tokens", "{p},{o}"),
    ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type", "{t:.1f},ChatGPT,{p},{o},{n},Conversation log"),
)


@st.composite
def vllm_result_trace(draw: st.DrawFn, files: FileFactory) -> str:
    """A vLLM benchmark_serving result JSON (input_lens, output_lens, start_times) read as a trace, maybe mutated."""
    n = draw(st.integers(1, 6))
    data: dict[str, Any] = {
        "completed": n, "input_lens": [draw(st.integers(1, 200)) for _ in range(n)],
        "output_lens": [draw(st.integers(0, 40)) for _ in range(n)],
        "start_times": sorted(draw(st.floats(0, 100)) for _ in range(n)),
    }
    if draw(st.booleans()):
        data = draw(mutated_mapping(data, ("errors", "ttfts")))
    if draw(st.integers(0, 3)) == 0 and isinstance(data, dict):
        key = draw(st.sampled_from(("input_lens", "output_lens", "start_times")))
        if isinstance(data.get(key), list) and data[key]:
            data[key][draw(st.integers(0, len(data[key]) - 1))] = draw(st.sampled_from(EDGE_VALUES))
    return files.write(".json", draw(encoded(_json_text(data))))


@st.composite
def trace_file(draw: st.DrawFn, files: FileFactory) -> str:
    """A trace in one of the formats read (CSV by header, JSON Lines, vLLM result JSON, JSON list), often broken."""
    kind = draw(st.sampled_from(("format", "format", "format", "jsonl", "vllm", "list", "odd")))
    if kind == "format":
        header, row = draw(st.sampled_from(TRACE_FORMATS))
        count = draw(st.integers(1, 8))
        rows = [row.format(t=i * draw(st.floats(0, 5)), s=i % 60, p=draw(st.integers(1, 200)), o=draw(st.integers(0, 40)),
                           n=0) for i in range(count)]
        if draw(st.booleans()):  # one cell broken
            broken = draw(st.integers(0, count - 1))
            cells = rows[broken].split(",")
            cells[draw(st.integers(0, len(cells) - 1))] = draw(st.sampled_from(TRACE_CELLS))
            rows[broken] = ",".join(cells)
        return files.write(".csv", draw(encoded("\n".join([header, *rows]) + "\n")))
    if kind == "vllm":
        return draw(vllm_result_trace(files))
    if kind == "list":
        rows = draw(st.lists(st.fixed_dictionaries({
            "arrival_seconds": st.sampled_from((0, 0.5, 1.0, -1, "x", None)),
            "prompt_tokens": st.sampled_from((1, 16, 100, 0, 2**40, 1.5)),
            "output_tokens": st.sampled_from((1, 8, 32, 0, None)),
        }), min_size=0, max_size=6))
        return files.write(".json", draw(encoded(_json_text(rows))))
    if kind == "jsonl":
        rows = draw(st.lists(st.fixed_dictionaries({
            "arrival_seconds": st.sampled_from((0, 0.5, 1.0, -1, float("nan"), "x", None)),
            "prompt_tokens": st.sampled_from((1, 16, 100, 0, -3, 2**40, 1.5, "7")),
            "output_tokens": st.sampled_from((1, 8, 32, 0, 2**31, None)),
        }), min_size=0, max_size=6))
        text = "\n".join(_json_text(row) for row in rows) + "\n"
        return files.write(draw(st.sampled_from((".jsonl", ".ndjson"))), draw(encoded(text)))
    header = draw(st.sampled_from(TRACE_HEADERS))  # "odd": any header, any cells
    valid_row = st.tuples(st.floats(0, 100).map(lambda t: f"{t:.3f}"), ints(1, 200), ints(1, 40)).map(",".join)
    odd_row = st.lists(st.sampled_from(TRACE_CELLS), min_size=1, max_size=4).map(",".join)
    rows = draw(st.lists(st.one_of(valid_row, valid_row, valid_row, odd_row), min_size=0, max_size=8))
    return files.write(".csv", draw(encoded("\n".join([header, *rows]) + "\n")))


def _table_rows() -> tuple[str, list[list[str]]]:
    lines = (DATA / "published_small.csv").read_text(encoding="utf-8").splitlines()
    header = lines[0]
    return header, [line.split(",") for line in lines[1:3]]


@st.composite
def measurements_csv(draw: st.DrawFn, files: FileFactory) -> str:
    """A small table in the published.csv schema (two rows of tests/data/published_small.csv), cells mutated."""
    header, rows = _table_rows()
    columns = header.split(",")
    rows = [list(r) for r in rows[: draw(st.integers(0, 2))]]
    for _ in range(draw(st.integers(0, 3))):
        if not rows:
            break
        row = draw(st.sampled_from(rows))
        column = draw(st.integers(0, len(columns) - 1))
        if column < len(row):
            row[column] = draw(st.sampled_from(EDGE_NUMBERS + ("llama2-7b", "a100", "ttft_seconds", "poisson", "zipf:1")))
    if draw(st.integers(0, 5)) == 0:
        header = ",".join(draw(st.permutations(columns))[: draw(st.integers(0, len(columns)))])
    text = "\n".join([header, *(",".join(r) for r in rows)]) + "\n"
    return files.write(".csv", draw(encoded(text)))


def _timings() -> dict[str, Any]:
    """Calibration timings of a tiny model on the A100 base (the shape ``simulate calibrate`` saves)."""
    model = {"name": "hand", "num_layers": 1, "hidden_size": 8, "num_heads": 1, "ffn_size": 16, "vocab_size": 16, "max_context": 64}
    return {
        "schema": "memwall-calibration/1",
        "device": {"kind": "cuda", "name": "Fuzz GPU", "torch": "2.13.0", "cuda": "12.8", "date": "2026-01-01T00:00:00Z"},
        "base_gpu": "A100-SXM4-80GB", "dtype": "fp16", "plan": "fuzz",
        "peaks": {"source": "datasheet", "flops": {"fp16": 1e12}, "hbm_bandwidth_bytes_per_second": 1e9},
        "launch_seconds": 1e-6, "timing": {"method": "made up", "warmup": 0, "repeats": 1, "statistic": "median"},
        "bandwidth": [{"kernel": "copy", "buffer_bytes": 10**6, "bytes": 2e6, "seconds": 2.5e-3, "bytes_per_second": 8e8}],
        "elementwise": [{"kernel": "add", "dtype": "fp16", "tokens": 1, "width": 8, "flops": 8, "bytes": 48, "seconds": 5e-7}],
        "gemm": [{"dtype": "fp16", "model": "m", "op": "o", "tokens": 4096, "k": 1, "n": 1, "flops": 1e10, "bytes": 1e6, "seconds": 0.0125}],
        "attention": [{"variant": "MHA", "phase": "decode", "batch": 1, "context": 512, "tokens": 1, "dtype": "fp16",
                       "flops": 1e3, "bytes": 1e6, "seconds": 4e-3}],
        "endtoend": {"model": model, "cases": [{"phase": "decode", "batch": 1, "context": 4, "seconds": 0.8}]},
        "skipped": [{"section": "endtoend", "case": "decode batch=128", "reason": "does not fit"}],
    }


@st.composite
def timings_file(draw: st.DrawFn, files: FileFactory) -> str:
    data = _timings()
    if draw(st.integers(0, 4)) < 2:  # clean
        return files.write(".json", json.dumps(data).encode("utf-8"))
    section = draw(st.sampled_from(("top", "gemm", "attention", "bandwidth", "endtoend", "peaks", "device", "cases")))
    if section == "top":
        data = draw(mutated_mapping(data))
    elif section in ("gemm", "attention", "bandwidth"):
        data[section] = [draw(mutated_mapping(data[section][0])), *data[section]]
    elif section == "cases":
        data["endtoend"]["cases"] = [draw(mutated_mapping(data["endtoend"]["cases"][0]))]
    elif section == "endtoend":
        data["endtoend"]["model"] = draw(mutated_mapping(data["endtoend"]["model"]))
    else:
        data[section] = draw(mutated_mapping(data[section]))
    if draw(st.integers(0, 9)) == 0:
        data = draw(st.sampled_from(([], "x", {"schema": "memwall-calibration/1"}, {"schema": 1})))
    return files.write(".json", draw(encoded(_json_text(data))))


def _serving_result() -> dict[str, Any]:
    """A vLLM benchmark_serving result (--save-result) of three requests, as calibrate --from-benchmark reads it."""
    return {"completed": 3, "request_rate": "inf", "max_concurrency": None, "total_input_tokens": 600,
            "total_output_tokens": 60, "input_lens": [100, 200, 300], "output_lens": [10, 20, 30], "mean_ttft_ms": 25.0,
            "median_ttft_ms": 20.0, "p99_ttft_ms": 40.0, "mean_tpot_ms": 8.0, "median_tpot_ms": 7.5, "p99_tpot_ms": 12.0,
            "output_throughput": 150.0, "total_token_throughput": 1650.0, "request_throughput": 2.5}


def _throughput_result() -> dict[str, Any]:
    """A vLLM benchmark_throughput --output-json of 100 requests at once."""
    return {"elapsed_time": 10.0, "num_requests": 100, "total_num_tokens": 30000, "requests_per_second": 10.0,
            "tokens_per_second": 3000.0}


# The fields the fuzzer found crashing calibrate --from-benchmark (issue 37), and others like them.
BENCHMARK_EDGES: tuple[Any, ...] = ("inf", "-inf", "nan", "abc", "", None, {}, [], [1], True, -1, 0, 1.5, 10**30, 1e308)


@st.composite
def benchmark_file(draw: st.DrawFn, files: FileFactory) -> str:
    """A benchmark for calibrate --from-benchmark: serving JSON, throughput JSON or a published.csv-schema CSV."""
    kind = draw(st.sampled_from(("serving", "serving", "throughput", "csv")))
    if kind == "csv":
        return draw(measurements_csv(files))
    data = _serving_result() if kind == "serving" else _throughput_result()
    if draw(st.integers(0, 2)) == 0:  # clean
        return files.write(".json", json.dumps(data).encode("utf-8"))
    for _ in range(draw(st.sampled_from((1, 1, 1, 2, 3)))):
        key = draw(st.sampled_from(sorted(data)))
        if isinstance(data[key], list) and data[key] and draw(st.booleans()):
            data[key][draw(st.integers(0, len(data[key]) - 1))] = draw(st.sampled_from(BENCHMARK_EDGES))
        elif draw(st.integers(0, 4)) == 0:
            data.pop(key)
        else:
            data[key] = draw(st.sampled_from(BENCHMARK_EDGES))
    if draw(st.integers(0, 9)) == 0:
        data["input_lens"] = [1] * draw(st.sampled_from((0, 2, 5000)))  # lengths that disagree with output_lens
    text = _json_text(data)
    return files.write(".json", draw(encoded(text)) if draw(st.integers(0, 3)) == 0 else text.encode("utf-8"))


@st.composite
def lengths_file(draw: st.DrawFn, files: FileFactory) -> str:
    """A lengths CSV for --dataset (input_tokens,output_tokens pairs), with odd rows, headers and encodings."""
    header = draw(st.sampled_from(("input_tokens,output_tokens", "output_tokens,input_tokens,x", "input_tokens", "a,b", "")))
    cell = st.one_of(ints(0, 3000), st.sampled_from(TRACE_CELLS))
    rows = draw(st.lists(st.lists(cell, min_size=1, max_size=3).map(",".join), max_size=6))
    comment = "# lengths\n" if draw(st.booleans()) else ""
    return files.write(".csv", draw(encoded(comment + "\n".join([header, *rows]) + "\n")))


KERNEL_TABLE_HEAD = "# memwall kernel table 1\n# gpu: A100-SXM4-80GB\n# engine: torch\nop,dtype,m,n,k,seconds\n"
KERNEL_CELLS = ("gemm", "conv", "fp16", "bf16", "fp8", "nvfp4", "int4_wo", "fp4", "1", "0", "-1", "4096", "nan", "inf", "1e-320", "x", "", "1e308",
                "99999999999999999999")


@st.composite
def kernel_table_file(draw: st.DrawFn, files: FileFactory, clean: bool = False) -> str:
    """A memwall kernel table (what calibrate --kernel-table-out writes), valid or with broken cells and lines."""
    rows = [f"gemm,bf16,{m},4096,4096,{m * 2e-6:.6e}" for m in (1, 8, 64, 512)]
    if clean or draw(st.integers(0, 2)) == 0:
        return files.write(".csv", (KERNEL_TABLE_HEAD + "\n".join(rows) + "\n").encode("utf-8"))
    head = KERNEL_TABLE_HEAD
    if draw(st.integers(0, 4)) == 0:
        head = draw(st.sampled_from(("", "# memwall kernel table 2\n", "# memwall kernel table 1\nop,dtype,m,n,k,seconds\n",
                                     "# memwall kernel table 1\n# gpu: x\nop,m,n\n")))
    for _ in range(draw(st.integers(1, 3))):
        index = draw(st.integers(0, len(rows) - 1))
        cells = rows[index].split(",")
        cells[draw(st.integers(0, len(cells) - 1))] = draw(st.sampled_from(KERNEL_CELLS))  # a row may be cut short
        rows[index] = ",".join(cells[: draw(st.integers(4, 6))] if draw(st.integers(0, 5)) == 0 else cells)
    return files.write(".csv", draw(encoded(head + "\n".join(rows) + "\n")))


# ---------------------------------------------------------------------------------------
# Command lines
#
# Each option has (valid values, edge values). A case is "clean" (every value valid: the run
# goes deep, through the engine and the reports) or "dirty" (each value an edge one time in
# two): half of the cases each, so both the happy paths and the error paths are exercised.


def _out(files: FileFactory, *suffixes: str) -> st.SearchStrategy[str]:
    return st.builds(files.out_path, st.sampled_from(suffixes))


def _valid_model_file(files: FileFactory) -> st.SearchStrategy[str]:
    return st.builds(lambda: files.write(".yaml", _yaml_text(_tiny_model()).encode("utf-8")))


def _valid_gpu_file(files: FileFactory) -> st.SearchStrategy[str]:
    return st.builds(lambda: files.write(".yaml", _yaml_text(_gpu()).encode("utf-8")))


def _valid_timings_file(files: FileFactory) -> st.SearchStrategy[str]:
    return st.builds(lambda: files.write(".json", json.dumps(_timings()).encode("utf-8")))


def option_choices(name: str, param: click.Parameter, files: FileFactory) -> tuple[st.SearchStrategy[str], st.SearchStrategy[str]]:
    """(valid, edge) values, as text, for the option named ``name`` (``--batch`` -> ``batch``)."""
    edge_numbers = st.sampled_from(EDGE_NUMBERS)
    numbers: dict[str, st.SearchStrategy[str]] = {
        "batch": ints(1, 16), "ctx": ints(64, 2048), "gen": ints(1, 32), "requests": ints(1, 50), "num_prompts": ints(1, 50),
        "group_size": st.sampled_from(("32", "64", "128")), "tp": st.sampled_from(("1", "2", "4", "8")),
        "tensor_parallel_size": st.sampled_from(("1", "2")), "ep": st.sampled_from(("1", "2")), "top": ints(1, 12),
        "seed": ints(0, 2**31), "qps": floats(0.5, 200), "request_rate": floats(0.5, 200), "burstiness": floats(0.2, 8),
        "trace_speedup": floats(0.5, 50), "max_num_seqs": ints(1, 256), "max_batched_tokens": ints(256, 8192),
        "max_num_batched_tokens": ints(256, 8192), "block_size": st.sampled_from(("8", "16", "32")),
        "kv_blocks": ints(64, 100000), "gpu_memory_utilization": floats(0.5, 0.95),
        "compute_efficiency": floats(0.05, 1), "memory_efficiency": floats(0.05, 1), "link_efficiency": floats(0.05, 1),
        "kernel_overlap": floats(0, 1), "expert_efficiency": floats(0.05, 1),
        "launch_overhead": floats(0, 5e-5), "slo_ttft": floats(0.001, 10), "slo_tpot": floats(0.001, 1),
        "slo_e2e": floats(0.01, 100), "workers": st.just("1"), "budget_seconds": floats(1, 10),
        "input_tokens": ints(1, 512), "output_tokens": ints(1, 128),
        # serving features added after the first fuzz test: replicas and routers, prefixes, sessions, closed loop
        "replicas": ints(1, 4), "router_staleness": floats(0, 2), "shared_prefix_tokens": ints(1, 128),
        "shared_prefix_ratio": floats(0.1, 1), "sessions": ints(1, 6), "turns": ints(1, 4), "think_time": floats(0, 2),
        "turn_tokens": ints(1, 128), "max_concurrency": ints(1, 16), "warmup_requests": ints(0, 8),
        "num_speculative_tokens": ints(1, 6), "prefill_tp": st.sampled_from(("1", "2")), "decode_tp": st.sampled_from(("1", "2")),
        "pp": st.sampled_from(("1", "2")), "pipeline_parallel_size": st.sampled_from(("1", "2")),
        "trace_start": floats(0, 10), "trace_duration": floats(0.1, 100), "num_scheduler_steps": ints(1, 8),
        "routing_skew": floats(0, 2),
    }
    if name in numbers and name not in ("input_tokens", "output_tokens") or (
        name in ("input_tokens", "output_tokens") and isinstance(param.type, (click.types.IntParamType, click.IntRange))
    ):
        if name == "num_speculative_tokens":  # 64 at most: the bound's edges too
            return numbers[name], st.one_of(edge_numbers, st.sampled_from(("64", "65", "1000")))
        return numbers[name], edge_numbers
    # Junk outputs stay inside the fuzz folder: calibrate creates a missing folder for its outputs.
    junk_paths = st.sampled_from(("", ".", "/", str(files.root / "missing" / "x.csv"), "nosuch.yaml", "x.txt"))
    named: dict[str, tuple[st.SearchStrategy[str], st.SearchStrategy[str]]] = {
        "model": (st.one_of(st.sampled_from(MODELS), _valid_model_file(files)),
                  st.one_of(model_file(files), st.sampled_from(("nosuch", "", "llama", "x.yaml", "/", *LONG_NAMES)))),
        "gpu": (st.one_of(st.sampled_from(GPUS), _valid_gpu_file(files)),
                st.one_of(gpu_file(files), st.sampled_from(("nosuch", "", "a1000", "x.yaml", *LONG_NAMES)))),
        "weights": (st.sampled_from(WEIGHTS), st.sampled_from(("fp4", "", "FP16", "int3", "w4a16"))),
        "attention": (st.sampled_from(("mha", "mqa", "gqa:1", "gqa:2", "gqa:4", "gqa:8")), attention_variants()),
        "engine": (st.sampled_from(("vllm", "vllm-v0.6", "vllm-v0.2", "sglang", "trtllm", "trtllm-v0", "tgi-v1", "tgi-v2", "llamacpp", "ideal")),
                   st.sampled_from(("tgi", "", "x.yaml", *LONG_NAMES))),
        "trace": (st.builds(lambda: files.write(".csv", b"arrival_seconds,prompt_tokens,output_tokens\n0,100,10\n0.5,50,20\n")),
                  st.one_of(trace_file(files), st.sampled_from(LONG_NAMES))),
        "prompt_tokens": (ints(16, 512), length_specs()), "input_len": (ints(16, 512), length_specs()),
        "output_tokens": (ints(1, 64), length_specs()), "output_len": (ints(1, 64), length_specs()),
        "goodput": (st.sampled_from(("ttft:500", "tpot:50", "e2el:1000")),
                    st.sampled_from(("ttft:nan", "ttft:-1", "x:1", "ttft", "ttft:inf", "", "ttft:1e-320"))),
        "metric_percentiles": (st.sampled_from(("50,90,99", "99", "25,75")),
                               st.sampled_from(("0", "100", "101", "-1", "nan", "", "50,,90", "x"))),
        "percentile_metrics": (st.sampled_from(("ttft,tpot,itl,e2el", "ttft", "e2el")), st.sampled_from(("", "x", "ttft,,tpot"))),
        "per_request": (_out(files, ".csv"), junk_paths), "save_result": (_out(files, ".json"), junk_paths),
        "plot": (_out(files, ".png", ".svg"), junk_paths),
        "contexts": (st.sampled_from(("512", "256,1024", "512,4096")),
                     st.sampled_from(("0", "-1", "nan", "", "1e30", "512,,1024", "x", "99999999999"))),
        "csv": (st.just(str(DATA / "published_small.csv")), measurements_csv(files)),
        "measurements": (_valid_timings_file(files), timings_file(files)),
        "from_benchmark": (st.builds(lambda: files.write(".json", json.dumps(_serving_result()).encode("utf-8"))),
                           st.one_of(benchmark_file(files), st.sampled_from(LONG_NAMES))),
        "overlay": (_valid_gpu_file(files), gpu_file(files)),
        "base": (st.sampled_from(GPUS), st.sampled_from(("nosuch", ""))),
        "out": (_out(files, ".csv", ".jsonl", ".yaml"), junk_paths),
        "save_measurements": (_out(files, ".json"), junk_paths),
        "bands_out": (_out(files, ".csv", ".yaml"), junk_paths),
        "launch_command": (st.sampled_from(("vllm", "sglang")), st.sampled_from(("", "x"))),
        "prefill_gpu": (st.sampled_from(GPUS), st.one_of(gpu_file(files), st.sampled_from(LONG_NAMES + ("nosuch", "")))),
        "decode_gpu": (st.sampled_from(GPUS), st.one_of(gpu_file(files), st.sampled_from(LONG_NAMES + ("nosuch", "")))),
        "disaggregate": (st.sampled_from(("1:1", "1:2", "2:1", "1:3")),
                         st.sampled_from(("0:1", "1:0", "1", "1:2:3", "x:y", "1025:1", "1:1e3", "-1:1", ":", "1:", " 1 : 2 "))),
        "speculative": (st.one_of(st.sampled_from(("eagle", "mtp")), st.sampled_from(MODELS).map(lambda m: f"draft:{m}")),
                        st.one_of(st.sampled_from(("draft:", "draft:nosuch", "medusa", "draft", "DRAFT:llama2-7b", "eagle:3",
                                                   *(f"draft:{n}" for n in LONG_NAMES))),
                                  model_file(files).map(lambda path: f"draft:{path}"))),
        # a list: its length is k (a single rate needs --num-speculative-tokens as well)
        "acceptance": (st.lists(floats(0, 1), min_size=1, max_size=6).map(lambda rates: ",".join(rates + rates[:1])),
                       st.sampled_from(("1.5", "-0.1", "nan", "inf", ",", "0.5,,0.5", "", "x", "0.5,abc", "1e-320",
                                        ",".join(["0.5"] * 65), ",".join(["0.7"] * 1000), ",".join(["0.9"] * 20000)))),
        "kv_offload": (st.sampled_from(("cpu:1", "cpu:16", "nvme:4", "cpu:0.5:25", "nvme:100:3")),
                       st.sampled_from(("cpu:", "cpu", "cpu:-1", "gpu:1", "cpu:nan", "cpu:1e309", "nvme:1:0", "cpu:inf",
                                        "cpu:1:nan", "nvme:0", "cpu:1:2:3", ":1"))),
        "kernel_table": (kernel_table_file(files, clean=True),
                         st.one_of(kernel_table_file(files), st.sampled_from(LONG_NAMES + ("", "/", "nosuch.csv")))),
        "dataset": (st.one_of(st.just("sharegpt"), st.builds(lambda: files.write(".csv", b"input_tokens,output_tokens\n100,20\n50,8\n"))),
                    st.one_of(lengths_file(files), st.sampled_from(("nosuch", "", "sharegpt.csv", "/", *LONG_NAMES)))),
        "records": (_out(files, ""), junk_paths),
        "html": (_out(files, ".html"), junk_paths),
        "deploy": (st.tuples(st.sampled_from(("k8s", "llm-d", "dynamo")), _out(files, "")).map(DEPLOY_SEPARATOR.join),
                   st.tuples(st.sampled_from(("k8s", "x", "", "K8S", "dynamo")),
                             st.one_of(junk_paths, _out(files, ""))).map(DEPLOY_SEPARATOR.join)),
    }
    if name in named:
        return named[name]
    if isinstance(param.type, click.Choice):
        return st.sampled_from(tuple(param.type.choices)), st.sampled_from(("", "x", "NONE"))
    if isinstance(param.type, (click.types.IntParamType, click.IntRange)):
        return ints(1, 32), edge_numbers
    if isinstance(param.type, (click.types.FloatParamType, click.FloatRange)):
        return floats(0.01, 10), edge_numbers
    return st.sampled_from(EDGE_TEXT), st.sampled_from(EDGE_TEXT)


SKIPPED_OPTIONS = frozenset({"help", "version", "quiet"})
NAMED_FIRST = frozenset({"contexts"})


def long_name(param: click.Parameter) -> str:
    flags = [opt for opt in getattr(param, "opts", []) if opt.startswith("--")]
    return flags[0] if flags else str(param.name)


@st.composite
def command_line(draw: st.DrawFn, command: click.Command, files: FileFactory, always: tuple[str, ...] = (),
                 most: int = 6, clean: bool | None = None, exclude: tuple[str, ...] = ()) -> list[str]:
    """Options of ``command``: those in ``always``, up to ``most`` others, each with a value.

    ``clean`` (drawn when None): every value valid and ``exclude`` (flags that conflict with
    ``always``) left out; else each value an edge one time in two and any flag may come.
    """
    if clean is None:
        clean = draw(st.booleans())
    params = [p for p in command.params if isinstance(p, click.Option) and p.name not in SKIPPED_OPTIONS]
    by_flag = {long_name(p): p for p in params}
    chosen = [flag for flag in always if flag in by_flag and (clean or draw(st.integers(0, 9)) > 0)]
    others = sorted(set(by_flag) - set(chosen) - (set(exclude) if clean else set()))
    chosen += draw(st.lists(st.sampled_from(others), max_size=most, unique=True)) if others else []
    args: list[str] = []
    for flag in chosen:
        param = by_flag[flag]
        if param.is_flag:
            args.append(flag)
            continue
        # The parameter's name first (compare's --ctx is 'contexts', a list), then the flag's.
        name = str(param.name) if str(param.name) in NAMED_FIRST else flag[2:].replace("-", "_")
        valid, edge = option_choices(name, param, files)
        value = draw(valid if clean or draw(st.booleans()) else edge)
        if param.nargs > 1:  # --deploy PLATFORM DIR: its values as separate words (dropped or added ones are bad input too)
            parts = value.split(DEPLOY_SEPARATOR) if DEPLOY_SEPARATOR in value else [value] * param.nargs
            args += [flag, *parts]
        elif value.startswith("-") or value == "":
            args.append(f"{flag}={value}")  # else click would read it as the next option or drop it
        else:
            args += [flag, value]
    return args
