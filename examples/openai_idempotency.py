"""Safe retries with an `Idempotency-Key` passed through the SDK's `extra_headers`.

    SURGE_BASE_URL=http://127.0.0.1:8000/v1 python examples/openai_idempotency.py

Send the same key on every retry of one logical request: surge runs the model once and answers a
retry of a finished request with the stored response, byte for byte, marked
`Idempotent-Replayed: true` (docs/traffic.md, "Idempotency keys"). The SDK never sends a key by itself.
Environment: SURGE_BASE_URL, SURGE_API_KEY, SURGE_MODEL_NAME (see openai_sync.py).
"""

from __future__ import annotations

import os
import uuid

from openai import OpenAI
from openai.types.chat import ChatCompletion


def main() -> None:
    client = OpenAI(
        base_url=os.environ.get("SURGE_BASE_URL", "http://127.0.0.1:8000/v1"),
        api_key=os.environ.get("SURGE_API_KEY", "unused"),
    )
    model = os.environ.get("SURGE_MODEL_NAME") or client.models.list().data[0].id

    # One key per logical request (an order id, a job id...), made once, reused on every retry.
    key = f"example-{uuid.uuid4()}"

    def send() -> tuple[ChatCompletion, str]:
        """The completion and surge's `Idempotent-Replayed` header ("true" on a replay)."""
        raw = client.chat.completions.with_raw_response.create(
            model=model,
            messages=[{"role": "user", "content": "Write a haiku."}],
            max_tokens=24,
            temperature=1.0,  # sampled: a second run would give other text, a replay gives the same
            extra_headers={"Idempotency-Key": key},
        )
        return raw.parse(), raw.headers.get("idempotent-replayed", "false")

    first, first_replayed = send()
    # ...the reply is lost on the way (a timeout, a dropped connection); the caller retries:
    retry, retry_replayed = send()

    print("first:", repr(first.choices[0].message.content), "replayed:", first_replayed)
    print("retry:", repr(retry.choices[0].message.content), "replayed:", retry_replayed)
    print("same completion id:", first.id == retry.id)


if __name__ == "__main__":
    main()
