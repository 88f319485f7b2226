"""Request-level load figures (models/load/requests.py): one sample per request, by tier, on an
injected clock and made-up outputs."""

from __future__ import annotations

from models.engine.outputs import RequestOutput
from models.load.requests import RequestLoad
from models.load.stats import LoadStats
from models.scheduler.sequence import FinishReason


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(min_finishes: int = 20) -> tuple[RequestLoad, Clock]:
    clock = Clock()
    stats = LoadStats(clock=clock, min_finishes=min_finishes, max_age_seconds=0.0, half_life_seconds=None)
    return RequestLoad(stats, clock), clock


def token(request_id: str, queue_time: float | None = None, reason: FinishReason | None = None) -> RequestOutput:
    return RequestOutput(request_id, "x", [7], 3, 1, finish_reason=reason, queue_time=queue_time)


def failed(request_id: str) -> RequestOutput:
    return RequestOutput(request_id, "", [], 3, 0, finish_reason=FinishReason.ERROR, error="the model failed")


def test_one_request_of_256_sequences_is_one_sample() -> None:
    """The attack (issue 34): 16 prompts x n 16 was 256 queue-time, TTFT and finish samples; two
    such requests failing made the error rate 1.0 (degradation level 3 for every tenant), and their
    later sequences' waits made the queue-time p90 whatever the last of them waited."""
    load, clock = make()
    for request in range(2):
        track = load.start(256, tier=2)
        ids = [f"r{request}-{i}" for i in range(256)]
        for i, request_id in enumerate(ids):
            clock.now += 0.1
            track.output(token(request_id, queue_time=0.2 + i))  # the first admitted waited 0.2 s
        for request_id in ids:
            track.output(failed(request_id))
    stats = load.stats
    assert [len(stats._queue_times[2]), len(stats._ttfts[2]), len(stats._finishes[2])] == [2, 2, 2]
    queue_p90, _, error_rate = load.window(2)
    assert queue_p90 == 0.2  # each request's first sequence, not its 256th
    assert error_rate == 0.0  # two requests: under the floor of 20, as two failed requests should be


def test_no_finish_but_a_server_error_counts_as_an_error() -> None:
    """Issue 34: a finish the request's own input caused (a grammar that rejects every token: the
    engine's client-error reason) is not a server error, nor is running out of tokens or of queue
    time. Every reason but ERROR (and ABORT, which is no finish) is checked, whichever exist."""
    load, _ = make(min_finishes=1)
    reasons = [reason for reason in FinishReason if reason not in (FinishReason.ERROR, FinishReason.ABORT)]
    for reason in reasons:
        track = load.start(2)
        track.output(token("a", 0.0, reason))
        track.output(token("b", 0.0, reason))
    assert load.window()[2] == 0.0
    track = load.start(3)  # one of three sequences fails: the request failed, once
    track.output(token("a", 0.0, FinishReason.STOP))
    track.output(failed("b"))
    track.end()  # its route stopped on the error and aborted the third
    assert load.window()[2] == 1 / (len(reasons) + 1)
    assert len(load.stats._finishes[0]) == len(reasons) + 1


def test_a_request_its_client_left_is_not_a_finish() -> None:
    load, _ = make(min_finishes=1)
    track = load.start(2)
    track.output(token("a", 0.0))
    track.end()
    track.end()  # once or more
    assert 0 not in load.stats._finishes and load.num_waiting() == 0


def test_waiting_sequences_by_tier_and_share_until_their_first_output() -> None:
    load, _ = make()
    low = load.start(4, tier=2, share="key:a")
    high = load.start(1, tier=0, share="key:b")
    assert (load.num_waiting(0), load.num_waiting(1), load.num_waiting(2), load.num_waiting()) == (1, 1, 5, 5)
    assert (load.num_waiting_of("key:a"), load.num_waiting_of("key:b"), load.num_waiting_of("key:c")) == (4, 1, 0)
    assert load.lowest_tier_in_flight() == 2
    assert not load.bears_shared_load(0) and load.bears_shared_load(2) and load.bears_shared_load(3)
    low.output(token("a-0", 0.0))
    assert load.num_waiting(2) == 4 and load.num_waiting_of("key:a") == 3
    low.end()  # aborted: its unstarted sequences leave the counts
    assert load.num_waiting() == 1 and load.num_waiting_of("key:a") == 0
    assert load.lowest_tier_in_flight() == 0 and load.bears_shared_load(0)
    high.output(token("b", 0.0, FinishReason.STOP))
    assert load.num_waiting() == 0 and load.lowest_tier_in_flight() is None


def test_a_request_still_waiting_counts_with_its_wait_so_far_in_its_tier_only() -> None:
    load, clock = make()
    track = load.start(1, tier=1)
    clock.now = 6.0
    assert load.window(1)[0] == 6.0
    assert load.window(0)[0] == 0.0
    clock.now = 7.0
    track.output(token("a", queue_time=6.5))  # its first output: the engine's own measure
    assert load.window(1)[0] == 6.5


def test_a_request_that_ends_unrun_waited_until_its_end() -> None:
    load, clock = make()
    track = load.start(1)
    clock.now = 120.0
    track.output(RequestOutput("a", "", [], 3, 0, finish_reason=FinishReason.REJECTED, error="waited too long"))
    assert load.window()[0] == 120.0 and load.window()[1] == 0.0  # no token: no TTFT sample
