"""`--kv-events-endpoint`: the prefix cache's block events on a ZeroMQ PUB socket, in the wire format
vLLM publishes and prefix-aware routers read (llm-d's KV-cache indexer, `vllm-router --policy
kv_aware`).

Each message is three frames: the topic (`--kv-events-topic`, empty by default), an 8-byte
big-endian sequence number counting from 0, and a msgpack payload: an event batch (`ts`,
`events`, `data_parallel_rank` 0) of `BlockStored` (`block_hashes`, `parent_block_hash`,
`token_ids`, `block_size`, `lora_id`, `medium`, `lora_name`, `extra_keys`), `BlockRemoved`
(`block_hashes`, `medium`) and `AllBlocksCleared` events, as vLLM's msgspec structs encode them:
in the form `--kv-events-format` names (`WireFormat`: vLLM's current one by default, the others
for the consumers that read older ones). `medium` is vLLM's name for its own KV cache, "GPU", whatever the
device: the tier a router weighs as the engine's cache.

What a block's hash is, and why a consumer hashes the tokens itself: models/kv/events.py.

The engine reports events from its step (or its process's pipe) through the observer; they are
queued here and sent by one thread, so the engine never waits on a socket. A full queue drops a
batch (counted, logged once): a router's index then misses some blocks until they are stored
again, which costs it a cache hit, not correctness. A bind address (`*`, `::`, `ipc://`,
`inproc://`) binds, any other connects, as vLLM's publisher does.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from itertools import count
from typing import Any

import msgspec
import zmq

from models import BlockRemoved, BlockStored, KvEvent

log = logging.getLogger("surge.kv_events")

MEDIUM = "GPU"
# Batches waiting for the sender thread: a burst's worth; past it they are dropped, not queued.
MAX_QUEUED_BATCHES = 10_000
SEND_HIGH_WATER_MARK = 100_000


class WireFormat:
    """vLLM's msgspec structs in one of the forms consumers read. A struct is either positional
    (msgspec's `array_like`: a msgpack array in field order, an event's tag first) or by name (a
    map, an event's tag in `"type"`); defaults are left out either way (vLLM's `omit_defaults`):

    - `map`: the batch and its events by name: vLLM's current encoding;
    - `array`: both positional: vLLM's encoding through 0.10, which llm-d's indexer decodes;
    - `array-map`: the batch positional, its events by name: what `vllm-router` 0.1.17 decodes
      (measured: it refuses a map batch, "KV event batch must be an array", and a positional
      event, "KV event must be a tagged map")."""

    def __init__(self, form: str) -> None:
        if form not in FORMATS:
            raise ValueError(f"unknown KV event format {form!r}; expected one of {', '.join(FORMATS)}")
        batch: dict[str, Any] = {"array_like": form != "map", "omit_defaults": True, "gc": False}
        event: dict[str, Any] = {**batch, "array_like": form == "array", "tag": True}
        self.batch = msgspec.defstruct(
            "EventBatch", [("ts", float), ("events", list), ("data_parallel_rank", int | None, None)], **batch
        )
        self.stored = msgspec.defstruct("BlockStored", _STORED_FIELDS, **event)
        self.removed = msgspec.defstruct("BlockRemoved", [("block_hashes", list[int]), ("medium", str | None)], **event)
        self.cleared = msgspec.defstruct("AllBlocksCleared", [], **event)
        self._encode = msgspec.msgpack.Encoder().encode

    def encode(self, batch: list[KvEvent], ts: float) -> bytes:
        return self._encode(self.batch(ts, [self.event(event) for event in batch], 0))

    def event(self, event: KvEvent) -> Any:
        """An engine event as vLLM's struct (LoRA fields null: surge serves no adapters)."""
        if isinstance(event, BlockStored):
            hashes, parent, tokens, size, extra = event
            return self.stored(hashes, parent, tokens, size, None, MEDIUM, None, extra)
        if isinstance(event, BlockRemoved):
            return self.removed(event.block_hashes, MEDIUM)
        return self.cleared()


FORMATS = ("map", "array", "array-map")
_STORED_FIELDS: list[Any] = [
    ("block_hashes", list[int]),
    ("parent_block_hash", int | None),
    ("token_ids", list[int]),
    ("block_size", int),
    ("lora_id", int | None),
    ("medium", str | None),
    ("lora_name", str | None),
    ("extra_keys", list[Any] | None, None),
]


class KvEventPublisher:
    def __init__(self, endpoint: str, topic: str = "", form: str = "map") -> None:
        self._wire = WireFormat(form)
        self.num_dropped = 0
        self._topic = topic.encode()
        self._queue: queue.Queue[list[KvEvent] | None] = queue.Queue(maxsize=MAX_QUEUED_BATCHES)
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.PUB)
        self._socket.set_hwm(SEND_HIGH_WATER_MARK)
        if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
            self._socket.bind(endpoint)
        else:
            self._socket.connect(endpoint)
        self._sequence = count()
        self._thread = threading.Thread(target=self._send_all, name="kv-events", daemon=True)
        self._thread.start()
        log.info("publishing KV events on %s (topic %r)", endpoint, topic)

    def publish(self, batch: list[KvEvent]) -> None:
        """From any thread (the engine's): queue one batch for the sender."""
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            if not self.num_dropped:
                log.warning("KV events queue full (%d batches): dropping batches", MAX_QUEUED_BATCHES)
            self.num_dropped += 1

    def close(self, timeout: float = 1.0) -> None:
        """Send what is queued (for at most `timeout` seconds), then close the socket."""
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout)
        self._thread.join(timeout)
        self._context.destroy(linger=0)  # closes the socket too

    def _send_all(self) -> None:
        while (batch := self._queue.get()) is not None:
            payload = self._wire.encode(batch, time.time())
            number = next(self._sequence).to_bytes(8, "big")
            try:
                self._socket.send_multipart((self._topic, number, payload))
            except zmq.ZMQError as exc:  # a closed context at shutdown, a full pipe
                log.warning("could not publish KV events: %s", exc)
