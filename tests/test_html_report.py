"""The HTML reports (--html) opened in a real, headless Chromium: no console error, the points each chart holds,
and the figures on the page equal those of --json (the run, the validation) or the results file (the sweep).

The browser is the distribution's (Debian: apt-get install -y chromium chromium-driver), driven by selenium
with both paths given, so nothing is downloaded. Without it the tests fail, saying so; MEMWALL_NO_BROWSER=1
skips them instead. A screenshot of each page goes to the test's tmp dir, and also to $MEMWALL_SCREENSHOTS
(a folder, e.g. docs/images) when that is set.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from simulator.cli import main
from simulator.validation.table import default_table

INSTALL = "apt-get install -y chromium chromium-driver"


def _browser_paths() -> tuple[str, str]:
    chromium = os.environ.get("MEMWALL_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    driver = os.environ.get("MEMWALL_CHROMEDRIVER") or shutil.which("chromedriver")
    if chromium and driver:
        return chromium, driver
    message = (f"no headless browser for the HTML report tests (chromium: {chromium or 'not found'}, chromedriver: "
               f"{driver or 'not found'}): {INSTALL}; or set MEMWALL_NO_BROWSER=1 to skip these tests")
    if os.environ.get("MEMWALL_NO_BROWSER") == "1":
        pytest.skip(message)
    pytest.fail(message)


@pytest.fixture(scope="module")
def browser():
    chromium, driver_path = _browser_paths()
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        if os.environ.get("MEMWALL_NO_BROWSER") == "1":
            pytest.skip("selenium is not installed")
        pytest.fail("selenium is not installed: pip install -e '.[test]'")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1200,2400"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


READ_PAGE = """
const charts = {};
for (const div of document.querySelectorAll('.plotly-graph-div')) {
  charts[div.id] = {
    traces: div.data.map(t => ({type: t.type, name: t.name || '',
                                x: t.x ? Array.from(t.x) : [], y: t.y ? Array.from(t.y) : []})),
    shapes: (div.layout.shapes || []).map(s => ({x0: s.x0, x1: s.x1})),
  };
}
const cells = {};
for (const td of document.querySelectorAll('td[data-key]')) { cells[td.dataset.key] = JSON.parse(td.dataset.value); }
return {charts: charts, cells: cells, data: JSON.parse(document.getElementById('memwall-data').textContent),
        pre: Array.from(document.querySelectorAll('pre')).map(p => p.textContent),
        plotly: typeof Plotly !== 'undefined', scripts: Array.from(document.scripts).filter(s => s.src).length};
"""


def open_page(driver, path: Path, kind: str, tmp_path: Path) -> dict:
    """Load the page, fail on any console error, keep a screenshot, and read back its charts, cells and data."""
    driver.get_log("browser")  # drop what an earlier page left
    driver.get(path.resolve().as_uri())
    page = driver.execute_script(READ_PAGE)
    errors = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == [], f"console errors in the {kind} report: {errors}"
    assert page["plotly"] and page["scripts"] == 0  # plotly.js inlined: the page loads nothing
    shot = tmp_path / f"html-{kind}.png"
    driver.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    folder = os.environ.get("MEMWALL_SCREENSHOTS")
    if folder:
        shutil.copyfile(shot, Path(folder) / shot.name)
    return page


def run_cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def counts(chart: dict) -> list[int]:
    return [len(trace["x"]) for trace in chart["traces"]]


RUN = ["--model", "llama2-7b", "--gpu", "a100", "--batch", "4", "--ctx", "64", "--gen", "8", "--client-path", "off",
       "--slo-ttft", "0.5", "--slo-tpot", "0.05", "-q"]


def test_run_report_in_the_browser(browser, tmp_path):
    out = tmp_path / "run.html"
    run_cli(*RUN, "--html", str(out))
    expected = json.loads(run_cli(*RUN, "--json"))
    page = open_page(browser, out, "run", tmp_path)
    charts = page["charts"]
    # A closed batch of 4 requests, each 56 prompt + 8 output tokens: 4 TTFTs, 4 TPOTs (8 > 1 token), 4 e2e.
    assert counts(charts["chart-ttft"]) == counts(charts["chart-tpot"]) == counts(charts["chart-e2e"]) == [4]
    # Iterations: 1 prefill of 4 x 56 = 224 tokens (the first token each), then 7 decodes (tokens 2..8) = 8,
    # one point per iteration on each of the two lines (running sequences, KV use).
    assert expected["time"]["iterations"] == 8
    assert counts(charts["chart-timeline"]) == [8, 8]
    running, kv = (trace["y"] for trace in charts["chart-timeline"]["traces"])
    assert running == [4] * 8
    # 4 sequences x ceil(63 tokens / 16 per block) = 4 x 4 = 16 blocks held throughout.
    assert kv == pytest.approx([100 * 16 / expected["kv_cache"]["blocks"]] * 8)
    # The SLO lines at 500 ms (TTFT) and 50 ms (TPOT); the chart's x axis is in ms.
    assert 500.0 in [shape["x0"] for shape in charts["chart-ttft"]["shapes"]]
    assert 50.0 in [shape["x0"] for shape in charts["chart-tpot"]["shapes"]]
    # The breakdown: 5 terms x 3 bars; the last decode step's terms add up to its time in --json; tp 1: no collectives.
    bars = charts["chart-breakdown"]["traces"]
    assert [trace["name"] for trace in bars] == ["roofline", "collectives", "launches", "engine overhead", "client path"]
    assert counts(charts["chart-breakdown"]) == [3] * 5
    decode = {trace["name"]: trace["y"][1] for trace in bars}
    assert sum(decode.values()) == pytest.approx(1e3 * expected["decode"]["last_step_seconds"])
    assert decode["collectives"] == 0.0
    assert decode["engine overhead"] == pytest.approx(1e3 * expected["decode"]["last_step_overhead_seconds"])
    # The figures on the page are --json's.
    assert page["data"]["summary"] == expected
    for key, value in page["cells"].items():
        node = expected
        for part in key.split("."):
            node = node[part]
        assert value == node, key
    assert "latency.ttft_seconds.p99" in page["cells"] and "throughput.output_tokens_per_second" in page["cells"]
    ttft = sorted(1e3 * v for v in page["data"]["latency_samples"]["ttft_seconds"]["values"])
    assert sorted(charts["chart-ttft"]["traces"][0]["x"]) == pytest.approx(ttft)


SCENARIO = """\
name: tiny
description: LLaMA-2-7B by batch on two GPUs
base: {model: llama2-7b, ctx: 512, gen: 32, client_path: "off"}
sweep:
  grid: {gpu: [a100, h100], batch: [1, 4, 16, 64]}
slo: {ttft_p99_seconds: 0.2, tpot_p99_seconds: 0.012}
output: {path: OUT}
"""


def test_sweep_report_in_the_browser(browser, tmp_path):
    results = tmp_path / "rows.jsonl"
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(SCENARIO.replace("OUT", str(results)))
    out = tmp_path / "sweep.html"
    run_cli("sweep", str(scenario), "--workers", "1", "--html", str(out))
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    page = open_page(browser, out, "sweep", tmp_path)
    charts = page["charts"]
    # 2 GPUs x 4 batches = 8 points, all fitting (7B fp16 weights 13.5 GB; 64 x 512 tokens x 0.5 MB KV = 16 GiB).
    assert len(rows) == 8 and all(row["fits"] for row in rows)
    met = [row for row in rows if row["slo.met"]]
    for div in ("chart-pareto-user", "chart-pareto-ttft", "chart-pareto-tpot"):
        traces = charts[div]["traces"]
        assert traces[0]["name"].startswith("meets the SLO") and len(traces[0]["x"]) == len(met)
        assert len(traces[0]["x"]) + len(traces[1]["x"]) == 8
    # The front by hand: points that no other point beats on both tokens/s per GPU and p99 TTFT.
    per_gpu = {row["point"]: row["throughput.output_tokens_per_second"] / row["gpus"] for row in rows}
    ttft = {row["point"]: row["p99.ttft_seconds"] for row in rows}
    front = sorted(p for p in per_gpu if not any(per_gpu[q] >= per_gpu[p] and ttft[q] <= ttft[p]
                                                  and (per_gpu[q], ttft[q]) != (per_gpu[p], ttft[p]) for q in per_gpu))
    assert counts(charts["chart-pareto-ttft"])[2] == len(front)
    assert sorted(page["data"]["fronts"]["chart-pareto-ttft"]) == front
    # The chosen point: the highest output tokens/s among the points meeting the SLO, from the results file.
    best = max(met, key=lambda row: row["throughput.output_tokens_per_second"])
    assert page["data"]["chosen"]["point"] == best["point"]
    star = charts["chart-pareto-user"]["traces"][3]
    assert star["name"].startswith(f"chosen: point {best['point']}")
    assert star["x"] == pytest.approx([1 / best["latency.tpot_seconds.mean"]])
    assert star["y"] == pytest.approx([best["throughput.output_tokens_per_second"] / best["gpus"]])
    assert charts["chart-pareto-ttft"]["traces"][3]["x"] == pytest.approx([1e3 * best["p99.ttft_seconds"]])
    for key, value in page["cells"].items():
        assert value == best[key], key
    assert {"point", "throughput.output_tokens_per_second", "p99.ttft_seconds", "slo.met"} <= set(page["cells"])
    # The SLO region: up to 200 ms on the TTFT chart.
    assert [s["x1"] for s in charts["chart-pareto-ttft"]["shapes"]] == [200.0]
    # Its launch commands, tensor parallel 1 as the row says.
    assert best["tp"] == 1
    assert any(text.startswith("# vllm\nvllm serve") and "--tensor-parallel-size 1" in text for text in page["pre"])
    assert any(text.startswith("# sglang\npython -m sglang.launch_server") for text in page["pre"])


# Five prefill TTFT rows of one vLLM source on A100 (one class: ampere / vllm / prefill / time, 5 rows = the
# minimum for a band) and three decode throughput rows of TensorRT-LLM on A100 (3 rows: too few for a band).
VALIDATION_ROWS = ("8000", "8002", "8004", "8006", "8008", "61", "62", "63")


def test_validation_report_in_the_browser(browser, tmp_path):
    with open(default_table(), newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        fields, rows = reader.fieldnames, [row for row in reader if row["id"] in VALIDATION_ROWS]
    assert fields is not None and len(rows) == 8
    table = tmp_path / "subset.csv"
    with open(table, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    out = tmp_path / "validation.html"
    run_cli("validate", "--csv", str(table), "--jobs", "1", "--html", str(out), "--no-rows")
    expected = json.loads(run_cli("validate", "--csv", str(table), "--jobs", "1", "--json"))
    page = open_page(browser, out, "validation", tmp_path)
    charts = page["charts"]
    assert expected["rows_compared"] == 8
    # y = x and the +-25% lines (2 points each), then one trace per engine: 5 vLLM TTFTs, 3 TensorRT-LLM rates.
    assert counts(charts["chart-validation-times"]) == [2, 2, 2, 5]
    assert counts(charts["chart-validation-rates"]) == [2, 2, 2, 3]
    high, low = charts["chart-validation-times"]["traces"][1:3]
    assert high["y"][0] / high["x"][0] == pytest.approx(1.25) and low["y"][0] / low["x"][0] == pytest.approx(0.75)
    by_id = {row["id"]: row for row in expected["rows"]}
    vllm = charts["chart-validation-times"]["traces"][3]
    assert vllm["x"] == [by_id[i]["measured"] for i in VALIDATION_ROWS[:5]]
    assert vllm["y"] == pytest.approx([by_id[i]["predicted_out_of_sample"] for i in VALIDATION_ROWS[:5]])
    # One class with 5 rows, banded at each of the 3 levels (full, family x regime, regime); the 3 rates: none.
    assert counts(charts["chart-bands"]) == [3]
    for key, value in page["cells"].items():
        node = expected
        for part in key.split("."):
            node = node[part]
        assert value == node, key
    assert page["cells"]["out_of_sample.rows"] == 8 and page["cells"]["out_of_sample.by_engine.vllm.rows"] == 5


def test_without_plotly_html_stops_before_the_run_with_one_line(monkeypatch, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "plotly" else real(name, *a))
    for args in ([*RUN, "--html", str(tmp_path / "run.html")],
                 ["validate", "--csv", str(tmp_path / "none.csv"), "--html", str(tmp_path / "v.html")]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 2
        assert result.output.strip().splitlines() == [
            "Error: --html needs plotly, which is not installed: pip install 'memwall[html]' (or pip install 'plotly>=5.18')"]
    assert not list(tmp_path.iterdir())  # nothing written, no run made


def test_long_logs_keep_every_nth_point():
    from simulator.report.html.page import every_nth

    assert every_nth(5_000, 5_000) == 1  # all of them
    assert every_nth(5_001, 5_000) == 2  # ceil(5001 / 5000): 2,501 points
    assert every_nth(1_000_000, 20_000) == 50  # a 10^6-request run: 20,000 points
    assert every_nth(0, 20_000) == 1
