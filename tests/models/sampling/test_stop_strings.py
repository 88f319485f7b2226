"""The stop-string automata against the obvious search, on random texts fed in random pieces."""

from __future__ import annotations

import random

from models.sampling.stop_strings import StopStrings


def naive(text: str, added: str, stops: list[str]) -> tuple[int | None, int]:
    """(where the earliest stop string that `added` completes starts, the held tail) by search."""
    longest = max(len(s) for s in stops)
    search_from = max(0, len(text) - longest + 1)
    whole = text + added
    starts = [i for i in (whole.find(s, search_from) for s in stops) if i >= 0]
    if starts:
        return min(starts), 0
    for n in range(min(longest - 1, len(whole)), 0, -1):
        if any(s.startswith(whole[-n:]) for s in stops):
            return None, n
    return None, 0


def test_the_automata_agree_with_searching_the_text() -> None:
    rng = random.Random(0)
    for _ in range(3000):
        alphabet = "ab" if rng.random() < 0.7 else "abc"
        stops = ["".join(rng.choices(alphabet, k=rng.randint(1, 6))) for _ in range(rng.randint(1, 4))]
        matcher, text = StopStrings(stops), ""
        for _ in range(30):
            added = "".join(rng.choices(alphabet, k=rng.randint(1, 4)))
            expected_hit, expected_held = naive(text, added, stops)
            hit = matcher.feed(added, len(text))
            assert hit == expected_hit, (stops, text, added)
            if hit is not None:
                break
            text += added
            assert matcher.held == expected_held, (stops, text)


def test_a_long_stop_string_is_found_across_many_pieces() -> None:
    stop = "ab" * 300 + "c"
    matcher = StopStrings([stop, "zz"])
    text = "x" + "ab" * 400 + "c"
    found = None
    for start in range(0, len(text), 3):
        found = matcher.feed(text[start : start + 3], start)
        if found is not None:
            break
    assert found == text.index(stop)
