"""vLLM's `GenerateRequest`: what its render endpoints answer for a request (the prompt's token
ids and the sampling parameters it would run with), so that a router can tokenize a request as
the server will (the prefix it would hit) without running it: docs/fleet.md."""

from __future__ import annotations

from typing import Any

from models import SamplingParams


def generate_request(
    request_id: str, token_ids: list[int], choices: list[SamplingParams], model: str, stream: bool, priority: int
) -> dict[str, Any]:
    """The fields vLLM's GenerateRequest has (text only: `features` is for images), the sampling
    parameters (the first choice's; `n` the number of choices) in vLLM's names."""
    params = choices[0]
    return {
        "request_id": request_id,
        "token_ids": token_ids,
        "features": None,
        "sampling_params": {
            "n": len(choices),
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "seed": params.seed,
            "presence_penalty": params.presence_penalty,
            "frequency_penalty": params.frequency_penalty,
            "max_tokens": params.max_tokens,
            "stop": list(params.stop),
            "stop_token_ids": list(params.stop_token_ids),
            "ignore_eos": params.ignore_eos,
            "logprobs": params.logprobs,
            "logit_bias": {str(token): bias for token, bias in params.logit_bias.items()} or None,
        },
        "model": model,
        "stream": stream,
        "cache_salt": params.cache_salt or None,
        "priority": priority,
    }
