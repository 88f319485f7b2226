"""Requests on their way into the engine's inbox while their grammar compiles.

`EngineCore.add_request` is called on a thread that other tenants' requests pass through too: the
event loop (engine on a thread) or the engine process's pipe receiver. A new large schema compiled
there (up to seconds, and superlinear in the schema) held up every other submission and abort
behind it. Here a request whose grammar is compiled already (the cache, per scope) goes to the
inbox at once; any other is compiled on the grammar compiler's own threads and reaches the inbox
when ready (or with its refusal). Meanwhile it counts as waiting: the inbox counter was raised
when it was added.

An abort can reach the loop before the request it aborts (still compiling): the loop asks `abort`,
which marks it, and `arrived` then drops it. On stop, `drain` hands over those still compiling so
their clients hear why; their compile's late arrival is ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from models.engine.request import EngineRequest
from models.grammar.compiler import GrammarCompiler

log = logging.getLogger("surge.engine")


class GrammarIntake:
    def __init__(self, grammars: GrammarCompiler, put: Callable[[EngineRequest], None]) -> None:
        """`put`: into the loop's inbox (thread-safe)."""
        self._grammars = grammars
        self._put = put
        # Written by the adding thread and the loop; single dict/set operations, atomic under the GIL.
        self._compiling: dict[str, EngineRequest] = {}
        self._aborted: set[str] = set()

    def add(self, request: EngineRequest) -> None:
        """On the adding thread: to the inbox now when nothing needs compiling, else once compiled."""
        seq = request.seq
        grammar = seq.params.grammar
        if grammar is None or self._grammars.is_compiled(grammar, seq.cache_scope):
            self._put(request.attach_grammar(self._grammars))
            return
        self._compiling[seq.request_id] = request
        self._grammars.submit(self._compile, request)

    def _compile(self, request: EngineRequest) -> None:
        """On a compile thread."""
        try:
            request.attach_grammar(self._grammars)
        except Exception:  # a bug, not the schema (that is a GrammarError, a refusal): still answer it
            log.exception("compiling the grammar of %s failed", request.seq.request_id)
            request.refusal = "the response format could not be prepared"
        self._put(request)

    # --- on the loop's thread ---------------------------------------------------------------

    def abort(self, request_id: str) -> bool:
        """Whether `request_id` is still compiling: then it is dropped when it arrives."""
        if request_id in self._compiling:
            self._aborted.add(request_id)
            return True
        return False

    def arrived(self, request: EngineRequest) -> bool:
        """Whether a request taken from the inbox is still wanted (not aborted while compiling)."""
        request_id = request.seq.request_id
        self._compiling.pop(request_id, None)
        if request_id in self._aborted:
            self._aborted.discard(request_id)
            return False
        return True

    def drain(self) -> list[EngineRequest]:
        """Those still compiling (the loop is stopping): forgotten here, to be failed by the caller."""
        pending = [request for request_id, request in list(self._compiling.items()) if request_id not in self._aborted]
        self._compiling.clear()
        self._aborted.clear()
        return pending
