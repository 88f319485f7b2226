"""What a client of background responses does: poll one until it has ended."""

from __future__ import annotations

import time
from typing import Any

import openai

RUNNING = ("queued", "in_progress")


def poll(sdk: openai.OpenAI, response_id: str, timeout: float = 60.0) -> Any:
    """The response once it is no longer running (or as it is when `timeout` runs out)."""
    deadline = time.monotonic() + timeout
    while True:
        response = sdk.responses.retrieve(response_id)
        if response.status not in RUNNING or time.monotonic() > deadline:
            return response
        time.sleep(0.05)
