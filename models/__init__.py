"""The engine: a continuous-batching loop over a torch model, in its own process or thread.

Its rooms, one concern each (each `__init__.py` says what it owns): `engine/` the step loop,
`process/` the engine's own process and the server's async client, `scheduler/` who runs each
step, `kv/` the K/V caches, `runner/` the forward pass, `linear/` faster linear layers,
`sampling/` logits to text, `grammar/` constrained decoding, `loading/` models and tokenizers,
`load/` how loaded the server is; `config.py` the one frozen engine config.

Its public face is the names below: what `app/` and `middleware/` import (`from models import
X`), and all they may. Everything else is the engine's own and may move. A name loads its module
on first use, not here: `surge` bounds oneDNN's caches before torch is imported, and the engine's
spawn imports no torch at all.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from models.config import (
        AUTO_THREADS as AUTO_THREADS,
        QUANTIZATIONS as QUANTIZATIONS,
        EngineConfig as EngineConfig,
        ModelConfig as ModelConfig,
        SchedulerConfig as SchedulerConfig,
    )
    from models.embedding.info import (
        Embedder as Embedder,
        EmbeddingQueueFull as EmbeddingQueueFull,
        EncoderInfo as EncoderInfo,
    )
    from models.embedding.process import start_embeddings as start_embeddings
    from models.engine.outputs import (
        ENGINE_STOPPED as ENGINE_STOPPED,
        OutputSource as OutputSource,
        RequestOutput as RequestOutput,
    )
    from models.grammar.compiler import (
        JSON_OPTIONS as JSON_OPTIONS,
        GrammarCompiler as GrammarCompiler,
        GrammarError as GrammarError,
        checked_schema as checked_schema,
        json_schema_grammar as json_schema_grammar,
    )
    from models.grammar.json_schema import SchemaTooComplex as SchemaTooComplex, check_bounds as check_bounds
    from models.kv.events import BlockRemoved as BlockRemoved, BlockStored as BlockStored, KvEvent as KvEvent
    from models.kv.prefix_cache import PrefixCacheStats as PrefixCacheStats
    from models.load.stats import LoadSnapshot as LoadSnapshot
    from models.loading.hub import is_repo_id as is_repo_id
    from models.loading.tiny import build_tiny as build_tiny
    from models.loading.tokenizer import Tokenizer as Tokenizer
    from models.process.async_engine import AsyncEngine as AsyncEngine
    from models.process.spawn import SpawnedEngine as SpawnedEngine, spawn_engine as spawn_engine
    from models.runner.cpus import bound_onednn_caches as bound_onednn_caches
    from models.runner.gpu import read_gpu_stats as read_gpu_stats
    from models.sampling.logprobs import TokenLogprob as TokenLogprob
    from models.sampling.params import (
        MAX_STOP_STRINGS as MAX_STOP_STRINGS,
        MAX_TOP_LOGPROBS as MAX_TOP_LOGPROBS,
        SamplingParams as SamplingParams,
    )
    from models.scheduler.sequence import (
        WARM_SCOPE as WARM_SCOPE,
        FinishReason as FinishReason,
        cache_scope_of as cache_scope_of,
    )

# Each name of the face, and the module that defines it.
FACE: dict[str, str] = {
    "AUTO_THREADS": "models.config",
    "EngineConfig": "models.config",
    "ModelConfig": "models.config",
    "QUANTIZATIONS": "models.config",
    "SchedulerConfig": "models.config",
    "Embedder": "models.embedding.info",
    "EmbeddingQueueFull": "models.embedding.info",
    "EncoderInfo": "models.embedding.info",
    "start_embeddings": "models.embedding.process",
    "ENGINE_STOPPED": "models.engine.outputs",
    "OutputSource": "models.engine.outputs",
    "RequestOutput": "models.engine.outputs",
    "TokenLogprob": "models.sampling.logprobs",
    "GrammarCompiler": "models.grammar.compiler",
    "GrammarError": "models.grammar.compiler",
    "JSON_OPTIONS": "models.grammar.compiler",
    "checked_schema": "models.grammar.compiler",
    "json_schema_grammar": "models.grammar.compiler",
    "SchemaTooComplex": "models.grammar.json_schema",
    "check_bounds": "models.grammar.json_schema",
    "PrefixCacheStats": "models.kv.prefix_cache",
    "BlockStored": "models.kv.events",
    "BlockRemoved": "models.kv.events",
    "KvEvent": "models.kv.events",
    "WARM_SCOPE": "models.scheduler.sequence",
    "LoadSnapshot": "models.load.stats",
    "is_repo_id": "models.loading.hub",
    "build_tiny": "models.loading.tiny",
    "Tokenizer": "models.loading.tokenizer",
    "AsyncEngine": "models.process.async_engine",
    "SpawnedEngine": "models.process.spawn",
    "spawn_engine": "models.process.spawn",
    "bound_onednn_caches": "models.runner.cpus",
    "read_gpu_stats": "models.runner.gpu",
    "MAX_STOP_STRINGS": "models.sampling.params",
    "MAX_TOP_LOGPROBS": "models.sampling.params",
    "SamplingParams": "models.sampling.params",
    "FinishReason": "models.scheduler.sequence",
    "cache_scope_of": "models.scheduler.sequence",
}

__all__ = sorted(FACE)


def __getattr__(name: str) -> Any:
    module = FACE.get(name)
    if module is None:
        raise AttributeError(f"module 'models' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value
