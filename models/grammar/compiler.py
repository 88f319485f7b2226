"""Grammars for constrained decoding: compiled once per grammar, one matcher per sequence.

Built on llguidance (docs/structured-outputs.md says why it and not xgrammar). A grammar is
llguidance's grammar text, a plain string: it travels in `SamplingParams` (so the dedup
fingerprint covers it) and pickles to the engine process as is. The API layer makes one from a
JSON Schema with `json_schema_grammar` and checks it with `GrammarCompiler.check` before any
stream opens; the engine compiles it with `GrammarCompiler.matcher` when the request arrives.
Compiles run on the compiler's own threads (`submit`): never on the event loop, the engine's step
loop or the engine process's pipe receiver, where one large schema stalled every other tenant's
submissions. Compiled grammars are cached per scope (an API key): a tenant never learns from a
compile's speed that another sent the same schema.

Per step, `fill_bitmask` asks the matchers of the constrained rows what they allow next
(models/grammar/masks.py, while the model runs); the sampler applies it; after sampling, each
matcher consumes its row's token. No torch here: the HTTP process checks grammars with this
module, and it imports no torch (models/grammar/masks.py holds the tensor half).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

import llguidance
import llguidance.hf
import numpy as np
from llguidance import LLMatcher, LLParserLimits

from models.grammar.json_schema import SchemaTooComplex, check_bounds, close_objects

if TYPE_CHECKING:  # the HTTP process imports this module: transformers only where it is used
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

# JSON as the compiler writes it: Python's `json.dumps` separators and no other whitespace. A
# constrained model can then always end (there is no run of whitespace to wander into), and
# what it writes looks like what models saw in training.
JSON_OPTIONS: Mapping[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# Compiled grammars kept for reuse: agents send the same few schemas over and over.
DEFAULT_CACHE_SIZE = 256
# Threads that compile: a compile drops the GIL, so two run at once, and a third waits its turn.
COMPILE_THREADS = 2
# The library's own bounds, at their defaults, but errors that never quote the grammar or the
# parser's state (they reach the log, not the client; see `client_message`).
_LIMITS = LLParserLimits(verbose_errors=False)
# What a client is told when the library gives up on a grammar for its size or shape (a resource
# limit, or a panic with a native backtrace): the detail goes to the log only.
TOO_COMPLEX = "the schema is too large or too complex to enforce"
_LIMIT_WORDS = ("panic", "backtrace", "limit", "too large", "too many", "max is", "fuel", "overflow")

T = TypeVar("T")


class GrammarError(ValueError):
    """A grammar the library cannot build or enforce; the message names the problem and is safe
    to show the client."""


def client_message(detail: str) -> str:
    """The library's error as a client may read it: a resource limit or a panic is the fixed
    TOO_COMPLEX (and `detail` is logged); a schema problem (an unsupported keyword, a bad
    pattern, a dangling $ref) is its text on one line, at most 400 characters."""
    if any(word in detail.lower() for word in _LIMIT_WORDS):
        log.warning("grammar refused for its size or shape: %.2000s", detail)
        return TOO_COMPLEX
    return " ".join(detail.split())[:400] or "the grammar cannot be built"


def json_schema_grammar(schema: Mapping[str, Any], *, closed: bool = False) -> str:
    """The grammar of JSON documents valid under `schema`. Raises GrammarError for a schema past
    surge's bounds (models/grammar/json_schema.py) or that is not a JSON object; other problems (an
    unsupported keyword) show in `check`. `closed`: objects take only their declared properties
    (`close_objects`)."""
    checked = checked_schema(schema, closed=closed)
    try:
        return str(LLMatcher.grammar_from_json_schema(checked, defaults=dict(JSON_OPTIONS)))  # type: ignore[arg-type]
    except (ValueError, TypeError) as exc:
        raise GrammarError(client_message(str(exc))) from exc


def checked_schema(schema: Any, *, closed: bool = False) -> Any:
    """`schema` within surge's bounds (else GrammarError naming the bound), its objects closed
    when `closed`."""
    try:
        check_bounds(schema)
    except SchemaTooComplex as exc:
        raise GrammarError(str(exc)) from exc
    return close_objects(schema) if closed else dict(schema) if isinstance(schema, Mapping) else schema


class GrammarCompiler:
    """One tokenizer's grammars: checks, a bounded cache of compiled ones per scope, fresh
    matchers, and the threads compiles run on.

    Thread-safe. The llguidance tokenizer (a scan of the whole vocabulary) is built by
    `prepare`, which start-up calls: built on first use instead, it held the GIL in the middle of
    serving (33 ms on the tiny model's 8,192 tokens: three steps of every running stream).
    A scope is whose compiles a cached grammar serves (an API key; "" without keys): one key's
    compile is never another's cache hit.
    """

    def __init__(
        self,
        hf_tokenizer: PreTrainedTokenizerBase,
        vocab_size: int,
        eos_token_ids: Collection[int],
        cache_size: int = DEFAULT_CACHE_SIZE,
        on_compiled: Callable[[float], None] | None = None,
    ) -> None:
        """vocab_size: the width of the logits, which may exceed the tokenizer's vocabulary.
        on_compiled: told the seconds each new grammar took (checked and compiled), for metrics."""
        self._on_compiled = on_compiled
        self._hf = hf_tokenizer
        self.vocab_size = vocab_size
        self._eos = sorted(eos_token_ids)
        self._cache_size = cache_size
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._compiled: OrderedDict[tuple[str, str], LLMatcher] = OrderedDict()
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None

    def prepare(self) -> None:
        """Build the llguidance tokenizer now (start-up), not at the first constrained request.
        A tokenizer llguidance cannot read is logged here and answered per request (a 400)."""
        start = time.perf_counter()
        try:
            self._llg_tokenizer()
        except GrammarError as exc:
            log.warning("%s", exc)
            return
        log.info("constrained decoding ready: tokenizer read in %.0f ms", (time.perf_counter() - start) * 1000)

    def _llg_tokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._tokenizer is None:
                try:
                    self._tokenizer = llguidance.hf.from_tokenizer(
                        self._hf,
                        n_vocab=self.vocab_size,
                        eos_token=self._eos or None,
                    )
                except Exception as exc:  # a slow (Python) tokenizer, or one llguidance cannot read
                    raise GrammarError(f"constrained decoding is not available for this tokenizer: {exc}") from exc
            return self._tokenizer

    def submit(self, work: Callable[..., T], *args: Any) -> Future[T]:
        """Run grammar work (a schema walk, a compile) on the compiler's own threads."""
        with self._lock:
            if self._executor is None:  # made on first use: most servers never see a grammar
                self._executor = ThreadPoolExecutor(COMPILE_THREADS, thread_name_prefix="surge-grammar-compile")
            executor = self._executor
        return executor.submit(work, *args)

    def terminal(self, text: str) -> str:
        """`text` as a terminal of a Lark grammar: a quoted string, or `<[id]>` when it is one
        token that llguidance counts as special (it counts every added `<...>` token so, e.g.
        Qwen's `<tool_call>`): such a token never matches a quoted string."""
        tokenizer = self._llg_tokenizer()
        ids = tokenizer.tokenize_str(text)
        if len(ids) == 1 and tokenizer.is_special_token(ids[0]):
            return f"<[{ids[0]}]>"
        return json.dumps(text)

    def check(self, grammar: str, scope: str = "") -> None:
        """Raise GrammarError naming what is wrong with `grammar` (an unsupported keyword, a bad
        pattern, a dangling $ref, TOO_COMPLEX); return when it can be enforced. Compiles it, so a
        grammar that passes is cached for the request of `scope` that follows."""
        self._template(grammar, scope)

    def is_compiled(self, grammar: str, scope: str = "") -> bool:
        """Whether `matcher(grammar, scope)` would find it compiled (so costs no compile)."""
        with self._lock:
            return (scope, grammar) in self._compiled

    def matcher(self, grammar: str, scope: str = "") -> LLMatcher:
        """A fresh matcher at the start of `grammar`, for one sequence of `scope`."""
        return self._template(grammar, scope).deep_copy()

    def _template(self, grammar: str, scope: str) -> LLMatcher:
        key = (scope, grammar)
        with self._lock:
            template = self._compiled.get(key)
            if template is not None:
                self._compiled.move_to_end(key)
                return template
        tokenizer = self._llg_tokenizer()
        start = time.perf_counter()
        # Outside the lock: compiling drops the GIL and can take long for a large schema; two
        # threads compiling the same new grammar at once only waste one compile. NOTE: no
        # `validate_grammar` first: it compiles too (8.6 ms of a 300-property schema's 13) and
        # reports the same errors the matcher does.
        template = LLMatcher(tokenizer, grammar, log_level=0, limits=_LIMITS)
        if template.is_error():
            raise GrammarError(client_message(template.get_error()))
        if self._on_compiled is not None:
            self._on_compiled(time.perf_counter() - start)
        with self._lock:
            self._compiled[key] = template
            self._compiled.move_to_end(key)
            while len(self._compiled) > self._cache_size:
                self._compiled.popitem(last=False)
        return template


def fill_bitmask(matchers: Sequence[LLMatcher], vocab_size: int) -> np.ndarray:
    """(n, ceil(vocab_size / 32)) int32: llguidance's bitmask of what matchers[i] allows next,
    32 tokens per word, least significant bit first. Drops the GIL while llguidance computes."""
    words = (vocab_size + 31) // 32
    bitmask = np.empty((len(matchers), words), dtype=np.int32)  # (n, W)
    for i, matcher in enumerate(matchers):
        matcher.unsafe_compute_mask_ptr(bitmask[i].ctypes.data, words * 4)
    return bitmask
