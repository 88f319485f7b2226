"""What similar-query merging compares (middleware/dedup/similar.py), as the app knows it: a request's
query (its last user turn's text) and context (everything else in its body that decides the
output), and the query's embedding by the served embedding model.

The context is the body itself, minus the query and the fields that change nothing in the output
(streaming, metadata, the end user, storage): two requests merge only where all the rest, the
conversation before the query, tools, formats, template settings and a previous response's id
included, is the same. A query that is not plain text (an image, a tool result, an assistant
turn last) is never merged.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

from pydantic import BaseModel

from app.generation.validation import PREFIX_CHARS_PER_TOKEN
from app.runtime.state import ServerState
from middleware.dedup.similar import Embed
from middleware.generation import SimilarQuery

# Fields that decide nothing in the output (and would keep equal requests apart).
IGNORED = frozenset(
    {
        "stream",
        "stream_options",
        "user",
        "metadata",
        "store",
        "service_tier",
        "safety_identifier",
        "prompt_cache_key",
        "background",
        "priority",
        "include",
    }
)
TEXT_PARTS = ("text", "input_text")


def similar_query(body: BaseModel, field: str) -> Callable[[], SimilarQuery | None]:
    """The request's query and context, computed when asked (only where merging is on)."""

    def build() -> SimilarQuery | None:
        dump = body.model_dump(mode="json", exclude_none=True, exclude=set(IGNORED))
        value = dump.get(field)
        if isinstance(value, str):
            text: str | None = value
            dump[field] = None
        elif isinstance(value, list) and value and isinstance(value[-1], dict) and value[-1].get("role") == "user":
            text = _text(value[-1].get("content"))
            value[-1] = {**value[-1], "content": None}
        else:
            return None
        if text is None or not text.strip():
            return None
        context = hashlib.sha256(json.dumps(dump, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        return SimilarQuery(text, context)

    return build


def _text(content: object) -> str | None:
    """A turn's text when it is only text: a string, or text parts (joined as templates join them)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        return None
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") not in TEXT_PARTS or not isinstance(part.get("text"), str):
            return None
        texts.append(part["text"])
    return "\n".join(texts)


def query_embedder(state: ServerState) -> Embed:
    """The merging layer's `embed`: a query's unit vector by the served embedding model (None
    without one); a long query is cut to its last part, as much as the encoder reads."""

    async def embed(text: str) -> list[float] | None:
        embeddings = state.embeddings
        if embeddings is None:
            return None
        limit = embeddings.info.max_input_tokens
        ids = embeddings.encode_text(text[-limit * PREFIX_CHARS_PER_TOKEN :])[-limit:]
        vectors = await embeddings.embed([ids])
        vector: list[float] = vectors[0].tolist()
        return vector

    return embed
