"""scripts/benchkit/prefix_responses.py: the `responses-chain` workload against a real surge: every
turn after the first continues the one before by `previous_response_id`, sends only its new user
turn, and is served from the prefix cache."""

from __future__ import annotations

import asyncio
from pathlib import Path

from scripts.benchkit import prefix
from scripts.benchkit.load import RunningServer
from scripts.benchkit.prefix import WorkloadSpec
from tests.live_server import MODEL_NAME, running_server

SYSTEM = "You are a careful assistant who answers in one short sentence. " * 12


def test_each_later_turn_continues_its_chain_from_the_prefix_cache(tiny_model_dir: Path) -> None:
    spec = WorkloadSpec("responses-chain", 3, 1, 6, SYSTEM, num_turns=3, stagger_s=0.0)
    with running_server(tiny_model_dir, max_model_len=2048) as live:
        sut = RunningServer("surge", live.url, MODEL_NAME)
        results, wall_s, _ = asyncio.run(prefix.run_workload(sut, spec))
        stored = [live.state.responses.memory.get("", r.response_id or "") for r in results]
    assert len(results) == 9 and all(r.error is None for r in results), [r.error for r in results]
    assert sorted(r.turn for r in results) == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert all(item is not None for item in stored)
    by_id = {r.response_id: item for r, item in zip(results, stored, strict=True)}
    for r in results:  # a later turn's stored request continues an earlier response of its chain
        item = by_id[r.response_id]
        assert item is not None
        previous = item.response["previous_response_id"]
        assert (previous is None) == (r.turn == 1) and (previous is None or previous in by_id)
        assert [i["content"][0]["type"] for i in item.input_items] == ["input_text"]  # only the new turn
    later = [r for r in results if r.turn > 1]
    assert all((r.cached_tokens or 0) > 0 for r in later)
    summary = prefix.summarize(results, wall_s)
    assert summary["ttft_p50_later_s"] is not None and summary["cache_hit_rate"] > 0.5
