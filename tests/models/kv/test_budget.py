"""The K/V's memory budget: max_num_seqs lowered to what fits at max_model_len, the prefix cache
given what the slots leave, start-up refused when one sequence does not fit; and a served model
that runs no more sequences at once than its budget holds."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import torch
from transformers import AutoConfig

from models.config import SchedulerConfig
from models.kv.budget import KVBudget, fit_kv_budget, kv_budget, kv_bytes_per_token, kv_slack_tokens
from models.kv.memory import Memory
from scripts.harness.ports import free_port
from tests.app.ops.test_metrics import Scrape
from tests.live_server import MODEL_NAME, running_server

MIB = 2**20
TOKEN = 4096  # K/V bytes a token: 1 MiB a sequence of 256


def _config(**fields: object) -> SchedulerConfig:
    return SchedulerConfig(**{"max_num_seqs": 32, "max_model_len": 256, **fields})  # type: ignore[arg-type]


def test_bytes_are_the_budget_outright() -> None:
    assert kv_budget(_config(kv_cache_bytes=5 * MIB), None) == KVBudget(5 * MIB, "--kv-cache-memory 5.0 MiB")


def test_a_share_leaves_the_rest_of_the_device_free() -> None:
    # 90% of 10 GiB may be filled; 6 GiB are free after loading: keep 1 GiB of them free.
    budget = kv_budget(_config(kv_cache_share=0.9), Memory(6 * 2**30, 10 * 2**30, "cuda:0"))
    assert budget is not None
    assert budget.bytes == 5 * 2**30  # to the byte: 90% of 10 GiB is no float's rounding
    assert "90% of cuda:0's 10.0 GiB" in budget.reason
    # Less free than the share leaves: nothing for the K/V (start-up then fails in the fit).
    starved = kv_budget(_config(kv_cache_share=0.9), Memory(2**29, 10 * 2**30, "cuda:0"))
    assert starved is not None and starved.bytes == 0


def test_no_budget() -> None:
    assert kv_budget(_config(kv_cache_share=0.0), Memory(1, 2, "the machine")) is None
    config = _config()
    assert fit_kv_budget(config, TOKEN, None) is config
    assert fit_kv_budget(config, 0, KVBudget(1, "echo")) is config  # a model with no K/V


def test_a_budget_that_holds_every_slot_changes_nothing_but_names_the_pool() -> None:
    fitted = fit_kv_budget(_config(prefix_cache_share=0.5), TOKEN, KVBudget(64 * MIB, "test"))
    assert fitted.max_num_seqs == 32
    assert fitted.prefix_cache_bytes == 16 * MIB  # half of 32 slots of 1 MiB
    assert fitted.kv_cache_bytes == 64 * MIB


def test_max_num_seqs_comes_down_to_what_fits_and_the_pool_takes_the_rest() -> None:
    fitted = fit_kv_budget(_config(), TOKEN, KVBudget(5 * MIB + MIB // 2, "test"))
    assert fitted.max_num_seqs == 5  # 1 MiB a sequence of 256 tokens
    assert fitted.max_model_len == 256  # the client's context limit is not what gives
    assert fitted.prefix_cache_bytes == MIB // 2 and fitted.prefix_caching


def test_a_reserved_cache_keeps_every_slot_and_counts_the_budget_in_tokens() -> None:
    # The CPU's cache commits memory per token written: the 5 sequences' worth becomes a bound
    # of 5 x 256 tokens across all 32 slots, with the same memory left for the prefix cache.
    fitted = fit_kv_budget(_config(), TOKEN, KVBudget(5 * MIB + MIB // 2, "test"), slack_tokens=9)
    assert fitted.max_num_seqs == 32 and fitted.max_kv_tokens == 5 * 256 and fitted.kv_slack_tokens == 9
    assert fitted.prefix_cache_bytes == MIB // 2
    # Every slot fits at full length: no token bound at all.
    roomy = fit_kv_budget(_config(), TOKEN, KVBudget(64 * MIB, "test"), slack_tokens=9)
    assert roomy.max_num_seqs == 32 and roomy.max_kv_tokens == 0
    # One sequence and its slack would not fit in the tokens: a slot of max_model_len instead.
    tight = fit_kv_budget(_config(), TOKEN, KVBudget(MIB + MIB // 2, "test"), slack_tokens=9)
    assert tight.max_num_seqs == 1 and tight.max_kv_tokens == 0


def test_the_slack_is_three_pages_a_row_of_each_sequence() -> None:
    config = AutoConfig.for_model(
        "llama", num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=128
    )
    per_token = kv_bytes_per_token(config, torch.float32)  # 2 layers x 2 x 2 heads x 32 x 4 = 1 KiB
    rows = 2 * 2 * 2
    assert per_token == 1024 and kv_slack_tokens(config, per_token) == 3 * 4096 * rows // per_token == 96


def test_an_explicit_pool_bound_is_kept_when_it_fits() -> None:
    fitted = fit_kv_budget(_config(prefix_cache_bytes=3 * MIB), TOKEN, KVBudget(40 * MIB, "test"))
    assert (fitted.max_num_seqs, fitted.prefix_cache_bytes) == (32, 3 * MIB)


def test_no_room_left_turns_the_prefix_cache_off() -> None:
    fitted = fit_kv_budget(_config(), TOKEN, KVBudget(4 * MIB, "test"))
    assert fitted.max_num_seqs == 4 and not fitted.prefix_caching


def test_not_one_sequence_fits() -> None:
    with pytest.raises(ValueError, match=r"lower --max-model-len \(at most 128 fits\)"):
        fit_kv_budget(_config(), TOKEN, KVBudget(MIB // 2, "test"))


def test_no_memory_left_at_all_says_so_rather_than_a_context_of_zero() -> None:
    starved = kv_budget(_config(), Memory(2**29, 10 * 2**30, "cuda:0"))  # less free than 10% of it
    with pytest.raises(ValueError, match=r"not one token's 4096 bytes fits; give it bytes"):
        fit_kv_budget(_config(), TOKEN, starved)


def _token_bytes(model_dir: Path) -> int:
    return kv_bytes_per_token(AutoConfig.from_pretrained(model_dir), torch.float32)


async def test_a_served_model_admits_what_its_token_budget_holds(tiny_model_dir: Path) -> None:
    # Two and a half sequences of 256 tokens: on the CPU two sequences' worth of tokens for the
    # slots (every slot kept), half a sequence's for the prefix cache. The engine in its own
    # process, as `surge serve` runs it: the fitted config must reach the HTTP side.
    per_token = _token_bytes(tiny_model_dir)
    sequence = 256 * per_token
    budget = sequence * 5 // 2
    settings = {"engine_mode": "process", "max_model_len": 256, "kv_cache_memory": str(budget)}
    slack = kv_slack_tokens(AutoConfig.from_pretrained(tiny_model_dir), per_token)
    with running_server(tiny_model_dir, **settings) as live:
        scheduler = live.engine.config.scheduler
        assert scheduler.max_num_seqs == SchedulerConfig().max_num_seqs and scheduler.max_kv_tokens == 512
        scrape = Scrape(live)
        assert scrape.value("surge_max_num_seqs") == scheduler.max_num_seqs
        assert scrape.value("surge_kv_cache_max_tokens") == 512
        assert scrape.value("surge_kv_cache_budget_bytes") == budget
        assert 0 < scrape.value("surge_prefix_cache_capacity_bytes") <= sequence // 2
        client = openai.AsyncOpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0)
        prompt = [{"role": "user", "content": "tell me about the sea"}]
        reply = await client.chat.completions.create(model=MODEL_NAME, messages=prompt, max_tokens=1)  # type: ignore[arg-type]
        assert reply.usage is not None
        # Each stream is admitted for its prompt, 40 tokens and the slack: as many as fit in 512.
        each = reply.usage.prompt_tokens + 40 + slack
        fits = 512 // each
        assert 2 <= fits < 5, (each, fits)  # more than the 2 slots of max_model_len, fewer than the streams
        running: list[float] = []
        done = asyncio.Event()

        async def watch() -> None:
            async with httpx.AsyncClient() as http:
                while not done.is_set():
                    text = (await http.get(f"{live.url}/metrics")).text
                    running.extend(
                        float(line.split()[-1])
                        for line in text.splitlines()
                        if line.startswith("surge_requests_running{")
                    )
                    await asyncio.sleep(0.01)

        async def one() -> str | None:
            stream = await client.chat.completions.create(
                model=MODEL_NAME,
                messages=prompt,  # type: ignore[arg-type]
                max_tokens=40,
                stream=True,
                extra_body={"ignore_eos": True, "temperature": 1.0},  # not deduplicated: five generations
            )
            reason = None
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].finish_reason:
                    reason = chunk.choices[0].finish_reason
            return reason

        watcher = asyncio.create_task(watch())
        started = time.monotonic()
        reasons = await asyncio.gather(*(one() for _ in range(5)))
        done.set()
        await watcher
        await client.close()
    assert reasons == ["length"] * 5, f"after {time.monotonic() - started:.1f} s"
    assert max(running) == fits  # the token budget was full, and never more


def test_start_up_fails_naming_the_longest_context_that_fits(tiny_model_dir: Path) -> None:
    argv = [sys.executable, "-m", "app.cli", "serve", "--model", str(tiny_model_dir)]
    longest = 300
    argv += ["--max-model-len", "512", "--kv-cache-memory", str(longest * _token_bytes(tiny_model_dir))]
    env = {**os.environ, "SURGE_PORT": str(free_port())}
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode != 0
    assert "could not start the engine" in proc.stderr
    assert f"lower --max-model-len (at most {longest} fits)" in proc.stderr, proc.stderr[-2000:]
