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


def test_a_run_held_in_memory_beyond_the_machine_is_refused_and_records_stream_it(tmp_path, monkeypatch):
    from simulator.engine import workload

    # A machine of 40 x 1,536 bytes: 40 requests held in memory fit, 41 do not; streamed, 41 run.
    monkeypatch.setattr(workload, "_physical_memory_bytes", lambda: 40 * workload.HELD_BYTES_PER_REQUEST)
    args = ["--model", "llama3-8b", "--gpu", "h100", "--qps", "10", "--ctx", "64", "--gen", "4"]
    assert CliRunner().invoke(main, [*args, "--requests", "40"]).exit_code == 0
    refused = CliRunner().invoke(main, [*args, "--requests", "41"])
    assert refused.exit_code == 2
    assert "41 requests (--requests, --batch or --trace) held in memory need about" in refused.output
    assert "give --records DIR" in refused.output
    assert "simulate at most 40 requests" in refused.output
    streamed = CliRunner().invoke(main, [*args, "--requests", "41", "--records", str(tmp_path / "records")])
    assert streamed.exit_code == 0, streamed.output
