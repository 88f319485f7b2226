"""Streaming with the openai SDK: print deltas as they arrive, then the usage chunk.

    SURGE_BASE_URL=http://127.0.0.1:8000/v1 python examples/openai_streaming.py

Environment: SURGE_BASE_URL, SURGE_API_KEY, SURGE_MODEL_NAME (see openai_sync.py).
"""

from __future__ import annotations

import os
import time

from openai import OpenAI


def main() -> None:
    client = OpenAI(
        base_url=os.environ.get("SURGE_BASE_URL", "http://127.0.0.1:8000/v1"),
        api_key=os.environ.get("SURGE_API_KEY", "unused"),
    )
    model = os.environ.get("SURGE_MODEL_NAME") or client.models.list().data[0].id

    start = time.perf_counter()
    first_token_s: float | None = None
    parts: list[str] = []
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Tell me a very short story."}],
        max_tokens=32,
        stream=True,
        stream_options={"include_usage": True},  # one last chunk with `choices: []` and the usage
    )
    for chunk in stream:
        if chunk.usage is not None:
            print(f"\nusage: {chunk.usage.prompt_tokens} prompt + {chunk.usage.completion_tokens} completion tokens")
        for choice in chunk.choices:
            if choice.delta.content:
                if first_token_s is None:
                    first_token_s = time.perf_counter() - start
                parts.append(choice.delta.content)
                print(choice.delta.content, end="", flush=True)
            if choice.finish_reason:
                print(f"\nfinish_reason: {choice.finish_reason}")
    assert first_token_s is not None
    print(f"time to first token: {first_token_s * 1000:.0f} ms, {len(parts)} content chunks")


if __name__ == "__main__":
    main()
