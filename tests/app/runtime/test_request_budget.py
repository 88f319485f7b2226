"""The request budget's arithmetic (app/runtime/request_budget.py); its 400s and a lowered default go
through a real server in tests/app/test_bad_input.py."""

from __future__ import annotations

import pytest

from app.config.settings import Settings
from app.runtime.request_budget import RequestBudget
from middleware.errors import OpenAIError

BUDGET = RequestBudget(tokens=2048, output=2000)


def fit(prompt_lens: list[int], n: int, max_tokens: int, *, explicit: bool, top: int | None = None) -> int:
    return BUDGET.fit(
        prompt_lens=prompt_lens, n=n, max_tokens=max_tokens, is_explicit=explicit, top_logprobs=top, param="prompt"
    )


def test_a_request_within_both_budgets_keeps_its_max_tokens() -> None:
    assert fit([10], 1, 54, explicit=True, top=20) == 54
    assert fit([2] * 32, 2, 30, explicit=False) == 30  # 128 + 64 x 30 = 2048: exactly the budget


def test_a_left_out_max_tokens_is_lowered_to_the_work_budget() -> None:
    # 32 prompts of 2 tokens, n = 2: 64 sequences, 128 tokens of prefill; (2048 - 128) // 64 = 30 each.
    assert fit([2] * 32, 2, 62, explicit=False) == 30


def test_a_left_out_max_tokens_is_lowered_to_the_output_budget() -> None:
    assert fit([10], 16, 54, explicit=False, top=20) == 2000 // (16 * 21)
    assert fit([1], 16, 200, explicit=False, top=0) == 2000 // 16  # logprobs of the chosen token only


def test_an_explicit_max_tokens_past_a_budget_is_a_400_naming_max_tokens() -> None:
    with pytest.raises(OpenAIError, match="asks for up to 2304 tokens") as work:
        fit([1] * 128, 2, 8, explicit=True)
    assert work.value.param == "max_tokens" and work.value.status_code == 400
    with pytest.raises(OpenAIError, match="3360 output tokens and log probabilities"):
        fit([10], 16, 10, explicit=True, top=20)


def test_prompts_alone_past_the_work_budget_are_a_400_naming_the_prompt() -> None:
    with pytest.raises(OpenAIError, match="allows 2048 per request") as refused:
        fit([20] * 128, 1, 40, explicit=False)
    assert refused.value.param == "prompt"


def test_the_default_work_budget_follows_the_context_length() -> None:
    assert RequestBudget.of(Settings(), 4096).tokens == 32 * 4096
    assert RequestBudget.of(Settings(max_request_tokens=5000), 4096).tokens == 5000


def test_the_default_body_limit_is_16_bytes_a_budget_token_within_1_to_32_mib() -> None:
    assert RequestBudget.of(Settings(), 4096).body_bytes == 16 * 32 * 4096  # 2 MiB
    assert RequestBudget.of(Settings(), 64).body_bytes == 1024 * 1024
    assert RequestBudget.of(Settings(), 131_072).body_bytes == 32 * 1024 * 1024
