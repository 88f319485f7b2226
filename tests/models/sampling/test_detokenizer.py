"""Tests for models/sampling/detokenizer.py, with the embedded tiny model's real byte-level BPE tokenizer.

A byte-level BPE splits multi-byte characters across tokens (and some tokens hold the end of one
character and the start of the next), which is exactly what incremental detokenisation must get right.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from models.loading import tiny
from models.loading.tokenizer import Tokenizer
from models.sampling.detokenizer import IncrementalDetokenizer

REPLACEMENT_CHAR = "\ufffd"

UNICODE_TEXTS = [
    "Café naïve — déjà vu, señor Ångström; Œuvre à Zürich.",
    "日本語のテキスト、中文字符和한국어 문장。",
    "Emoji: 😀👍🏽 family 👨\u200d👩\u200d👧\u200d👦 flag 🇯🇵 keycap 1\ufe0f\u20e3 done",
    "4-byte: 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𠜎𠜱𠝹 🜁🜂 and back to ASCII.",
    "Mixed: naïve 日本 😀 𝔘 é\u0301 (combining) — ok",
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(tiny.build_tokenizer())


def _push_all(detok: IncrementalDetokenizer, token_ids: Sequence[int]) -> tuple[list[str], bool]:
    """Push tokens one at a time as the engine does, until a stop string matches; return the deltas."""
    deltas = []
    for token_id in token_ids:
        delta, stopped = detok.push(token_id)
        deltas.append(delta)
        if stopped:
            return deltas, True
    return deltas, False


def _assert_whole_characters(deltas: list[str]) -> None:
    for delta in deltas:
        assert REPLACEMENT_CHAR not in delta, delta
        # A lone surrogate (half a character) would not encode.
        assert delta.encode("utf-8").decode("utf-8") == delta


def _long_text(rng: random.Random, num_words: int) -> str:
    words = [
        "the",
        "cache",
        "slot",
        "naïve",
        "Zürich",
        "日本語",
        "テキスト",
        "😀",
        "👍🏽",
        "𝔘𝔫𝔦",
        "𠜎",
        "é\u0301",
        "42,",
    ]
    return " ".join(rng.choice(words) for _ in range(num_words))


# --- streaming whole characters --------------------------------------------------------------


def test_tokenizer_splits_characters_across_tokens(tokenizer: Tokenizer) -> None:
    # The premise of the tests below: some single tokens are not whole characters.
    split = [i for text in UNICODE_TEXTS for i in tokenizer.encode(text) if REPLACEMENT_CHAR in tokenizer.decode([i])]
    assert len(split) > 20


@pytest.mark.parametrize("text", UNICODE_TEXTS)
def test_unicode_text_streams_exactly_in_whole_characters(tokenizer: Tokenizer, text: str) -> None:
    ids = tokenizer.encode(text)
    detok = IncrementalDetokenizer(tokenizer.decode, tokenizer.encode("Prompt: "))

    deltas, stopped = _push_all(detok, ids)

    assert not stopped
    _assert_whole_characters(deltas)
    assert "".join(deltas) == text
    assert detok.text == text
    assert detok.flush() == ""


def test_partial_characters_are_held_back_not_dropped(tokenizer: Tokenizer) -> None:
    text = "😀👍🏽𠜎"
    ids = tokenizer.encode(text)
    detok = IncrementalDetokenizer(tokenizer.decode, [])

    deltas, _ = _push_all(detok, ids)

    # Fewer non-empty deltas than tokens: the tokens of a split character wait for the last one.
    assert "" in deltas
    _assert_whole_characters(deltas)
    assert "".join(deltas) == text


def test_empty_prompt_streams_exactly(tokenizer: Tokenizer) -> None:
    text = UNICODE_TEXTS[2]
    detok = IncrementalDetokenizer(tokenizer.decode, [])
    deltas, _ = _push_all(detok, tokenizer.encode(text))
    _assert_whole_characters(deltas)
    assert "".join(deltas) == text


def test_output_cut_in_the_middle_of_a_character_emits_no_half_character(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("ok 𠜎")
    assert REPLACEMENT_CHAR in tokenizer.decode(ids[:-1])  # the last token completes the character

    detok = IncrementalDetokenizer(tokenizer.decode, [])
    deltas, _ = _push_all(detok, ids[:-1])  # max_tokens ends the sequence here
    deltas.append(detok.flush())

    _assert_whole_characters(deltas)
    assert "".join(deltas) == "ok "


def test_literal_replacement_character_mid_text_is_emitted(tokenizer: Tokenizer) -> None:
    text = "bad \ufffd byte"
    detok = IncrementalDetokenizer(tokenizer.decode, [])
    deltas, _ = _push_all(detok, tokenizer.encode(text))
    assert "".join(deltas) == text


@pytest.mark.xfail(
    strict=True,
    reason="bug: push() treats any window ending in U+FFFD as an incomplete character and holds its "
    "tokens back, and flush() releases only self.text, so a literal U+FFFD that ends the output is lost",
)
def test_literal_replacement_character_at_the_end_is_not_dropped(tokenizer: Tokenizer) -> None:
    text = "bad byte: \ufffd"
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    detok = IncrementalDetokenizer(tokenizer.decode, [])

    deltas, _ = _push_all(detok, ids)

    assert "".join(deltas) + detok.flush() == text


# --- prompt context --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prompt",
    ["", "x", "A long system prompt with 日本語 and emoji 😀 at the very end 👍🏽", "ends with a space "],
)
def test_prompt_text_does_not_leak_into_the_output(tokenizer: Tokenizer, prompt: str) -> None:
    output = " Hello there, 世界 🌍!"
    detok = IncrementalDetokenizer(tokenizer.decode, tokenizer.encode(prompt))

    deltas, _ = _push_all(detok, tokenizer.encode(output))

    assert "".join(deltas) == output


def test_stop_string_inside_the_prompt_does_not_stop_the_output(tokenizer: Tokenizer) -> None:
    output = "OP and then more"
    detok = IncrementalDetokenizer(tokenizer.decode, tokenizer.encode("Say STOP, then ST"), stop=["STOP"])

    deltas, stopped = _push_all(detok, tokenizer.encode(output))

    assert not stopped
    assert "".join(deltas) + detok.flush() == output


# --- stop strings ----------------------------------------------------------------------------


def test_stop_string_spanning_several_tokens_is_matched_and_not_emitted(tokenizer: Tokenizer) -> None:
    stop = "### The End ###"
    ids = tokenizer.encode("Once upon a time, 日本 😀. " + stop + " epilogue that must not appear")
    assert len(tokenizer.encode(stop)) >= 3
    detok = IncrementalDetokenizer(tokenizer.decode, tokenizer.encode("Tell a story:"), stop=[stop])

    deltas, stopped = _push_all(detok, ids)

    assert stopped
    assert len(deltas) < len(ids)  # the engine pushes nothing after the stop
    _assert_whole_characters(deltas)
    assert "".join(deltas) == "Once upon a time, 日本 😀. "
    assert detok.text == "Once upon a time, 日本 😀. "
    assert detok.flush() == ""


def test_text_before_a_stop_string_in_the_same_token_is_emitted(tokenizer: Tokenizer) -> None:
    text = "hello world"
    ids = tokenizer.encode(text)
    detok = IncrementalDetokenizer(tokenizer.decode, [], stop=["o w"])

    deltas, stopped = _push_all(detok, ids)

    assert stopped
    assert "".join(deltas) == "hell"


def test_possible_stop_prefix_is_held_back_then_released(tokenizer: Tokenizer) -> None:
    stop = "the end!"
    text = "wait for it: the end is near, the end."
    ids = tokenizer.encode(text)
    detok = IncrementalDetokenizer(tokenizer.decode, [], stop=[stop])

    emitted = ""
    held_back_at = []
    for n, token_id in enumerate(ids, start=1):
        delta, stopped = detok.push(token_id)
        assert not stopped
        emitted += delta
        decoded = tokenizer.decode(ids[:n])
        assert decoded.startswith(emitted)
        # Exactly the tail that could still grow into the stop string is held back.
        held = decoded[len(emitted) :]
        assert stop.startswith(held) and held != stop
        if decoded.endswith("the end"):
            assert held == "the end"
            held_back_at.append(n)

    assert len(held_back_at) == 2  # both "the end"s were held, and both released
    assert emitted == text


def test_flush_releases_text_held_back_for_a_stop_string(tokenizer: Tokenizer) -> None:
    text = "and the story ends with the e"
    detok = IncrementalDetokenizer(tokenizer.decode, [], stop=["the end"])

    deltas, stopped = _push_all(detok, tokenizer.encode(text))

    assert not stopped
    assert "".join(deltas) == "and the story ends with "
    assert detok.flush() == "the e"
    assert detok.flush() == ""


def test_earliest_of_several_stop_strings_wins_over_list_order(tokenizer: Tokenizer) -> None:
    # Both stop strings complete on the same character; "the end" starts earlier.
    detok = IncrementalDetokenizer(tokenizer.decode, [], stop=["end", "the end"])

    deltas, stopped = _push_all(detok, tokenizer.encode("and that is the end of it"))

    assert stopped
    assert "".join(deltas) == "and that is "


def test_first_stop_string_to_appear_wins(tokenizer: Tokenizer) -> None:
    detok = IncrementalDetokenizer(tokenizer.decode, [], stop=["STOP", "HALT"])

    deltas, stopped = _push_all(detok, tokenizer.encode("go go HALT then STOP"))

    assert stopped
    assert "".join(deltas) == "go go "


def test_stop_string_at_the_very_start_emits_nothing(tokenizer: Tokenizer) -> None:
    stop = "STOP here"
    detok = IncrementalDetokenizer(tokenizer.decode, tokenizer.encode("prompt"), stop=[stop])

    deltas, stopped = _push_all(detok, tokenizer.encode(stop + " and the rest"))

    assert stopped
    assert deltas == [""] * len(deltas)
    assert detok.text == ""
    assert detok.flush() == ""


def test_empty_stop_string_is_ignored(tokenizer: Tokenizer) -> None:
    text = "nothing stops this"
    detok = IncrementalDetokenizer(tokenizer.decode, [], stop=[""])
    deltas, stopped = _push_all(detok, tokenizer.encode(text))
    assert not stopped
    assert "".join(deltas) == text


def test_stop_string_made_of_multibyte_characters(tokenizer: Tokenizer) -> None:
    detok = IncrementalDetokenizer(tokenizer.decode, [], stop=["😀👍🏽"])

    deltas, stopped = _push_all(detok, tokenizer.encode("日本語 😀 not yet, 😀👍🏽 now"))

    assert stopped
    _assert_whole_characters(deltas)
    assert "".join(deltas) == "日本語 😀 not yet, "


# --- long outputs and the context window -----------------------------------------------------


@pytest.mark.parametrize("num_prompt_tokens", [0, 3, 5, 12])
def test_long_output_decodes_exactly_across_window_trims(tokenizer: Tokenizer, num_prompt_tokens: int) -> None:
    text = _long_text(random.Random(num_prompt_tokens), num_words=300)
    ids = tokenizer.encode(text)
    assert len(ids) > 400
    prompt = tokenizer.encode("prompt words " * 10)[:num_prompt_tokens]
    window_lens = []

    def decode(token_ids: Sequence[int]) -> str:
        window_lens.append(len(token_ids))
        return tokenizer.decode(token_ids)

    detok = IncrementalDetokenizer(decode, prompt)
    deltas, _ = _push_all(detok, ids)

    _assert_whole_characters(deltas)
    assert "".join(deltas) == text
    # Each decode sees a short window, however long the output grows.
    assert max(window_lens) < 80


def test_stop_string_found_at_every_offset_around_the_window_trim(tokenizer: Tokenizer) -> None:
    stop = "<<STOP>>"
    body_ids = tokenizer.encode(_long_text(random.Random(7), num_words=120))
    prompt = tokenizer.encode("prompt:")
    for cut in range(50, 90):
        before = tokenizer.decode(body_ids[:cut])
        if REPLACEMENT_CHAR in before:
            continue  # cut inside a character
        ids = body_ids[:cut] + tokenizer.encode(stop + " after")
        detok = IncrementalDetokenizer(tokenizer.decode, prompt, stop=["nope", stop])

        deltas, stopped = _push_all(detok, ids)

        assert stopped, cut
        assert "".join(deltas) == before, cut


def test_long_output_with_held_back_prefixes_decodes_exactly(tokenizer: Tokenizer) -> None:
    # "the" is a prefix of the stop string, so text is held back and released again and again.
    text = _long_text(random.Random(3), num_words=300)
    detok = IncrementalDetokenizer(tokenizer.decode, [], stop=["the cache is full"])

    deltas, stopped = _push_all(detok, tokenizer.encode(text))

    assert not stopped
    _assert_whole_characters(deltas)
    assert "".join(deltas) + detok.flush() == text
