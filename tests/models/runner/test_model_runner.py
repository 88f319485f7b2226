"""The packed step (decodes and prompt chunks in one forward) gives the logits of the split one
(a prefill forward, then a decode forward), step by step, on every architecture we serve."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from models.kv.cache import SlotCache
from models.loading.tiny import build_tiny
from models.runner import attention
from models.runner.model_runner import ModelRunner
from models.sampling.params import SamplingParams
from models.scheduler.output import PrefillChunk
from models.scheduler.sequence import Sequence


def load(model_dir: Path, device: str, attn_implementation: str = "sdpa") -> AutoModelForCausalLM:
    """float32 on `device` (the `device` fixture: SURGE_TEST_DEVICE, default cpu)."""
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation=attn_implementation
    )
    return model.to(device).eval()


Steps = list[tuple[int, list[PrefillChunk], list[Sequence]]]


def sequences(seed: int, lengths: dict[str, int]) -> list[Sequence]:
    """Random prompts of these lengths, each in the slot of its position."""
    rng = random.Random(seed)
    seqs = [
        Sequence(name, [rng.randrange(3, 500) for _ in range(n)], SamplingParams(max_tokens=8))
        for name, n in lengths.items()
    ]
    for slot, seq in enumerate(seqs):
        seq.slot = slot
    return seqs


def run_steps(runner: ModelRunner, steps: Steps) -> list[torch.Tensor]:
    """Each step's logits, advancing the sequences as the engine would."""
    out = []
    for num_slots, chunks, decodes in steps:
        out.append(runner.forward(num_slots, chunks, decodes))
        for chunk in chunks:
            chunk.seq.num_computed_tokens += chunk.num_tokens
        for seq in decodes:
            seq.num_computed_tokens += 1
        # Fixed tokens, not sampled ones: both runners then feed the very same inputs.
        for seq in [ch.seq for ch in chunks if ch.completes_prompt] + decodes:
            seq.output_token_ids.append(7 + len(seq.output_token_ids))
    return out


def script(runner: ModelRunner) -> list[torch.Tensor]:
    """Five sequences joining, chunking and decoding over four steps; each step's logits."""
    a, b, c, d, e = sequences(0, {"a": 5, "b": 9, "c": 20, "d": 12, "e": 10})
    return run_steps(
        runner,
        [
            (3, [PrefillChunk(a, 0, 5), PrefillChunk(b, 0, 9), PrefillChunk(c, 0, 6)], []),
            # c is mid-prompt in slot 2: a padding row of the decode block, and a chunk of its own
            (5, [PrefillChunk(c, 6, 14), PrefillChunk(d, 0, 12), PrefillChunk(e, 0, 4)], [a, b]),
            (5, [PrefillChunk(e, 4, 6)], [a, b, c, d]),
            (5, [], [a, b, c, d, e]),
            (5, [], [a, b, c, d, e]),
        ],
    )


@pytest.mark.parametrize("capacity", [256, 8])
def test_packed_step_gives_the_split_steps_logits(arch_dir: Path, device: str, capacity: int) -> None:
    packed = ModelRunner(load(arch_dir, device), max_num_seqs=5, max_model_len=64)
    split = ModelRunner(load(arch_dir, device), max_num_seqs=5, max_model_len=64, packed=False)
    assert packed.packed and not split.packed
    for runner in (packed, split):
        # 8 positions to start with: the cache grows (and its scratch column moves) mid-script
        runner.cache = SlotCache(len(runner.cache.layers), 5, 64, initial_capacity=capacity)
    got, want = script(packed), script(split)
    # rows: completing chunks (a, b; then c, d; then e), then decodes
    assert [t.shape[0] for t in got] == [2, 4, 5, 5, 5]
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.shape == w.shape, step
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4, msg=f"step {step}")


def test_on_the_cpu_the_slots_are_reserved_at_full_length(arch_dir: Path, device: str) -> None:
    # Memory follows the tokens written and the cache never grows by copying (models/kv/cache.py);
    # elsewhere it grows by doubling from 256 positions.
    runner = ModelRunner(load(arch_dir, device), max_num_seqs=3, max_model_len=512)
    on_cpu = device == "cpu"
    assert runner.cache.reserve is on_cpu and runner.cache.capacity == (512 if on_cpu else 256)


def test_a_model_without_sdpa_attention_runs_split(arch_dir: Path, device: str) -> None:
    # eager attention may carry what SDPA cannot (softcapping): such a model keeps two forwards
    runner = ModelRunner(load(arch_dir, device, "eager"), max_num_seqs=5, max_model_len=64)
    assert not runner.packed
    assert len(script(runner)) == 5


def test_on_cuda_the_runner_turns_cudnn_attention_off(arch_dir: Path, device: str) -> None:
    # cuDNN's SDPA builds a plan per new shape and every decode step's keys are one longer: on an
    # H200 in bf16 that made each step ~45 ms instead of ~10 (scripts/device_check.sh found it).
    if not device.startswith("cuda"):
        pytest.skip("a CUDA-only setting (SURGE_TEST_DEVICE=cuda runs it)")
    torch.backends.cuda.enable_cudnn_sdp(True)
    ModelRunner(load(arch_dir, device), max_num_seqs=5, max_model_len=64)
    assert not torch.backends.cuda.cudnn_sdp_enabled()


def test_steps_of_new_prompts_attend_causally_without_a_mask(arch_dir: Path, device: str) -> None:
    # When every chunk starts its prompt, attention needs no mask (SDPA's causal path); a chunk
    # longer than a sliding window (16 here), a continued chunk, and decodes beside new chunks
    # keep their masks. Each step's logits must match the split runner's either way.
    packed = ModelRunner(load(arch_dir, device), max_num_seqs=4, max_model_len=64)
    split = ModelRunner(load(arch_dir, device), max_num_seqs=4, max_model_len=64, packed=False)
    plans: list[bool] = []
    forward = packed.model.forward

    def spy_forward(*args: object, **kwargs: object) -> object:
        assert packed.cache.plan is not None
        plans.append(packed.cache.plan.causal_chunks)
        return forward(*args, **kwargs)

    packed.model.forward = spy_forward  # type: ignore[method-assign]
    results = []
    for runner in (packed, split):
        a, b, c, d = sequences(1, {"a": 20, "b": 7, "c": 3, "d": 30})
        steps: Steps = [
            (1, [PrefillChunk(a, 0, 20)], []),  # one new prompt, longer than the window
            (3, [PrefillChunk(b, 0, 7), PrefillChunk(c, 0, 3)], [a]),  # new prompts beside a decode
            (4, [PrefillChunk(d, 0, 10)], [a, b, c]),  # a first chunk that does not finish its prompt
            (4, [PrefillChunk(d, 10, 20)], [a, b, c]),  # its continuation reads the earlier keys
            (4, [], [a, b, c, d]),
        ]
        results.append(run_steps(runner, steps))
    sliding = packed._sliding_window is not None
    assert plans == [not sliding, True, True, False, False]
    for step, (g, w) in enumerate(zip(*results, strict=True)):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4, msg=f"step {step}")


def test_a_short_tail_beside_a_long_new_prompt_attends_chunk_by_chunk(arch_dir: Path, device: str) -> None:
    # A step that finishes one prompt (2 tokens left) and starts the next (30): one padded batch
    # would pad the tail to 30 rows; each chunk runs alone instead, the new one causally without
    # a mask, the tail against its earlier keys. Logits must match the split runner's.
    packed = ModelRunner(load(arch_dir, device), max_num_seqs=3, max_model_len=64)
    split = ModelRunner(load(arch_dir, device), max_num_seqs=3, max_model_len=64, packed=False)
    seen: list[tuple[bool, tuple[bool, ...]]] = []
    forward = packed.model.forward

    def spy_forward(*args: object, **kwargs: object) -> object:
        plan = packed.cache.plan
        assert plan is not None and plan.chunks is not None
        seen.append((plan.chunk_index is not None, tuple(chunk.fresh for chunk in plan.chunks)))
        return forward(*args, **kwargs)

    packed.model.forward = spy_forward  # type: ignore[method-assign]
    results = []
    for runner in (packed, split):
        a, b, c = sequences(3, {"a": 12, "b": 30, "c": 9})
        steps: Steps = [
            (1, [PrefillChunk(a, 0, 10)], []),  # a's first part
            (2, [PrefillChunk(a, 10, 2), PrefillChunk(b, 0, 14)], []),  # a's tail, b's start (not padded)
            (3, [PrefillChunk(b, 14, 16), PrefillChunk(c, 0, 9)], [a]),  # even sizes: one padded batch
            (3, [], [a, b, c]),
        ]
        results.append(run_steps(runner, steps))
    window = packed._sliding_window
    fits = window is None or window >= 14
    assert seen[1] == (False, (False, fits))  # 2 x 14 rows padded for 16 real: one by one
    assert seen[2][0] is True  # 2 x 16 for 25 real: batched
    assert results[0][0].numel() == results[1][0].numel() == 0  # a's first part alone: nothing sampled
    for step, (g, w) in enumerate(zip(*results, strict=True)):
        if step:
            torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4, msg=f"step {step}")


@pytest.fixture(scope="module")
def gqa_dir(model_root: Path) -> Path:
    """The `m` tiny Llama: 8 query heads over 4 key/value heads (`s` has none to group)."""
    out = model_root / "runner-gqa-m"
    if not out.exists():
        build_tiny("m", out)
    return out


def test_grouped_query_decode_matches_the_split_steps(gqa_dir: Path, device: str) -> None:
    """On the CPU the packed decode block hands grouped-query attention to torch whole
    (`enable_gqa`, with the mask); the split runner goes through transformers' SDPA function.
    Both must give the same logits, with the fast path really taken."""
    model = load(gqa_dir, device)
    assert model.model.layers[0].self_attn.num_key_value_groups == 2
    calls: list[bool] = []
    original = attention.decode_attention

    def spy(module: torch.nn.Module, query: torch.Tensor, *args: torch.Tensor, **kwargs: object) -> torch.Tensor:
        calls.append(query.device.type == "cpu")
        return original(module, query, *args, **kwargs)

    attention.decode_attention = spy
    try:
        packed = script(ModelRunner(model, 5, 256, packed=True))
    finally:
        attention.decode_attention = original
    split = script(ModelRunner(load(gqa_dir, device), 5, 256, packed=False))
    assert calls and all(calls) == (device == "cpu")
    for got, expected in zip(packed, split, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
