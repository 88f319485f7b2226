"""The engine loop: one background thread that owns the model, the cache and the scheduler.

Nothing here touches asyncio. Requests and aborts arrive through a thread-safe inbox; each
step's outputs leave through one `publish` call (the async side hands them to the event
loop in a single hop). A failed forward pass fails that step's requests and the loop goes
on; if the loop itself dies, `dead` says why and every live request gets an error.
"""

from __future__ import annotations

import gc
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from models.config import SchedulerConfig
from models.decode_threads import measure_decode_threads
from models.echo import EchoRunner, echo_token_ids
from models.engine_request import EngineRequest
from models.faults import forward_faults_from_env
from models.gpu import GpuStat, read_gpu_stats
from models.grammar import GrammarCompiler
from models.grammar_intake import GrammarIntake
from models.grammar_masks import MaskWorker
from models.loader import LoadedModel
from models.model_runner import ModelRunner, Runner
from models.observer import NULL_OBSERVER, EngineObserver
from models.outputs import ENGINE_STOPPED, MODEL_FAILED, EngineDeadError, RequestOutput, TokenLogprob, error_output
from models.prefix_cache import PrefixCacheStats
from models.prefix_setup import start_prefix_cache
from models.queue_deadline import QueueDeadline
from models.sampler import Sampler
from models.sampling_params import SamplingParams
from models.scheduler import Scheduler, SchedulerOutput, warmup_sequences
from models.sequence import FinishReason, Sequence
from models.slot_release import SlotRelease

log = logging.getLogger("surge.engine")

Publish = Callable[[list[RequestOutput]], None]


class _Stop:
    """Inbox sentinel: leave the loop."""


def _nothing(*_: object) -> None:
    """No iteration hook; no publishing (warmup)."""


class EngineCore:
    def __init__(
        self,
        loaded: LoadedModel,
        config: SchedulerConfig,
        publish: Publish,
        clock: Callable[[], float] = time.monotonic,
        observer: EngineObserver = NULL_OBSERVER,
        on_iteration: Callable[[], None] = _nothing,
    ) -> None:
        self.config = config
        self.clock = clock
        self.observer = observer  # metrics
        # Called on the engine thread after warmup and after every loop iteration (inbox drained,
        # step run): the engine process ships that iteration's outputs and figures from here.
        self._on_iteration = on_iteration
        self._deadline = QueueDeadline(config.max_queue_seconds)
        self.kv_usage = 0.0
        self.tokenizer = loaded.tokenizer
        self.runner: Runner
        if loaded.model is None:  # the echo model: no forward pass at all
            self.runner = EchoRunner(echo_token_ids(loaded.tokenizer), loaded.vocab_size, config.max_num_seqs)
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
        self._inbox: queue.SimpleQueue[EngineRequest | str | _Stop] = queue.SimpleQueue()
        self._intake = GrammarIntake(self.grammars, self._inbox.put)
        # Requests (not aborts) put in the inbox and taken out: each counter has one writer (the
        # caller of add_request; the loop), so their difference is exact without a lock.
        self._num_inbox_added = 0
        self._num_inbox_taken = 0
        self._requests: dict[str, EngineRequest] = {}
        self._thread: threading.Thread | None = None
        self.dead: BaseException | None = None
        self.is_warm = False
        self.num_steps = 0
        self.num_aborted = 0  # requests taken out because their client went away
        self._faults = forward_faults_from_env()  # tests only (models/faults.py); None when off

    # --- called from any thread -------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        priority: int = 0,
        arrival_time: float | None = None,
        share: str = "",
    ) -> None:
        """`arrival_time` (engine clock): when the request arrived, if earlier than now; `share`:
        whose share of the queue it takes (models/fair_shares.py). Called from any thread; a
        grammar not compiled yet is compiled on the compiler's threads (models/grammar_intake.py)."""
        if self.dead is not None:
            raise EngineDeadError(ENGINE_STOPPED)
        arrived = self.clock() if arrival_time is None else arrival_time
        seq = Sequence(request_id, list(prompt_token_ids), params, priority, share=share, arrival_time=arrived)
        request = EngineRequest.build(seq, self.tokenizer, self.runner.device)
        self._num_inbox_added += 1  # before the put: counted early rather than missed
        self._intake.add(request)

    def abort_request(self, request_id: str) -> None:
        self._inbox.put(request_id)

    def start(self) -> None:
        """Run the loop on a background thread of this process."""
        self._thread = threading.Thread(target=self.run, name="surge-engine", daemon=True)
        self._thread.start()

    @staticmethod
    def start_on_own_thread(build: Callable[[], EngineCore]) -> Future[EngineCore]:
        """Build a core on a new thread (`build` loads the model) and run its loop there; the
        future holds the core once built, or what `build` raised.

        Loading on the loop's thread rather than another: torch's OpenMP runtime (libgomp) keeps
        a team of worker threads per thread that runs parallel regions, and once a process holds
        more of them than CPUs its idle workers sleep between regions instead of spinning, so
        every op of every step pays a wake-up. On 2 AVX2 cores, with the model loaded on one
        thread and the loop on another, a decode-only step of the tiny `l` at 32 rows took
        81 and 73 ms against 69 and 61 ms with both on one (scripts/bench_engine.py)."""
        built: Future[EngineCore] = Future()

        def main() -> None:
            try:
                core = build()
            except BaseException as exc:  # the caller awaits the future: it must hear of it
                built.set_exception(exc)
                return
            core._thread = threading.current_thread()
            built.set_result(core)
            core.run()

        threading.Thread(target=main, name="surge-engine", daemon=True).start()
        return built

    def stop(self, timeout: float = 10.0) -> None:
        self._inbox.put(_Stop())
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def is_alive(self) -> bool:
        if self._thread is None:  # run() on the caller's thread (the engine process)
            return self.dead is None
        return self.dead is None and self._thread.is_alive()

    @property
    def num_waiting(self) -> int:
        """Requests not yet running: the scheduler's queue plus those still in the inbox.

        NOTE: not `inbox.qsize()`, which also counted aborts (a client that went away showed as
        one more request waiting, over --max-queued-requests on /metrics)."""
        return self.scheduler.num_waiting + self._num_inbox_added - self._num_inbox_taken

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
            self.scheduler.prefix_cache = start_prefix_cache(self.config, self.runner)
            # Everything alive now (torch, transformers, the weights' Python objects) lives as long
            # as the process: out of the collector's sight, a full collection no longer walks
            # millions of objects in the middle of a step.
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
        outputs += self._run(plan)
        if outputs:
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
            token_ids, logprobs = self._execute(plan)
        except Exception:
            log.exception("forward pass failed; failing the %d requests of this step", len(plan.sequences))
            self.scheduler.forget_prefixes()  # a copy may have failed half-way: trust no pool row
            # NOTE: the exception stays in the log: its text (paths, tensor shapes, device details)
            # is not for clients, who get this sentence in a 500 or an error event.
            return self._fail(plan.sequences, MODEL_FAILED)
        reasons = self.scheduler.update_from_output(plan, token_ids)
        self.num_steps += 1
        self.observer.on_step(len(plan.decodes) + len(plan.prefills), plan.num_prompt_tokens, len(token_ids))
        return self._postprocess(plan.sampled, token_ids, reasons, logprobs)

    def _execute(self, plan: SchedulerOutput) -> tuple[list[int], list[TokenLogprob | None]]:
        if self._faults is not None and self.is_warm:
            self._faults.before_forward()
        if self._threads is not None:
            self._threads.before_step(plan.num_prompt_tokens)
        requests = self._requests
        rows = [requests[seq.request_id].row for seq in plan.sampled]
        constrained = [i for i, row in enumerate(rows) if row.matcher is not None]
        # The grammar masks are computed while the model runs (models/grammar_masks.py).
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
            if stopped:
                self.scheduler.finish(seq, FinishReason.STOP)  # a no-op if it stopped on its token too
                reason = FinishReason.STOP
            elif reason is not None:
                text += request.detokenizer.flush()
            if reason is not None:
                self._finished(seq, reason)
            lps = [logprob] if logprob is not None else []
            counts, cached = (seq.num_prompt_tokens, seq.num_output_tokens), seq.num_cached_tokens
            queued = seq.queue_time if is_first else None  # the server's load figures take it from here
            outputs.append(RequestOutput(seq.request_id, text, [token_id], *counts, lps, reason, error, cached, queued))
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
            if chunk.start == chunk.seq.num_cached_tokens:  # its first chunk: admitted this step
                chunk.seq.queue_time = now - chunk.seq.arrival_time
                self.observer.on_admitted(chunk.seq.queue_time)
        running = self.scheduler.running
        config = self.config
        if config.max_kv_tokens:  # what bounds admission there: the tokens the running were admitted for
            self.kv_usage = self.scheduler.num_reserved_tokens / config.max_kv_tokens
        else:
            self.kv_usage = sum(seq.num_tokens for seq in running) / (config.max_num_seqs * config.max_model_len)

    def _drain_inbox(self, block: bool, timeout: float | None = None) -> bool:
        """Take in new requests and aborts, waiting for the first at most `timeout` seconds when
        `block` (None: as long as it takes); return False when asked to stop."""
        while True:
            try:
                item = self._inbox.get(block=block, timeout=timeout if block else None)
            except queue.Empty:
                return True
            block = False
            if isinstance(item, _Stop):
                self._fail_all("the server is shutting down")
                return False
            if isinstance(item, str):
                self._abort(item)
                continue
            if not self._intake.arrived(item):  # aborted while its grammar compiled
                self._num_inbox_taken += 1
                continue
            if item.refusal is not None:
                self._num_inbox_taken += 1
                self._publish([error_output(item.seq, item.refusal, FinishReason.INVALID)])
                continue
            try:
                self.scheduler.add(item.seq)
            except ValueError as exc:
                self._num_inbox_taken += 1
                self._publish([error_output(item.seq, str(exc))])
                continue
            self._num_inbox_taken += 1  # after the scheduler counts it
            self._requests[item.seq.request_id] = item
            self._deadline.add(item.seq)

    def _abort(self, request_id: str) -> None:
        if self._intake.abort(request_id):
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
        """The engine's side of a request's end: forget it, count it, settle the KV figure. (The
        load figures count requests, not sequences: the server records them, models/request_load.py.)"""
        self._requests.pop(seq.request_id, None)
        self._settle_kv_usage()
        self.observer.on_finish(reason, self.clock() - seq.arrival_time)

    def _settle_kv_usage(self) -> None:
        # kv_usage is measured when a step is planned; with the batch empty no step follows to
        # bring it down, so zero it here (metrics and the load score read it while idle).
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
        seqs = [request.seq for request in self._requests.values()]
        while True:  # requests still in the inbox get the error too
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, EngineRequest):
                self._num_inbox_taken += 1
                if self._intake.arrived(item):
                    seqs.append(item.seq)
        compiling = self._intake.drain()  # after the inbox: one arriving meanwhile is in this list
        self._num_inbox_taken += len(compiling)
        seqs += [request.seq for request in compiling]
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
        self.observer, self._publish = NULL_OBSERVER, _nothing
        for seq in seqs:
            self._requests[seq.request_id] = EngineRequest.build(seq, self.tokenizer, self.runner.device)
            self.scheduler.add(seq)
        while self.scheduler.has_work:
            self.step()
        self.step()  # an empty step applies the slot moves the last finishes left
        measure_decode_threads(self.runner, self._threads, self.config.max_num_seqs)  # if --num-threads auto
        self.num_steps = 0
        self.observer, self._publish = observer, publish
        log.info("warmup done")
