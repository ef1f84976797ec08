"""Scenario files: axis expansion, point order, and one clear error per kind of bad input."""

from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cli import main
from simulator.errors import InputError
from simulator.sweep.scenario import (
    DEFAULT_USD_PER_GPU_HOUR,
    OPTION_NAMES,
    expand_values,
    load_scenario,
)

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


def write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(InputError) as info:
        load_scenario(write(tmp_path, text))
    return str(info.value)


BASE = "base: {model: llama2-7b, gpu: a100}\n"


# --- ranges ---------------------------------------------------------------------------


def test_powers_of_two_from_1_to_256_are_the_nine_values_2_to_the_0_through_8():
    assert expand_values({"powers_of_two": {"start": 1, "stop": 256}}, "x") == [1, 2, 4, 8, 16, 32, 64, 128, 256]


def test_powers_of_two_keep_only_those_inside_the_bounds():
    # 3 < 4 = 2**2 and 2**6 = 64 < 100 < 128 = 2**7
    assert expand_values({"powers_of_two": {"start": 3, "stop": 100}}, "x") == [4, 8, 16, 32, 64]


def test_step_range_includes_stop_when_the_steps_land_on_it():
    assert expand_values({"start": 1, "stop": 9, "step": 2}, "x") == [1, 3, 5, 7, 9]
    assert expand_values({"start": 1, "stop": 10, "step": 4}, "x") == [1, 5, 9]
    assert expand_values({"start": 8, "stop": 2, "step": -3}, "x") == [8, 5, 2]


def test_float_step_range_reads_as_written():
    assert expand_values({"start": 0.1, "stop": 0.5, "step": 0.1}, "x") == [0.1, 0.2, 0.3, 0.4, 0.5]


@settings(max_examples=40, deadline=None, derandomize=True)
@given(start=st.integers(-50, 50), step=st.integers(1, 10), count=st.integers(1, 30), overshoot=st.integers(0, 9))
def test_step_range_has_every_step_from_start_up_to_stop(start, step, count, overshoot):
    stop = start + (count - 1) * step + overshoot % step  # past the last step by less than one step
    values = expand_values({"start": start, "stop": stop, "step": step}, "x")
    assert len(values) == count and values[0] == start
    assert all(b - a == step for a, b in zip(values, values[1:]))
    assert values[-1] <= stop < values[-1] + step


@settings(max_examples=40, deadline=None, derandomize=True)
@given(start=st.integers(1, 5000), width=st.integers(0, 5000))
def test_powers_of_two_are_exactly_those_in_the_bounds(start, width):
    stop = start + width
    if 2 ** (stop.bit_length() - 1) < start:  # no power of two in [start, stop]
        with pytest.raises(InputError, match="no power of two lies in"):
            expand_values({"powers_of_two": {"start": start, "stop": stop}}, "x")
        return
    values = expand_values({"powers_of_two": {"start": start, "stop": stop}}, "x")
    assert all(v & (v - 1) == 0 and start <= v <= stop for v in values)  # powers of two, inside
    assert values[0] / 2 < start and values[-1] * 2 > stop  # none missing at either end
    assert all(b == 2 * a for a, b in zip(values, values[1:]))


def test_values_form_and_scalar_form():
    assert expand_values({"values": [4, 2]}, "x") == [4, 2]
    assert expand_values(7, "x") == [7]


# --- points ---------------------------------------------------------------------------


def test_grid_is_the_cartesian_product_last_axis_fastest(tmp_path):
    scenario = load_scenario(
        write(
            tmp_path,
            "base: {model: llama2-70b, ctx: 4096}\n"
            "sweep:\n  grid:\n    gpu: [a100, h100]\n    tp: [1, 2, 4, 8]\n"
            "    batch: {powers_of_two: {start: 1, stop: 256}}\n",
        )
    )
    points = scenario.points()
    assert len(points) == 2 * 4 * 9 == 72
    assert points[0] == {"model": "llama2-70b", "ctx": 4096, "gpu": "a100", "tp": 1, "batch": 1}
    assert points[1]["batch"] == 2 and points[9]["tp"] == 2 and points[36]["gpu"] == "h100"


def test_zip_goes_in_step_outside_the_grid(tmp_path):
    scenario = load_scenario(
        write(tmp_path, BASE.replace(", gpu: a100", "") + "sweep:\n  zip: {gpu: [a100, h100], tp: [4, 2]}\n  grid: {batch: [1, 8, 64]}\n")
    )
    points = [(p["gpu"], p["tp"], p["batch"]) for p in scenario.points()]
    assert points == [("a100", 4, 1), ("a100", 4, 8), ("a100", 4, 64), ("h100", 2, 1), ("h100", 2, 8), ("h100", 2, 64)]


def test_values_are_converted_by_the_command_option_types(tmp_path):
    scenario = load_scenario(write(tmp_path, BASE + "sweep: {grid: {compute_efficiency: [1, 0.5]}}\n"))
    assert [p["compute_efficiency"] for p in scenario.points()] == [1.0, 0.5]
    assert isinstance(scenario.points()[0]["compute_efficiency"], float)


def test_valid_axis_names_are_the_run_settings():
    names = set(OPTION_NAMES)
    assert {"model", "gpu", "batch", "ctx", "gen", "tp", "weights", "kv", "attention", "attention_kernel", "fusion"} <= names
    assert not {"json", "csv", "top", "version"} & names  # report format, not simulation inputs


def test_cost_overrides_resolve_aliases_and_keep_the_other_defaults(tmp_path):
    scenario = load_scenario(write(tmp_path, BASE + "sweep: {grid: {batch: [1]}}\ncost: {usd_per_gpu_hour: {a100: 1.25}}\n"))
    assert scenario.usd_per_gpu_hour["A100-SXM4-80GB"] == 1.25
    assert scenario.usd_per_gpu_hour["H100-SXM5-80GB"] == DEFAULT_USD_PER_GPU_HOUR["H100-SXM5-80GB"]


def test_output_format_follows_the_suffix_and_defaults_to_out_folder(tmp_path):
    scenario = load_scenario(write(tmp_path, BASE + "sweep: {grid: {batch: [1]}}\n", "cap.yaml"))
    assert scenario.output_path == Path("out") / "cap.csv" and scenario.output_format == "csv"
    scenario = load_scenario(write(tmp_path, BASE + "sweep: {grid: {batch: [1]}}\n"), out=str(tmp_path / "r.jsonl"))
    assert scenario.output_format == "jsonl"


# --- bad input ------------------------------------------------------------------------


def test_unknown_axis_lists_valid_names_and_suggests_the_nearest(tmp_path):
    message = error_of(tmp_path, BASE + "sweep: {grid: {bach: [1, 2]}}\n")
    assert "s.yaml: sweep.grid.bach: unknown option 'bach' (did you mean 'batch'?)" in message
    assert "valid options: model, gpu" in message


def test_wrong_type_names_the_element(tmp_path):
    message = error_of(tmp_path, BASE + "sweep: {grid: {batch: [1, 2, abc]}}\n")
    assert "sweep.grid.batch[2]:" in message and "must be a valid integer (got 'abc')" in message
    assert "sweep.grid.batch[1]: expected an integer, got 2.5" in error_of(tmp_path, BASE + "sweep: {grid: {batch: [1, 2.5]}}\n")
    assert "sweep.grid.weights[1]:" in error_of(tmp_path, BASE + "sweep: {grid: {weights: [fp16, fp9]}}\n")


def test_empty_sweep(tmp_path):
    assert "sweep: empty sweep" in error_of(tmp_path, BASE + "sweep: {grid: {}}\n")
    assert "sweep.grid.batch: empty list of values" in error_of(tmp_path, BASE + "sweep: {grid: {batch: []}}\n")
    assert "sweep: Field required" in error_of(tmp_path, BASE)


def test_range_with_step_zero(tmp_path):
    message = error_of(tmp_path, BASE + "sweep: {grid: {batch: {start: 1, stop: 8, step: 0}}}\n")
    assert "sweep.grid.batch.step: step must not be 0" in message


def test_range_going_the_wrong_way(tmp_path):
    assert "sweep.grid.batch.step:" in error_of(tmp_path, BASE + "sweep: {grid: {batch: {start: 8, stop: 1, step: 2}}}\n")


def test_output_in_a_missing_folder(tmp_path):
    message = error_of(tmp_path, BASE + "sweep: {grid: {batch: [1]}}\noutput: {path: nowhere/x.csv}\n")
    assert "output.path: folder 'nowhere' of 'nowhere/x.csv' does not exist" in message
    with pytest.raises(InputError, match="--out: folder"):
        load_scenario(write(tmp_path, BASE + "sweep: {grid: {batch: [1]}}\n"), out=str(tmp_path / "missing" / "x.csv"))


def test_unknown_gpu_in_an_axis_names_its_index(tmp_path):
    message = error_of(tmp_path, "base: {model: llama2-7b}\nsweep: {grid: {gpu: [a100, h1000]}}\n")
    assert "sweep.grid.gpu[1]: unknown GPU 'h1000' (did you mean 'h100'?)" in message


def test_zip_axes_of_different_lengths(tmp_path):
    message = error_of(tmp_path, BASE + "sweep: {zip: {batch: [1, 2], ctx: [512]}}\n")
    assert "sweep.zip.ctx: 1 value(s) but sweep.zip.batch has 2" in message


def test_unknown_field_lists_the_allowed_ones(tmp_path):
    message = error_of(tmp_path, BASE + "sweep: {grid: {batch: [1]}}\nslo: {tpot: 0.05}\n")
    assert "slo.tpot: unknown field 'tpot'" in message and "allowed: ttft_p99_seconds, tpot_p99_seconds, e2e_p99_seconds" in message


def test_option_both_in_base_and_swept(tmp_path):
    assert "sweep.grid.gpu: also set in base.gpu" in error_of(tmp_path, BASE + "sweep: {grid: {gpu: [a100, h100]}}\n")


def test_searches_need_an_slo_and_must_not_sweep_what_they_search(tmp_path):
    no_slo = BASE + "sweep: {grid: {tp: [1]}}\nsearch: {max_batch_under_slo: {high: 64}}\n"
    assert "search.max_batch_under_slo: a search needs an slo block" in error_of(tmp_path, no_slo)
    swept = BASE + "sweep: {grid: {batch: [1]}}\nslo: {tpot_p99_seconds: 0.05}\nsearch: {max_batch_under_slo: {}}\n"
    assert "search.max_batch_under_slo: batch is swept" in error_of(tmp_path, swept)
    qps_swept = BASE + "sweep: {grid: {qps: [1, 2]}}\nslo: {ttft_p99_seconds: 2}\nsearch: {max_qps_under_slo: {}}\n"
    assert "search.max_qps_under_slo: qps is swept" in error_of(tmp_path, qps_swept)
    gpus_alone = BASE + "sweep: {grid: {tp: [1]}}\nslo: {tpot_p99_seconds: 0.05}\nsearch: {min_gpus_for_qps: {qps: 5}}\n"
    assert "search.min_gpus_for_qps: needs search.max_qps_under_slo" in error_of(tmp_path, gpus_alone)


def test_cli_prints_one_line_and_exits_2(tmp_path):
    path = write(tmp_path, BASE + "sweep: {grid: {batch: [1, 2, abc]}}\n")
    result = CliRunner().invoke(main, ["sweep", str(path)])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "sweep.grid.batch[2]" in result.output
    assert "Traceback" not in result.output


def test_missing_scenario_file_exits_2(tmp_path):
    result = CliRunner().invoke(main, ["sweep", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2 and "no such file" in result.output


# --- shipped scenarios ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["llama2-70b-a100-vs-h100", "gqa-vs-mha", "precision", "slo-capacity"])
def test_shipped_scenarios_validate(name):
    scenario = load_scenario(SCENARIOS / f"{name}.yaml")
    assert scenario.points()


@pytest.mark.parametrize("grid, expected", [
    # a vLLM spelling beside its setting: two axes of tp (tp 1 and 2 would never run)
    ("{tp: [1, 2], tensor_parallel_size: [4, 8]}", "sweep.grid.tensor_parallel_size: sweeps tp, as another axis"),
    ("{batch: [1, 1, 4]}", "sweep.grid.batch: repeats 1: a point would run twice"),
    ("{batch: {start: 0, stop: 1.0e300, step: 1.0e-300}}", "sweep.grid.batch: more than 100,000 values"),
    ("{batch: {start: 1.0e308, stop: -1.0e308, step: -1.0e308}}", "more than 100,000 values"),
    ("{batch: {start: true, stop: 4, step: 1}}", "sweep.grid.batch.start: Value error, expected a number, not a "
                                                 "true/false flag"),
    # three axes of 100,000 values: 10^15 points
    ("{batch: {start: 1, stop: 100000, step: 1}, ctx: {start: 1000, stop: 100999, step: 1},"
     " gen: {start: 1, stop: 100000, step: 1}}", "sweep: 1,000,000,000,000,000 points; at most 1,000,000"),
])
def test_a_sweep_that_cannot_run_as_written_is_refused_at_load(tmp_path, grid, expected):
    message = error_of(tmp_path, f"base: {{model: llama2-7b, gpu: a100}}\nsweep:\n  grid: {grid}\n")
    assert expected in message


def test_zipped_axes_may_repeat_a_value_but_not_a_whole_row(tmp_path):
    base = "base: {model: llama2-70b}\n"
    ok = "sweep:\n  zip:\n    gpu: [a100, a100, h100]\n    tp: [4, 8, 4]\n"
    assert len(load_scenario(write(tmp_path, base + ok)).points()) == 3
    twice = "sweep:\n  zip:\n    gpu: [a100, h100, a100]\n    tp: [4, 8, 4]\n"
    assert "sweep.zip: row 2 repeats row 0 in every zipped axis" in error_of(tmp_path, base + twice)


@pytest.mark.parametrize("block, expected", [
    # pydantic read true as 1: a 1 s limit, $1 an hour, a search from 1
    ("slo: {tpot_p99_seconds: true}", "slo.tpot_p99_seconds: Value error, expected a number, not a true/false flag"),
    ("cost: {usd_per_gpu_hour: {h100: true}}", "h100: expected dollars per GPU-hour, not a true/false flag"),
    ("cost: {usd_per_gpu_hour: {h100: 1.0e308}}", "cost.usd_per_gpu_hour.h100: Input should be less than or equal to"),
    ("cost: {usd_per_gpu_hour: {h100: 2.0, H100-SXM5-80GB: 5.0}}",
     "cost.usd_per_gpu_hour.H100-SXM5-80GB: prices H100-SXM5-80GB again (as cost.usd_per_gpu_hour.h100 does)"),
])
def test_slo_and_prices_are_numbers_given_once(tmp_path, block, expected):
    text = "base: {model: llama2-7b, gpu: h100}\nsweep:\n  grid: {batch: [1, 2]}\n" + block + "\n"
    assert expected in error_of(tmp_path, text)


def test_a_search_named_without_bounds_runs_at_its_default_bounds(tmp_path):
    text = ("base: {model: llama2-7b, gpu: h100, requests: 10}\nsweep:\n  grid: {ctx: [1024, 2048]}\n"
            "slo: {ttft_p99_seconds: 1.0}\nsearch:\n  max_qps_under_slo:\n")
    search = load_scenario(write(tmp_path, text)).search
    assert search.max_qps_under_slo is not None and (search.max_qps_under_slo.low, search.max_qps_under_slo.high) == (0.1, 100.0)


@pytest.mark.parametrize("setup, search, expected", [
    ("batch: 8", "max_qps_under_slo: {}", "search.max_qps_under_slo: its runs arrive at a rate, which batch"),
    ("qps: 1.0", "max_qps_under_slo: {high: 1.0e9}", "search.max_qps_under_slo.high: at most 1e+07 requests/s"),
    ("requests: 50", "max_batch_under_slo: {}", "search.max_batch_under_slo: its runs are closed batches of the batch "
                                               "it tries, which requests"),
    ("qps: 1.0, disaggregate: '1:1'", "max_qps_under_slo: {}\n  min_gpus_for_qps: {qps: 10}",
     "search.min_gpus_for_qps: searches the number of replicas, which a disaggregated run's pools fix"),
])
def test_a_search_that_contradicts_the_points_is_refused_at_load_by_its_name(tmp_path, setup, search, expected):
    text = (f"base: {{model: llama2-7b, gpu: h100, {setup}}}\nsweep:\n  grid: {{ctx: [1024, 2048]}}\n"
            f"slo: {{ttft_p99_seconds: 1.0}}\nsearch:\n  {search}\n")
    assert expected in error_of(tmp_path, text)
