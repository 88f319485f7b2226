"""Read surge's `x-ratelimit-*` headers with the SDK's `with_raw_response`.

    surge serve --rate-limit-rpm 60 --rate-limit-tpm 40000 &
    SURGE_BASE_URL=http://127.0.0.1:8000/v1 python examples/openai_rate_limits.py

The headers are there only for the limits that are on (docs/traffic.md, "Rate limits"). `with_raw_response`
returns the HTTP response; `.parse()` gives the same typed object a plain call returns.
Environment: SURGE_BASE_URL, SURGE_API_KEY, SURGE_MODEL_NAME (see openai_sync.py).
"""

from __future__ import annotations

import os

from openai import OpenAI

HEADERS = (
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
)


def main() -> None:
    client = OpenAI(
        base_url=os.environ.get("SURGE_BASE_URL", "http://127.0.0.1:8000/v1"),
        api_key=os.environ.get("SURGE_API_KEY", "unused"),
    )
    model = os.environ.get("SURGE_MODEL_NAME") or client.models.list().data[0].id

    for _ in range(2):  # twice, to see `remaining` go down
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=8
        )
        for name in HEADERS:
            print(f"{name}: {raw.headers.get(name, '(limit off)')}")
        completion = raw.parse()
        print("reply:", completion.choices[0].message.content)
        print()


if __name__ == "__main__":
    main()
