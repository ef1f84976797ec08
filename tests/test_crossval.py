"""Leave-one-source-out cross-validation, the fit rule, error summaries, error bands, user calibration."""

import csv
import dataclasses
import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from simulator.cli import main
from simulator.errors import InputError
from simulator.plan.error_bands import MIN_ROWS, error_band, lookup_band, regime_of_run
from simulator.validation.bands import Residual, band_of, bands_document, compute_bands, write_bands
from simulator.validation.crossval import (
    MIN_CLASS_ROWS,
    Solver,
    cross_validate,
    efficiencies_for,
    fit,
    solve_increasing,
    summarise,
)
from simulator.validation.replay import DEFAULT_EFFICIENCIES, Efficiencies, Replayer
from simulator.validation.table import COLUMNS, default_table, load_table
from simulator.validation.user_benchmark import BenchmarkSetup, rows_from_serving

DATA = Path(__file__).parent / "data"
SMALL = DATA / "published_small.csv"


@pytest.fixture(scope="module")
def small():
    rows = load_table(SMALL)
    with Replayer() as replayer:
        yield rows, cross_validate(rows, replayer)


# --- the split ----------------------------------------------------------------------------------

def test_no_fold_fits_on_the_source_it_predicts(small):
    rows, v = small
    source_of = {r.id: r.source_id for r in rows}
    for source, fits in v.fold_fits.items():
        used = {i for f in fits.values() for i in f.compute_rows + f.memory_rows}
        assert used and all(source_of[i] != source for i in used)


def test_a_sources_own_numbers_never_move_its_out_of_sample_predictions(small):
    """Make every figure of src-a absurd (x100): its in-sample predictions move (it takes part in the fit),
    its out-of-sample predictions do not (src-a is left out of the fold that predicts it)."""
    rows, v = small
    absurd = [dataclasses.replace(r, measured=r.measured * 100) if r.source_id == "src-a" else r for r in rows]
    with Replayer() as replayer:
        w = cross_validate(absurd, replayer)
    before = {s.row.id: s for s in v.scored}
    after = {s.row.id: s for s in w.scored}
    for i in ("1", "2", "3"):  # src-a
        assert after[i].out_of_sample.value == before[i].out_of_sample.value
    assert after["1"].in_sample.value != before["1"].in_sample.value
    # ...and the rows of other A100 sources, whose folds include src-a, are predicted differently
    assert after["4"].out_of_sample.value != before["4"].out_of_sample.value


def test_a_family_without_rows_keeps_the_defaults(small):
    _, v = small
    ada = v.in_sample_fit["ada"]
    assert (ada.compute, ada.memory) == (0.70, 0.80) and ada.compute_is_default and ada.memory_is_default


# --- the fit rule -------------------------------------------------------------------------------

def test_solve_increasing_finds_the_root_and_refuses_an_unbracketed_one():
    assert solve_increasing(lambda x: math.log(x / 0.3), 0.05, 1.0) == pytest.approx(0.3, abs=1e-4)
    assert solve_increasing(lambda x: x - 2.0, 0.05, 1.0) is None  # every x in [0.05, 1] is below 2
    assert solve_increasing(lambda x: None, 0.05, 1.0) is None


def test_the_fit_recovers_the_efficiencies_that_made_the_measurements(tmp_path):
    """Figures simulated at compute 0.6 / memory 0.7; the rule must find 0.6 / 0.7 from them."""
    shapes = [
        {"id": "c1", "batch": 1, "input_tokens": 2048, "output_tokens": 1, "metric": "ttft_seconds", "regime": "prefill"},
        {"id": "c2", "batch": 2, "input_tokens": 3000, "output_tokens": 1, "metric": "ttft_seconds", "model": "llama2-13b", "regime": "prefill"},
        {"id": "m1", "batch": 1, "input_tokens": 1, "output_tokens": 128, "metric": "decode_tokens_per_second_per_sequence"},
        {"id": "m2", "batch": 1, "input_tokens": 128, "output_tokens": 128, "metric": "tpot_seconds", "model": "llama2-13b"},
    ]
    base = {"source_id": "s", "engine": "vllm", "model": "llama2-7b", "gpu": "a100", "tp": 1, "weights": "fp16", "kv": "fp16",
                "mode": "static", "regime": "decode_b1", "measured": 1.0}
    path = tmp_path / "t.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(COLUMNS))
        writer.writeheader()
        writer.writerows({**base, **shape} for shape in shapes)
    truth = Efficiencies(0.6, 0.7)
    with Replayer() as replayer:
        rows = [dataclasses.replace(r, measured=replayer.predict(r, truth).value) for r in load_table(path)]
        fits = fit(rows, Solver(replayer))
    ampere = fits["ampere"]
    assert ampere.compute == pytest.approx(0.6, abs=2e-3) and ampere.memory == pytest.approx(0.7, abs=2e-3)
    assert ampere.compute_rows == ("c1", "c2") and ampere.memory_rows == ("m1", "m2")
    assert fits["hopper"].compute_is_default


def _write_table(path: Path, rows: list[dict]) -> None:
    base = {"source_id": "s", "engine": "vllm", "model": "llama2-7b", "gpu": "a100", "tp": 1, "weights": "fp16", "kv": "fp16",
            "mode": "static", "regime": "decode_b1", "measured": 1.0}
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(COLUMNS))
        writer.writeheader()
        writer.writerows({**base, **row} for row in rows)


PREFILLS = [  # compute-bound prefills (rule 1)
    {"batch": 1, "input_tokens": 2048, "output_tokens": 1, "metric": "ttft_seconds", "regime": "prefill"},
    {"batch": 2, "input_tokens": 3000, "output_tokens": 1, "metric": "ttft_seconds", "model": "llama2-13b", "regime": "prefill"},
    {"batch": 4, "input_tokens": 1024, "output_tokens": 1, "metric": "ttft_seconds", "regime": "prefill"},
]
DECODES = [  # memory-bound batch-1 decodes (rule 2)
    {"batch": 1, "input_tokens": 1, "output_tokens": 128, "metric": "decode_tokens_per_second_per_sequence"},
    {"batch": 1, "input_tokens": 128, "output_tokens": 128, "metric": "tpot_seconds", "model": "llama2-13b"},
    {"batch": 1, "input_tokens": 512, "output_tokens": 64, "metric": "tpot_seconds"},
]


def test_each_engine_of_a_family_gets_its_own_ceilings_and_a_thin_class_falls_back(tmp_path):
    """Three engines on A100, each its own source: vllm's figures made at compute 0.6 / memory 0.7, llamacpp's
    at 0.3 / 0.4 (3 prefills and 3 decodes each), tgi's at 0.5 / 0.55 (one prefill).

    In sample, vllm's and llamacpp's classes have 3 rows of each kind (MIN_CLASS_ROWS = 3) and recover their
    own ceilings (round 2 holds the class's own other value, so the solutions are exact). tgi's one prefill
    is too few: its class takes the family-wide values, whose compute is the median of the 7 prefills
    (about 0.3, 0.3, 0.3, 0.5, 0.6, 0.6, 0.6 -> 0.5; each solved with the family memory held, hence "about").
    Out of sample, the fold without s-l has no llamacpp row: no llamacpp class, and llamacpp's rows are
    predicted with that fold's family-wide fit."""
    assert MIN_CLASS_ROWS == 3
    truth = {"vllm": Efficiencies(0.6, 0.7), "llamacpp": Efficiencies(0.3, 0.4), "tgi": Efficiencies(0.5, 0.55)}
    shapes = [{**p, "id": f"vc{i}", "source_id": "s-v"} for i, p in enumerate(PREFILLS)]
    shapes += [{**d, "id": f"vm{i}", "source_id": "s-v"} for i, d in enumerate(DECODES)]
    shapes += [{**p, "id": f"lc{i}", "source_id": "s-l", "engine": "llamacpp"} for i, p in enumerate(PREFILLS)]
    shapes += [{**d, "id": f"lm{i}", "source_id": "s-l", "engine": "llamacpp"} for i, d in enumerate(DECODES)]
    shapes += [{**PREFILLS[0], "id": "tc0", "source_id": "s-t", "engine": "tgi"}]
    path = tmp_path / "t.csv"
    _write_table(path, shapes)
    with Replayer() as replayer:
        rows = [dataclasses.replace(r, measured=replayer.predict(r, truth[r.engine]).value) for r in load_table(path)]
        v = cross_validate(rows, replayer)
    fits = v.in_sample_fit
    # a TGI row of no stated version replays with the vllm profile: its class is TGI's own, "tgi:vllm"
    assert [r.runtime for r in rows if r.id in ("vc0", "lc0", "tc0")] == ["vllm", "llamacpp", "tgi:vllm"]
    vllm, llama, tgi = (fits.classes[("ampere", e)] for e in ("vllm", "llamacpp", "tgi:vllm"))
    assert (vllm.compute, vllm.memory) == (pytest.approx(0.6, abs=2e-3), pytest.approx(0.7, abs=2e-3))
    assert vllm.compute_rows == ("vc0", "vc1", "vc2") and vllm.memory_rows == ("vm0", "vm1", "vm2")
    assert (llama.compute, llama.memory) == (pytest.approx(0.3, abs=2e-3), pytest.approx(0.4, abs=2e-3))
    assert llama.compute_rows == ("lc0", "lc1", "lc2") and llama.memory_rows == ("lm0", "lm1", "lm2")
    wide = fits["ampere"]
    assert len(wide.compute_rows) == 7 and wide.compute == pytest.approx(0.5, abs=0.02)
    assert (tgi.compute, tgi.memory) == (wide.compute, wide.memory)
    assert tgi.compute_from_family and tgi.memory_from_family and tgi.compute_rows == () and not tgi.compute_is_default
    # a row of an engine with no calibrating row at all takes the family-wide ceilings
    other = dataclasses.replace(rows[0], engine="deepspeed-fastgen")
    assert efficiencies_for(fits, other) == wide.efficiencies
    assert efficiencies_for(fits, rows[0]) == vllm.efficiencies
    # leave one source out: the fold predicting s-l never saw a llamacpp row
    fold = v.fold_fits["s-l"]
    assert ("ampere", "llamacpp") not in fold.classes
    assert not any(i.startswith("l") for i in fold["ampere"].compute_rows + fold["ampere"].memory_rows)
    out = {s.row.id: s for s in v.scored}
    assert out["lc0"].out_of_sample.value == replayer_value(rows, "lc0", fold["ampere"].efficiencies)


def test_a_class_is_an_engine_and_the_release_its_profile_stands_for(tmp_path):
    """vLLM 0.4 (V0 loop) and 0.8 (V1), TGI 1.0.3 (no CUDA graphs) and 2.0.4, TensorRT-LLM 0.9 (C++ executor) and
    1.0 (Python), LMDeploy TurboMind (replayed with trtllm-v0, its own class) and llama.cpp: seven classes."""
    cells = [("vllm", "0.4.2"), ("vllm", "0.8.5"), ("tgi", "1.0.3"), ("tgi", "2.0.4"), ("trtllm", "0.9.0"),
             ("trtllm", "1.0"), ("lmdeploy", "0.2.0"), ("llamacpp", "")]
    path = tmp_path / "t.csv"
    _write_table(path, [{**PREFILLS[0], "id": f"r{i}", "engine": e, "engine_version": v} for i, (e, v) in enumerate(cells)])
    assert [r.runtime for r in load_table(path)] == [
        "vllm:vllm-v0", "vllm", "tgi:tgi-v1", "tgi:tgi-v2", "trtllm:trtllm-v0", "trtllm", "lmdeploy:trtllm-v0", "llamacpp"]


def replayer_value(rows, row_id: str, eff: Efficiencies) -> float | None:
    with Replayer() as replayer:
        return replayer.predict(next(r for r in rows if r.id == row_id), eff).value


# --- summaries ----------------------------------------------------------------------------------

def test_summary_numbers_on_hand_errors():
    # |errors| sorted: 0.1, 0.2, 0.6, 0.7 (None = skipped row, not counted)
    # median = (0.2 + 0.6) / 2 = 0.4; p90 at rank 0.9 x 3 = 2.7: 0.6 + 0.7 x (0.7 - 0.6) = 0.67; max 0.7
    s = summarise([0.1, -0.2, 0.6, -0.7, None])
    assert (s.rows, s.median, s.p90, s.max) == (4, pytest.approx(0.4), pytest.approx(0.67), pytest.approx(0.7))
    assert summarise([None]).median is None


# --- error bands --------------------------------------------------------------------------------

def test_band_arithmetic_by_hand():
    errors = [0.6, -0.3, 0.1, 0.4, -0.1, 0.0, 0.3, -0.2, 0.5, 0.2]
    # sorted: -0.3 -0.2 -0.1 0.0 0.1 0.2 0.3 0.4 0.5 0.6; 10th percentile at rank 0.1 x 9 = 0.9:
    # -0.3 + 0.9 x 0.1 = -0.21; 90th at rank 8.1: 0.5 + 0.1 x 0.1 = 0.51
    low, high = band_of(errors)
    assert low == pytest.approx(-0.21) and high == pytest.approx(0.51)


def _residuals() -> list[Residual]:
    out = [Residual("hopper", "vllm", "serving", "ttft", e) for e in (0.1, 0.2)]  # full class: 2 rows
    out += [Residual("hopper", "sglang", "serving", "ttft", e) for e in (-0.1, 0.0, 0.3, 0.4)]  # with vllm: 6
    out += [Residual("ampere", "vllm", "prefill", "ttft", e) for e in (0.0, 0.1)]
    return out


def test_the_fallback_goes_to_coarser_classes_and_says_so(tmp_path):
    path = tmp_path / "bands.json"
    write_bands(path, bands_document(_residuals(), {"test": True}))
    lookup = lookup_band("hopper", "vllm", "serving", "ttft", path)
    band = lookup.band
    assert band is not None and band.level == "family_regime" and band.rows == 6
    # hopper / serving / ttft: -0.1 0.0 0.1 0.2 0.3 0.4; rank 0.5 -> -0.05, rank 4.5 -> 0.35
    assert (band.low, band.high) == (pytest.approx(-0.05), pytest.approx(0.35))
    assert "hopper / vllm / serving / ttft: 2" in band.note
    assert "-5%..+35%, from 6 validation rows" in band.text()


def test_a_class_with_too_few_rows_everywhere_gives_no_band(tmp_path):
    path = tmp_path / "bands.json"
    write_bands(path, bands_document(_residuals(), {}))
    lookup = lookup_band("ampere", "vllm", "prefill", "ttft", path)
    assert lookup.band is None and f"fewer than {MIN_ROWS} validation rows" in lookup.reason
    assert error_band("ampere", "vllm", "prefill", "ttft", path) is None
    assert lookup_band("hopper", "vllm", "serving", "ttft", tmp_path / "none.json").reason.startswith("no error bands")


def test_bands_count_each_residual_once_per_level():
    classes = {(c["level"], c["family"], c["engine"], c["regime"], c["metric_kind"]): c for c in compute_bands(_residuals())}
    assert classes[("regime", None, None, "serving", "ttft")]["rows"] == 6
    assert classes[("full", "hopper", "vllm", "serving", "ttft")]["low"] is None  # 2 rows: no band


def test_regime_of_a_run():
    assert regime_of_run("ttft", 8, 2048, serving=True) == "serving"
    assert regime_of_run("ttft", 8, 40_000, serving=False) == "long_context"
    assert regime_of_run("ttft", 8, 2048, serving=False) == "prefill"
    assert [regime_of_run("tpot", b, 2048, serving=False) for b in (1, 8)] == ["decode_b1", "decode_batch"]


def test_write_bands_from_the_command(tmp_path):
    out = tmp_path / "bands.json"
    result = CliRunner().invoke(main, ["validate", "--csv", str(SMALL), "--write-bands", "--bands-out", str(out), "--no-rows"])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["schema"] == "memwall-error-bands/1" and data["min_rows"] == MIN_ROWS
    regime_rows = sum(c["rows"] for c in data["classes"] if c["level"] == "regime")
    assert regime_rows == 12  # every row of the small table was replayed out of sample


# --- the real table, a fast subset ---------------------------------------------------------------

def test_a_subset_of_the_shipped_table_is_replayed_and_split_by_source():
    rows = load_table(default_table())
    sizes: dict[str, int] = {}
    for r in rows:
        sizes[r.source_id] = sizes.get(r.source_id, 0) + 1
    # the two smallest sources of at least 4 rows: a few seconds however the table grows
    keep = {sorted((n, s) for s, n in sizes.items() if n >= 4)[i][1] for i in range(2)}
    subset = [r for r in rows if r.source_id in keep]
    with Replayer() as replayer:
        v = cross_validate(subset, replayer)
    for s in v.scored:
        assert s.error_out is not None or s.skipped  # scored, or skipped with its reason
    assert set(v.fold_fits) == keep
    source_of = {r.id: r.source_id for r in subset}
    for source, fits in v.fold_fits.items():
        assert all(source_of[i] != source for f in fits.values() for i in f.compute_rows + f.memory_rows)


# --- calibrating on a user's benchmark ----------------------------------------------------------

def _serving_json() -> dict:
    return {"completed": 3, "request_rate": "inf", "total_input_tokens": 600, "total_output_tokens": 60,
            "input_lens": [100, 200, 300], "output_lens": [10, 20, 30], "mean_ttft_ms": 25.0, "median_ttft_ms": 20.0,
            "p99_ttft_ms": 40.0, "mean_tpot_ms": 8.0, "output_throughput": 150.0, "request_throughput": 2.5}


def test_a_vllm_serving_result_becomes_rows_in_si_units(tmp_path):
    path = tmp_path / "run.json"
    rows = rows_from_serving(_serving_json(), path, BenchmarkSetup("llama2-7b", "a100"), tmp_path)
    got = {r.metric: r.measured for r in rows}
    assert got == {"ttft_mean_seconds": 0.025, "ttft_p50_seconds": 0.020, "ttft_p99_seconds": 0.040,
                   "tpot_mean_seconds": 0.008, "output_tokens_per_second": 150.0, "request_throughput": 2.5}
    first = rows[0]
    # mean lengths (100 + 200 + 300) / 3 = 200 and (10 + 20 + 30) / 3 = 20; the lengths file is written beside
    assert (first.input_tokens, first.output_tokens, first.num_prompts, first.request_rate) == (200, 20, 3, math.inf)
    assert (tmp_path / "bench-run.csv").read_text(encoding="utf-8").splitlines()[1:] == ["100,10", "200,20", "300,30"]
    with pytest.raises(InputError, match="give --model and --base"):
        rows_from_serving(_serving_json(), path, BenchmarkSetup(), tmp_path)


def test_calibrate_from_benchmark_writes_an_overlay_that_loads(tmp_path):
    bench = tmp_path / "run.json"
    bench.write_text(json.dumps(_serving_json()), encoding="utf-8")
    out = tmp_path / "mine.yaml"
    result = CliRunner().invoke(main, ["calibrate", "--from-benchmark", str(bench), "--model", "llama2-7b",
                                       "--base", "a100", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["cross_validation"] == "leave one row out (6 rows)"
    assert {"median", "p90", "max", "rows"} <= set(data["in_sample"])
    from simulator.model import load_gpu

    gpu = load_gpu(str(out))
    assert gpu.name.endswith("(calibrated on benchmarks)")
    assert (gpu.efficiency.compute, gpu.efficiency.memory) == (data["fitted"]["compute"], data["fitted"]["memory"])


def test_defaults_are_the_gpu_module_defaults():
    assert DEFAULT_EFFICIENCIES == Efficiencies(0.70, 0.80)


def test_runs_spread_over_processes_give_the_same_predictions(small, monkeypatch):
    from simulator.validation import replay as validate

    rows, v = small
    monkeypatch.setattr(validate, "PARALLEL_MIN_RUNS", 1)
    with Replayer() as replayer:
        w = cross_validate(rows, replayer, workers=2)
    assert [(s.in_sample.value, s.out_of_sample.value) for s in w.scored] == [
        (s.in_sample.value, s.out_of_sample.value) for s in v.scored]


def test_the_plot_splits_times_from_rates_one_series_per_engine(small, tmp_path):
    from simulator.report.validation_plot import validation_plot_data

    _, v = small
    data = validation_plot_data(v.scored)
    # times: rows 1, 2, 4, 6, 7, 9, 10, 11, 12 (seconds); rates: 3, 5, 8 (per second)
    times, rates = data["panels"]["times"], data["panels"]["rates"]
    assert sorted(i for s in times.values() for i in s["ids"]) == sorted(["1", "2", "4", "6", "7", "9", "10", "11", "12"])
    assert sorted(i for s in rates.values() for i in s["ids"]) == ["3", "5", "8"]
    assert set(times) == {"trtllm", "lmdeploy", "vllm", "sglang"} and data["rows"] == 12
    pytest.importorskip("matplotlib")
    from simulator.report.validation_plot import plot_validation

    out = plot_validation(v.scored, tmp_path / "v.png")
    assert out.stat().st_size > 10_000


def test_a_runs_headline_figures_get_the_band_of_their_class(tmp_path):
    from simulator.plan.error_bands import error_bands_for_run
    from simulator.plan.run import simulate_settings

    path = tmp_path / "bands.json"
    write_bands(path, bands_document(_residuals(), {}))
    run = simulate_settings({"model": "llama2-7b", "gpu": "h100", "qps": 2, "requests": 10, "engine": "vllm"})
    bands = error_bands_for_run(run, path)
    # arrivals at a rate on an H100: hopper / vllm / serving; its ttft class falls back to hopper / serving (6 rows)
    assert bands["ttft"]["level"] == "family_regime" and bands["ttft"]["rows"] == 6
    assert bands["throughput"]["low"] is None and "fewer than 5" in bands["throughput"]["reason"]


# --- one vote per campaign; a family with no row borrows -----------------------------------------

def test_each_campaign_has_one_vote_in_a_median():
    """Source a: five rows solving to 0.2; sources b and c: one row each, 0.8 and 0.7.
    Pooled, the median of the seven values would be 0.2; one vote per campaign: median(0.2, 0.8, 0.7) = 0.7."""
    from types import SimpleNamespace

    from simulator.validation.crossval import _median

    values = {"a1": 0.2, "a2": 0.2, "a3": 0.2, "a4": 0.2, "a5": 0.2, "b1": 0.8, "c1": 0.7}
    rows = [SimpleNamespace(id=i, source_id=i[0]) for i in values]
    solver = SimpleNamespace(solve=lambda row, parameter, held: values[row.id])
    value, used, unsolved = _median(solver, rows, "compute", 0.5, 0.7)
    assert value == pytest.approx(0.7) and len(used) == 7 and unsolved == ()


def test_a_ceiling_comes_from_the_class_the_family_the_predecessor_the_engine_elsewhere_or_all_families():
    from simulator.validation.crossval import FamilyFit, Fit, ceiling_for

    fits = Fit(
        {"ampere": FamilyFit("ampere", 0.6, 0.8, ("r",), ("r",)), "hopper": FamilyFit("hopper", 0.4, 0.8, ("r",), ("r",)),
         "ada": FamilyFit("ada", 0.9, 0.8, ("r",), ("r",)),
         "blackwell": FamilyFit("blackwell", 0.7, 0.8)},  # no row: the defaults, fitted on nothing
        {("ampere", "trtllm"): FamilyFit("ampere", 0.7, 0.8, ("r",), ("r",), engine="trtllm"),
         ("hopper", "trtllm"): FamilyFit("hopper", 0.5, 0.8, ("r",), ("r",), engine="trtllm"),
         ("ada", "sglang"): FamilyFit("ada", 0.3, 0.8, ("r",), ("r",), engine="sglang"),
         ("hopper", "tgi"): FamilyFit("hopper", 0.4, 0.8, (), ("r",), engine="tgi", compute_from_family=True)},
    )
    assert ceiling_for(fits, "ampere", "trtllm", "compute") == (0.7, "class")
    assert ceiling_for(fits, "ampere", "vllm", "compute") == (0.6, "family")
    assert ceiling_for(fits, "hopper", "tgi", "compute") == (0.4, "family")  # too few rows of its own
    # Blackwell has no row: its predecessor Hopper's trtllm class (0.5), not median(0.7, 0.5) = 0.6 over
    # every family's trtllm class ...
    assert ceiling_for(fits, "blackwell", "trtllm", "compute") == (0.5, "predecessor class")
    # ... and for an engine with no Hopper class, Hopper's family-wide 0.4, not median(0.6, 0.4, 0.9) = 0.6
    assert ceiling_for(fits, "blackwell", "vllm", "compute") == (0.4, "predecessor")
    # A family without a predecessor in the table (CDNA3): the engine's own classes elsewhere (0.3) ...
    assert ceiling_for(fits, "cdna3", "sglang", "compute") == (pytest.approx(0.3), "engine elsewhere")
    # ... and an engine with no class anywhere the median of the fitted families, median(0.6, 0.4, 0.9) = 0.6
    assert ceiling_for(fits, "cdna3", "vllm", "compute") == (pytest.approx(0.6), "all families")
    # The walk goes back while a generation has no row: without Hopper, Blackwell borrows Ampere's 0.6
    no_hopper = Fit({"ampere": fits["ampere"], "hopper": FamilyFit("hopper", 0.7, 0.8)}, {})
    assert ceiling_for(no_hopper, "blackwell", "vllm", "compute") == (0.6, "predecessor")
    assert ceiling_for(Fit(), "blackwell", "vllm", "memory") == (DEFAULT_EFFICIENCIES.memory, "default")


def test_fixed_costs_count_in_a_steps_time_and_moe_rows_do_not_calibrate():
    from types import SimpleNamespace

    from simulator.validation.crossval import _shares, calibration_role

    # 0.4 s of memory-bound operators in a 1.0 s step (the rest launches and host time): share 0.4, below half
    step = SimpleNamespace(compute_bound_seconds=0.1, memory_bound_seconds=0.4, seconds=1.0, communication_seconds=0.0)
    assert _shares(step) == (pytest.approx(0.1), pytest.approx(0.4))
    rows = {r.id: r for r in load_table(default_table())}
    # row 2: Mistral-7B prefill of 2,048 tokens at batch 1 on H200 (dense, compute-bound): calibrates compute
    assert calibration_role(rows["2"]) == "compute"
    # row 3004: Llama 4 Scout (MoE) batch-1 decode on B200: predicted, never fitted
    assert rows["3004"].model == "llama4-scout" and calibration_role(rows["3004"]) is None


def test_older_releases_replay_with_the_v0_style_profile():
    from simulator.validation.profiles import engine_profile, release

    assert release("0.7.3 (ROCm 6.3.1)") == (0, 7, 3) and release("not stated") is None
    assert engine_profile("vllm", "0.2.2")[0] == "vllm-v0.2"  # before 0.2.6: no CUDA graphs
    assert engine_profile("vllm", "0.2.7")[0] == "vllm-v0"
    assert engine_profile("vllm", "0.5.4")[0] == "vllm-v0"  # before 0.6: V0, output processing in the loop
    assert engine_profile("vllm", "0.6.1")[0] == "vllm-v0.6"  # 0.6 and 0.7: V0 with asynchronous output processing
    assert engine_profile("vllm", "0.7.3 (ROCm 6.3.1, V0 engine)")[0] == "vllm-v0.6"
    assert engine_profile("vllm", "0.10.0 (ROCm 6.4.1)")[0] == "vllm"
    assert engine_profile("vllm", "")[0] == "vllm"  # unstated: the current engine
    assert engine_profile("tgi", "1.0.3")[0] == "tgi-v1"  # before 2.0: no CUDA graphs, no chunked prefill
    assert engine_profile("tgi", "2.0.4")[0] == "tgi-v2"  # before 3.0: no chunked prefill
    assert engine_profile("tgi", "3.0.1")[0] == "vllm"
    assert engine_profile("lmdeploy", "0.1.0")[0] == "trtllm-v0"  # a C++ server, like TensorRT-LLM's C++ executor
    # LMDeploy's PyTorch engine batches from a Python loop: the Python engine's profile, and the note says so
    profile, note = engine_profile("lmdeploy", "0.13.0-dev (PyTorch engine; main at e433925)")
    assert profile == "vllm" and "PyTorch engine" in note
    assert engine_profile("llamacpp", "b2834 (befddd0f)")[0] == "llamacpp"
    assert engine_profile("trtllm", "0.17")[0] == "trtllm-v0"  # before 1.0: the C++ executor
    assert engine_profile("trtllm", "1.0")[0] == "trtllm"  # 1.0 on: the PyTorch backend's Python executor
    assert engine_profile("trtllm", "NIM 1.8.0 (TensorRT-LLM, version not stated)")[0] == "trtllm-v0"
    assert engine_profile("trtllm", "TensorRT-LLM (MLPerf v4.0 NVIDIA harness)")[0] == "trtllm-v0"


def test_tensorrt_llm_before_0_8_decodes_with_the_per_head_kernel():
    # XQA, which groups the query heads of a K/V head, came with 0.8; earlier releases decode with masked MHA.
    rows = {r.id: r for r in load_table(default_table())}
    old, new = rows["290"], rows["46"]  # Llama-2-70B throughputs: TensorRT-LLM 0.6.1 and 0.9.0
    assert (old.engine_version, new.engine_version) == ("0.6.1", "0.9.0")
    kernel, note = old.attention_kernel
    assert kernel == "per-head" and "before 0.8" in note
    assert new.attention_kernel == (None, "")
    assert old.run_key() != dataclasses.replace(old, engine_version="0.9.0").run_key()
    # a harness names no release: the profile's kernel
    assert dataclasses.replace(old, engine_version="TensorRT-LLM (MLPerf v4.0 NVIDIA harness)").attention_kernel[0] is None


def test_the_expert_fraction_is_fitted_on_moe_rows_of_other_sources(tmp_path):
    """Figures simulated at compute 0.6, memory 0.7 and experts at 0.5 of them: rule 7 finds 0.5 from the MoE
    decodes, and the fold that predicts one MoE source fits it on the other source's rows only."""
    moe = {"model": "mixtral-8x7b", "tp": 2, "metric": "tpot_seconds"}
    shapes = (
        [{"id": f"c{i}", "source_id": "dense", **row} for i, row in enumerate(PREFILLS)]
        + [{"id": f"m{i}", "source_id": "dense", **row} for i, row in enumerate(DECODES)]
        + [{"id": "a1", "source_id": "moe-a", "batch": 1, "input_tokens": 128, "output_tokens": 64, **moe},
           {"id": "a2", "source_id": "moe-a", "batch": 2, "input_tokens": 512, "output_tokens": 64, **moe},
           {"id": "b1", "source_id": "moe-b", "batch": 1, "input_tokens": 1024, "output_tokens": 32, **moe},
           {"id": "b2", "source_id": "moe-b", "batch": 4, "input_tokens": 256, "output_tokens": 32, **moe}]
    )
    path = tmp_path / "t.csv"
    _write_table(path, shapes)
    truth = Efficiencies(0.6, 0.7, 0.5)
    with Replayer() as replayer:
        rows = [dataclasses.replace(r, measured=replayer.predict(r, truth).value) for r in load_table(path)]
        solver = Solver(replayer)
        assert [r.id for r in rows if solver.expert_role(r)] == ["a1", "a2", "b1", "b2"]
        assert solver.role(rows[-1]) is None  # MoE rows calibrate neither compute nor memory
        fits = fit(rows, solver)
        assert fits.expert == pytest.approx(0.5, abs=2e-3) and fits.expert_rows == ("a1", "a2", "b1", "b2")
        assert efficiencies_for(fits, rows[-1]).expert == fits.expert
        v = cross_validate(rows, replayer)
        assert set(v.fold_fits["moe-a"].expert_rows) == {"b1", "b2"}
        assert set(v.fold_fits["moe-b"].expert_rows) == {"a1", "a2"}
        # moe-a's figures made absurd (x3): its out-of-sample predictions do not move, its in-sample ones do
        absurd = [dataclasses.replace(r, measured=3 * r.measured) if r.source_id == "moe-a" else r for r in rows]
        w = cross_validate(absurd, replayer)
    before, after = {s.row.id: s for s in v.scored}, {s.row.id: s for s in w.scored}
    assert after["a1"].out_of_sample.value == before["a1"].out_of_sample.value
    assert after["a1"].in_sample.value != before["a1"].in_sample.value
    assert {s.row.id: s.role for s in v.scored}["a1"] == "expert"


def test_the_host_time_per_sequence_of_tensorrt_llm_1_is_fitted_on_other_campaigns(tmp_path):
    """Offline runs replayed with the trtllm profile, simulated with 20 us of host time per sequence: rule 8
    picks 20 us from the grid, and each fold picks it from the other campaign's rows only."""
    # Llama-3-8B in FP8 on a B200 at hundreds of sequences: a step's GPU time (~2-4 ms) is below 20 us x
    # sequences of host time, so the overlapped host work shows
    offline = {"engine": "trtllm", "engine_version": "1.0", "model": "llama3-8b", "gpu": "b200", "weights": "fp8",
               "kv": "fp8", "mode": "serving",
               "regime": "serving", "request_rate": "inf", "metric": "output_tokens_per_second", "input_dist": "fixed",
               "output_dist": "fixed"}
    _write_table(tmp_path / "t.csv", [
        {"id": "a1", "source_id": "a", "input_tokens": 128, "output_tokens": 128, "num_prompts": 1024, "max_num_seqs": 512, **offline},
        {"id": "a2", "source_id": "a", "input_tokens": 256, "output_tokens": 64, "num_prompts": 512, "max_num_seqs": 256, **offline},
        {"id": "b1", "source_id": "b", "input_tokens": 256, "output_tokens": 128, "num_prompts": 1024, "max_num_seqs": 512, **offline},
        {"id": "b2", "source_id": "b", "input_tokens": 128, "output_tokens": 256, "num_prompts": 1024, "max_num_seqs": 1024, **offline},
    ])
    truth = dataclasses.replace(DEFAULT_EFFICIENCIES, host_per_sequence=20e-6)  # no row calibrates: the defaults hold
    with Replayer() as replayer:
        rows = [dataclasses.replace(r, measured=replayer.predict(r, truth).value) for r in load_table(tmp_path / "t.csv")]
        assert {r.profile[0] for r in rows} == {"trtllm"}
        v = cross_validate(rows, replayer)
        assert v.in_sample_fit.host == {"trtllm": 20e-6}
        assert v.fold_fits["a"].host == {"trtllm": 20e-6} and set(v.fold_fits["a"].host_rows["trtllm"]) == {"b1", "b2"}
        assert set(v.fold_fits["b"].host_rows["trtllm"]) == {"a1", "a2"}
        assert set(v.in_sample_fit.host_rows["trtllm"]) == {"a1", "a2", "b1", "b2"}
        # a's figures made absurd (x3): b's fold fits on them and moves; a's fold does not see them
        absurd = [dataclasses.replace(r, measured=3 * r.measured) if r.source_id == "a" else r for r in rows]
        w = cross_validate(absurd, replayer)
    assert w.fold_fits["b"].host["trtllm"] != 20e-6 and w.fold_fits["a"].host["trtllm"] == 20e-6
    before, after = {s.row.id: s for s in v.scored}, {s.row.id: s for s in w.scored}
    assert after["a1"].out_of_sample.value == before["a1"].out_of_sample.value
    # each row is predicted with its fold's 20 us: exactly the figure it was simulated with
    assert before["b2"].out_of_sample.value == pytest.approx(rows[3].measured, rel=1e-12)


def test_benchmark_lengths_beyond_any_context_are_refused_by_option(tmp_path):
    # 2^64 prompt tokens raised OverflowError deep in the replay (long fuzz profile); the option's range says it
    bench = tmp_path / "run.json"
    bench.write_text(json.dumps(_serving_json()), encoding="utf-8")
    for option in ("--input-tokens", "--output-tokens"):
        result = CliRunner().invoke(main, ["calibrate", "--from-benchmark", str(bench), "--model", "llama2-7b",
                                           "--base", "a100", option, str(2**64)])
        assert result.exit_code == 2 and f"Invalid value for '{option}'" in result.output
        assert "1<=x<=16777216" in result.output
