"""Tool-call grammars on the tiny tokenizer: random logits sampled under each format's grammar
always give a reply its own parser reads as valid calls (arguments valid under the tool's
schema), in the number the choice allows; `auto` lets text through until the tag."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from app.tools.formats import FORMATS
from app.tools.grammar import CallGrammar, FunctionSpec, hermes_grammar, llama3_grammar, mistral_grammar
from models.grammar.compiler import GrammarCompiler
from models.grammar.masks import fill_disallowed
from models.loading import tiny
from models.sampling.params import SamplingParams
from models.sampling.sampler import Sampler, SamplingRow, make_generator

WEATHER = FunctionSpec(
    "get_weather",
    {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
)
NOW = FunctionSpec("now", None)
GRAMMARS: dict[str, Callable[[CallGrammar], str]] = {
    "hermes": hermes_grammar,
    "llama3_json": llama3_grammar,
    "mistral": mistral_grammar,
}


@pytest.fixture(scope="module")
def hf_tokenizer() -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(tiny.ensure_tokenizer())


@pytest.fixture(scope="module")
def compiler(hf_tokenizer: PreTrainedTokenizerBase) -> GrammarCompiler:
    return GrammarCompiler(hf_tokenizer, len(hf_tokenizer), (tiny.IM_END_ID,))


def sample(
    compiler: GrammarCompiler,
    hf: PreTrainedTokenizerBase,
    grammar: str,
    seed: int,
    bias: dict[int, float],
    max_tokens: int = 300,
) -> str:
    """A reply sampled from random logits under `grammar`; it must end within max_tokens unless
    that is below 300 (then it is cut there)."""
    compiler.check(grammar)
    params = SamplingParams(max_tokens=300, seed=seed, grammar=grammar, logit_bias=bias)
    output: list[int] = []
    row = SamplingRow(params, make_generator(seed, torch.device("cpu")), output, compiler.matcher(grammar))
    sampler = Sampler(compiler.vocab_size, torch.device("cpu"))
    logits = torch.Generator().manual_seed(seed)
    for _ in range(max_tokens):
        token_id = sampler(torch.randn(1, compiler.vocab_size, generator=logits) * 3, [row]).token_ids[0]
        if token_id == tiny.IM_END_ID:
            break
        output.append(token_id)
        assert row.matcher is not None and row.matcher.consume_token(token_id)
        if row.matcher.is_stopped():
            break
    else:
        if max_tokens >= 300:
            raise AssertionError(f"no end in {max_tokens} tokens: {hf.decode(output)!r}")
    return str(hf.decode(output))


def check_calls(reply: Any, allowed: list[FunctionSpec]) -> None:
    by_name = {function.name: function for function in allowed}
    for call in reply.calls:
        arguments = json.loads(call.arguments)
        schema = by_name[call.name].parameters or {"type": "object", "maxProperties": 0}
        jsonschema.validate(arguments, schema)


@pytest.mark.parametrize("fmt", list(GRAMMARS))
@pytest.mark.parametrize("parallel", [True, False])
def test_required_always_gives_valid_calls(
    compiler: GrammarCompiler, hf_tokenizer: PreTrainedTokenizerBase, fmt: str, parallel: bool
) -> None:
    grammar = GRAMMARS[fmt](CallGrammar([WEATHER, NOW], "required", parallel, terminal=compiler.terminal))
    for seed in range(4):
        text = sample(compiler, hf_tokenizer, grammar, seed, {})
        reply = FORMATS[fmt].parse(text)
        assert reply.content is None and reply.calls, text
        assert parallel or len(reply.calls) == 1
        check_calls(reply, [WEATHER, NOW])


@pytest.mark.parametrize("fmt", list(GRAMMARS))
def test_a_named_tool_is_the_one_call(
    compiler: GrammarCompiler, hf_tokenizer: PreTrainedTokenizerBase, fmt: str
) -> None:
    grammar = GRAMMARS[fmt](CallGrammar([WEATHER], "named", True, terminal=compiler.terminal))
    for seed in range(3):
        reply = FORMATS[fmt].parse(sample(compiler, hf_tokenizer, grammar, seed, {}))
        assert [call.name for call in reply.calls] == ["get_weather"]
        check_calls(reply, [WEATHER])


def test_auto_is_free_text_until_the_tag_then_a_valid_call(
    compiler: GrammarCompiler, hf_tokenizer: PreTrainedTokenizerBase
) -> None:
    grammar = hermes_grammar(CallGrammar([WEATHER, NOW], "auto", True, terminal=compiler.terminal))
    # Without a push the random model writes text (the tag is one token in 8192).
    for seed in range(3):
        text = sample(compiler, hf_tokenizer, grammar, seed, {tiny.IM_END_ID: -100.0}, max_tokens=60)
        assert not FORMATS["hermes"].parse(text).calls and "<tool_call>" not in text
    # Pushed towards the tag, it opens a call, and the call is then held to the grammar.
    for seed in range(3):
        text = sample(compiler, hf_tokenizer, grammar, seed, {tiny.TOOL_CALL_ID: 12.0})
        reply = FORMATS["hermes"].parse(text)
        assert reply.calls, text
        check_calls(reply, [WEATHER, NOW])


def test_auto_text_can_never_contain_the_tag(compiler: GrammarCompiler) -> None:
    grammar = hermes_grammar(CallGrammar([WEATHER], "auto", False, terminal=compiler.terminal))
    compiler.check(grammar)
    matcher = compiler.matcher(grammar)
    for token_id in compiler._hf.encode("plain words ", add_special_tokens=False):  # type: ignore[attr-defined]
        assert matcher.consume_token(token_id)
    assert matcher.consume_token(tiny.TOOL_CALL_ID)  # the tag opens the call...
    allowed = (~fill_disallowed([matcher], compiler.vocab_size)[0]).nonzero().squeeze(1).tolist()
    assert allowed == compiler._hf.encode("\n", add_special_tokens=False)  # type: ignore[attr-defined]


def test_a_response_format_replaces_free_text_in_auto(
    compiler: GrammarCompiler, hf_tokenizer: PreTrainedTokenizerBase
) -> None:
    content = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    with_content = {**content, "x-guidance": {"whitespace_flexible": False}}
    grammar = hermes_grammar(CallGrammar([WEATHER], "auto", True, with_content, compiler.terminal))
    for seed in range(3):
        reply = FORMATS["hermes"].parse(sample(compiler, hf_tokenizer, grammar, seed, {}))
        if not reply.calls:
            jsonschema.validate(json.loads(reply.content or ""), content)
