"""scripts/reliability: the fast versions of the overload, keys-burst and soak drivers against real
`surge serve` processes (the same criteria code as `make test-reliability`), and the criteria
themselves on made-up data, so each is seen to fail when it should."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts.harness.chat import ChatAttempt
from scripts.reliability import keys_burst, overload, soak
from scripts.reliability.common import parse_metrics

# The overload and keys-burst runs judge timing under load (hysteresis, fairness): they run on
# the machine alone, not beside a second test worker (`serial`, Makefile). The soak judges memory,
# outcomes and logs, and runs beside the others.


def criteria_rows(report: str) -> dict[str, str]:
    """criterion -> `pass`, `FAIL` or `reported` (not judged), from the report's table."""
    rows = {}
    for line in report.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 4 and cells[3] in ("pass", "FAIL", "reported"):
            rows[cells[0]] = cells[3]
    return rows


# ---------------------------------------------------------------------------------- the drivers


@pytest.mark.serial
@pytest.mark.timeout(240)
def test_overload_fast_meets_every_criterion(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "overload.md"
    status = overload.main(
        ["--fast", "--model", str(tiny_model_dir), "--out", str(out), "--log", str(tmp_path / "log")]
    )
    report = out.read_text()
    rows = criteria_rows(report)
    assert len(rows) == 6, report
    # Speed (503 latency, goodput) is the full run's to judge: no wall-clock bound in make test.
    speed = {"503 latency p99 (request start to response)", "goodput vs capacity"}
    assert {name for name, result in rows.items() if result == "reported"} == speed, report
    assert status == 0 and {rows[name] for name in rows.keys() - speed} == {"pass"}, report
    assert "Degradation level over time" in report and "through the openai SDK" in report


@pytest.mark.serial
@pytest.mark.timeout(180)
def test_keys_burst_fast_meets_every_criterion(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "keys.md"
    status = keys_burst.main(["--fast", "--model", str(tiny_model_dir), "--out", str(out), "--dir", str(tmp_path)])
    report = out.read_text()
    rows = criteria_rows(report)
    assert len(rows) == 4, report
    assert status == 0 and set(rows.values()) == {"pass"}, report
    assert sum(line.startswith("| sk-") for line in report.splitlines()) == 10  # one row per key


@pytest.mark.timeout(240)
def test_soak_fast_meets_every_criterion_and_dumps_tracemalloc(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "soak.md"
    status = soak.main(["--fast", "--model", str(tiny_model_dir), "--out", str(out), "--dir", str(tmp_path)])
    report = out.read_text()
    rows = criteria_rows(report)
    assert len(rows) == 5, report
    assert status == 0 and set(rows.values()) == {"pass"}, report
    # Both processes were traced and dumped twice: after warm-up, and at the end with growth.
    for role in ("server", "engine"):
        (dump,) = tmp_path.glob(f"surge-tracemalloc-{role}-*.txt")
        text = dump.read_text()
        assert text.startswith("# surge tracemalloc dump 2 "), text[:200]
        assert "## top 15 allocation sites by growth since dump 1" in text
        assert f"tracemalloc, {role} process" in report


# ---------------------------------------------------------------------------------- the criteria


def test_hysteresis_check_rejects_steps_down_faster_than_a_cooldown_a_level() -> None:
    ok, _ = overload.check_hysteresis([(0.0, 0), (1.0, 3), (7.0, 2), (13.0, 1), (19.5, 0)], 6.0, 0.5)
    assert ok
    ok, why = overload.check_hysteresis([(0.0, 0), (1.0, 2), (8.0, 0)], 6.0, 0.5)
    assert not ok and "only 7.0 s" in (why or "") and "12 s needed" in (why or "")
    # Two levels at once, two cooldowns on: windows nobody observed, each its own calm.
    ok, _ = overload.check_hysteresis([(0.0, 0), (1.0, 2), (13.5, 0)], 6.0, 0.5)
    assert ok
    # The first sample's level was set before sampling began: its end is not timed.
    ok, _ = overload.check_hysteresis([(0.1, 1), (0.2, 0), (0.5, 2), (7.0, 1)], 6.0, 0.5)
    assert ok
    ok, why = overload.check_hysteresis([(0.0, 2), (7.0, 1), (9.0, 0)], 6.0, 0.5)
    assert not ok and "only 2.0 s" in (why or "")
    ok, _ = overload.check_hysteresis([(0.0, 1), (2.0, 2), (8.1, 1)], 6.0, 0.5)  # cooldown restarts on a rise
    assert ok


def _attempt(start_s: float, error: str | None = None, *, tokens: int = 0, detail: str = "") -> ChatAttempt:
    status = 200 if error is None else (int(error) if error.isdigit() else None)
    return ChatAttempt(start_s, status=status, error=error, completion_tokens=tokens, detail=detail)


def test_keys_burst_flags_a_key_over_its_limit_and_a_starved_quiet_key() -> None:
    config = keys_burst.FAST
    outcomes = [keys_burst.KeyOutcome(spec) for spec in config.key_specs()]
    for outcome in outcomes:
        outcome.attempts = [_attempt(float(i)) for i in range(5)]
    noisy = outcomes[-1]
    # 9 s of window (8 + margin): at most 60 x (1 + 9/60) = 69 successes.
    noisy.attempts = [_attempt(i * 0.1) for i in range(81)]
    quiet = outcomes[0]
    limited = '{"error": {"type": "requests", "code": "rate_limit_exceeded"}}'
    quiet.attempts[0] = _attempt(0.0, "429", detail=limited)
    rows = {c.name: c for c in keys_burst.evaluate(config, outcomes)}
    assert not rows["no key above its limit + burst"].passed
    assert "sk-noisy-9: 81 > 69 requests" in rows["no key above its limit + burst"].measured
    assert not rows["quiet keys not starved by the noisy one"].passed
    assert not rows["limited keys get what their limit allows"].passed  # the noisy key got no 429


def test_soak_outcomes_tell_deliberate_from_unexpected() -> None:
    assert soak.Outcome("disconnect-stream", [_attempt(0, "disconnected")]).unexpected() == []
    assert soak.Outcome("stream", [_attempt(0, "disconnected")]).unexpected() != []
    first, conflict, replay = _attempt(0), _attempt(0, "409"), _attempt(1)
    replay.is_replayed = True
    ok = soak.Outcome("idempotent-concurrent", [first, conflict, replay], finals=[first, replay])
    assert ok.unexpected() == []
    both = [_attempt(0), _attempt(1)]
    ran_twice = soak.Outcome("idempotent-retry", both, finals=both)
    assert ran_twice.unexpected() == ["idempotent-retry: 2 of 2 clients ran the model (1 expected)"]
    assert soak.Outcome("idempotent-retry", [_attempt(0), _attempt(1, "409")]).unexpected() != []


def test_parse_metrics_sums_families_and_keeps_label_sets() -> None:
    text = (
        "# HELP x\n"
        'http_requests_total{handler="/v1/chat/completions",method="POST",status="503"} 7.0\n'
        'http_requests_total{handler="/v1/chat/completions",method="POST",status="200"} 3.0\n'
        'surge_requests_waiting{model="m"} 2.0\n'
    )
    metrics = parse_metrics(text)
    assert metrics["http_requests_total"] == 10.0 and metrics["surge_requests_waiting"] == 2.0
