"""`simulate validate`: reading the table, how a row is replayed through the engine, lengths, the command."""

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from simulator.cli import main
from simulator.cli.validate import _far_off_text, far_off
from simulator.errors import InputError
from simulator.model.gpu_family import family_of
from simulator.validation.crossval import Scored
from simulator.validation.lengths import load_lengths
from simulator.validation.replay import Efficiencies, Prediction, Replayer, sample_lengths, whole_run_scale
from simulator.validation.table import COLUMNS, load_table, metric_kind

DATA = Path(__file__).parent / "data"
SMALL = DATA / "published_small.csv"
EXACT = Efficiencies(1.0, 1.0)


def row(**fields) -> dict:
    base = {"id": "1", "source_id": "s", "engine": "vllm", "engine_version": "", "model": "llama2-7b", "gpu": "a100", "tp": "1",
                "replicas": "1", "weights": "fp16", "kv": "fp16", "mode": "static", "regime": "decode_b1", "batch": "1",
                "input_tokens": "128", "output_tokens": "128", "input_dist": "fixed", "output_dist": "fixed", "request_rate": "",
                "num_prompts": "", "max_num_seqs": "", "max_batched_tokens": "", "chunked_prefill": "", "metric": "tpot_seconds",
                "measured": "0.01", "unit": "seconds", "quote": "", "source": "test", "link": "-", "notes": "", "explanation": ""}
    base.update({k: str(v) for k, v in fields.items()})
    return base


def write_table(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(COLUMNS))
        writer.writeheader()
        writer.writerows(rows)
    return path


def table(tmp_path: Path, *rows: dict) -> list:
    return load_table(write_table(tmp_path / "t.csv", list(rows)))


def exact_a100(tmp_path: Path) -> str:
    """The shipped A100 with every efficiency 1 and no fixed costs: the bare roofline."""
    path = tmp_path / "a100-exact.yaml"
    efficiency = {"compute": 1.0, "memory": 1.0, "link": 1.0, "kernel_launch_seconds": 0.0, "allreduce_latency_seconds": 0.0}
    path.write_text(yaml.safe_dump({"base": "a100", "efficiency": efficiency}), encoding="utf-8")
    return str(path)


# --- reading the table -------------------------------------------------------------------------

def test_the_small_fixture_reads_with_its_types():
    rows = load_table(SMALL)
    assert [r.id for r in rows] == [str(i) for i in range(1, 13)]
    serving = rows[5]
    assert (serving.mode, serving.request_rate, serving.num_prompts, serving.batch) == ("serving", 4.0, 40, None)
    assert rows[7].request_rate == math.inf and rows[7].chunked_prefill is True
    assert rows[10].replicas == 2 and rows[10].input_dist == "uniform:128:384"
    assert rows[0].family == "ampere" and rows[5].family == "hopper"


def test_a_missing_column_is_named(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("id,model\n1,llama2-7b\n", encoding="utf-8")
    with pytest.raises(InputError, match="missing column.*source_id"):
        load_table(path)


def test_a_bad_value_names_the_file_line_and_column(tmp_path):
    with pytest.raises(InputError, match=r"t\.csv:3: column 'batch': expected an integer \(got 'many'\)"):
        table(tmp_path, row(), row(id="2", batch="many"))


def test_a_row_of_no_prompt_tokens_is_refused_not_replayed_as_one(tmp_path):
    with pytest.raises(InputError, match=r"t\.csv:3: column 'input_tokens': must be >= 1 \(got 0\)"):
        table(tmp_path, row(), row(id="2", input_tokens="0"))


def test_a_serving_metric_in_a_static_row_lists_the_allowed_ones(tmp_path):
    with pytest.raises(InputError, match="'ttft_p99_seconds' is not a static metric; allowed: ttft_seconds"):
        table(tmp_path, row(metric="ttft_p99_seconds"))


def test_repeated_ids_and_bad_distributions_are_refused(tmp_path):
    with pytest.raises(InputError, match="'1' repeats line 2"):
        table(tmp_path, row(), row())
    with pytest.raises(InputError, match="column 'input_dist': cannot read 'uniform:9:3'"):
        table(tmp_path, row(input_dist="uniform:9:3"))
    with pytest.raises(InputError, match="column 'measured': must be finite and at least 1e-09"):
        table(tmp_path, row(measured="nan"))
    # A subnormal measurement would overflow the relative error (8.7e-3 / 1e-320 is inf): refused, as is any value
    # below a nanosecond or 1e-9 per second.
    for tiny in ("1e-320", "5e-10"):
        with pytest.raises(InputError, match=f"column 'measured': must be finite and at least 1e-09 .*got {tiny}"):
            table(tmp_path, row(measured=tiny))
    assert table(tmp_path, row(measured="1e-9"))


def test_metric_kinds():
    assert [metric_kind(m) for m in ("ttft_seconds", "ttft_p99_seconds", "itl_mean_seconds", "tpot_seconds",
                                     "e2e_p50_seconds", "request_throughput", "decode_tokens_per_second_per_sequence")] == [
        "ttft", "ttft", "tpot", "tpot", "e2e", "throughput", "throughput"]


def test_families():
    assert [family_of(g) for g in ("a100", "A10G", "h200", "l4", "mi300x", "b200")] == [
        "ampere", "ampere", "hopper", "ada", "cdna3", "blackwell"]
    assert family_of("no-such-gpu") is None


# --- replay: what each static metric means --------------------------------------------------------

def test_static_batch_metrics_hang_together(tmp_path):
    """A static batch: out tok/s = B O / (TTFT + (O - 1) TPOT) (the prefill emits token 1, then O - 1 decode
    steps), per-sequence rate = out tok/s / B, batch latency = TTFT + (O - 1) TPOT, request throughput = B / that."""
    B, I, O = 8, 300, 50
    metrics = ["ttft_seconds", "tpot_seconds", "output_tokens_per_second", "decode_tokens_per_second_per_sequence",
               "e2e_seconds", "request_throughput"]
    rows = table(tmp_path, *(row(id=str(i), batch=B, input_tokens=I, output_tokens=O, metric=m) for i, m in enumerate(metrics)))
    with Replayer() as replayer:
        ttft, tpot, tps, per_seq, e2e, rps = (replayer.predict(r, EXACT).value for r in rows)
        assert replayer.engine_runs == 1  # six rows, one run
    assert tps == pytest.approx(B * O / (ttft + (O - 1) * tpot), rel=1e-9)
    assert per_seq == pytest.approx(tps / B, rel=1e-12)
    assert e2e == pytest.approx(ttft + (O - 1) * tpot, rel=1e-9)
    assert rps == pytest.approx(B / e2e, rel=1e-9)


def test_batch_1_decode_of_llama2_7b_on_a_bare_a100_is_bandwidth_over_weight_bytes(tmp_path):
    """6,738,415,616 parameters, of which the 32000 x 4096 embedding is not streamed per token:
    2 bytes x (6,738,415,616 - 131,072,000) = 13,214,687,232 bytes per token; 2.039e12 B/s / that = 154.3 tok/s.
    The 1-token prefill, KV reads (<= 129 tokens) and activations only slow it (by well under 5%).
    """
    streamed = 2 * (6_738_415_616 - 32_000 * 4096)
    assert streamed == 13_214_687_232
    rows = table(tmp_path, row(gpu=exact_a100(tmp_path), engine="ideal", input_tokens=1, output_tokens=128,
                               metric="decode_tokens_per_second_per_sequence"))
    with Replayer() as replayer:
        prediction = replayer.predict(rows[0], EXACT)
    assert prediction.fits and prediction.value is not None
    assert 0.95 * 2.039e12 / streamed <= prediction.value <= 2.039e12 / streamed


def test_engines_without_a_profile_use_the_closest_and_say_so(tmp_path):
    rows = table(tmp_path, row(engine="lmdeploy"), row(id="2", engine="trtllm", engine_version="0.9.0"))
    with Replayer() as replayer:
        lmdeploy, trtllm = (replayer.predict(r, EXACT) for r in rows)
    assert "engine lmdeploy simulated with the trtllm-v0 profile" in lmdeploy.notes
    assert lmdeploy.value == pytest.approx(trtllm.value, rel=1e-12)
    assert any("trtllm 0.9.0 simulated with the trtllm-v0 profile" in n for n in trtllm.notes)


def test_unknown_models_and_over_long_static_rows_are_skipped_with_the_reason(tmp_path):
    rows = table(tmp_path, row(model="gpt-neox-20b"), row(id="2", model="gptj-6b", input_tokens=2048, output_tokens=128))
    with Replayer() as replayer:
        unknown, too_long = (replayer.predict(r, EXACT) for r in rows)
    assert unknown.value is None and "unknown model 'gpt-neox-20b'" in unknown.skipped
    # 2048 + 128 = 2176 > GPT-J's 2048 positions
    assert too_long.value is None and "2176 tokens exceed" in too_long.skipped


def test_a_static_batch_beyond_hbm_runs_in_smaller_batches_one_within_hbm_as_one(tmp_path):
    """llama2-13b fp16 KV per token: 2 x 40 layers x 5120 x 2 bytes = 819,200 bytes; weights ~13.0e9 x 2 = 26 GB.
    Batch 64 of 4096 tokens: 64 x 4096 x 819,200 = 214.7 GB of KV, beyond the A100's 85.9 GB (80 GiB): smaller batches.
    Batch 16: 16 x 4096 x 819,200 = 53.7 GB + 26 GB = 79.7 GB <= 85.9 GB: one batch, though the simulator's
    budget (0.9 utilization, workspace, reserve) holds fewer."""
    assert 2 * 40 * 5120 * 2 == 819_200
    rows = table(tmp_path, *(row(id=str(b), model="llama2-13b", batch=b, input_tokens=2048, output_tokens=2048)
                             for b in (64, 16)))
    with Replayer() as replayer:
        beyond, within = (replayer.predict(r, EXACT) for r in rows)
    assert not beyond.fits and any("exceeds HBM" in n for n in beyond.notes)
    assert not within.fits and any("run as one batch" in n for n in within.notes)


# --- replay: serving rows ---------------------------------------------------------------------------

def test_replicas_split_the_load_and_multiply_throughput(tmp_path):
    """R replicas at rate R q: one replica at q (random routing thins a Poisson stream), throughput x R."""
    serving = {"mode": "serving", "regime": "serving", "batch": "", "input_tokens": 256, "output_tokens": 32, "num_prompts": 60}
    rows = table(
        tmp_path,
        row(id="1", replicas=1, request_rate=2, metric="output_tokens_per_second", **serving),
        row(id="2", replicas=3, request_rate=6, num_prompts=180, metric="output_tokens_per_second",
            **{k: v for k, v in serving.items() if k != "num_prompts"}),
        row(id="3", replicas=1, request_rate=2, metric="ttft_p99_seconds", **serving),
        row(id="4", replicas=3, request_rate=6, num_prompts=180, metric="ttft_p99_seconds",
            **{k: v for k, v in serving.items() if k != "num_prompts"}),
    )
    with Replayer() as replayer:
        one, three, ttft_one, ttft_three = (replayer.predict(r, EXACT) for r in rows)
    assert three.value == pytest.approx(3 * one.value, rel=1e-12)
    assert ttft_three.value == pytest.approx(ttft_one.value, rel=1e-12)
    assert any("one of 3 replicas" in n for n in three.notes)


def test_prompts_are_capped_with_a_note(tmp_path):
    serving = {"mode": "serving", "regime": "serving", "batch": "", "num_prompts": 5000, "metric": "request_throughput",
               "input_tokens": 64, "output_tokens": 8}
    rows = table(tmp_path, row(request_rate=100, **serving), row(id="2", request_rate="inf", max_num_seqs=16, **serving))
    with Replayer(max_prompts=20, max_rate_prompts=30) as replayer:
        at_rate, at_once = (replayer.predict(r, EXACT) for r in rows)
    assert "30 of the source's 5000 requests simulated" in at_rate.notes
    # all at once: two waves of max_num_seqs = 2 x 16 = 32 requests, more than the cap of 20
    assert "32 of the source's 5000 requests simulated" in at_once.notes


def test_a_run_at_a_rate_is_simulated_whole_so_its_queue_grows_as_the_sources_did(tmp_path):
    # 3,000 requests at 100/s on one sequence at a time (each of 64 + 8 tokens): the server falls behind from the
    # start, so the k-th request waits for the k - 1 before it; the whole run is simulated (no cap note), and its
    # mean TTFT is about 10x that of its first 300 requests, as a queue growing linearly in k gives
    serving = {"mode": "serving", "regime": "serving", "batch": "", "num_prompts": 3000, "request_rate": 100,
               "max_num_seqs": 1, "metric": "ttft_mean_seconds", "input_tokens": 64, "output_tokens": 8}
    rows = table(tmp_path, row(**serving))
    with Replayer() as whole:
        full = whole.predict(rows[0], EXACT)
    assert not any("of the source's" in n for n in full.notes)
    with Replayer(max_rate_prompts=300) as capped:
        part = capped.predict(rows[0], EXACT)
    assert any("300 of the source's 3000 requests simulated" in n for n in part.notes)
    assert 9 < full.value / part.value < 11
    # no request count stated: the all-at-once cap, not the whole-run one
    unstated = table(tmp_path, row(**{**serving, "num_prompts": ""}))[0]
    with Replayer(max_prompts=50) as replayer:
        assert "num_prompts not stated: 50 requests simulated" in replayer.predict(unstated, EXACT).notes


def test_the_whole_run_scale_spreads_the_drain_over_the_sources_arrivals():
    # 100 of 1,000 requests at 10 requests/s: the simulated ones arrive over 9.5 s and the run ends at
    # 11.5 s (a 2 s drain). The source's arrive over 100 s and drain the same 2 s: 1,000 tokens' worth
    # over 102 s against 100 over 11.5 s, x (1000 / 102) / (100 / 11.5) = 1.12745.
    assert whole_run_scale(100, 1000, 10.0, 9.5, 11.5) == pytest.approx((1000 / 102) / (100 / 11.5), rel=1e-12)
    assert whole_run_scale(100, 100, 10.0, 9.5, 11.5) == 1.0  # the whole run was simulated
    assert whole_run_scale(32, 5000, math.inf, 0.0, 3.0) == 1.0  # all at once: no arrival span to scale


def test_a_capped_run_at_a_rate_reports_the_whole_runs_throughput(tmp_path):
    # 4,000 requests at 4 requests/s, a light load for Llama-2-7B on an A100 (each request 256 + 32
    # tokens, well under a second): the source's run takes 1,000 s of arrivals plus a drain under 1 s,
    # so its output rate is 4 x 32 = 128 tokens/s within 0.1%. The first 40 alone (the validation seed's
    # arrivals span 10.5 s, not the mean 9.75 s) charge the same drain to 40 requests: 7% lower.
    serving = {"mode": "serving", "regime": "serving", "batch": "", "num_prompts": 4000, "request_rate": 4,
               "metric": "output_tokens_per_second", "input_tokens": 256, "output_tokens": 32}
    rows = table(tmp_path, row(**serving))
    with Replayer(max_rate_prompts=40) as capped:
        part = capped.predict(rows[0], EXACT)
        raw = capped.run(rows[0], EXACT).metrics.output_tokens_per_second
    assert any("throughputs for the source's whole run: its 4000 requests arrive over 1000 s" in n for n in part.notes)
    assert 128 * 1000 / 1001 <= part.value <= 128
    assert raw < 0.99 * part.value
    # At 400 requests/s and at most 4 sequences at a time the same server falls behind (4 sequences of
    # 32 tokens take ~0.2 s; 40 requests arrive in ~0.1 s): they drain for seconds after 0.1 s of
    # arrivals, no steady state to extrapolate, so the capped run's own throughput is reported.
    flood = table(tmp_path, row(**{**serving, "request_rate": 400, "max_num_seqs": 4}))[0]
    with Replayer(max_rate_prompts=40) as capped:
        over = capped.predict(flood, EXACT)
        assert over.value == pytest.approx(capped.run(flood, EXACT).metrics.output_tokens_per_second, rel=1e-12)
    assert any("no steady state to extrapolate" in n for n in over.notes)


# --- lengths ----------------------------------------------------------------------------------------

def _tiny_draws(tmp_path, input_tokens: int, output_tokens: int):
    """200 draws of a serving row on lengths/tiny.csv (pairs (100, 50), (300, 150), (500, 250)) stating these means."""
    (tmp_path / "lengths").mkdir()
    (tmp_path / "lengths" / "tiny.csv").write_bytes((DATA / "lengths" / "tiny.csv").read_bytes())
    rows = table(tmp_path, row(mode="serving", regime="serving", batch="", request_rate=1, num_prompts=10,
                               input_tokens=input_tokens, output_tokens=output_tokens,
                               input_dist="dataset:tiny", output_dist="dataset:tiny", metric="ttft_mean_seconds"))
    prompts, outputs, notes = sample_lengths(rows[0], 200, np.random.default_rng(0), 4096)
    return set(zip(prompts.tolist(), outputs.tolist())), len(set(prompts.tolist())), notes


def test_a_sample_file_beside_the_table_is_drawn_in_pairs(tmp_path):
    # every draw is one of the file's pairs; the row states the file's own means (300, 150), so nothing is scaled
    pairs, distinct, notes = _tiny_draws(tmp_path, 300, 150)
    assert pairs <= {(100, 50), (300, 150), (500, 250)} and distinct == 3
    assert notes == []


def test_a_sample_file_is_scaled_to_the_sources_stated_means(tmp_path):
    # The source drew its own prompts (means 600 and 75); the file's means are 300 and 150: prompts x 2,
    # outputs x 0.5, so (100, 50), (300, 150), (500, 250) become (200, 25), (600, 75), (1000, 125)
    pairs, distinct, notes = _tiny_draws(tmp_path, 600, 75)
    assert pairs <= {(200, 25), (600, 75), (1000, 125)} and distinct == 3
    assert any("scaled by 2.00" in n for n in notes) and any("scaled by 0.50" in n for n in notes)


def _tiny_capped_outputs(tmp_path, dist: str):
    (tmp_path / "lengths").mkdir()
    (tmp_path / "lengths" / "tiny.csv").write_bytes((DATA / "lengths" / "tiny.csv").read_bytes())
    rows = table(tmp_path, row(mode="serving", regime="serving", batch="", request_rate=1, num_prompts=10,
                               input_tokens=300, output_tokens=300, input_dist="dataset:tiny", output_dist=dist,
                               metric="ttft_mean_seconds"))
    return sample_lengths(rows[0], 200, np.random.default_rng(0), 4096)


def test_a_sample_files_lengths_are_capped_at_the_sources_maximum(tmp_path):
    # Outputs (50, 150, 250) scaled x 2 to the stated mean of 300 are (100, 300, 500); the source allowed 400
    # output tokens at most, so the 500s become 400 (a benchmark's max_new_tokens); the prompts are not capped.
    prompts, outputs, notes = _tiny_capped_outputs(tmp_path, "dataset:tiny:400")
    assert set(outputs.tolist()) == {100, 300, 400} and set(prompts.tolist()) == {100, 300, 500}
    assert any("capped at the source's 400" in n for n in notes)


@pytest.mark.parametrize("dist", ["dataset:tiny:x", "dataset:tiny:0", "dataset::400", "dataset:tiny:1.5"])
def test_a_dataset_cap_must_be_a_whole_number_of_tokens(tmp_path, dist):
    with pytest.raises(InputError, match="dataset:NAME:MAX"):
        _tiny_capped_outputs(tmp_path, dist)


def test_random_ratio_is_uniform_around_the_length_and_long_prompts_are_shortened(tmp_path):
    rows = table(tmp_path, row(mode="serving", regime="serving", batch="", request_rate=1, input_tokens=1000,
                               output_tokens=100, input_dist="random_ratio:0.5", metric="ttft_mean_seconds"))
    prompts, outputs, notes = sample_lengths(rows[0], 500, np.random.default_rng(0), 1300)
    # uniform in [1000 x 0.5, 1000 x 1.5] = [500, 1500]; the model holds 1300 tokens, so prompts <= 1300 - 100
    assert prompts.min() >= 500 and prompts.max() == 1200 and set(outputs.tolist()) == {100}
    assert "prompts shortened" in notes[0]


def test_histograms_and_summary_statistics(tmp_path):
    hist = tmp_path / "h.csv"
    hist.write_text("bucket_low,bucket_high,count\n10,19,3\n100,100,1\n", encoding="utf-8")
    data = load_lengths(hist)
    draws = data.sample("input_tokens", 4000, np.random.default_rng(0), None)
    assert set(draws.tolist()) <= set(range(10, 20)) | {100}
    # bucket 100 holds 1 of 4 counts: its share of 4000 draws is 1000 +- 4 sigma (sigma = sqrt(4000 x 1/4 x 3/4) = 27)
    assert abs(int((draws == 100).sum()) - 1000) < 4 * 27.4
    stats = tmp_path / "s.csv"
    stats.write_text("statistic,input_tokens,output_tokens\nmean,200,\nmedian,100,\n", encoding="utf-8")
    # log-normal with median e^mu = 100 and mean e^(mu + s^2/2) = 200: s^2 = 2 ln 2
    draws = load_lengths(stats).sample("input_tokens", 20000, np.random.default_rng(0), None)
    assert np.median(draws) == pytest.approx(100, rel=0.05)
    assert draws.mean() == pytest.approx(200, rel=0.1)
    bad = tmp_path / "b.csv"
    bad.write_text("a,b\n1,2\n", encoding="utf-8")
    with pytest.raises(InputError, match="unknown lengths file"):
        load_lengths(bad)


# --- the command ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_json() -> dict:
    result = CliRunner().invoke(main, ["validate", "--csv", str(SMALL), "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_validate_json_has_both_blocks_with_their_fields(small_json):
    for block in ("in_sample", "out_of_sample"):
        data = small_json[block]
        assert {"median", "p90", "max", "rows", "by_engine", "by_family", "by_regime"} <= set(data)
        assert set(data["by_family"]) == {"ampere", "hopper"}
        assert {"median", "p90", "max", "rows"} <= set(data["by_engine"]["vllm"])
    assert [r["id"] for r in small_json["rows"]] == [str(i) for i in range(1, 13)]
    first = small_json["rows"][0]
    assert first["error_out_of_sample"] == pytest.approx((first["predicted_out_of_sample"] - 0.16) / 0.16)
    assert set(small_json["fit"]["folds"]) == {"src-a", "src-b", "src-c", "src-d", "src-e"}


def test_validate_text_shows_in_and_out_of_sample_side_by_side():
    result = CliRunner().invoke(main, ["validate", "--csv", str(SMALL), "--no-rows"])
    assert result.exit_code == 0, result.output
    assert "in-sample" in result.output and "out-of-sample" in result.output
    assert "family hopper" in result.output and "regime serving" in result.output
    assert "Worst 5 rows out of sample" in result.output


def test_a_missing_table_is_one_line_and_exit_2(tmp_path):
    result = CliRunner().invoke(main, ["validate", "--csv", str(tmp_path / "nope.csv")])
    assert result.exit_code == 2
    assert "nope.csv: no such file" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_a_bad_plot_path_fails_before_any_replay(tmp_path):
    result = CliRunner().invoke(main, ["validate", "--csv", str(SMALL), "--plot", str(tmp_path / "x.txt")])
    assert result.exit_code == 2 and "--plot" in result.output


def test_a_row_whose_prompts_were_cached_replays_with_a_warm_prefix_cache(tmp_path):
    """Two serving rows alike but for prompts_cached: 20 requests of 1,024-token prompts at once. Cold, every
    prompt is prefilled; warm, each reuses floor((1024 - 1) / 16) = 63 blocks and prefills 1024 - 1008 = 16 tokens,
    so its TTFT is far shorter. Rows in an old table without the column load as not cached."""
    serving = {"mode": "serving", "regime": "serving", "batch": "", "input_tokens": 1024, "output_tokens": 16,
               "request_rate": "inf", "num_prompts": 20, "metric": "ttft_mean_seconds", "measured": 0.1}
    cold_row, warm_row = table(tmp_path, row(id=0, prompts_cached="false", **serving),
                               row(id=1, prompts_cached="true", **serving))
    assert (cold_row.prompts_cached, warm_row.prompts_cached) == (False, True)
    eff = Efficiencies(0.6, 0.7)
    with Replayer() as replayer:
        cold, warm = replayer.predict(cold_row, eff), replayer.predict(warm_row, eff)
    assert warm.value < cold.value / 5
    assert any("already cached" in note for note in warm.notes)


def test_a_row_run_with_attention_data_parallelism_replays_with_it(tmp_path):
    """DeepSeek-V3 on 8 H200s, 300 requests of 1,024 + 256 tokens at once: attention data-parallel, each GPU reads
    the latents of 1/8 of the sequences (4,392 bytes per token instead of 35,136), so steps are shorter and the
    replayed throughput is higher than the same row replayed tensor-parallel."""
    serving = {"engine": "sglang", "model": "deepseek-v3", "gpu": "h200", "tp": 8, "weights": "fp8", "kv": "fp8",
               "mode": "serving", "regime": "serving", "batch": "", "input_tokens": 1024, "output_tokens": 256,
               "request_rate": "inf", "num_prompts": 300, "metric": "output_tokens_per_second", "measured": 1000}
    tp_row, dp_row = table(tmp_path, row(id=0, **serving), row(id=1, dp_attention="true", **serving))
    assert (tp_row.dp_attention, dp_row.dp_attention) == (False, True)
    assert tp_row.run_key() != dp_row.run_key()
    with Replayer() as replayer:
        tp, dp = replayer.predict(tp_row, Efficiencies(0.5, 0.6)), replayer.predict(dp_row, Efficiencies(0.5, 0.6))
    assert dp.value > tp.value


def test_a_row_that_states_expert_parallelism_replays_with_whole_experts_on_each_gpu(tmp_path):
    """Mixtral-8x7B at batch 1 on 8 H100s: expert-parallel (ep 8), each GPU holds one whole expert and the top-2
    routing reads 2 experts' full matrices on 2 GPUs; sliced (ep blank: 1), every GPU reads 1/8 of both, so the
    step's slowest GPU reads 8 x less expert weight per step and the decode is faster. Blank is not stated."""
    static = {"model": "mixtral-8x7b", "gpu": "h100", "tp": 8, "batch": 1, "input_tokens": 128, "output_tokens": 64,
              "metric": "tpot_seconds"}
    sliced, whole = table(tmp_path, row(id=0, **static), row(id=1, ep=8, **static))
    assert (sliced.ep, whole.ep) == (None, 8)
    assert sliced.run_key() != whole.run_key()
    with Replayer() as replayer:
        eff = Efficiencies(0.6, 0.7)
        a, b = replayer.predict(sliced, eff), replayer.predict(whole, eff)
    assert b.value > a.value
    with pytest.raises(InputError, match="column 'ep': must be >= 1"):
        table(tmp_path, row(ep=0, **static))


def test_a_row_with_multi_step_scheduling_replays_on_the_v0_engine_with_it(tmp_path):
    """vLLM 0.8.5 with --num-scheduler-steps 10: multi-step scheduling exists only in V0 (0.8's engine arguments
    fall back to it), so the row replays with the V0 profile of 0.6-0.7 and pays a tenth of its host work per
    decode step: 400 requests of 128 + 512 tokens at once on an A100 finish sooner than with one step per pass."""
    serving = {"engine_version": "0.8.5", "model": "llama2-7b", "mode": "serving", "regime": "serving", "batch": "",
               "input_tokens": 128, "output_tokens": 512, "request_rate": "inf", "num_prompts": 400, "max_num_seqs": 256,
               "metric": "output_tokens_per_second", "measured": 1000}
    single, multi = table(tmp_path, row(id=0, **serving), row(id=1, num_scheduler_steps=10, **serving))
    assert (single.num_scheduler_steps, multi.num_scheduler_steps) == (1, 10)
    assert single.profile[0] == "vllm" and multi.profile[0] == "vllm-v0.6"
    assert single.run_key() != multi.run_key()
    one_step = table(tmp_path, row(id=2, **dict(serving, engine_version="0.7.3")))[0]
    with Replayer() as replayer:
        eff = Efficiencies(0.6, 0.7)
        slow, fast = replayer.predict(one_step, eff), replayer.predict(multi, eff)
    assert one_step.profile[0] == "vllm-v0.6" and fast.value > slow.value


def test_a_version_cell_that_names_the_v0_engine_replays_on_it(tmp_path):
    """vLLM 0.8.x still ships the V0 engine (VLLM_USE_V1=0); a row whose version cell says its source ran it replays
    with the V0 profile of 0.6-0.8, one whose cell does not with V1, and older releases keep their own profile."""
    def profile(version: str) -> str:
        return table(tmp_path, row(engine_version=version))[0].profile[0]
    assert profile("0.8.5 (ROCm 6.3.1, V0 engine inferred)") == "vllm-v0.6"
    assert profile("0.8.5 (ROCm 6.3.1)") == "vllm"
    assert profile("0.5.4 (V0 engine)") == "vllm-v0"


# --- rows far off and their explanations -----------------------------------------------------------

def test_rows_beyond_40_percent_are_counted_and_the_unexplained_named(tmp_path):
    rows = table(tmp_path, row(id=1, explanation="the source's own anomaly"), row(id=2), row(id=3), row(id=4),
                 row(id=5, explanation="  "))
    # measured 0.01 s each: +45%, +39%, -50%, skipped, -41% (a blank explanation is none)
    predicted = {"1": 0.0145, "2": 0.0139, "3": 0.005, "4": None, "5": 0.0059}
    scored = tuple(Scored(r, Prediction(predicted[r.id]), Prediction(predicted[r.id])) for r in rows)
    assert far_off(scored) == (["1", "3", "5"], ["3", "5"])
    assert _far_off_text(scored) == ("Rows beyond 40% out of sample: 3 of 4; 2 without an explanation in the table (3, 5)")
    explained = tuple(s for s in scored if s.row.id in ("1", "2"))
    assert _far_off_text(explained) == "Rows beyond 40% out of sample: 1 of 2, each with an explanation in the table"


def test_a_table_whose_every_row_is_skipped_is_an_error_after_the_report(tmp_path):
    """An unknown GPU skips each row, with its reason in the report; a validation that replayed nothing fails."""
    path = write_table(tmp_path / "t.csv", [row(gpu="nosuchgpu"), row(id="2", gpu="nosuchgpu")])
    result = CliRunner().invoke(main, ["validate", "--csv", str(path), "--no-rows", "--jobs", "1"])
    assert result.exit_code == 2
    assert "unknown GPU 'nosuchgpu'" in result.output and "no row could be replayed; every one was skipped" in result.output
    replayed = CliRunner().invoke(main, ["validate", "--csv", str(write_table(tmp_path / "ok.csv", [row(), row(id="2", gpu="nosuchgpu")])),
                                         "--no-rows", "--jobs", "1"])
    assert replayed.exit_code == 0, replayed.output
