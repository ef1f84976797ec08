"""Trace files: every format read to the exact arrays worked out from the file, both CSV readers alike,
every bad cell reported with file, line and column."""

import json
from pathlib import Path

import numpy as np
import pytest

from simulator.engine.traces import MAX_TIME_SECONDS, datetime_ns, read_trace
from simulator.engine.workload import trace_workload
from simulator.errors import InputError

DATA = Path(__file__).parent / "data"

try:
    import pyarrow  # noqa: F401

    READERS = ["python", "arrow"]
except ImportError:  # the columnar reader is an optional extra; the csv path is tested regardless
    READERS = ["python"]

CSV_TRACES = ["azure_trace_small.csv", "azure_2024_small.csv", "vidur_small.csv", "burstgpt_small.csv", "trace_bom.csv"]


def arrays(trace):
    return trace.arrival_seconds.tolist(), trace.prompt_tokens.tolist(), trace.output_tokens.tolist()


@pytest.mark.parametrize("reader", READERS)
def test_azure_2023_seven_fractional_digits(reader):
    trace = read_trace(DATA / "azure_trace_small.csv", reader=reader)
    # TIMESTAMPs 18:15:46.6805900, 46.9810000, 47.1805900, 48.6805900, 49.0000000, 50.6805900, in ns from the
    # first: 300,410,000; 500,000,000; 2,000,000,000; 2,319,410,000; 4,000,000,000.
    assert arrays(trace) == (
        [0.0, 0.30041, 0.5, 2.0, 2.31941, 4.0],
        [374, 396, 879, 91, 1200, 512],
        [44, 109, 32, 12, 250, 128],
    )
    assert trace.format == "Azure LLM inference" and trace.timed and not trace.notes


@pytest.mark.parametrize("reader", READERS)
def test_azure_2024_offsets_and_a_failed_row(reader):
    trace = read_trace(DATA / "azure_2024_small.csv", reader=reader)
    # UTC: 00:00:00.009930, 00.509930, (01.250000 has 0 GeneratedTokens: skipped), 02.000000, and
    # 01:00:00.009930+01:00 = 00:00:00.009930 UTC. From the earliest: 0, 0.5, 2 - 0.00993 = 1.99007, 0.
    assert arrays(trace) == ([0.0, 0.5, 1.99007, 0.0], [4808, 3180, 7433, 34], [10, 8, 14, 12])
    assert len(trace.notes) == 1 and "skipped 1 of 5 rows with 0 prompt or output tokens" in trace.notes[0]


@pytest.mark.parametrize("reader", READERS)
def test_vidur_trace(reader):
    trace = read_trace(DATA / "vidur_small.csv", reader=reader)
    assert arrays(trace) == ([0.0, 4.314579, 4.541877, 4.710427], [374, 396, 879, 91], [44, 109, 55, 16])
    assert trace.format == "Vidur"


@pytest.mark.parametrize("reader", READERS)
def test_burstgpt_trace_skips_failures(reader):
    trace = read_trace(DATA / "burstgpt_small.csv", reader=reader)
    # Timestamps 5, 45, 118, 140, 171 s; rows at 45 and 140 have Response tokens 0 (failures).
    # Kept: 5, 118, 171 -> 0, 113, 166 s after the earliest kept request.
    assert arrays(trace) == ([0.0, 113.0, 166.0], [472, 417, 212], [18, 30, 212])
    assert "skipped 2 of 5 rows" in trace.notes[0] and "BurstGPT" in trace.notes[0]


@pytest.mark.parametrize("reader", READERS)
def test_byte_order_mark_and_crlf(reader):
    trace = read_trace(DATA / "trace_bom.csv", reader=reader)
    # 0.5 and 1.25 s -> 0 and 0.75 s.
    assert arrays(trace) == ([0.0, 0.75], [100, 200], [10, 20])


@pytest.mark.parametrize("name", CSV_TRACES)
def test_columnar_and_csv_readers_give_identical_arrays(name):
    pytest.importorskip("pyarrow")
    a, b = read_trace(DATA / name, reader="arrow"), read_trace(DATA / name, reader="python")
    for x, y in zip(arrays(a), arrays(b)):
        assert x == y
    assert a.arrival_seconds.dtype == b.arrival_seconds.dtype == np.float64
    assert a.prompt_tokens.dtype == b.prompt_tokens.dtype == np.int64
    assert a.notes == b.notes


@pytest.mark.parametrize("reader", READERS)
def test_readers_agree_across_chunks(tmp_path, reader):
    # 140,001 rows: three csv chunks (65,536 + 65,536 + 8,929) and several 1 MiB pyarrow blocks. Row i
    # arrives at 2024-05-10 00:00:00 + i ms (+00:00), prompt 1 + i mod 1000, output 1 + i mod 7; row 100,000
    # (in the second chunk) has 0 output tokens and is skipped.
    n = 140_001
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(n):
        seconds, ms = divmod(i, 1000)
        minutes, seconds = divmod(seconds, 60)
        output = 0 if i == 100_000 else 1 + i % 7
        lines.append(f"2024-05-10 00:{minutes:02d}:{seconds:02d}.{ms:03d}000+00:00,{1 + i % 1000},{output}")
    path = tmp_path / "big.csv"
    path.write_text("\n".join(lines) + "\n")
    trace = read_trace(path, reader=reader)
    kept = np.array([i for i in range(n) if i != 100_000])
    assert len(trace) == n - 1
    assert np.array_equal(trace.arrival_seconds, kept / 1000)
    assert np.array_equal(trace.prompt_tokens, 1 + kept % 1000)
    assert np.array_equal(trace.output_tokens, 1 + kept % 7)


def test_vllm_result_with_start_times():
    trace = read_trace(DATA / "vllm_result.json")
    # start_times 1000.25, 1000.5, (1000.75 failed: error and 0 output tokens), 1001.0 -> 0, 0.25, 0.75.
    assert arrays(trace) == ([0.0, 0.25, 0.75], [512, 1024, 128], [128, 64, 32])
    assert trace.timed and "skipped 1 of 4 requests with an error or 0 tokens" in trace.notes[0]


def test_vllm_result_without_timing_arrives_at_zero_with_a_hint():
    trace = read_trace(DATA / "vllm_result_untimed.json")
    assert arrays(trace) == ([0.0, 0.0, 0.0], [100, 200, 300], [10, 20, 30])
    assert not trace.timed
    assert "--qps 2.5 --arrival gamma --burstiness 0.5" in trace.notes[0]
    workload = trace_workload(trace)
    assert workload.arrival_seconds.tolist() == [0.0, 0.0, 0.0] and workload.notes == trace.notes


def test_vidur_length_only_trace_is_untimed(tmp_path):
    path = tmp_path / "lengths.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n3772,54,3826,69.85\n2015,156,2171,12.9\n")
    trace = read_trace(path)
    assert arrays(trace) == ([0.0, 0.0], [3772, 2015], [54, 156]) and not trace.timed


def test_jsonl_and_json_list_rows(tmp_path):
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text('{"arrived_at": 2.5, "num_prefill_tokens": 7, "num_decode_tokens": "3"}\n\n'
                     '{"arrived_at": "4", "num_prefill_tokens": 8.0, "num_decode_tokens": 0}\n'
                     '{"arrived_at": 3, "num_prefill_tokens": 9, "num_decode_tokens": 1}\n')
    # Vidur keys; the second row has 0 decode tokens and is skipped; 2.5 and 3 s -> 0 and 0.5 s.
    assert arrays(read_trace(jsonl)) == ([0.0, 0.5], [7, 9], [3, 1])
    listed = tmp_path / "t.json"
    listed.write_text('[{"arrival_seconds": "2024-05-10T00:00:01Z", "prompt_tokens": 5, "output_tokens": 6},'
                      ' {"arrival_seconds": "2024-05-10T00:00:00Z", "prompt_tokens": 7, "output_tokens": 8}]')
    assert arrays(read_trace(listed)) == ([1.0, 0.0], [5, 7], [6, 8])


def test_datetime_forms():
    # 2024-05-10 is day 19,853 after 1970-01-01: 19,853 * 86,400 = 1,715,299,200 s.
    base = 1_715_299_200 * 10**9
    assert datetime_ns("2024-05-10") == base
    assert datetime_ns("2024-05-10T01:02:03.123456789") == base + 3723 * 10**9 + 123_456_789
    assert datetime_ns("2024-05-10 01:02:03+01:00") == base + 123 * 10**9  # 01:02:03 at +01 is 00:02:03 UTC
    assert datetime_ns("2024-05-10 00:00:00-0530") == base + 19_800 * 10**9
    assert datetime_ns(" 2024-05-10 00:00:00.5 ") == base + 500_000_000
    assert datetime_ns("2024-05-10 00:00:00.1234567891") is None  # 10 fractional digits
    assert datetime_ns("2024-02-30 00:00:00") is None
    assert datetime_ns("soon") is None


# -- bad input --------------------------------------------------------------------------------------------

OURS = "arrival_seconds,prompt_tokens,output_tokens\n"


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize(
    "body, message",
    [
        ("0,1,1\nnan,1,1\n", "t.csv:3: arrival_seconds 'nan' is not a finite number of seconds"),
        ("0,1,1\n-inf,1,1\n", "t.csv:3: arrival_seconds '-inf' is not a finite number of seconds"),
        ("0,1,1\ninf,1,1\n2,1,1\n", "t.csv:3: arrival_seconds 'inf' is not a finite number of seconds"),
        ("0,1,1\n1e13,1,1\n", "t.csv:3: arrival_seconds '1e13' is beyond"),
        ("0,1,1\n2024-05-10,1,1\n", "t.csv:3: arrival_seconds '2024-05-10' is a date-time, but the first row's"),
        ("soon,10,5\n", "t.csv:2: arrival_seconds 'soon' is not a number of seconds nor an ISO date-time"),
        ("0,nan,1\n", "t.csv:2: prompt_tokens 'nan' is not a finite number"),
        ("0,1e400,1\n", "t.csv:2: prompt_tokens '1e400' is not a finite number"),
        ("0,1,9223372036854775808\n", "t.csv:2: output_tokens '9223372036854775808' must be < 2\\^31"),
        ("0,2147483648,1\n", "t.csv:2: prompt_tokens '2147483648' must be < 2\\^31"),
        ("0,1.5,1\n", "t.csv:2: prompt_tokens '1.5' is not a whole number"),
        ("0,10,5\n1,-3,5\n", "t.csv:3: prompt_tokens '-3' must be >= 1"),
        ("0,0,5\n", "t.csv:2: prompt_tokens '0' must be >= 1"),
        ("0,abc,5\n", "t.csv:2: prompt_tokens 'abc' is not a number"),
        ("0,,5\n", "t.csv:2: prompt_tokens '' is not a number"),
        ("0,1,1\n1,2\n", "t.csv:3: 2 cells, but the header names 3 columns"),
        ("", "t.csv: the trace has no requests"),
    ],
)
def test_bad_cells_name_file_line_and_column(tmp_path, reader, body, message):
    path = tmp_path / "t.csv"
    path.write_text(OURS + body)
    with pytest.raises(InputError, match=message):
        read_trace(path, reader=reader)


@pytest.mark.parametrize("reader", READERS)
def test_bad_dates_and_mixed_kinds(tmp_path, reader):
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00,1,1\n2024-02-30 00:00:00,1,1\n")
    with pytest.raises(InputError, match="t.csv:3: TIMESTAMP '2024-02-30 00:00:00' is not a number of seconds nor"):
        read_trace(path, reader=reader)
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00,1,1\n12.5,1,1\n")
    with pytest.raises(InputError, match="t.csv:3: TIMESTAMP '12.5' is a number, but the first row's arrival was a date"):
        read_trace(path, reader=reader)
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n1500-01-01,1,1\n")
    with pytest.raises(InputError, match="outside 1677-09-21"):
        read_trace(path, reader=reader)


@pytest.mark.parametrize("reader", READERS)
def test_encodings(tmp_path, reader):
    path = tmp_path / "t.csv"
    path.write_bytes(b"arrival_seconds,prompt_tokens,output_tokens,note\n0,1,1,ok\n1,1,1,caf\xe9\n")
    # Header 15 + 1 + 13 + 1 + 13 + 1 + 4 + newline = 49 bytes, "0,1,1,ok\n" 9, "1,1,1,caf" 9: offset 67.
    with pytest.raises(InputError, match=r"t.csv:3: not UTF-8 text \(byte 0xe9 at offset 67\)"):
        read_trace(path, reader=reader)
    path.write_bytes("arrival_seconds,prompt_tokens,output_tokens\n0,1,1\n".encode("utf-16"))
    with pytest.raises(InputError, match="t.csv: the file is UTF-16; save it as UTF-8"):
        read_trace(path, reader=reader)


def test_unknown_and_incomplete_columns(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.68,10\n")
    with pytest.raises(InputError, match=r"t.csv: missing a column of the Azure LLM inference format, which needs "
                                         r"TIMESTAMP, ContextTokens, GeneratedTokens; found: TIMESTAMP, ContextTokens"):
        read_trace(path)
    path.write_text("when,in,out\n0,1,1\n")
    with pytest.raises(InputError, match=r"no trace format has these columns: when, in, out; known formats: memwall"):
        read_trace(path)
    with pytest.raises(InputError, match="cannot read .*missing.csv: no such file"):
        read_trace(tmp_path / "missing.csv")
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(InputError, match="empty.csv: the file is empty"):
        read_trace(tmp_path / "empty.csv")


def test_all_rows_failed(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("Timestamp,Request tokens,Response tokens\n1,5,0\n2,6,0\n")
    with pytest.raises(InputError, match=r"t.csv: the trace has no requests \(all 2 rows had 0 tokens\)"):
        read_trace(path)


def test_bad_json_cells(tmp_path):
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text('{"arrival_seconds": 0, "prompt_tokens": 1, "output_tokens": 1}\n{oops\n')
    with pytest.raises(InputError, match=r"t.jsonl:2: not JSON"):
        read_trace(jsonl)
    jsonl.write_text('{"arrival_seconds": 0, "prompt_tokens": true, "output_tokens": 1}\n')
    with pytest.raises(InputError, match=r"t.jsonl:1: prompt_tokens True is not a number"):
        read_trace(jsonl)
    jsonl.write_text('{"arrival_seconds": NaN, "prompt_tokens": 1, "output_tokens": 1}\n')
    with pytest.raises(InputError, match=r"t.jsonl:1: arrival_seconds nan is not a finite number of seconds"):
        read_trace(jsonl)
    jsonl.write_text('{"arrival_seconds": 0, "prompt_tokens": 9223372036854775808, "output_tokens": 1}\n')
    with pytest.raises(InputError, match=r"t.jsonl:1: prompt_tokens 9223372036854775808 must be < 2\^31"):
        read_trace(jsonl)
    jsonl.write_text('{"arrival_seconds": 0, "prompt_tokens": 1, "output_tokens": 1}\n{"arrival_seconds": 1}\n')
    with pytest.raises(InputError, match=r"t.jsonl:2: no 'prompt_tokens' key"):
        read_trace(jsonl)
    vllm = tmp_path / "r.json"
    vllm.write_text('{"input_lens": [1, 2], "output_lens": [1]}')
    with pytest.raises(InputError, match=r"r.json: output_lens has 1 entries but input_lens has 2"):
        read_trace(vllm)
    vllm.write_text('{"input_lens": [1, 2], "output_lens": [1, -4]}')
    with pytest.raises(InputError, match=r"r.json: output_lens\[1\] -4 must be >= 0"):
        read_trace(vllm)
    vllm.write_text('{"input_lens": [1], "output_lens": [1], "start_times": [1e300]}')
    with pytest.raises(InputError, match=r"r.json: start_times\[0\] 1e\+300 is beyond"):
        read_trace(vllm)
    vllm.write_text('{"ttfts": [0.1]}')
    with pytest.raises(InputError, match=r"a JSON trace is a vLLM benchmark result"):
        read_trace(vllm)


def test_time_cap_is_a_physical_bound():
    # 1e12 s is ~31,700 years: any real trace is inside, a Unix time in ms (1.7e12) is not.
    assert MAX_TIME_SECONDS / (365.25 * 86400) == pytest.approx(31_688, rel=1e-4)


def test_requests_take_the_first_of_a_replayed_trace_and_more_than_it_holds_is_refused(tmp_path):
    from click.testing import CliRunner

    from simulator.cli import main

    path = tmp_path / "t.csv"
    path.write_text("arrival_seconds,prompt_tokens,output_tokens\n0,100,10\n1,120,10\n2,140,10\n")
    args = ["--model", "llama2-7b", "--gpu", "a100", "--trace", str(path), "--json"]
    two = json.loads(CliRunner().invoke(main, [*args, "--requests", "2"]).stdout)
    assert two["requests"]["total"] == 2 and two["workload"]["prompt_tokens_mean"] == 110  # (100 + 120) / 2
    refused = CliRunner().invoke(main, [*args, "--requests", "4"])
    assert refused.exit_code == 2 and "--requests 4: t.csv holds 3 requests" in refused.output
