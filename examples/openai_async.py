"""The openai SDK's async client: concurrent requests (surge batches them) and an async stream.

    SURGE_BASE_URL=http://127.0.0.1:8000/v1 python examples/openai_async.py

Environment: SURGE_BASE_URL, SURGE_API_KEY, SURGE_MODEL_NAME (see openai_sync.py).
"""

from __future__ import annotations

import asyncio
import os

from openai import AsyncOpenAI


async def main() -> None:
    client = AsyncOpenAI(
        base_url=os.environ.get("SURGE_BASE_URL", "http://127.0.0.1:8000/v1"),
        api_key=os.environ.get("SURGE_API_KEY", "unused"),
    )
    model = os.environ.get("SURGE_MODEL_NAME") or (await client.models.list()).data[0].id

    # Sent together, these run in the same engine steps: continuous batching serves them at once.
    questions = ["Name a colour.", "Name a fruit.", "Name a city."]
    replies = await asyncio.gather(
        *(
            client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": q}], max_tokens=12, temperature=0
            )
            for q in questions
        )
    )
    for question, reply in zip(questions, replies, strict=True):
        print(f"{question} -> {reply.choices[0].message.content!r}")

    stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Count to five."}], max_tokens=16, stream=True
    )
    num_chunks = 0
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            num_chunks += 1
            print(chunk.choices[0].delta.content, end="", flush=True)
    print(f"\nstreamed {num_chunks} chunks")
    await client.close()


if __name__ == "__main__":
    asyncio.run(main())
