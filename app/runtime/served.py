"""One chat model this server serves: its engine, what its chat template says, its after-parse layers.

`--model` may repeat (app/config/arguments.py): each served chat model has an engine of its own
(its own process, queue, K/V and degradation levels) and its own chain of after-parse layers,
whose admission reads that engine's load. A request's `model` picks one (app/runtime/state.py);
the light model (app/generation/light.py) may take it instead under load.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.config.settings import Settings
from app.tools.formats import ToolFormat
from middleware.admission.admission import Admission
from middleware.errors import invalid_request, not_found_model
from middleware.generation import Handler
from models import AsyncEngine


@dataclass(frozen=True, slots=True)
class ServedModel:
    name: str  # in the API: what a request's `model` says, and what replies say
    source: str  # the --model value: a directory, hub id, `tiny`, `echo`
    version: str  # the `model_version` label of its metrics
    engine: AsyncEngine
    tool_format: ToolFormat  # how its template writes tool calls (app/tools/formats.py)
    reasons: bool  # its template is a reasoning model's (app/reasoning.py)
    pipeline: Handler  # its after-parse layers around the submission to its engine (app/generation/pipeline.py)
    admission: Admission  # its queue bounds and degradation levels


def check_model(settings: Settings, requested: str) -> None:
    """`requested` names the chat model: else 404, or 400 where it names the embedding model."""
    if settings.chat_model_named(requested) is not None:
        return
    if settings.names_embedding_model(requested):
        raise invalid_request(
            f"The model `{requested}` is an embedding model: it serves /v1/embeddings only, not generation."
            f" The chat models here: {', '.join(name for name, _ in settings.chat_models)}.",
            param="model",
        )
    raise not_found_model(requested)
