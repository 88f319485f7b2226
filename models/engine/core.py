"""The engine loop: one background thread that owns the model, the cache and the scheduler.

Nothing here touches asyncio. Requests and aborts arrive through a thread-safe inbox; each
step's outputs leave through one `publish` call (the async side hands them to the event
loop in a single hop). A failed forward pass fails that step's requests and the loop goes
on; if the loop itself dies, `dead` says why and every live request gets an error.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable

from models.config import SchedulerConfig
from models.engine.faults import forward_faults_from_env
from models.engine.inbox import Inbox, Stop
from models.engine.observer import NULL_OBSERVER, EngineObserver, WarmupObserver
from models.engine.outputs import (
    ENGINE_STOPPED,
    MODEL_FAILED,
    EngineDeadError,
    RequestOutput,
    TokenLogprob,
    error_output,
)
from models.engine.prefix_setup import start_prefix_cache
from models.engine.request import EngineRequest
from models.engine.slot_release import SlotRelease
from models.grammar.compiler import GrammarCompiler
from models.grammar.masks import MaskWorker
from models.kv.prefix_cache import PrefixCacheStats
from models.loading.loader import LoadedModel
from models.runner.decode_threads import measure_decode_threads
from models.runner.echo import EchoRunner, echo_token_ids
from models.runner.gpu import GpuStat, read_gpu_stats
from models.runner.model_runner import ModelRunner
from models.runner.protocol import Runner
from models.sampling.params import SamplingParams
from models.sampling.sampler import Sampler
from models.scheduler.output import SchedulerOutput
from models.scheduler.queue_deadline import QueueDeadline
from models.scheduler.scheduler import Scheduler
from models.scheduler.sequence import FinishReason, Sequence
from models.scheduler.warmup import warmup_sequences

log = logging.getLogger("surge.engine")

Publish = Callable[[list[RequestOutput]], None]


class EngineCore:
    def __init__(
        self,
        loaded: LoadedModel,
        config: SchedulerConfig,
        publish: Publish,
        clock: Callable[[], float] = time.monotonic,
        observer: EngineObserver = NULL_OBSERVER,
        on_iteration: Callable[[], None] = lambda: None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.observer = observer  # metrics
        # On the engine thread after warmup and each loop iteration: the engine process ships from here.
        self._on_iteration = on_iteration
        self._deadline = QueueDeadline(config.max_queue_seconds)
        self.kv_usage = 0.0
        self.tokenizer = loaded.tokenizer
        self.runner: Runner
        if loaded.model is None:  # the echo model: no forward pass at all
            echo_ids = echo_token_ids(loaded.tokenizer.encode, loaded.tokenizer.eos_token_ids)
            self.runner = EchoRunner(echo_ids, loaded.vocab_size, config.max_num_seqs)
        else:
            self.runner = ModelRunner(loaded.model, config.max_num_seqs, config.max_model_len)
        self._slots = SlotRelease(self.runner, config.max_num_seqs, clock, at_once=config.max_kv_tokens > 0)
        self.sampler = Sampler(loaded.vocab_size, self.runner.device)
        self.grammars = GrammarCompiler(
            loaded.tokenizer.hf,
            loaded.vocab_size,
            loaded.tokenizer.eos_token_ids,
            on_compiled=observer.on_grammar_compiled,
        )
        self._masks = MaskWorker(loaded.vocab_size)
        self._threads = loaded.threads
        self.scheduler = Scheduler(config, loaded.tokenizer.eos_token_ids)
        self._publish = publish
        self._inbox = Inbox(self.grammars)
        self._requests: dict[str, EngineRequest] = {}
        self._thread: threading.Thread | None = None
        self.dead: BaseException | None = None
        self.is_warm = False
        self.full_step_seconds = 0.0  # a decode step of every slot, timed at warmup
        self.num_steps = 0
        self.num_aborted = 0  # requests taken out because their client went away
        self._faults = forward_faults_from_env()  # tests only (models/engine/faults.py); None when off

    # --- called from any thread -------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        arrival_time: float | None = None,
        share: str = "",
        tier: int = 0,
        user: str = "",
    ) -> None:
        """`arrival_time` (engine clock): when it arrived, if earlier than now; `share` and `user`: whose
        place in the queue it takes (models/scheduler/fair_shares.py); `tier`: whose slot it may take
        (models/scheduler/preemption.py). From any thread (models/engine/intake.py compiles grammars)."""
        if self.dead is not None:
            raise EngineDeadError(ENGINE_STOPPED)
        arrived = self.clock() if arrival_time is None else arrival_time
        seq = Sequence(request_id, list(prompt_token_ids), params, priority, share, tier, user, arrival_time=arrived)
        request = EngineRequest.build(seq, self.tokenizer, self.runner.device)
        self._inbox.add(request)

    def abort_request(self, request_id: str) -> None:
        self._inbox.abort(request_id)

    def start(self) -> None:  # the loop, on a background thread of this process
        self._thread = threading.Thread(target=self.run, name="surge-engine", daemon=True)
        self._thread.start()

    def adopt_current_thread(self) -> None:  # it calls `run` next (models/engine/own_thread.py)
        self._thread = threading.current_thread()

    def stop(self, timeout: float = 10.0) -> None:
        self._inbox.stop()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def is_alive(self) -> bool:
        if self._thread is None:  # run() on the caller's thread (the engine process)
            return self.dead is None
        return self.dead is None and self._thread.is_alive()

    @property
    def num_waiting(self) -> int:  # not yet running: the scheduler's queue and the inbox
        return self.scheduler.num_waiting + self._inbox.num_requests

    @property
    def num_preempted(self) -> int:
        return self.scheduler.num_preempted

    @property
    def num_running(self) -> int:
        return self.scheduler.num_running

    def gpu_stats(self) -> list[GpuStat]:
        return read_gpu_stats()  # this process holds the CUDA context

    @property
    def num_waiting_tokens(self) -> int:
        return self.scheduler.num_waiting_tokens

    @property
    def prefix_cache_stats(self) -> PrefixCacheStats:
        cache = self.scheduler.prefix_cache
        return cache.stats() if cache is not None else PrefixCacheStats()

    # --- the engine thread --------------------------------------------------------------

    def run(self) -> None:
        """Warm up, then serve until stopped or dead; returns when the loop ends."""
        on_iteration = self._on_iteration
        try:
            self._warmup()
            self.scheduler.prefix_cache = start_prefix_cache(self.config, self.runner, self.observer.on_kv_events)
            # What is alive now lives as long as the process: frozen, no full collection walks it mid-step.
            gc.collect()
            gc.freeze()
            self.is_warm = True
            on_iteration()
            while True:
                idle = not self.scheduler.has_work
                wait = self._slots.idle_wait() if idle else None
                if not self._drain_inbox(block=idle, timeout=wait):
                    break
                if self.scheduler.has_work:
                    self.step()
                elif wait is not None:  # idle that long: the free slots' memory goes back
                    self.step()  # first the moves and prefix-cache copies the last finishes left
                    self._slots.idle()
                on_iteration()
        except BaseException as exc:  # the loop must never die silently
            log.exception("engine loop died")
            self.dead = exc
            self._fail_all(ENGINE_STOPPED)
        finally:
            self._masks.close()

    def step(self) -> None:
        """Schedule, execute, postprocess, publish: one iteration of the running batch."""
        outputs = self._expire_waiting()
        plan = self.scheduler.schedule()
        self._record_plan(plan)
        if outputs := outputs + self._run(plan):
            self._publish(outputs)

    def _run(self, plan: SchedulerOutput) -> list[RequestOutput]:
        """The plan's slot moves, forward pass and sampling, the scheduler's bookkeeping, the
        requests' outputs. A failure fails the plan's requests, not the loop."""
        try:
            self.runner.apply_moves(plan.moves)
            self._slots.after_moves(plan.moves, self.scheduler.running)  # moves read their sources first
            self.runner.apply_loads(plan.loads)
            if plan.is_empty:
                return []
            started = time.perf_counter()
            token_ids, logprobs = self._execute(plan)
        except Exception:
            log.exception("forward pass failed; failing the %d requests of this step", len(plan.sequences))
            self.scheduler.forget_prefixes()  # a copy may have failed half-way: trust no pool row
            # NOTE: the exception stays in the log: its text (paths, tensor shapes, device details)
            # is not for clients, who get this sentence in a 500 or an error event.
            return self._fail(plan.sequences, MODEL_FAILED)
        seconds = time.perf_counter() - started  # the scheduler paces long prompts' chunks by it
        reasons = self.scheduler.update_from_output(plan, token_ids, seconds)
        self.num_steps += 1
        self.observer.on_step(len(plan.decodes) + len(plan.prefills), plan.num_prompt_tokens, len(token_ids), seconds)
        return self._postprocess(plan.sampled, token_ids, reasons, logprobs)

    def _execute(self, plan: SchedulerOutput) -> tuple[list[int], list[TokenLogprob | None]]:
        if self._faults is not None and self.is_warm:
            self._faults.before_forward()
        if self._threads is not None:
            self._threads.before_step(plan.num_prompt_tokens)
        requests = self._requests
        rows = [requests[seq.request_id].row for seq in plan.sampled]
        constrained = [i for i, row in enumerate(rows) if row.matcher is not None]
        # The grammar masks are computed while the model runs (models/grammar/masks.py).
        masks = self._masks.start(constrained, [rows[i].matcher for i in constrained])  # type: ignore[misc]
        logits = self.runner.forward(plan.num_slots, plan.prefills, plan.decodes)
        if not rows:
            return [], []
        result = self.sampler(logits, rows, masks.result() if masks is not None else None)
        if result.mask_seconds:
            self.observer.on_grammar_masks(result.mask_seconds)
        return result.token_ids, result.logprobs

    def _postprocess(
        self,
        sampled: list[Sequence],
        token_ids: list[int],
        reasons: list[FinishReason | None],
        logprobs: list[TokenLogprob | None],
    ) -> list[RequestOutput]:
        """Each sampled token's text (stop strings matched here), timings and output delta."""
        outputs = []
        observer = self.observer
        now = self.clock()
        gaps: list[float] = []
        for seq, token_id, reason, logprob in zip(sampled, token_ids, reasons, logprobs, strict=True):
            request = self._requests[seq.request_id]
            is_first = seq.num_output_tokens == 1
            if is_first:
                observer.on_first_token(now - seq.arrival_time)
            else:
                gaps.append(now - request.last_token_time)
            request.last_token_time = now
            text, stopped = request.detokenizer.push(token_id)
            error = None
            if reason is None and not stopped and request.row.matcher is not None:
                reason, error = request.follow_grammar(token_id)
                if reason is not None:
                    self.scheduler.finish(seq, reason)
            stop_reason: str | int | None = None
            if stopped:
                self.scheduler.finish(seq, FinishReason.STOP)  # a no-op if it stopped on its token too
                reason = FinishReason.STOP
                stop_reason = request.detokenizer.matched_stop
            elif reason is not None:
                text += request.detokenizer.flush()
                if reason is FinishReason.STOP and self.scheduler.stopped_on_stop_token(seq, token_id):
                    stop_reason = token_id
            if reason is not None:
                self._finished(seq, reason)
            queued = seq.queue_time if is_first else None  # the server's load figures take it from here
            lps = [logprob] if logprob is not None else []
            counts = (seq.num_prompt_tokens, seq.num_output_tokens, lps, reason, error, seq.num_cached_tokens, queued)
            outputs.append(RequestOutput(seq.request_id, text, [token_id], *counts, stop_reason))
        if gaps:
            observer.on_token_gaps(gaps)
        return outputs

    def _expire_waiting(self) -> list[RequestOutput]:
        """Drop requests that waited longer than max_queue_seconds, without using the model."""
        outputs = []
        for seq in self._deadline.expired(self.clock()):
            self._finish(seq, FinishReason.REJECTED)
            message = f"the request waited more than {self.config.max_queue_seconds:g} s in the queue"
            outputs.append(error_output(seq, message, FinishReason.REJECTED))
        return outputs

    def _record_plan(self, plan: SchedulerOutput) -> None:
        """Queue times of the sequences this step admits, and the KV use of the batch it runs."""
        now = self.clock()
        for chunk in plan.prefills:
            if chunk.start == chunk.seq.num_cached_tokens and not chunk.seq.num_preemptions:  # admitted now
                chunk.seq.queue_time = now - chunk.seq.arrival_time
                self.observer.on_admitted(chunk.seq.queue_time)
        self.kv_usage = self.scheduler.kv_usage()

    def _drain_inbox(self, block: bool, timeout: float | None = None) -> bool:
        """Take in new requests and aborts, waiting for the first at most `timeout` seconds when
        `block` (None: as long as it takes); return False when asked to stop."""
        while True:
            item = self._inbox.get(block, timeout)
            if item is None:
                return True
            block = False
            if isinstance(item, Stop):
                self._fail_all("the server is shutting down")
                return False
            if isinstance(item, str):
                self._abort(item)
                continue
            if item.refusal is not None:
                self._inbox.taken()
                self._publish([error_output(item.seq, item.refusal, FinishReason.INVALID)])
                continue
            try:
                self.scheduler.add(item.seq)
            except ValueError as exc:
                self._inbox.taken()
                self._publish([error_output(item.seq, str(exc))])
                continue
            self._inbox.taken()  # after the scheduler counts it
            self._requests[item.seq.request_id] = item
            self._deadline.add(item.seq)

    def _abort(self, request_id: str) -> None:
        if self._inbox.abort_compiling(request_id):
            return
        seq = self.scheduler.abort(request_id)
        if seq is not None:
            self._requests.pop(request_id, None)
            self.num_aborted += 1
            self._settle_kv_usage()

    def _finish(self, seq: Sequence, reason: FinishReason) -> None:
        """End a request the scheduler has not ended yet (an expiry, a failure)."""
        self.scheduler.finish(seq, reason)
        self._finished(seq, reason)

    def _finished(self, seq: Sequence, reason: FinishReason) -> None:
        """The engine's side of a request's end: forget it, count it, settle the KV figure."""
        self._requests.pop(seq.request_id, None)
        self._settle_kv_usage()
        self.observer.on_finish(reason, self.clock() - seq.arrival_time)

    def _settle_kv_usage(self) -> None:
        # Measured when a step is planned: with the batch empty no step follows, so zero it here.
        if not self.scheduler.num_running:
            self.kv_usage = 0.0

    def _fail(self, seqs: list[Sequence], message: str) -> list[RequestOutput]:
        """End `seqs` with an error; their error outputs."""
        outputs = []
        for seq in seqs:
            self._finish(seq, FinishReason.ERROR)
            outputs.append(error_output(seq, message))
        return outputs

    def _fail_all(self, message: str) -> None:
        """Every request the engine holds, or holds in its inbox, ends with `message`."""
        seqs = [request.seq for request in self._requests.values()]
        seqs += [request.seq for request in self._inbox.drain()]
        try:
            self._publish(self._fail(seqs, message))
        except Exception:
            log.exception("could not tell %d requests that the engine stopped", len(seqs))

    def _warmup(self) -> None:
        """Run the shapes serving will use (a batched prefill, full-width decode) through `step()`,
        before /ready; nothing of it is published, observed or counted."""
        seqs = warmup_sequences(self.config)
        log.info("warming up: %d sequences, prompt %d tokens", len(seqs), seqs[0].num_prompt_tokens)
        self.grammars.prepare()
        observer, publish = self.observer, self._publish
        warm = WarmupObserver()
        self.observer, self._publish = warm, lambda _: None
        for seq in seqs:
            self._requests[seq.request_id] = EngineRequest.build(seq, self.tokenizer, self.runner.device)
            self.scheduler.add(seq)
        while self.scheduler.has_work:
            self.step()
        self.step()  # an empty step applies the slot moves the last finishes left
        measured = measure_decode_threads(self.runner, self._threads, len(seqs))  # if --num-threads auto
        rows, self.full_step_seconds = (len(seqs), measured) if measured else (warm.rows, warm.full_step_seconds)
        self.num_steps = 0
        self.observer, self._publish = observer, publish
        log.info("warmup done: a decode step of %d rows takes %.1f ms", rows, 1000 * self.full_step_seconds)
