"""The KV-event contract: a real server publishes its prefix cache's block events on ZeroMQ; a pyzmq
subscriber decodes them with msgpack (not the msgspec that encodes them) as a router's indexer
does, and checks the frames, the order (sequence numbers, parents before children, removals of
stored blocks only), the token ids against the prompt, evictions, and the tenant's scope digest."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import openai
import pytest
import zmq

from scripts.harness.ports import free_port
from tests.live_server import MODEL_NAME, LiveServer, running_server

KEY = "sk-kv-events-tenant-0001"
BLOCK = 16
# vLLM's struct fields in order: what the array form's positions mean (the tag first in an event).
FIELDS = {
    "EventBatch": ["ts", "events", "data_parallel_rank"],
    "BlockStored": [
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "extra_keys",
    ],
    "BlockRemoved": ["block_hashes", "medium"],
    "AllBlocksCleared": [],
}


def as_map(value: Any, struct: str) -> dict[str, Any]:
    """A decoded struct as a map whichever form it came in (array: by position, the tag first)."""
    if isinstance(value, dict):
        return value
    if struct == "EventBatch":
        return dict(zip(FIELDS[struct], value, strict=False))
    tag, *fields = value
    return {"type": tag, **dict(zip(FIELDS[tag], fields, strict=False))}


class Subscriber:
    def __init__(self, address: str) -> None:
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.SUB)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self.socket.bind(address)
        self.messages: list[tuple[bytes, int, dict[str, Any]]] = []
        self.form = ""

    def drain(self, until: float = 2.0) -> list[dict[str, Any]]:
        """The events received within `until` seconds of quiet, in order; the frames kept."""
        events: list[dict[str, Any]] = []
        while self.socket.poll(int(until * 1000)):
            topic, number, payload = self.socket.recv_multipart()
            raw = msgpack.unpackb(payload, raw=False)
            batch = as_map(raw, "EventBatch")
            is_map = isinstance(batch["events"][0], dict)
            self.form = ("map" if isinstance(raw, dict) else "array-map") if is_map else "array"
            batch["events"] = [as_map(event, "event") for event in batch["events"]]
            self.messages.append((topic, int.from_bytes(number, "big"), batch))
            events += batch["events"]
            until = 0.3
        return events

    def close(self) -> None:
        self.context.destroy(linger=0)


@pytest.fixture(
    params=[("thread", "map"), ("process", "array"), ("thread", "array-map")],
    ids=["thread-map", "process-array", "thread-array-map"],
)
def subscribed(tiny_model_dir: Path, request: pytest.FixtureRequest) -> Iterator[tuple[LiveServer, Subscriber]]:
    """A server whose engine runs on a thread, or in its own process (events cross the pipe), in
    each msgpack form that vLLM's consumers read."""
    port = free_port()
    subscriber = Subscriber(f"tcp://127.0.0.1:{port}")
    # Room for 6 blocks of the tiny `s` model (32 KiB each): a third prompt evicts.
    settings: dict[str, Any] = {
        "kv_events_endpoint": f"tcp://127.0.0.1:{port}",
        "prefix_cache_size": "192KiB",
        "engine_mode": request.param[0],
        "kv_events_format": request.param[1],
    }
    try:
        with running_server(tiny_model_dir, max_model_len=512, api_key=(KEY,), **settings) as live:
            yield live, subscriber
    finally:
        subscriber.close()


def complete(live: LiveServer, prompt: list[int]) -> None:
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key=KEY, max_retries=0)
    client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=1, temperature=0)


def test_block_events_follow_the_prefix_cache(subscribed: tuple[LiveServer, Subscriber]) -> None:
    live, subscriber = subscribed
    rng = random.Random(7)
    first = [rng.randrange(3, 8000) for _ in range(3 * BLOCK + 5)]
    shared = first[: 2 * BLOCK] + [rng.randrange(3, 8000) for _ in range(BLOCK + 3)]
    other = [rng.randrange(3, 8000) for _ in range(4 * BLOCK + 1)]
    # A SUB socket sends its subscription to a publisher that connects only when the application
    # next uses the socket (libzmq attaches the new pipe then): a subscriber polls, as routers do.
    assert subscriber.drain(0.5) == []
    complete(live, first)
    stored_first = subscriber.drain()
    complete(live, shared)
    stored_shared = subscriber.drain()
    complete(live, other)
    later = subscriber.drain()

    assert subscriber.form == live.state.settings.kv_events_format
    # Frames: empty topic, sequence numbers 0, 1, 2, ... with nothing skipped, vLLM's batch.
    assert [number for _, number, _ in subscriber.messages] == list(range(len(subscriber.messages)))
    for topic, _, batch in subscriber.messages:
        assert topic == b"" and batch["data_parallel_rank"] == 0 and isinstance(batch["ts"], float)

    # The first prompt's whole blocks, in one chain from its root: its tokens, 16 a block.
    (event,) = stored_first
    assert event["type"] == "BlockStored" and event["block_size"] == BLOCK and event["medium"] == "GPU"
    assert event["parent_block_hash"] is None and len(event["block_hashes"]) == 3
    assert event["token_ids"] == first[: 3 * BLOCK]
    assert event["lora_id"] is None and event["lora_name"] is None
    scope = event["extra_keys"][0]  # the tenant's scope, as a digest: never its key
    assert scope is not None and KEY not in str(scope) and event["extra_keys"][1:] == [None, None]
    # The second prompt shares two blocks: only its third is new, a child of the shared second.
    (event,) = stored_shared
    assert event["parent_block_hash"] == stored_first[0]["block_hashes"][1]
    assert event["token_ids"] == shared[2 * BLOCK : 3 * BLOCK] and event.get("extra_keys") is None

    # The third prompt needs 4 blocks where 2 are free: the least recently used go first.
    stored = {h for e in stored_first + stored_shared for h in e["block_hashes"]}
    removed = [h for e in later if e["type"] == "BlockRemoved" for h in e["block_hashes"]]
    assert removed and set(removed) <= stored and len(set(removed)) == len(removed)
    new = [e for e in later if e["type"] == "BlockStored"]
    assert later.index(next(e for e in later if e["type"] == "BlockRemoved")) < later.index(new[0])
    assert [t for e in new for t in e["token_ids"]] == other[: 4 * BLOCK]
    children = {h: e["parent_block_hash"] for e in stored_first + stored_shared + new for h in e["block_hashes"]}
    for block, parent in children.items():  # every parent was stored before its child, once
        assert parent is None or parent in children, block
