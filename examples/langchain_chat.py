"""LangChain's `ChatOpenAI` (package langchain-openai) pointed at surge: `invoke` and `stream`.

    SURGE_BASE_URL=http://127.0.0.1:8000/v1 python examples/langchain_chat.py

Environment: SURGE_BASE_URL, SURGE_API_KEY, SURGE_MODEL_NAME (see openai_sync.py).
"""

from __future__ import annotations

import os

from langchain_core.messages import HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI
from openai import OpenAI
from pydantic import SecretStr


def main() -> None:
    base_url = os.environ.get("SURGE_BASE_URL", "http://127.0.0.1:8000/v1")
    api_key = os.environ.get("SURGE_API_KEY", "unused")
    model = os.environ.get("SURGE_MODEL_NAME") or OpenAI(base_url=base_url, api_key=api_key).models.list().data[0].id

    llm = ChatOpenAI(
        model=model,
        base_url=base_url,
        api_key=SecretStr(api_key),
        max_completion_tokens=24,  # sent as max_completion_tokens, which surge takes like max_tokens
        temperature=0,
        stream_usage=True,  # the usage chunk at the end of a stream
    )
    messages = [SystemMessage("You are terse."), HumanMessage("Say hello.")]

    reply = llm.invoke(messages)
    print("invoke:", repr(reply.content))
    print("usage:", reply.usage_metadata)

    num_chunks = 0
    for chunk in llm.stream(messages):
        if chunk.content:
            num_chunks += 1
            print(chunk.content, end="", flush=True)
    print(f"\nstreamed {num_chunks} chunks")


if __name__ == "__main__":
    main()
