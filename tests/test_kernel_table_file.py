"""memwall's own kernel-table file: what ``simulate calibrate --kernel-table-out`` writes and ``--kernel-table`` reads."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from simulator.calibrate.overlay import kernel_table_rows
from simulator.cli import main
from simulator.cost.kernel_tables.csv_format import MAGIC, read_kernel_table, write_kernel_table
from simulator.cost.kernel_tables.table import TableOrigin
from simulator.cost.system import System
from simulator.errors import InputError
from simulator.model import load_gpu, load_model
from simulator.model.engine_profile import load_engine_profile
from simulator.model.precision import Precision
from simulator.model.step import Step

ORIGIN = TableOrigin("A100-SXM4-80GB", "torch", "2.13.0", "", "made up for the test")


def _write(tmp_path, rows, name="k.csv", origin=ORIGIN):
    path = tmp_path / name
    write_kernel_table(path, origin, rows)
    return path


def test_a_table_round_trips_with_its_origin(tmp_path):
    path = _write(tmp_path, [("bf16", 1, 4096, 4096, 20e-6), ("bf16", 16, 4096, 4096, 25e-6),
                             ("fp8", 1, 4096, 4096, 15e-6), ("fp8", 16, 4096, 4096, 16e-6)])
    assert path.read_text().splitlines()[0] == MAGIC
    tables = read_kernel_table(str(path))
    assert set(tables) == {"bf16", "fp8"}
    assert tables["bf16"].origin.gpu == "A100-SXM4-80GB" and tables["bf16"].origin.version == "2.13.0"
    assert tables["bf16"].seconds[:, 0, 0] == pytest.approx([20e-6, 25e-6])


@pytest.mark.parametrize("body, message", [
    ("op,dtype,m,n,k,seconds\ngemm,bf16,1,8,8,1e-5\n", "line 1 must be"),
    (MAGIC + "\nop,dtype,m,n,k,seconds\ngemm,bf16,1,8,8,1e-5\n", "no '# gpu: NAME' line"),
    (MAGIC + "\n# gpu: X\nop,m,n\n", "line 3: the header must be"),
    (MAGIC + "\n# gpu: X\nop,dtype,m,n,k,seconds\nattention,bf16,1,8,8,1e-5\n", "line 4: op 'attention'"),
    (MAGIC + "\n# gpu: X\nop,dtype,m,n,k,seconds\ngemm,fp7,1,8,8,1e-5\n", "line 4: dtype 'fp7'"),
    (MAGIC + "\n# gpu: X\nop,dtype,m,n,k,seconds\ngemm,bf16,one,8,8,1e-5\n", "line 4: m, n, k must be integers"),
    (MAGIC + "\n# gpu: X\nop,dtype,m,n,k,seconds\ngemm,bf16,1,8,8,inf\n", "line 4: m, n, k must be >= 1"),
    (MAGIC + "\n# gpu: X\nop,dtype,m,n,k,seconds\ngemm,bf16,1,8\n", "line 4: 4 fields, expected 6"),
])
def test_a_bad_file_is_one_line_naming_the_line(tmp_path, body, message):
    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(InputError, match=message):
        read_kernel_table(str(path))


def test_a_users_table_times_the_gemms_it_covers(tmp_path):
    # Llama-2-7B at tp 1 on an A100: o_proj is 4096 x 4096. Measured 30 us at 1 row and 120 us at 64; a decode of
    # 8 sequences sits between them in log space: 30 us * 4^(log 8 / log 64) = 30 us * 4^0.5 = 60 us per layer.
    path = _write(tmp_path, [("bf16", 1, 4096, 4096, 30e-6), ("bf16", 64, 4096, 4096, 120e-6)])
    system = System(load_model("llama2-7b"), load_gpu("a100"), Precision(weights="fp16", kv="fp16"), 1,
                    engine=load_engine_profile("vllm"), kernel_table=str(path))
    costs = {op.name: op for op in system.step_cost(Step.decode(8, 512)).operators}
    assert costs["o_proj"].measured and costs["o_proj"].seconds == pytest.approx(32 * 60e-6, rel=1e-9)
    # The qkv projection (n = 12,288) lies outside the table's single n: its roofline scaled to the table.
    assert costs["qkv_proj"].measured
    assert not costs["attention"].measured
    assert system.time_model.kernels.describe() == "measured, A100-SXM4-80GB / torch 2.13.0"


def test_a_table_of_another_gpu_is_refused(tmp_path):
    path = _write(tmp_path, [("bf16", 1, 4096, 4096, 30e-6), ("bf16", 64, 4096, 4096, 120e-6)])
    with pytest.raises(InputError, match="measured on A100-SXM4-80GB, the run's GPU is H100-SXM5-80GB"):
        System(load_model("llama2-7b"), load_gpu("h100"), Precision(weights="fp16", kv="fp16"), 1,
               kernel_table=str(path))


def test_calibrate_writes_the_timed_gemms_as_a_table_and_a_run_reads_it(tmp_path):
    timings = {
        "schema": "memwall-calibration-1", "device": {"kind": "cuda", "name": "NVIDIA A100-SXM4-80GB", "torch": "2.13.0"},
        "base_gpu": "A100-SXM4-80GB",
        "gemm": [{"dtype": "fp16", "tokens": m, "n": 4096, "k": 4096, "seconds": s}
                 for m, s in ((1, 30e-6), (64, 120e-6))],
    }
    # fp16 runs the bf16 tensor-core kernels: the rows are bf16 rows.
    assert kernel_table_rows(timings) == [("bf16", 1, 4096, 4096, 30e-6), ("bf16", 64, 4096, 4096, 120e-6)]
    from simulator.calibrate.overlay import write_kernel_table_of

    table = tmp_path / "a100.csv"
    assert write_kernel_table_of(table, timings) == 2
    result = CliRunner().invoke(main, ["--model", "llama2-7b", "--gpu", "a100", "--batch", "8", "--ctx", "640",
                                       "--gen", "128", "--kernel-table", str(table), "--json"])
    assert result.exit_code == 0, result.output
    kernels = json.loads(result.output)["kernels"]
    assert kernels["source"] == "measured, A100-SXM4-80GB / torch 2.13.0" and kernels["table_file"] == str(table)
    assert 0 < kernels["steps"]["decode_last"]["measured_share"] < 1 and kernels["steps"]["decode_last"]["by_kind"]["gemm"] == "measured"
    assert math.isfinite(json.loads(result.output)["latency"]["tpot_seconds"]["mean"])


def test_a_missing_table_file_is_one_line():
    result = CliRunner().invoke(main, ["--model", "llama2-7b", "--gpu", "a100", "--kernel-table", "/nonexistent.csv"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "--kernel-table: /nonexistent.csv: cannot read" in result.output
