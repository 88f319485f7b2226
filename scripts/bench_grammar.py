"""Structured-generation libraries side by side on surge's tiny tokenizer: llguidance and xgrammar.

    python -m scripts.bench_grammar                      # whichever of the two is installed
    /other/venv/bin/python -m scripts.bench_grammar      # a venv with xgrammar (it pulls triton)

For each library: the tokenizer's set-up, a JSON schema's compile time (first and again), and the
per-step cost of a batch of 32 constrained rows: filling the token mask of every row (for
llguidance, surge's own `fill_disallowed`) and applying it to (32, vocab) float32 logits, while
each row walks its own document (a token drawn at random among the allowed ones, so the rows sit
in different grammar states; a finished document starts over, so every step has 32 rows). Also
how many documents ended by themselves in that many steps.
Figures go to docs/performance.md.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Z][a-z]{1,12}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1, "maxItems": 3},
        "address": {"$ref": "#/$defs/address"},
        "score": {"anyOf": [{"type": "number"}, {"type": "null"}]},
    },
    "required": ["name", "age", "role", "tags", "address", "score"],
    "additionalProperties": False,
    "$defs": {
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 16},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        }
    },
}
ROWS = 32


def timed(work: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    result = work()
    return result, time.perf_counter() - start


def allowed(bitmask_row: Any, vocab_size: int) -> list[int]:
    import numpy as np

    bits = np.unpackbits(bitmask_row.view(np.uint8), bitorder="little")[:vocab_size]
    return [int(i) for i in np.nonzero(bits)[0]]


def figures(
    setup_s: float, compile_s: float, again_s: float, mask_s: list[float], apply_s: list[float], ended: int, errors: int
) -> dict[str, Any]:
    return {
        "setup_s": setup_s,
        "compile_s": compile_s,
        "compile_again_s": again_s,
        "mask_s": mask_s,
        "apply_s": apply_s,
        "ended": ended,
        "errors": errors,
    }


def bench_llguidance(hf_tokenizer: Any, steps: int, seed: int) -> dict[str, Any]:
    """What surge runs: models/grammar/compiler.py's compiler and masks, applied with one masked_fill_."""
    import llguidance
    import llguidance.hf
    import torch

    from models.grammar.compiler import json_schema_grammar
    from models.grammar.masks import fill_disallowed

    tokenizer, setup_s = timed(lambda: llguidance.hf.from_tokenizer(hf_tokenizer))
    vocab = tokenizer.vocab_size
    grammar = json_schema_grammar(SCHEMA)
    _, compile_s = timed(lambda: llguidance.LLMatcher(tokenizer, grammar))
    _, again_s = timed(lambda: llguidance.LLMatcher(tokenizer, grammar))
    matchers = [llguidance.LLMatcher(tokenizer, grammar) for _ in range(ROWS)]
    rng = random.Random(seed)
    logits = torch.zeros(ROWS, vocab)
    mask_s, apply_s, ended, errors = [], [], 0, 0
    for _ in range(steps):
        for i, m in enumerate(matchers):  # a finished document starts over: 32 rows in every step
            if m.is_stopped():
                ended += not m.is_error()
                errors += m.is_error()
                matchers[i] = llguidance.LLMatcher(tokenizer, grammar)
        disallowed, t = timed(lambda: fill_disallowed(matchers, vocab))
        mask_s.append(t)
        _, t = timed(functools.partial(logits.masked_fill_, disallowed, float("-inf")))
        apply_s.append(t)
        for i, m in enumerate(matchers):
            m.consume_token(rng.choice((~disallowed[i]).nonzero().squeeze(1).tolist()))
    return figures(setup_s, compile_s, again_s, mask_s, apply_s, ended, errors)


def bench_xgrammar(hf_tokenizer: Any, steps: int, seed: int) -> dict[str, Any]:
    import torch
    import xgrammar as xgr

    info, setup_s = timed(lambda: xgr.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=len(hf_tokenizer)))
    compiler = xgr.GrammarCompiler(info)
    compiled, compile_s = timed(lambda: compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False))
    _, again_s = timed(lambda: compiler.compile_json_schema(json.dumps(SCHEMA), any_whitespace=False))  # its cache
    matchers = [xgr.GrammarMatcher(compiled) for _ in range(ROWS)]
    bitmask = xgr.allocate_token_bitmask(ROWS, info.vocab_size)
    rng = random.Random(seed)
    logits = torch.zeros(ROWS, info.vocab_size)
    mask_s, apply_s, ended, errors = [], [], 0, 0
    for _ in range(steps):
        for i, m in enumerate(matchers):  # a finished document starts over: 32 rows in every step
            if m.is_terminated():
                ended += 1
                matchers[i] = xgr.GrammarMatcher(compiled)
        _, t = timed(lambda: [m.fill_next_token_bitmask(bitmask, i) for i, m in enumerate(matchers)])
        mask_s.append(t)
        _, t = timed(lambda: xgr.apply_token_bitmask_inplace(logits, bitmask))
        apply_s.append(t)
        for i, m in enumerate(matchers):
            if not m.accept_token(rng.choice(allowed(bitmask[i].numpy(), info.vocab_size))):
                errors += 1
    return figures(setup_s, compile_s, again_s, mask_s, apply_s, ended, errors)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    import torch
    from transformers import AutoTokenizer

    from models.loading.tiny import ensure_tokenizer

    torch.set_num_threads(1)
    hf_tokenizer = AutoTokenizer.from_pretrained(ensure_tokenizer())
    runs = {"llguidance": bench_llguidance, "xgrammar": bench_xgrammar}
    print("| library | tokenizer set-up ms | compile ms (again) | mask 32 rows ms p50/p90 | apply ms p50 | ended |")
    print("|---|---|---|---|---|---|")
    for name, run in runs.items():
        if importlib.util.find_spec(name) is None:
            print(f"| {name} | not installed | | | | |")
            continue
        r = run(hf_tokenizer, args.steps, args.seed)
        masks = sorted(r["mask_s"])
        p90 = masks[int(0.9 * (len(masks) - 1))]
        compile_ms = f"{r['compile_s'] * 1000:.2f} ({r['compile_again_s'] * 1000:.2f})"
        mask_ms = f"{statistics.median(masks) * 1000:.3f} / {p90 * 1000:.3f}"
        apply_ms = f"{statistics.median(r['apply_s']) * 1000:.3f}"
        print(
            f"| {name} | {r['setup_s'] * 1000:.0f} | {compile_ms} | {mask_ms} | {apply_ms} "
            f"| {r['ended']} ({r['errors']} errors) |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
