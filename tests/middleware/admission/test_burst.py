"""Admission's queue bound counts every request waiting for a slot, held ones included."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx

from tests.live_server import MODEL_NAME, running_server

USER = [{"role": "user", "content": "Tell me about the sea."}]
LONG = {"model": MODEL_NAME, "messages": USER, "max_tokens": 1500, "ignore_eos": True, "stream": True}


def test_held_requests_count_against_the_queue_bound(tiny_model_dir: Path) -> None:
    """Regression (overload run, surge_requests_waiting 9 with --max-queued-requests 8): a request
    past admission but not yet submitted (held: a greedy request waits a loop turn for its dedup
    flight to submit it; a Redis round trip for the tokens bucket) was not counted by admission,
    so requests admitted meanwhile overshot the bound."""
    with running_server(tiny_model_dir, max_model_len=2048, max_queued_requests=1) as live:
        url = f"{live.url}/v1/chat/completions"
        assert live.engine.core.num_waiting == 0
        assert live.state.admission is not None
        release = live.state.admission.hold()  # one request between admission and submission
        try:
            refused = httpx.post(url, json={**LONG, "stream": False, "max_tokens": 1})
        finally:
            release()
        assert refused.status_code == 503, refused.text
        assert "1 requests are already waiting" in refused.json()["error"]["message"]
        assert httpx.post(url, json={**LONG, "stream": False, "max_tokens": 1}).status_code == 200
        live.wait_idle()


def test_queue_bound_holds_for_a_simultaneous_burst(tiny_model_dir: Path) -> None:
    """24 greedy requests at once behind one long stream: at most the bound is queued, the rest 503."""
    max_queued = 2
    with running_server(tiny_model_dir, max_model_len=2048, max_num_seqs=1, max_queued_requests=max_queued) as live:
        url = f"{live.url}/v1/chat/completions"

        async def burst() -> tuple[list[int], list[int]]:
            async with httpx.AsyncClient(limits=httpx.Limits(max_connections=None), timeout=60.0) as client:
                async with client.stream("POST", url, json=LONG) as running:
                    # Kept: a dropped async iterator is closed by the loop, which ends the stream and frees
                    # the slot (the cause of this test's flakes: the burst then met an empty engine).
                    lines = running.aiter_lines()
                    await lines.__anext__()
                    bodies = [
                        {"model": MODEL_NAME, "messages": [{"role": "user", "content": f"burst {i}"}], "max_tokens": 1}
                        for i in range(24)
                    ]
                    tasks = [asyncio.create_task(client.post(url, json=body)) for body in bodies]
                    # Until every request is refused or queued, with the long stream holding the only slot
                    # (closing it would free the slot: a late arrival could then rightly be admitted).
                    queued: list[int] = []
                    deadline = asyncio.get_running_loop().time() + 30.0
                    while True:
                        queued.append(live.engine.core.num_waiting + live.state.num_held)
                        if sum(task.done() for task in tasks) + queued[-1] >= len(tasks):
                            break
                        assert asyncio.get_running_loop().time() < deadline, "the burst was never all decided"
                        await asyncio.sleep(0.01)
                    assert live.engine.core.num_running == 1, "the long stream ended before the burst was decided"
                    refused = [task.result().status_code for task in tasks if task.done()]
                return refused, queued

        refused, queued = asyncio.run(burst())
        assert max(queued) <= max_queued, queued
        assert refused == [503] * len(refused) and len(refused) >= 24 - max_queued, refused
        live.wait_idle()


def test_full_queue_refuses_before_the_body_is_read(tiny_model_dir: Path) -> None:
    """Regression (overload run: 503 p99 0.7 s at 3x capacity): a refusal for a full queue came
    only after the body was parsed, the chat template rendered and the prompt tokenized, work
    thrown away for most requests under overload. Now the queue bound is checked first: even a
    body that is not JSON gets the 503."""
    with running_server(tiny_model_dir, max_model_len=2048, max_queued_requests=1) as live:
        url = f"{live.url}/v1/chat/completions"
        assert live.state.admission is not None
        release = live.state.admission.hold()  # the queue is full
        try:
            refused = httpx.post(url, content=b"{not json", headers={"Content-Type": "application/json"})
        finally:
            release()
        assert refused.status_code == 503, refused.text
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error"]["code"] == "service_unavailable"
        assert httpx.post(url, content=b"{not json").status_code == 400  # with room, it is parsed


def test_a_fan_out_request_counts_every_sequence_against_the_bound(tiny_model_dir: Path) -> None:
    """The attack: one /v1/completions request of many prompts x n used to count as one request,
    so it put any number of sequences in the queue past --max-queued-requests."""
    with running_server(tiny_model_dir, max_model_len=2048, max_num_seqs=1, max_queued_requests=4) as live:
        url = f"{live.url}/v1/completions"
        assert live.state.admission is not None
        release = live.state.admission.hold()  # one sequence already waiting
        try:
            fan_out = {"model": MODEL_NAME, "prompt": ["a", "b"], "n": 2, "max_tokens": 1}  # four sequences
            refused = httpx.post(url, json=fan_out)
            assert refused.status_code == 503, refused.text
            assert "1 requests are already waiting and this request adds 4" in refused.json()["error"]["message"]
            three = httpx.post(url, json={**fan_out, "prompt": ["a"], "n": 3})  # 1 + 3 fit the bound
            assert three.status_code == 200, three.text
            assert len(three.json()["choices"]) == 3
        finally:
            release()
        # An empty queue takes the whole request, whatever the bound: it never waits for room forever.
        assert live.engine.core.num_waiting == 0
        assert len(httpx.post(url, json={**fan_out, "n": 4}).json()["choices"]) == 8
        live.wait_idle()


def test_one_keys_fan_out_cannot_fill_the_queue_bound(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The attack (issue 34): with per-key limits counting requests, one key's fan-out requests took
    the queue's places eight at a time until the bound was full, and every other key got 503s. A
    key now holds at most --max-queue-share-per-key of the bound (a 429 past it, its own volume);
    another key is still admitted."""
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"sk-fan-out": None, "sk-other": None}))
    settings = {
        "max_model_len": 2048,
        "max_num_seqs": 1,
        "max_queued_requests": 16,  # the share: 8 places per key
        "keys_file": str(keys),
        "degrade_thresholds": "",  # what is tested is the bound, not degradation
    }
    with running_server(tiny_model_dir, **settings) as live:  # type: ignore[arg-type]
        url = f"{live.url}/v1/completions"
        eight = {"model": MODEL_NAME, "prompt": ["a", "b"], "n": 4, "max_tokens": 1500, "ignore_eos": True}

        def status(key: str, **body: object) -> tuple[int, httpx.Headers, bytes]:
            """The answer to a streamed request: its status at once (a queued stream opens at admission)."""
            auth = {"authorization": f"Bearer {key}"}
            with httpx.stream("POST", url, json={**body, "stream": True}, headers=auth, timeout=60) as response:
                body_bytes = response.read() if response.status_code != 200 else b""
                return response.status_code, response.headers, body_bytes  # leaving aborts it

        with httpx.stream(
            "POST", url, json={**eight, "stream": True}, headers={"authorization": "Bearer sk-fan-out"}, timeout=60
        ) as first:
            assert first.status_code == 200
            lines = first.iter_lines()  # kept: a dropped iterator closes the response
            next(lines)
            assert live.engine.core.num_waiting == 7  # one runs, seven wait
            code, headers, body = status("sk-fan-out", **eight)  # 7 + 8 of the key's own: past its 8
            assert code == 429, body
            assert headers["retry-after"]
            message = json.loads(body)["error"]["message"]
            assert "7 sequences waiting and this request adds 8" in message and "8 of 16" in message
            code, _, body = status("sk-other", **eight)  # another key finds its room
            assert code == 200, body
        live.wait_idle()
