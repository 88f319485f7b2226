"""Any Hugging Face causal LM: Llama, Qwen2, Mistral (sliding window) and GPT-2 give the same
greedy tokens in the continuous-batching engine as transformers' own `generate`, and each
serves a streamed chat over HTTP."""

from __future__ import annotations

import json
import random
from pathlib import Path

import openai
import torch
from transformers import AutoModelForCausalLM

from models.config import EngineConfig, ModelConfig, SchedulerConfig
from models.kv.budget import kv_bytes_per_token
from models.process.async_engine import AsyncEngine
from models.sampling.params import SamplingParams
from tests.live_server import MODEL_NAME, running_server


def reference_greedy(model_dir: Path, device: str, prompt: list[int], max_new_tokens: int) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt], device=device),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=device),
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


async def test_engine_matches_generate(arch_dir: Path, device: str) -> None:
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 8000) for _ in range(n)] for n in (5, 40, 23, 9)]
    lengths = [24, 12, 30, 18]
    expected = [reference_greedy(arch_dir, device, p, n) for p, n in zip(prompts, lengths, strict=True)]
    config = EngineConfig(
        ModelConfig(str(arch_dir), device=device, dtype="float32"),
        SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=24, max_model_len=256),
        separate_process=False,  # one start per architecture: no child process to spawn
    )
    engine = await AsyncEngine.start(config)
    # Llama, Qwen2 and Mistral run the fused decoder (models/runner/fused_decoder.py), GPT-2 transformers' forward.
    fused = getattr(engine.core, "runner").decoder is not None  # noqa: B009
    assert fused == (json.loads((arch_dir / "config.json").read_text())["model_type"] != "gpt2")
    try:
        group = engine.submit(
            [
                (p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
                for p, n in zip(prompts, lengths, strict=False)
            ]
        )
        got: list[list[int]] = [[] for _ in prompts]
        async with group:
            async for out in group:
                got[group.index[out.request_id]] += out.token_ids
        # The budget's bytes a token (models/kv/budget.py) are what the slot cache really holds.
        runner = getattr(engine.core, "runner")  # noqa: B009
        assert kv_bytes_per_token(runner.model.config, torch.float32) == runner.kv_block_bytes(1)
    finally:
        engine.stop()
    assert got == expected


def test_serves_a_streamed_chat(arch_dir: Path, device: str) -> None:
    # The server's default dtype for the device (bfloat16 on CUDA): only the stream's shape is checked.
    with running_server(arch_dir, device=device, max_model_len=256, max_num_seqs=2) as live:
        client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="x", max_retries=0)
        stream = client.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": "Hi there, how are you?"}],
            max_tokens=10,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1
