"""The scheduler: which sequences run this step, and in which KV slot. Pure Python.

No torch, no asyncio, no clock: a synchronous state machine (add, schedule, update_from_output,
finish, abort) that the engine thread drives and that tests drive with made-up token ids. It owns
the per-token bookkeeping, as vLLM's `update_from_output`: which tokens are computed, which token
each sequence sampled, which sequences stop (eos, a stop token, max_tokens, the context length).
Stop strings are matched on text, so the engine's detokenizer finds those and calls `finish`.

Slots stay compact: running sequences occupy slots 0..num_running-1, so one decode step reads one
contiguous block of the KV cache. When a sequence leaves (ends, or is preempted for a better
tier's: models/scheduler/preemption.py), the sequence in the last slot moves into the hole; the
move is reported in the next `SchedulerOutput` and the model runner copies that slot's cache
before the forward pass. The prefix cache's blocks (models/kv/prefix_cache.py) are copied into a
new sequence's slot when it is admitted, out of a slot when its prompt is computed and when it ends.
"""

from __future__ import annotations

from collections.abc import Collection

from models.config import SchedulerConfig
from models.kv.prefix_cache import PrefixCache
from models.scheduler.batch_policy import batch_limit
from models.scheduler.chunk_pacer import ChunkPacer
from models.scheduler.fair_shares import FairShares
from models.scheduler.lanes import WaitingLanes
from models.scheduler.output import BlockCopy, PrefillChunk, SchedulerOutput, SlotMove
from models.scheduler.preemption import victim_for
from models.scheduler.sequence import WARM_SCOPE, FinishReason, Sequence, SequenceStatus


class Scheduler:
    def __init__(self, config: SchedulerConfig, eos_token_ids: Collection[int] = ()) -> None:
        self.config = config
        self.eos_token_ids = frozenset(eos_token_ids)
        # Heap of (priority, fair tag, arrival_order, seq); aborted entries are dropped lazily when
        # they surface.
        self._waiting = WaitingLanes(
            lambda seq: self._waiting_ids.get(seq.request_id) is seq,
            config.heavy_sequence_tokens,
            config.max_num_seqs,
            config.light_lane_share,
        )
        self._shares = FairShares()
        self._waiting_ids: dict[str, Sequence] = {}
        self.num_waiting_tokens = 0  # prompt tokens of the waiting sequences
        self.running: list[Sequence] = []  # running[i].slot == i
        self._pending_moves: list[SlotMove | BlockCopy] = []
        self._num_arrivals = 0
        # K/V tokens the running sequences may reach, each admitted for its whole length
        # (config.max_kv_tokens bounds it where the budget counts tokens).
        self.num_reserved_tokens = 0
        self.num_preempted = 0  # running sequences sent back to the queue for a better tier's
        token_cap = config.max_prompt_chunk_while_decoding
        self.pacer = ChunkPacer(config.max_prompt_chunk_seconds_while_decoding, token_cap)
        # Set by the engine once it knows the model's K/V size (after warmup); None: no caching.
        self.prefix_cache: PrefixCache | None = None

    @property
    def num_waiting(self) -> int:
        return len(self._waiting_ids)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def has_work(self) -> bool:
        return bool(self._waiting_ids or self.running)

    def add(self, seq: Sequence) -> None:
        if seq.num_prompt_tokens == 0:
            raise ValueError("a sequence needs at least one prompt token")
        if seq.num_prompt_tokens >= self.config.max_model_len:
            raise ValueError("the prompt does not fit the model's context length")
        if seq.request_id in self._waiting_ids or any(s.request_id == seq.request_id for s in self.running):
            raise ValueError(f"duplicate request id {seq.request_id!r}")
        self._num_arrivals += 1
        seq.arrival_order = self._num_arrivals
        seq.status = SequenceStatus.WAITING
        self._waiting_ids[seq.request_id] = seq
        self.num_waiting_tokens += seq.num_prompt_tokens
        self._waiting.add((seq.priority, self._shares.tag(seq.share, seq.user), seq.arrival_order, seq))

    def kv_usage(self) -> float:
        """The share of the K/V the running batch holds (0 to 1), for the load score and metrics."""
        config = self.config
        if config.max_kv_tokens:  # what bounds admission there: the tokens the running were admitted for
            return self.num_reserved_tokens / config.max_kv_tokens
        return sum(seq.num_tokens for seq in self.running) / (config.max_num_seqs * config.max_model_len)

    def schedule(self) -> SchedulerOutput:
        """Plan one step.

        Every running sequence that has its prompt computed decodes one token. The rest of the
        token budget (max_num_batched_tokens minus the decode rows) goes to prompt chunks:
        first to sequences already part-way through their prompt, oldest first, then to waiting
        sequences in (priority, fair share, arrival) order while a slot is free (within the batch
        policy's limit) and, where the K/V budget counts tokens, while the next one's whole length
        fits (the first that does not fit waits, and those behind it with it). A prompt larger
        than the budget is split across steps, and while there are decode rows no prompt takes
        more than max_prompt_chunk_while_decoding tokens of a step, nor a longer prompt more than
        the pacer gives it (models/scheduler/chunk_pacer.py).
        """
        if (self.config.preemption or self.config.heavy_sequence_tokens) and self._waiting_ids and self.running:
            self._preempt_for_waiting()  # before the moves are taken: a preemption adds its own
        out = SchedulerOutput(moves=self._pending_moves)
        self._pending_moves = []
        out.decodes = [seq for seq in self.running if not seq.is_prefilling]
        budget = self.config.max_num_batched_tokens - len(out.decodes)
        chunk_cap = self.pacer.cap() if out.decodes else 0
        for seq in self.running:
            if budget <= 0:
                break
            if seq.is_prefilling:
                budget = self._plan_chunk(out, seq, budget, chunk_cap)
        deferred: list[tuple[int, int, int, Sequence]] = []
        limit = batch_limit(self.config, len(self._waiting_ids), len(self.running))
        while budget > 0 and len(self.running) < limit:
            admitted = self._pop_waiting(deferred)
            if admitted is None:
                break
            seq = admitted
            seq.status = SequenceStatus.RUNNING
            seq.slot = len(self.running)
            self.running.append(seq)
            self._load_prefix(out, seq)
            budget = self._plan_chunk(out, seq, budget, chunk_cap)
        for entry in deferred:
            self._waiting.push(entry)
        out.num_slots = len(self.running)
        out.sampled = [chunk.seq for chunk in out.prefills if chunk.completes_prompt] + out.decodes
        return out

    def update_from_output(
        self, out: SchedulerOutput, token_ids: list[int], seconds: float | None = None
    ) -> list[FinishReason | None]:
        """The step's forward pass ran in `seconds` (None: not measured) and `token_ids` were
        sampled, one per `out.sampled` sequence: count its tokens as computed, append each sampled
        token, and finish the sequences that stop on theirs (their slots are free by the next
        step). Returns, per sampled sequence, why it stopped (None: it goes on)."""
        if seconds is not None:
            self.pacer.observe(len(out.decodes), out.num_prompt_tokens, seconds)
        for chunk in out.prefills:
            chunk.seq.num_computed_tokens += chunk.num_tokens
            if chunk.completes_prompt:
                self._keep(chunk.seq)
        for seq in out.decodes:
            seq.num_computed_tokens += 1
        reasons = []
        for seq, token_id in zip(out.sampled, token_ids, strict=True):
            reason = self._append_token(seq, token_id)
            if reason is not None:
                self.finish(seq, reason)
            reasons.append(reason)
        return reasons

    def stopped_on_stop_token(self, seq: Sequence, token_id: int) -> bool:
        """Whether `token_id` ended `seq` as one of its `stop_token_ids` (not as an end token)."""
        params = seq.params
        is_eos = not params.ignore_eos and token_id in self.eos_token_ids
        return not is_eos and token_id in params.stop_token_ids

    def _append_token(self, seq: Sequence, token_id: int) -> FinishReason | None:
        """Record a sampled token; return why the sequence must stop, if it must."""
        seq.output_token_ids.append(token_id)
        params = seq.params
        if not params.ignore_eos and token_id in self.eos_token_ids:
            return FinishReason.STOP
        if token_id in params.stop_token_ids:
            return FinishReason.STOP
        if seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.config.max_model_len:
            return FinishReason.LENGTH
        return None

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """Take a sequence out of the batch (or the queue); its slot is free by the next step."""
        if seq.is_finished:
            return
        if seq.status is SequenceStatus.WAITING:
            # Only if it is this very sequence: a retry may reuse the id of an aborted one.
            if self._waiting_ids.get(seq.request_id) is seq:
                del self._waiting_ids[seq.request_id]
                self.num_waiting_tokens -= seq.num_prompt_tokens
                self._shares.left(seq.share, seq.user)
        else:
            if reason is not FinishReason.ERROR:  # after a failed step its slot is not trusted
                self._keep(seq)
            self._release_slot(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def abort(self, request_id: str) -> Sequence | None:
        seq: Sequence | None = self._waiting_ids.get(request_id)
        if seq is None:
            seq = next((s for s in self.running if s.request_id == request_id), None)
        if seq is not None:
            self.finish(seq, FinishReason.ABORT)
        return seq

    def _plan_chunk(self, out: SchedulerOutput, seq: Sequence, budget: int, paced: int) -> int:
        """Plan the next chunk of seq's prompt, at most `paced` tokens (0: no cap) if the prompt is
        longer than max_prompt_chunk_while_decoding (prompts within it go whole); return the budget
        left for other prompts this step. None when the chunk leaves its prompt part-way: one
        prompt at a time is, and the prompts behind it wait rather than share its steps."""
        cap = paced if seq.num_prefill_tokens > self.config.max_prompt_chunk_while_decoding else 0
        num_tokens = min(seq.num_prefill_tokens - seq.num_computed_tokens, budget, cap or budget)
        chunk = PrefillChunk(seq, seq.num_computed_tokens, num_tokens)
        out.prefills.append(chunk)
        return budget - num_tokens if chunk.completes_prompt else 0

    def forget_prefixes(self) -> None:
        """Drop every cached prefix: the pool's contents can no longer be trusted."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    def _load_prefix(self, out: SchedulerOutput, seq: Sequence) -> None:
        """Start an admitted sequence from the longest cached prefix of its prompt. At least one
        prompt token is left to compute: its logits give the first sampled token."""
        cache = self.prefix_cache
        if cache is None:
            return
        rows = cache.match(seq.prefix_scope, seq.prefill_token_ids, seq.num_prefill_tokens - 1)
        if rows:
            out.loads.append(BlockCopy(seq.slot, 0, rows))
            seq.num_computed_tokens = len(rows) * cache.block_size
            if not seq.num_preemptions:  # what the client is told came from the cache: its prompt's
                seq.num_cached_tokens = seq.num_computed_tokens

    def _keep(self, seq: Sequence) -> None:
        """Keep the computed tokens' whole blocks (prompt, and generated tokens at the end) in the
        prefix cache; the copies run first thing in the next step, before the slot is reused."""
        cache = self.prefix_cache
        if cache is None or seq.slot < 0:
            return
        num_tokens = seq.num_computed_tokens
        is_warm = seq.prefix_scope == WARM_SCOPE  # a warm template: its prompt only, pinned
        if is_warm:
            num_tokens = min(num_tokens, seq.num_prompt_tokens)
        tokens = (
            seq.prompt_token_ids if num_tokens <= seq.num_prompt_tokens else seq.prompt_token_ids + seq.output_token_ids
        )
        first, rows = cache.insert(seq.prefix_scope, tokens, num_tokens, pin=is_warm)
        if rows:
            self._pending_moves.append(BlockCopy(seq.slot, first, rows))

    def _waits_for_prefix(self, seq: Sequence) -> bool:
        """Whether a running sequence is computing the next block of seq's prompt that the cache
        lacks: seq then waits (a step, or a long prompt's few) and reuses it rather than compute
        it a second time. The n choices of one prompt, or a burst sharing a system prompt."""
        cache = self.prefix_cache
        if cache is None:
            return False
        limit = seq.num_prompt_tokens - 1
        end = cache.cached_length(seq.prefix_scope, seq.prompt_token_ids, limit) + cache.block_size
        if end > limit:
            return False
        head = seq.prompt_token_ids[:end]
        for other in self.running:
            if (
                other.is_prefilling
                and other.num_prompt_tokens >= end
                and other.prefix_scope == seq.prefix_scope
                and other.prompt_token_ids[:end] == head
            ):
                return True
        return False

    def _pop_waiting(self, deferred: list[tuple[int, int, int, Sequence]]) -> Sequence | None:
        """The next waiting sequence to admit; those that wait for a prefix being computed go to
        `deferred` (the caller puts them back), at most max_num_seqs of them a step."""
        while (entry := self._waiting.pop(self._waiting.heavy_allowed(self.running))) is not None:
            _, tag, _, seq = entry
            if self._waiting_ids.get(seq.request_id) is seq:
                if len(deferred) < self.config.max_num_seqs and self._waits_for_prefix(seq):
                    deferred.append(entry)
                    continue
                reserved = self._reserved_tokens(seq)
                bound = self.config.max_kv_tokens
                # Alone, a sequence always runs: a config the budget fitted never needs this, one
                # built by hand with a bound below max_model_len must not wait for ever.
                if bound and self.num_reserved_tokens and self.num_reserved_tokens + reserved > bound:
                    self._waiting.push(entry)  # first in line until the K/V has room
                    return None
                del self._waiting_ids[seq.request_id]
                self.num_waiting_tokens -= seq.num_prompt_tokens
                self._shares.took(seq.share, tag, seq.user)
                self.num_reserved_tokens += reserved
                return seq
        return None

    def _preempt_for_waiting(self) -> None:
        """While the first waiting sequences find no room (slots, or the K/V budget) and running
        ones are of a less important tier, those go back to the queue, their computed blocks to
        the prefix cache (models/scheduler/preemption.py). At most max_num_seqs a step."""
        heads = [entry[3] for entry in (self._waiting.head(False), self._waiting.head(True)) if entry is not None]
        if all(self._victim(head) is None for head in heads):
            return  # the common case, a full batch and a queue of its own tier and lane: one look
        bound, limit = self.config.max_kv_tokens, self.config.max_num_seqs
        reserved, taken = self.num_reserved_tokens, 0  # what the sequences ahead will take
        for *_, waiting in self._waiting.candidates(limit):
            needs = reserved + self._reserved_tokens(waiting)
            if len(self.running) + taken < limit and not (bound and needs > bound):
                reserved, taken = needs, taken + 1
                continue  # it finds room as things are
            victim = self._victim(waiting)
            if victim is None:
                continue  # it waits, and takes no place from those behind it
            reserved, taken = needs - self._reserved_tokens(victim), taken + 1
            self._keep(victim)
            self._release_slot(victim)
            victim.preempt()
            self._waiting_ids[victim.request_id] = victim
            self.num_waiting_tokens += victim.num_prompt_tokens
            tag = self._shares.tag(victim.share, victim.user)
            self._waiting.push((victim.priority, tag, victim.arrival_order, victim))
            self.num_preempted += 1

    def _victim(self, head: Sequence) -> Sequence | None:
        return victim_for(self.running, head, self.config.preemption, self._waiting.heavy_share)

    def _reserved_tokens(self, seq: Sequence) -> int:
        """The K/V a sequence may fill: its prompt and max_tokens (never past max_model_len), and
        the pages it fills only in part."""
        longest = min(self.config.max_model_len, seq.num_prompt_tokens + seq.params.max_tokens)
        return longest + self.config.kv_slack_tokens

    def _release_slot(self, seq: Sequence) -> None:
        self.num_reserved_tokens -= self._reserved_tokens(seq)
        hole = seq.slot
        last = self.running.pop()
        if last is not seq:
            self.running[hole] = last
            last.slot = hole
            # NOTE: cache positions of a mid-prefill sequence beyond num_computed_tokens are garbage
            # and a decoding one's are all computed, so num_computed_tokens bounds the copy.
            self._pending_moves.append(SlotMove(src=len(self.running), dst=hole, num_tokens=last.num_computed_tokens))
        seq.slot = -1
