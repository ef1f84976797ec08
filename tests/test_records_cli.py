"""--records: a run streams its per-request records to a folder and reports the same figures."""

import json

from click.testing import CliRunner

from simulator.cli import main

ARGS = ["--model", "llama3-8b", "--gpu", "h100", "--qps", "20", "--requests", "30", "--seed", "1", "--json"]


def test_streamed_records_give_the_same_report_and_one_row_per_request(tmp_path):
    runner = CliRunner()
    held = runner.invoke(main, ARGS)
    streamed = runner.invoke(main, [*ARGS, "--records", str(tmp_path / "rec")])
    assert held.exit_code == 0 and streamed.exit_code == 0, streamed.output
    a, b = json.loads(held.stdout), json.loads(streamed.stdout)
    assert a["requests"] == b["requests"] and a["latency"] == b["latency"] and a["throughput"] == b["throughput"]
    # 30 requests x 8 bytes (float64) per first-token time; 30 x 1 byte (int8) per status
    assert (tmp_path / "rec" / "requests" / "first_token.bin").stat().st_size == 30 * 8
    assert (tmp_path / "rec" / "requests" / "status.bin").stat().st_size == 30


def test_records_needs_a_folder_and_one_replica(tmp_path):
    runner = CliRunner()
    a_file = tmp_path / "f.txt"
    a_file.write_text("x")
    result = runner.invoke(main, [*ARGS, "--records", str(a_file)])
    assert result.exit_code == 2 and "--records: " in result.output and "is a file" in result.output
    result = runner.invoke(main, [*ARGS, "--records", str(tmp_path / "r"), "--replicas", "2"])
    assert result.exit_code == 2 and "one replica" in result.output


def test_a_records_folder_name_the_file_system_refuses_is_a_clear_error():
    result = CliRunner().invoke(main, [*ARGS, "--records", "a" * 300])  # longer than any file name may be (255)
    assert result.exit_code == 2 and "--records: cannot use" in result.output and "Traceback" not in result.output


def test_an_output_file_name_the_file_system_refuses_is_a_clear_error():
    result = CliRunner().invoke(main, [*ARGS, "--per-request", "a" * 300 + ".csv"])
    assert result.exit_code == 2 and "--per-request: cannot use" in result.output and "Traceback" not in result.output


def test_a_nul_in_an_output_name_is_a_clear_error(tmp_path):
    result = CliRunner().invoke(main, [*ARGS, "--records", str(tmp_path / "a\x00b")])
    assert result.exit_code == 2 and "--records:" in result.output and "NUL" in result.output
