"""Agent frameworks that speak the Responses API, against a real server: the openai Agents SDK's
Responses model running a tool loop, and LangChain's `ChatOpenAI(use_responses_api=True)`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest
from agents import Agent, ModelSettings, OpenAIResponsesModel, RunConfig, Runner, function_tool, set_tracing_disabled
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI
from pydantic import BaseModel

from tests.live_server import MODEL_NAME, LiveServer, running_server

set_tracing_disabled(True)  # the SDK would export traces to OpenAI


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[LiveServer]:
    """A context that holds an agent's turns: instructions, tool schemas, earlier calls and outputs."""
    with running_server(tiny_model_dir, max_model_len=2048) as live:
        yield live


class Forecast(BaseModel):
    sky: Literal["sunny", "rainy"]


def test_the_agents_sdk_runs_a_tool_loop(server: LiveServer) -> None:
    calls: list[str] = []

    @function_tool
    def get_weather(city: Literal["Oslo", "Paris"]) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"Sunny in {city}"

    client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    agent = Agent(
        name="weather",
        instructions="Answer with the weather.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model=MODEL_NAME, openai_client=client),
        # The first turn must call the tool; the SDK then resets the choice to `auto`, the tool's
        # output goes back as a function_call_output item, and the second turn answers in the
        # output type's schema (text.format), which the grammar closes: a completed Response.
        # Greedy: sampled, the random-weight model's second turn (`auto`) sometimes called the tool
        # again until max_turns ran out (a clean-clone CI on 2026-12-07), which is not under test.
        model_settings=ModelSettings(tool_choice="required", max_tokens=40, parallel_tool_calls=False, temperature=0.0),
        output_type=Forecast,
    )
    config = RunConfig(tracing_disabled=True)
    result = asyncio.run(Runner.run(agent, "Weather in Oslo?", max_turns=4, run_config=config))
    assert calls and calls[0] in ("Oslo", "Paris")
    kinds = [item.type for item in result.new_items]
    assert kinds[:2] == ["tool_call_item", "tool_call_output_item"], kinds
    assert isinstance(result.final_output, Forecast)


@tool
def lookup(city: Literal["Oslo", "Paris"]) -> str:
    """The weather in a city."""
    return f"Sunny in {city}"


@pytest.mark.parametrize("streaming", [False, True])
def test_langchain_binds_tools_over_the_responses_api(server: LiveServer, streaming: bool) -> None:
    chat = ChatOpenAI(
        model=MODEL_NAME,
        base_url=f"{server.url}/v1",
        api_key="unused",  # type: ignore[arg-type]
        use_responses_api=True,
        max_tokens=40,  # type: ignore[call-arg]
        streaming=streaming,
        max_retries=0,
    )
    reply = chat.bind_tools([lookup], tool_choice="lookup", parallel_tool_calls=False).invoke("Weather in Oslo?")
    (call,) = reply.tool_calls
    assert call["name"] == "lookup" and call["args"]["city"] in ("Oslo", "Paris")
    assert json.dumps(call["args"])
