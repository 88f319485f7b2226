"""Grammars on the tiny tokenizer: checks name the problem, masks agree with the matcher, and the
sampler never picks a token the grammar forbids, whatever the logits, bias or sampling mode."""

from __future__ import annotations

import json
import random
import threading
from typing import Any

import jsonschema
import pytest
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from models.grammar.compiler import TOO_COMPLEX, GrammarCompiler, GrammarError, client_message, json_schema_grammar
from models.grammar.masks import fill_disallowed
from models.loading import tiny
from models.sampling.params import SamplingParams
from models.sampling.sampler import Sampler, SamplingRow, make_generator

CPU = torch.device("cpu")
EOS = (tiny.IM_END_ID, tiny.ENDOFTEXT_ID)
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "minItems": 1, "maxItems": 3},
        "ok": {"type": "boolean"},
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
    },
    "required": ["name", "age", "tags", "ok", "zip"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def hf_tokenizer() -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(tiny.ensure_tokenizer())


@pytest.fixture(scope="module")
def compiler(hf_tokenizer: PreTrainedTokenizerBase) -> GrammarCompiler:
    return GrammarCompiler(hf_tokenizer, len(hf_tokenizer), EOS)


def test_a_schema_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(GrammarError):
        json_schema_grammar([1, 2])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ({"type": "array", "uniqueItems": True}, "uniqueItems"),
        ({"type": "string", "format": "colour"}, "colour"),
        ({"type": "string", "pattern": "(("}, "unclosed group"),
        ({"$ref": "#/$defs/missing"}, "/$defs/missing"),
        ({"type": "nothing"}, "nothing"),
    ],
)
def test_what_cannot_be_enforced_is_an_error_naming_it(
    compiler: GrammarCompiler, schema: dict[str, Any], named: str
) -> None:
    with pytest.raises(GrammarError, match=named.replace("$", r"\$")):
        compiler.check(json_schema_grammar(schema))


def test_the_compiled_grammar_is_reused_and_each_matcher_is_fresh(compiler: GrammarCompiler) -> None:
    grammar = json_schema_grammar({"type": "object", "properties": {"x": {"const": 1}}, "required": ["x"]})
    first = compiler.matcher(grammar)
    assert first.consume_token(first_allowed(first, compiler.vocab_size))
    second = compiler.matcher(grammar)
    assert compiler._compiled[("", grammar)] is not first  # a copy, never the cached template
    masks = fill_disallowed([first, second], compiler.vocab_size)
    assert not torch.equal(masks[0], masks[1])


def first_allowed(matcher: Any, vocab_size: int) -> int:
    return int((~fill_disallowed([matcher], vocab_size)[0]).nonzero()[0])


def test_the_mask_is_exactly_what_the_matcher_accepts(compiler: GrammarCompiler) -> None:
    matcher = compiler.matcher(json_schema_grammar(PERSON))
    rng = random.Random(0)
    for _ in range(6):  # a few positions into the document
        disallowed = fill_disallowed([matcher], compiler.vocab_size)[0]
        allowed = (~disallowed).nonzero().squeeze(1).tolist()
        assert allowed
        probe = rng.sample(range(compiler.vocab_size), 300) + allowed[:50]
        for token_id in probe:
            assert matcher.deep_copy().consume_token(token_id) == (not bool(disallowed[token_id])), token_id
        assert matcher.consume_token(rng.choice(allowed))


SAMPLING_MODES: list[dict[str, Any]] = [
    {"temperature": 1.0},
    {"temperature": 0.0},
    {"temperature": 1.5, "top_k": 5},
    {"temperature": 1.0, "top_p": 0.5},
    {"temperature": 1.0, "logit_bias": {17: 100.0, 300: 100.0}},
    {"temperature": 0.8, "presence_penalty": 2.0, "logprobs": 3},
]


def decode_document(
    compiler: GrammarCompiler, hf_tokenizer: PreTrainedTokenizerBase, grammar: str, mode: dict[str, Any], seed: int
) -> str:
    """Samples with random logits under the grammar until it is complete; the text."""
    vocab_size = compiler.vocab_size
    sampler = Sampler(vocab_size, CPU)
    params = SamplingParams(max_tokens=400, seed=seed, grammar=grammar, **mode)
    output: list[int] = []
    constrained = SamplingRow(params, make_generator(seed, CPU), output, compiler.matcher(grammar))
    free = SamplingRow(SamplingParams(max_tokens=400, temperature=1.0), None, [])
    logits_rng = torch.Generator().manual_seed(seed)
    for _ in range(400):
        logits = torch.randn(2, vocab_size, generator=logits_rng) * 3
        token_id = sampler(logits, [free, constrained]).token_ids[1]
        output.append(token_id)
        assert constrained.matcher is not None and constrained.matcher.consume_token(token_id)
        if constrained.matcher.is_stopped():
            return str(hf_tokenizer.decode(output))
    raise AssertionError(f"no complete document in 400 tokens: {hf_tokenizer.decode(output)!r}")


@pytest.mark.parametrize("mode", SAMPLING_MODES, ids=lambda mode: ",".join(mode))
def test_sampled_documents_match_the_schema(
    compiler: GrammarCompiler, hf_tokenizer: PreTrainedTokenizerBase, mode: dict[str, Any]
) -> None:
    grammar = json_schema_grammar(PERSON)
    for seed in range(4):
        document = json.loads(decode_document(compiler, hf_tokenizer, grammar, mode, seed))
        jsonschema.validate(document, PERSON)


def test_a_grammar_does_not_change_the_unconstrained_rows(compiler: GrammarCompiler) -> None:
    vocab_size = compiler.vocab_size
    logits = torch.randn(3, vocab_size, generator=torch.Generator().manual_seed(1)) * 3

    def seeded(seed: int) -> SamplingRow:
        return SamplingRow(SamplingParams(max_tokens=4, seed=seed), make_generator(seed, CPU), [])

    alone = Sampler(vocab_size, CPU)(logits[[0, 2]], [seeded(5), seeded(6)]).token_ids
    grammar = json_schema_grammar({"type": "object"})
    constrained = SamplingRow(SamplingParams(max_tokens=4, grammar=grammar), None, [], compiler.matcher(grammar))
    mixed = Sampler(vocab_size, CPU)(logits, [seeded(5), constrained, seeded(6)]).token_ids
    assert [mixed[0], mixed[2]] == alone
    assert not fill_disallowed([compiler.matcher(grammar)], vocab_size)[0, mixed[1]]


def test_logits_are_not_modified_by_a_mask(compiler: GrammarCompiler) -> None:
    logits = torch.randn(2, compiler.vocab_size, generator=torch.Generator().manual_seed(2))
    before = logits.clone()
    grammar = json_schema_grammar(PERSON)
    rows = [
        SamplingRow(SamplingParams(max_tokens=4, temperature=0.0, grammar=grammar), None, [], compiler.matcher(grammar))
        for _ in range(2)
    ]
    Sampler(compiler.vocab_size, CPU)(logits, rows)
    assert torch.equal(logits, before)


def test_a_library_panic_is_a_fixed_sentence_and_the_detail_goes_to_the_log(caplog: pytest.LogCaptureFixture) -> None:
    panic = (
        "panic: assertion failed: grammar.symbols.len() < u16::MAX as usize - 10\n<backtrace>\n"
        "   0: <unknown>\n   1: /root/.cargo/registry/src/index.crates.io/llguidance-1.9.1/src/earley/grammar.rs:412"
    )
    with caplog.at_level("WARNING"):
        assert client_message(panic) == TOO_COMPLEX
        assert client_message("Parser Error: Current row has 2407 items; max is 2000") == TOO_COMPLEX
    assert ".cargo" in caplog.text  # the operator still sees it
    assert client_message("regex parse error:\n    ((\n     ^\nerror: unclosed group") == (
        "regex parse error: (( ^ error: unclosed group"
    )


def test_a_compiled_grammar_serves_only_its_own_scope(hf_tokenizer: PreTrainedTokenizerBase) -> None:
    """A key must not learn from a compile's speed that another key sent the same schema."""
    compiled: list[float] = []
    compiler = GrammarCompiler(hf_tokenizer, len(hf_tokenizer), EOS, on_compiled=compiled.append)
    grammar = json_schema_grammar(PERSON)
    compiler.check(grammar, "key:a")
    assert compiler.is_compiled(grammar, "key:a") and not compiler.is_compiled(grammar, "key:b")
    compiler.matcher(grammar, "key:a")
    assert len(compiled) == 1
    compiler.matcher(grammar, "key:b")  # compiled again, for b
    assert len(compiled) == 2 and compiler.is_compiled(grammar, "key:b")


def test_the_deepest_schema_within_the_bounds_compiles_on_a_small_thread_stack(compiler: GrammarCompiler) -> None:
    """The bound on depth leaves room: a 1 MiB thread stack (an eighth of the usual) compiles a
    schema at the bound (the 1,000-deep chain overflowed 8 MiB)."""
    defs: dict[str, Any] = {
        f"d{i}": {"anyOf": [{"type": "array", "items": {"$ref": f"#/$defs/d{i + 1}"}}, {"type": "null"}]}
        for i in range(42)
    }
    defs["d42"] = {"type": "string"}
    grammar = json_schema_grammar({"$ref": "#/$defs/d0", "$defs": defs})  # 127 subschemas deep
    errors: list[BaseException] = []

    def compile_it() -> None:
        try:
            compiler.check(grammar)
        except BaseException as exc:
            errors.append(exc)

    previous = threading.stack_size(1024 * 1024)
    try:
        thread = threading.Thread(target=compile_it)
        thread.start()
    finally:
        threading.stack_size(previous)
    thread.join()
    assert not errors


def test_objects_are_closed_only_when_asked(compiler: GrammarCompiler) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    for closed, accepts in ((True, False), (False, True)):
        matcher = compiler.matcher(json_schema_grammar(schema, closed=closed))
        ids = compiler._llg_tokenizer().tokenize_str('{"a": 1, "zz": 2}')
        assert all(matcher.consume_token(t) for t in ids) is accepts
