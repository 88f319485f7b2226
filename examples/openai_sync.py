"""The openai SDK against surge, synchronously: a chat completion and a text completion.

    SURGE_BASE_URL=http://127.0.0.1:8000/v1 python examples/openai_sync.py

Environment: SURGE_BASE_URL (default http://127.0.0.1:8000/v1), SURGE_API_KEY (any value when the
server has no keys), SURGE_MODEL_NAME (default: the first model /v1/models lists).
"""

from __future__ import annotations

import os

from openai import OpenAI


def main() -> None:
    client = OpenAI(
        base_url=os.environ.get("SURGE_BASE_URL", "http://127.0.0.1:8000/v1"),
        api_key=os.environ.get("SURGE_API_KEY", "unused"),
    )
    model = os.environ.get("SURGE_MODEL_NAME") or client.models.list().data[0].id

    chat = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Say hello in three words."}],
        max_tokens=16,
        temperature=0.7,
        seed=42,  # same seed, same text
    )
    print("chat:", chat.choices[0].message.content)
    print("finish_reason:", chat.choices[0].finish_reason)
    assert chat.usage is not None
    print("usage:", chat.usage.prompt_tokens, "prompt +", chat.usage.completion_tokens, "completion tokens")

    # The legacy text endpoint takes a raw prompt: no chat template.
    text = client.completions.create(model=model, prompt="Once upon a time", max_tokens=16, temperature=0)
    print("completion:", text.choices[0].text)


if __name__ == "__main__":
    main()
