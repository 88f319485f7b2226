"""The load tester end to end against a live tiny surge: `python -m scripts.loadtest` and
`scripts.loadtest.cli.main` in both loop modes, the table, the PNG, dedup hits, errors by status; and
Locust running scripts/locustfile.py."""

from __future__ import annotations

import csv as csv_module
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from scripts.loadtest.cli import main as loadtest_main
from tests.live_server import LiveServer, running_server

REPO_ROOT = Path(__file__).resolve().parents[2]
# Small requests so a two-second run finishes many of them on 2 cores.
QUICK = ["--prompt-words", "4:16", "--max-tokens", "4:16", "--quiet"]


@pytest.fixture(scope="module")
def live(tiny_model_dir: Path) -> Iterator[LiveServer]:
    with running_server(tiny_model_dir, max_model_len=512, max_num_seqs=8, max_num_batched_tokens=128) as server:
        yield server


def table_rows(report: str, first_title: str) -> list[dict[str, str]]:
    """The rows of the markdown table whose first column is titled `first_title`, as {title: cell}."""
    lines = report.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_title} |"))
    titles = [cell.strip() for cell in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(titles, (cell.strip() for cell in line.strip("|").split("|")), strict=True)))
    return rows


def counter(base_url: str, family: str) -> float:
    lines = httpx.get(f"{base_url}/metrics").text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith((family + "{", family + " ")))


def check_latency_table(report: str, *, is_streaming: bool) -> None:
    rows = {row["latency (ms)"]: row for row in table_rows(report, "latency (ms)")}
    assert list(rows) == ["time to first token", "inter-token latency", "end-to-end latency"]
    for name, row in rows.items():
        if not is_streaming and name != "end-to-end latency":
            assert row["p50"] == "–" and row["samples"] == "0"  # a JSON response has no first token
            continue
        p50, p90, p99 = (float(row[q]) for q in ("p50", "p90", "p99"))
        # p50 may print as 0.0: a dedup replay sends its deltas at once, so its token gaps are ~0.
        assert 0 <= p50 <= p90 <= p99 < 30_000 and p99 > 0, row
    if is_streaming:
        assert float(rows["time to first token"]["p50"]) <= float(rows["end-to-end latency"]["p50"])


def test_closed_loop_streams_with_duplicates_and_writes_the_plot(live: LiveServer, tmp_path: Path) -> None:
    hits_before = counter(live.url, "surge_dedup_hits_total")
    plot, out = tmp_path / "latency.png", tmp_path / "report.md"
    argv = ["--base-url", f"{live.url}/v1", "--concurrency", "4", "--duration", "2", "--duplicate-fraction", "0.5"]
    proc = subprocess.run(
        [sys.executable, "-m", "scripts.loadtest", *argv, *QUICK, "--plot", str(plot), "--out", str(out)],
        cwd=REPO_ROOT,
        env={k: v for k, v in os.environ.items() if not k.startswith("SURGE_")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = out.read_text()
    assert report in proc.stdout

    (summary,) = table_rows(report, "mode")
    assert summary["mode"] == "closed loop, 4 users"
    assert int(summary["requests"]) == int(summary["ok"]) >= 8 and summary["errors"] == "0", report
    assert int(summary["duplicates"]) > 0, report
    assert float(summary["req/s"]) > 0 and float(summary["output tok/s"]) > 0
    check_latency_table(report, is_streaming=True)
    assert table_rows(report, "errors by status") == [{"errors by status": "none", "requests": "0"}]

    hits = counter(live.url, "surge_dedup_hits_total") - hits_before
    assert hits >= 1, report  # duplicates of temperature-0 requests are served by the dedup cache
    assert f"Server counters during the run: dedup hits {hits:.0f}," in report, report
    assert plot.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert f"Latency plot: {plot}" in proc.stdout


def test_open_loop_json_without_matplotlib_skips_the_plot(
    live: LiveServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now fails
    plot = tmp_path / "latency.png"
    argv = ["--base-url", f"{live.url}/v1", "--rate", "8", "--duration", "1.5", "--no-stream", "--plot", str(plot)]
    assert loadtest_main([*argv, *QUICK]) == 0
    report = capsys.readouterr().out

    (summary,) = table_rows(report, "mode")
    assert summary["mode"] == "open loop, Poisson 8 req/s"
    assert 2 <= int(summary["requests"]) <= 30 and summary["errors"] == "0"  # Poisson: about 12
    check_latency_table(report, is_streaming=False)
    assert "matplotlib is not installed" in report and not plot.exists()


def test_loadtest_counts_429s_by_status(tiny_model_dir: Path, tmp_path: Path) -> None:
    with running_server(tiny_model_dir, max_model_len=512, rate_limit_rpm=6) as limited:  # a burst of 6
        argv = ["--base-url", f"{limited.url}/v1", "--concurrency", "2", "--num-requests", "12"]
        proc = subprocess.run(
            [sys.executable, "-m", "scripts.loadtest", *argv, "--duration", "5", *QUICK, "--no-plot"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (summary,) = table_rows(proc.stdout, "mode")
    assert summary["requests"] == "12" and int(summary["ok"]) >= 6
    errors = {row["errors by status"]: int(row["requests"]) for row in table_rows(proc.stdout, "errors by status")}
    assert set(errors) == {"429"} and errors["429"] == 12 - int(summary["ok"])
    assert "rate-limited (429) " in proc.stdout


def test_locust_runs_a_short_fixed_profile_with_ttft_and_e2e_rows(live: LiveServer, tmp_path: Path) -> None:
    """Locust itself, headless, 4 users for 6 s: its CSV has the POST, TTFT and E2E rows of the
    requests, none failed, and the E2E row counts the tokens the streams' usage reported."""
    csv = tmp_path / "run"
    argv = ["-f", "scripts/locustfile.py", "--host", live.url, "--headless", "-u", "4", "-r", "4", "-t", "6s"]
    argv += ["--csv", str(csv), "--only-summary", "--loglevel", "WARNING"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SURGE_")}
    # A subprocess: importing locust monkey-patches the standard library with gevent.
    proc = subprocess.run(
        [sys.executable, "-m", "locust", *argv], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=90
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with (tmp_path / "run_stats.csv").open() as stats:
        rows = {(row["Type"], row["Name"]): row for row in csv_module.DictReader(stats)}
    kinds = {kind for kind, name in rows if name == "chat (stream)"}
    assert kinds == {"POST", "TTFT", "E2E"}, rows.keys()
    count = {kind: int(rows[(kind, "chat (stream)")]["Request Count"]) for kind in kinds}
    # A stream cut by the run's end has fired its TTFT row only: at most one per user.
    assert count["POST"] >= 4 and count["E2E"] == count["POST"] <= count["TTFT"] <= count["POST"] + 4, count
    assert all(int(row["Failure Count"]) == 0 for row in rows.values()), rows
    e2e, ttft = rows[("E2E", "chat (stream)")], rows[("TTFT", "chat (stream)")]
    assert 0 < float(ttft["Median Response Time"]) <= float(e2e["Median Response Time"])
    assert float(e2e["Average Content Size"]) >= 16  # max_tokens 16..128, the tiny model rarely stops early
