"""The naive baseline for `scripts/bench.py`: FastAPI calling `model.generate` for one request at a time.

    .venv/bin/python -m scripts.naive_server --model DIR --port 8001 [--num-threads 1]

This is the "synchronous" design the field started from, kept deliberately simple so the benchmark
measures the design and not a strawman: one model, one lock, one `generate()` at a time; tokens
stream out through `transformers.TextIteratorStreamer` while `generate` runs in a worker thread.
Greedy only; `max_tokens` is honoured; `ignore_eos` (the bench sends it so every system produces the
same number of tokens) maps to `min_new_tokens = max_tokens`, which masks eos until then.

Endpoints: POST /v1/chat/completions (streaming and not), GET /v1/models, GET /health.

NOTE: this script knows nothing about surge (no `app/` or `models/` imports), so it measures plain
transformers. It is a bench peer, not part of the product.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, StreamingResponse
from transformers import AutoModelForCausalLM, AutoTokenizer, TextIteratorStreamer


def build_app(model_dir: Path, model_name: str) -> FastAPI:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    lock = asyncio.Lock()  # one generate() at a time: the design under test
    app = FastAPI()

    def encode(body: dict[str, Any]) -> torch.Tensor:
        ids = tokenizer.apply_chat_template(
            body["messages"], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        return torch.tensor([ids], dtype=torch.long)  # (1, T)

    def generate_kwargs(body: dict[str, Any], input_ids: torch.Tensor) -> dict[str, Any]:
        max_new_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        kwargs: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
            "max_new_tokens": max_new_tokens,
            "do_sample": False,
            "pad_token_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        }
        if body.get("ignore_eos"):
            kwargs["min_new_tokens"] = max_new_tokens
        return kwargs

    def run_generate(kwargs: dict[str, Any]) -> torch.Tensor:
        with torch.inference_mode():
            return model.generate(**kwargs)

    def chunk(request_id: str, delta: dict[str, Any], finish_reason: str | None, **extra: Any) -> str:
        payload = {
            "id": request_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model_name,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            **extra,
        }
        return f"data: {json.dumps(payload)}\n\n"

    async def stream(body: dict[str, Any], input_ids: torch.Tensor) -> AsyncIterator[str]:
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        kwargs = generate_kwargs(body, input_ids)
        async with lock:
            streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
            result: dict[str, torch.Tensor] = {}

            def run() -> None:
                result["ids"] = run_generate({**kwargs, "streamer": streamer})

            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            yield chunk(request_id, {"role": "assistant", "content": ""}, None)
            # NOTE: TextIteratorStreamer's iterator blocks, so each step is fetched in a thread.
            iterator = iter(streamer)
            while True:
                text = await asyncio.to_thread(next, iterator, None)
                if text is None:
                    break
                if text:
                    yield chunk(request_id, {"content": text}, None)
            await asyncio.to_thread(thread.join)
        num_prompt = int(input_ids.shape[1])
        num_completion = int(result["ids"].shape[1]) - num_prompt if "ids" in result else 0
        finish = "length" if num_completion >= kwargs["max_new_tokens"] else "stop"
        usage = {"prompt_tokens": num_prompt, "completion_tokens": num_completion}
        usage["total_tokens"] = num_prompt + num_completion
        yield chunk(request_id, {}, finish, usage=usage)
        yield "data: [DONE]\n\n"

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "naive"}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        body = await request.json()
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            raise HTTPException(status_code=400, detail="`messages` is required")
        input_ids = encode(body)
        if body.get("stream"):
            return StreamingResponse(stream(body, input_ids), media_type="text/event-stream")
        async with lock:
            kwargs = generate_kwargs(body, input_ids)
            ids = await asyncio.to_thread(run_generate, kwargs)
        new_ids = ids[0, input_ids.shape[1] :]
        text = tokenizer.decode(new_ids, skip_special_tokens=True)
        num_completion = int(new_ids.shape[0])
        return JSONResponse(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model_name,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "finish_reason": "length" if num_completion >= kwargs["max_new_tokens"] else "stop",
                    }
                ],
                "usage": {
                    "prompt_tokens": int(input_ids.shape[1]),
                    "completion_tokens": num_completion,
                    "total_tokens": int(input_ids.shape[1]) + num_completion,
                },
            }
        )

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="a local model directory")
    parser.add_argument("--model-name", help="the `model` id it reports; default: the directory as given")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--num-threads", type=int, default=1, help="torch threads")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.num_threads)
    app = build_app(args.model, args.model_name or str(args.model))
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
