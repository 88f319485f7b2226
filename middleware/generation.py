"""One generation request on its way through the after-parse layers, and the shape of a layer.

Once a route has parsed, validated and tokenized a request, its cost is known, and the after-parse
layers run (middleware/__init__.py gives their order and why). Each is called with the request and
the next handler and gives back the `OutputSource` the route renders: it may refuse (raise an
`OpenAIError`), change the request (degraded sampling parameters), answer without the engine (a
cached or canned reply), or wrap what the handlers inside it return (metering). The innermost
handler is the app's: it submits to the engine.

Knows Starlette's scope and headers and the engine's value types, never the engine.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from starlette.datastructures import Headers
from starlette.types import Scope

from models import OutputSource, SamplingParams

# Every protocol's generation endpoint: what the door's per-request layers (requests per minute,
# concurrency, idempotency keys) apply to.
GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")
# Every path whose requests spend the model's time: the generation endpoints and embeddings.
MODEL_PATHS = (*GENERATION_PATHS, "/v1/embeddings")


def _nothing_held() -> None:
    return None


@dataclass(frozen=True, slots=True)
class SimilarQuery:
    """What similar-query merging compares (middleware/dedup/similar.py): the query's text, embedded,
    and a digest of everything else the output depends on (the conversation before it, tools,
    formats), which must match exactly."""

    text: str
    context: str


@dataclass(slots=True)
class Generation:
    scope: Scope
    headers: Headers
    endpoint: str  # "chat", "completions", "responses", "messages": part of what makes two requests the same
    prompts: Sequence[list[int]]
    # One SamplingParams per choice of each prompt: sequence i * len(choice_params) + j is prompt i's
    # j-th choice. As degraded, once admission has run.
    choice_params: list[SamplingParams]
    priority: int  # the engine's order, lower first: the key's tier, then the body's priority
    tier: int = 0  # the key's tier (keys file): what shedding goes by (middleware/admission/priority.py)
    user: str = ""  # the end user (the body's `user`, or --user-header): a place within the key's share
    level: int = 0  # the degradation level admission applied (0 normal, 4 shedding)
    # Called when the request reaches the engine: it is no longer held between the layers (admission
    # counts held requests as queued). Idempotent; admission sets it.
    release_hold: Callable[[], None] = _nothing_held
    # The route's query and context, built on demand (only where merging is on for the key).
    similar: Callable[[], SimilarQuery | None] | None = None
    # Set by merging: the dedup key of the similar generation to share, instead of this request's own.
    dedup_key: str | None = None

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(prompt) for prompt in self.prompts)

    @property
    def num_sequences(self) -> int:
        return len(self.prompts) * len(self.choice_params)

    @property
    def share(self) -> str:
        """Whose share of the engine's queue the request takes (its sequences interleave with other
        shares' within a priority level): its API key, else its client's address."""
        return share_of(self.scope)

    @property
    def key_share(self) -> str | None:
        """Its share when it has an API key: what the per-key share of the queue bound counts."""
        return key_share_of(self.scope)


def share_of(scope: Scope) -> str:
    """A request's share of the queue: its API key, else its client's address."""
    key = key_share_of(scope)
    if key is not None:
        return key
    client = scope.get("client")
    return "addr:" + (str(client[0]) if client else "")


def key_share_of(scope: Scope) -> str | None:
    """A request's share of the queue if it has an API key; None without one (auth off: every caller
    is one tenant, often behind one address, so no share of its own is bounded)."""
    api_key: str | None = scope.get("state", {}).get("api_key")
    return None if api_key is None else "key:" + api_key


Handler = Callable[[Generation], Awaitable[OutputSource]]


class GenerationLayer(Protocol):
    async def __call__(self, generation: Generation, call_next: Handler) -> OutputSource: ...


def chain(layers: Sequence[GenerationLayer], innermost: Handler) -> Handler:
    """One handler that runs `layers` outermost first, then `innermost`."""
    handler = innermost
    for layer in reversed(layers):
        handler = functools.partial(layer, call_next=handler)
    return handler
