"""What travels on the engine process's two pipes: one typed message per write, each way.

Server -> child (models/process/parent.py writes, models/process/child.py reads):
- `AddRequests`: every request the server's event loop submitted in one iteration, so a burst
  arrives whole and fills one step;
- `AbortRequest`, `StopEngine`.
Child -> server, at most one message per loop iteration:
- `Loaded` once the model is loaded (or `LoadFailed`), then `StepReport` whenever something
  changed (outputs, observer events, the engine's figures), `GpuReport` about once a second on
  CUDA, and `Died` if the loop died.

NOTE: messages and events are NamedTuples, but a `StepReport`'s outputs travel as plain tuples
(`output_to_wire` / `output_from_wire`, the only readers of that layout): a step carries one per
running sequence, and a NamedTuple pickles several times slower than a tuple (docs/engine.md,
measurements).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from models.config import SchedulerConfig
from models.engine.outputs import RequestOutput
from models.kv.events import KvEvent
from models.kv.prefix_cache import PrefixCacheStats
from models.runner.gpu import GpuStat
from models.sampling.params import SamplingParams
from models.scheduler.sequence import FinishReason

# --- server -> child ----------------------------------------------------------------------------


class NewRequest(NamedTuple):
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int
    arrival_time: float  # time.monotonic(), one clock for both processes
    share: str  # whose share of the queue it takes (models/scheduler/fair_shares.py)
    tier: int  # whose running sequences it may preempt (models/scheduler/preemption.py)
    user: str  # whose place within the share it takes (models/scheduler/fair_shares.py)


class AddRequests(NamedTuple):
    requests: list[NewRequest]


class AbortRequest(NamedTuple):
    request_id: str


class StopEngine(NamedTuple):
    pass


ToEngine = AddRequests | AbortRequest | StopEngine

# --- child -> server ----------------------------------------------------------------------------


class EngineStats(NamedTuple):
    """The engine's figures as of its last report (the server answers queue questions from them)."""

    is_warm: bool
    num_waiting: int
    num_waiting_tokens: int
    num_running: int
    kv_usage: float
    num_aborted: int
    num_preempted: int
    num_steps: int
    num_received: int  # requests taken off the pipe (the server counts what it sent)
    prefix_cache: PrefixCacheStats = PrefixCacheStats()
    full_step_seconds: float = 0.0  # a decode step of every slot, timed at warmup


IDLE_STATS = EngineStats(False, 0, 0, 0, 0.0, 0, 0, 0, 0)


# Observer events (models/engine/observer.py), recorded in the child and replayed into the server's metrics.
class StepEvent(NamedTuple):
    num_seqs: int
    num_prompt_tokens: int
    num_generated_tokens: int
    seconds: float


class AdmittedEvent(NamedTuple):
    queue_time: float


class FirstTokenEvent(NamedTuple):
    ttft: float


class TokenGapsEvent(NamedTuple):
    gaps: list[float]


class FinishEvent(NamedTuple):
    reason: FinishReason
    e2e: float


class GrammarMasksEvent(NamedTuple):
    seconds: float


class KvEventsEvent(NamedTuple):
    events: list[KvEvent]


EngineEvent = (
    StepEvent | AdmittedEvent | FirstTokenEvent | TokenGapsEvent | FinishEvent | GrammarMasksEvent | KvEventsEvent
)

# (request_id, text, token_ids, num_prompt_tokens, num_output_tokens, logprobs, finish_reason, error,
#  num_cached_tokens, queue_time)
WireOutput = tuple[
    str, str, list[int], int, int, list[Any], str | None, str | None, int, float | None, str | int | None
]


class Loaded(NamedTuple):
    eos_token_ids: list[int]
    # Resolved against the model (max_model_len) and the K/V's memory budget (max_num_seqs, the
    # prefix cache's bound): models/loading/loader.py resolve_engine_config.
    scheduler: SchedulerConfig
    # The child's Hugging Face tokenizer, pickled: the server unpickles it off its event loop. One
    # tokenizer, as AutoTokenizer chose it, on both sides; and the server never imports torch,
    # which transformers' AutoTokenizer does (through its config classes), but the tokenizer
    # classes themselves do not.
    tokenizer: bytes


class LoadFailed(NamedTuple):
    message: str


class StepReport(NamedTuple):
    outputs: list[WireOutput]
    events: list[EngineEvent]
    stats: EngineStats


class GpuReport(NamedTuple):
    stats: list[GpuStat]


class Died(NamedTuple):
    message: str


FromEngine = Loaded | LoadFailed | StepReport | GpuReport | Died


def output_to_wire(o: RequestOutput) -> WireOutput:
    reason = o.finish_reason.value if o.finish_reason is not None else None
    return (
        o.request_id,
        o.text,
        o.token_ids,
        o.num_prompt_tokens,
        o.num_output_tokens,
        o.logprobs,
        reason,
        o.error,
        o.num_cached_tokens,
        o.queue_time,
        o.stop_reason,
    )


def output_from_wire(w: WireOutput) -> RequestOutput:
    request_id, text, token_ids, num_prompt_tokens, num_output_tokens, logprobs, reason, error, cached, queued, stop = w
    finish = FinishReason(reason) if reason is not None else None
    return RequestOutput(
        request_id, text, token_ids, num_prompt_tokens, num_output_tokens, logprobs, finish, error, cached, queued, stop
    )
