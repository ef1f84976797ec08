"""--ceilings kernels: the roofline's GEMM parameters fitted on measured kernels (validation/kernel_ceilings.json)."""

import json

import pytest
import yaml
from click.testing import CliRunner

from simulator.cli import main
from simulator.errors import InputError
from simulator.model import load_gpu
from simulator.model.kernel_ceilings import ceilings_file, with_ceilings
from simulator.plan.run import run_from_options
from simulator.validation.crossval import HOST_PRIOR, kernel_efficiencies
from simulator.validation.replay import Replayer
from tests.test_validate import SMALL, row, table

FILE = json.loads(ceilings_file().read_text())


def test_every_shipped_gpu_has_kernel_ceilings_that_are_physical():
    # Fractions of the data-sheet peak and bandwidth, not factors that absorb other costs: a large weight stream
    # reaches 80-92% of the DRAM bandwidth (simulator/model/gpu.py's sources); a GEMM's MMAs at most the peak.
    from simulator.model.gpu import list_gpus

    names = {gpu.name for gpu in list_gpus()}
    assert names <= set(FILE["gpus"])
    for name, entry in FILE["gpus"].items():
        assert 0.80 <= entry["memory"] <= 0.92, name
        assert 0.4 <= entry["compute"] <= 1.0, name
        assert 0.0 <= entry["overlap"] <= 1.0 and 0.0 <= entry["memory_latency_seconds"] <= 1e-5, name
    assert FILE["gpus"]["H100-SXM5-80GB"]["source"] == "own tables"
    assert FILE["gpus"]["MI300X"]["source"].startswith("all tabled GPUs")


def test_kernels_replace_the_four_fitted_fields_and_keep_the_rest():
    h100 = load_gpu("h100")
    fitted = with_ceilings(h100, "kernels").efficiency
    entry = FILE["gpus"]["H100-SXM5-80GB"]
    assert (fitted.compute, fitted.memory, fitted.memory_latency_seconds, fitted.overlap) == (
        entry["compute"], entry["memory"], entry["memory_latency_seconds"], entry["overlap"])
    assert fitted.link == h100.efficiency.link and fitted.kernel_launch_seconds == h100.efficiency.kernel_launch_seconds
    assert fitted.fitted_on == "kernels (own tables)" and h100.efficiency.fitted_on == "end-to-end"
    assert with_ceilings(h100, None) is h100 and with_ceilings(h100, "end-to-end") is h100
    # MI300X keeps its own sustained clock: the pooled NVIDIA fit holds no MI300X clock drop
    assert with_ceilings(load_gpu("mi300x"), "kernels").efficiency.sustained_clock == 0.575


def test_a_gpu_without_kernel_ceilings_is_refused_with_the_way_out(tmp_path):
    path = tmp_path / "mine.yaml"
    spec = load_gpu("h100").model_dump()
    spec.update(name="My-H100", aliases=[])
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(InputError, match=r"no kernel-fitted parameters for GPU 'My-H100'.*--ceilings end-to-end"):
        with_ceilings(load_gpu(str(path)), "kernels")


def test_a_run_says_its_ceilings_came_from_kernels():
    options = dict(model="llama2-7b", gpu="a100", batch=1, ctx=256, gen=4)
    out = run_from_options(dict(options, ceilings="kernels"))
    entry = FILE["gpus"]["A100-SXM4-80GB"]
    assert out["efficiency"]["memory"] == entry["memory"] and out["efficiency"]["fitted_on"] == "kernels (own tables)"
    # the error bands are the default ceilings': the run says so
    assert any(w.startswith("--ceilings kernels:") and "error bands" in w for w in out["warnings"])
    assert not any("--ceilings" in w for w in run_from_options(options)["warnings"])
    # an explicit ceiling still wins over either source
    out = run_from_options(dict(options, ceilings="kernels", memory_efficiency=0.5))
    assert out["efficiency"]["memory"] == 0.5


def test_batch_1_decode_under_kernel_ceilings_streams_the_weights_at_the_kernel_fitted_bandwidth(tmp_path):
    """llama2-7b streams 2 x (6,738,415,616 - 32,000 x 4,096) = 13,214,687,232 bytes per token; at the A100 kernel
    fit's memory ceiling mu, a bare engine (no launches, no host time) decodes mu x 2.039e12 / that tokens/s. Its
    1-row GEMMs' MMAs are ~1/60 of their loads, the KV reads and activations are small: within 5% below."""
    streamed = 2 * (6_738_415_616 - 32_000 * 4096)
    mu = FILE["gpus"]["A100-SXM4-80GB"]["memory"]
    bare = tmp_path / "a100-bare.yaml"
    bare.write_text(yaml.safe_dump({"base": "a100", "efficiency": {"kernel_launch_seconds": 0.0}}))
    rows = table(tmp_path, row(gpu=str(bare), engine="ideal", input_tokens=1, output_tokens=128,
                               metric="decode_tokens_per_second_per_sequence"))
    eff = kernel_efficiencies(rows[0])
    assert (eff.memory, eff.ceilings, eff.host_per_sequence) == (mu, "kernels", None)
    with Replayer() as replayer:
        value = replayer.predict(rows[0], eff).value
    assert value is not None and 0.95 * mu * 2.039e12 / streamed <= value <= mu * 2.039e12 / streamed


def test_the_trtllm_profile_gets_the_host_prior_not_its_in_sample_fit(tmp_path):
    rows = table(tmp_path, row(engine="trtllm", engine_version="1.0"))
    assert kernel_efficiencies(rows[0]).host_per_sequence == HOST_PRIOR


def test_validate_with_kernel_ceilings_fits_nothing_so_in_and_out_of_sample_agree():
    result = CliRunner().invoke(main, ["validate", "--csv", str(SMALL), "--json", "--ceilings", "kernels", "--jobs", "1"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["ceilings"] == "kernels"
    assert set(data["fit"]["kernel_ceilings"]) == {"A100-SXM4-80GB", "H100-SXM5-80GB"}
    compared = [r for r in data["rows"] if r["predicted_out_of_sample"] is not None]
    assert compared and all(r["predicted_in_sample"] == r["predicted_out_of_sample"] for r in compared)
    assert data["in_sample"]["median"] == data["out_of_sample"]["median"]


def test_validate_text_names_the_kernel_ceilings_and_bands_are_refused():
    result = CliRunner().invoke(main, ["validate", "--csv", str(SMALL), "--no-rows", "--ceilings", "kernels"])
    assert result.exit_code == 0, result.output
    assert "Ceilings fitted on measured GEMM kernels, none on this table" in result.output
    assert "out-of-sample (nothing fitted here)" in result.output
    result = CliRunner().invoke(main, ["validate", "--csv", str(SMALL), "--ceilings", "kernels", "--write-bands"])
    assert result.exit_code == 2 and "--write-bands" in result.output and "Traceback" not in result.output


def test_validate_skips_a_row_whose_gpu_the_kernel_file_does_not_cover(tmp_path):
    # one row on a GPU YAML of the user's own: skipped with the reason, the others still scored
    import csv

    spec = load_gpu("h100").model_dump()
    spec.update(name="My-H100", aliases=[])
    gpu = tmp_path / "mine.yaml"
    gpu.write_text(yaml.safe_dump(spec))
    with SMALL.open(newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    rows[0]["gpu"] = str(gpu)
    path = tmp_path / "t.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    result = CliRunner().invoke(main, ["validate", "--csv", str(path), "--json", "--ceilings", "kernels", "--jobs", "1"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    first = data["rows"][0]
    assert first["predicted_out_of_sample"] is None and "no kernel-fitted parameters for GPU 'My-H100'" in first["skipped"]
    assert data["out_of_sample"]["rows"] == data["rows_compared"] > 0
