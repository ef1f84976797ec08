"""Bad configs, timings and results files at their edge: one clear InputError, never a traceback or NaN."""

from __future__ import annotations

import copy
import errno
import json

import pytest
import yaml
from click.testing import CliRunner

from simulator import files
from simulator.calibrate.overlay import load_measurements
from simulator.cli import main
from simulator.errors import InputError
from simulator.model import load_gpu, load_model
from simulator.sweep.results_file import ResultsFile
from simulator.tabular import to_csv, to_json

A100_LIKE = {
    "name": "edge-gpu", "peak_flops": {"fp16": 312e12}, "hbm_bytes": 80 * 2**30,
    "hbm_bandwidth_bytes_per_second": 2.039e12, "sram_bytes_per_sm": 167936, "link_bandwidth_bytes_per_second": 300e9,
}


def _gpu_file(tmp_path, **changes):
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump({**A100_LIKE, **changes}), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("field, value, message", [
    ("hbm_bandwidth_bytes_per_second", 1e-300, "1e-300 bytes/s is not plausible for a GPU; allowed: 1e+09 to 1e+15 bytes/s"),
    ("hbm_bytes", float("inf"), "Input should be a finite number"),
    ("hbm_bytes", 2.0**46, "not plausible for a GPU; allowed: 1.07374e+09 to 3.51844e+13 bytes"),
    ("peak_flops", {"fp16": 1e20}, "fp16: 1e+20 FLOP/s is not plausible"),
    ("fp16_accumulate_flops", 1e20, "1e+20 FLOP/s is not plausible for a GPU; allowed: 1e+08 to 1e+17 FLOP/s"),
    ("efficiency", {"memory": 1e-320}, "not plausible for a GPU; allowed: 0.001 to 1 of peak"),
])
def test_a_gpu_file_out_of_physical_bounds_names_the_field(tmp_path, field, value, message):
    path = _gpu_file(tmp_path, **{field: value})
    with pytest.raises(InputError) as exc:
        load_gpu(path)
    text = str(exc.value)
    assert text.startswith(f"{path}: field '{field}") and message in text and "\n" not in text


def test_a_gpu_file_within_bounds_loads(tmp_path):
    assert load_gpu(_gpu_file(tmp_path)).hbm_bandwidth_bytes_per_second == 2.039e12


def test_an_overlay_whose_base_is_itself_or_a_cycle_is_refused(tmp_path):
    itself, first, second = tmp_path / "self.yaml", tmp_path / "a.yaml", tmp_path / "b.yaml"
    itself.write_text(f"base: {itself}\n", encoding="utf-8")
    first.write_text(f"base: {second}\n", encoding="utf-8")
    second.write_text(f"base: {first}\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"the chain of base GPUs loops \(.*self.yaml -> .*self.yaml\)"):
        load_gpu(str(itself))
    with pytest.raises(InputError, match=r"loops \(.*a.yaml -> .*b.yaml -> .*a.yaml\)"):
        load_gpu(str(first))


@pytest.mark.parametrize("field, value", [("num_layers", 10**6), ("hidden_size", float("inf")), ("max_context", 2**40),
                                          ("num_heads", -1), ("vocab_size", "many")])
def test_a_model_file_out_of_range_names_the_field(tmp_path, field, value):
    spec = {"name": "m", "num_layers": 2, "hidden_size": 256, "num_heads": 4, "ffn_size": 512, "vocab_size": 1000,
            "max_context": 4096, field: value}
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(spec), encoding="utf-8")
    with pytest.raises(InputError, match=rf"m.yaml: field '{field}'"):
        load_model(str(path))


def _timings() -> dict:
    return {
        "schema": "memwall-calibration/1",
        "device": {"name": "d", "torch": "2", "date": "2026-01-01"}, "base_gpu": "a100", "dtype": "fp16", "plan": "p",
        "peaks": {"source": "datasheet", "flops": {"fp16": 1e12}, "hbm_bandwidth_bytes_per_second": 1e9},
        "launch_seconds": 1e-6, "timing": {"method": "m"}, "bandwidth": [], "elementwise": [],
        "gemm": [{"dtype": "fp16", "tokens": 1, "flops": 2e6, "bytes": 2e6, "seconds": 1e-3}],
        "attention": [], "endtoend": {"model": {}, "cases": []}, "skipped": [],
    }


@pytest.mark.parametrize("change, message", [
    (lambda t: t["gemm"][0].pop("seconds"), "field 'gemm.0.seconds': Field required"),
    (lambda t: t["gemm"][0].update(seconds="x"), "field 'gemm.0.seconds': Input should be a valid number"),
    (lambda t: t.update(dtype="bf16"), "field 'dtype': peaks.flops has no entry for 'bf16' (it has: fp16)"),
    (lambda t: t["endtoend"].update(cases=[{"phase": "decode", "batch": 1, "context": 4, "seconds": 1.0}]),
     "endtoend.model: field 'name': Field required"),
    (lambda t: t.update(peaks=[]), "field 'peaks': Input should be a valid dictionary (got [])"),
])
def test_malformed_calibration_timings_name_the_field(tmp_path, change, message):
    timings = copy.deepcopy(_timings())
    change(timings)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(timings), encoding="utf-8")
    with pytest.raises(InputError) as exc:
        load_measurements(path)
    assert str(exc.value).startswith(f"--measurements {path}: ") and message in str(exc.value)


def test_valid_timings_load(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_timings()), encoding="utf-8")
    assert load_measurements(path)["gemm"][0]["seconds"] == 1e-3


def test_non_finite_numbers_are_null_in_json_and_empty_in_csv():
    assert to_json({"mfu": float("nan"), "x": [1.0, float("inf")]}) == '{"mfu": null, "x": [1.0, null]}'
    assert to_csv([{"a": float("nan"), "b": 1.5, "c": float("-inf")}]) == "a,b,c\n,1.5,\n"


def test_a_sweep_that_fails_on_a_full_disk_leaves_no_empty_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "results.csv"
    results = ResultsFile(path, "csv")
    results.start([])
    assert not path.exists()  # nothing is written before the first row

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", full)
    with pytest.raises(InputError, match="No space left on device"):
        results.append({"point": 0, "fits": True})
    assert list(tmp_path.iterdir()) == []


def test_sweep_out_in_a_missing_folder_fails_before_any_point(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text("base: {model: llama2-7b, gpu: a100}\nsweep: {grid: {batch: [1]}}\n", encoding="utf-8")
    result = CliRunner().invoke(main, ["sweep", str(scenario), "--workers", "1", "--out", str(tmp_path / "no" / "r.csv")])
    assert result.exit_code == 2
    assert "does not exist" in result.output and "Traceback" not in result.output


def test_sweep_plot_with_a_wrong_suffix_fails_before_any_point(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text("base: {model: llama2-7b, gpu: a100}\nsweep: {grid: {batch: [1]}}\n", encoding="utf-8")
    out = tmp_path / "r.csv"
    result = CliRunner().invoke(main, ["sweep", str(scenario), "--workers", "1", "--out", str(out), "--plot", "x.txt"])
    assert result.exit_code == 2 and "--plot: 'x.txt' must end in one of .png, .svg, .pdf" in result.output
    assert not out.exists()


@pytest.mark.parametrize("stop", [".inf", ".nan"])
def test_scenario_powers_of_two_to_infinity_is_a_field_error(tmp_path, stop):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "base: {model: llama2-7b, gpu: a100}\n"
        f"sweep: {{grid: {{batch: {{powers_of_two: {{start: 1, stop: {stop}}}}}}}}}\n", encoding="utf-8")
    result = CliRunner().invoke(main, ["sweep", str(scenario), "--workers", "1", "--out", str(tmp_path / "r.csv")])
    assert result.exit_code == 2
    assert "sweep.grid.batch.powers_of_two.stop: Input should be a finite number" in result.output


def test_scenario_base_model_null_is_unset(tmp_path):
    scenario = tmp_path / "s.yaml"
    scenario.write_text("base: {model: null, gpu: a100}\nsweep: {grid: {batch: [1]}}\n", encoding="utf-8")
    result = CliRunner().invoke(main, ["sweep", str(scenario), "--workers", "1", "--out", str(tmp_path / "r.csv")])
    assert result.exit_code == 2 and "base: no model given" in result.output


def test_gpus_table_columns_line_up():
    result = CliRunner().invoke(main, ["gpus"])
    assert result.exit_code == 0
    table = result.output.split("\n\n")[0].splitlines()
    # Every cell of the last column (ridge) is right-aligned, so every line ends at the same place.
    assert len({len(line) for line in table}) == 1


def test_explain_with_a_vanishing_memory_efficiency_is_one_line(tmp_path):
    from simulator.model import Precision
    from simulator.plan.deployment_planner import plan_deployment
    from simulator.report.explain import explain_run

    gpu = load_gpu("a100").with_efficiency(memory=1e-320)
    deployment = plan_deployment(load_model("llama2-7b"), gpu, Precision(), 1, 512)
    with pytest.raises(InputError, match="explain: the decode step time is inf s"):
        explain_run(deployment, 1, 512, 128)


def test_an_hf_config_field_of_the_wrong_type_is_one_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "mixtral", "hidden_size": 256, "num_attention_heads": 4,
                                "num_hidden_layers": 2, "vocab_size": 100, "num_local_experts": {"a": 1}}), encoding="utf-8")
    with pytest.raises(InputError, match=r"config.json: a config.json field has a value of the wrong type"):
        load_model(str(path))
