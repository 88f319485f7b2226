"""Warm templates: the operator's frequent system prompts and prompt prefixes, prefilled into the
prefix cache before the server is ready and kept there (pinned), so that the first request that
starts with one already reuses it (`cached_tokens` > 0 on the very first request).

The file (`--warm-templates`) is a JSON list; each entry is a chat prefix, rendered by the
model's chat template exactly as a chat request's messages are (without the assistant's
generation prompt, which a real request's next message replaces), or a completions prompt:

    [{"messages": [{"role": "system", "content": "You are ..."}], "tools": [...]},
     {"prompt": "Translate to French:\\n"}]

A template is shared by every tenant (an API key reuses it like its own cached prefix): it is the
operator's text, not a tenant's. Only whole blocks of 16 tokens are reused, up to the first token
where a request differs. docs/engine.md#warm-templates.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models import WARM_SCOPE, AsyncEngine, SamplingParams

log = logging.getLogger("surge.server")

MAX_TEMPLATES = 256


@dataclass(frozen=True, slots=True)
class WarmTemplate:
    messages: tuple[dict[str, Any], ...] = ()
    tools: tuple[dict[str, Any], ...] = ()
    prompt: str | None = None

    def token_ids(self, engine: AsyncEngine) -> list[int]:
        if self.prompt is not None:
            return engine.tokenizer.encode(self.prompt)
        tools = list(self.tools) or None
        return engine.tokenizer.encode_chat(list(self.messages), tools, None, add_generation_prompt=False)


def load_templates(path: str) -> list[WarmTemplate]:
    """The file's templates; a ValueError naming the entry at fault for anything else."""
    try:
        entries = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--warm-templates {path}: not a readable JSON file: {exc}") from exc
    if not isinstance(entries, list) or not 0 < len(entries) <= MAX_TEMPLATES:
        raise ValueError(f"--warm-templates {path}: expected a JSON list of 1 to {MAX_TEMPLATES} templates")
    return [_template(path, index, entry) for index, entry in enumerate(entries)]


def _template(path: str, index: int, entry: object) -> WarmTemplate:
    where = f"--warm-templates {path}, entry {index}"
    if not isinstance(entry, dict) or set(entry) - {"messages", "tools", "prompt"}:
        raise ValueError(f"{where}: expected an object with `messages` (and `tools`) or `prompt`")
    if ("messages" in entry) == ("prompt" in entry):
        raise ValueError(f"{where}: give `messages` or `prompt`, one of them")
    if "prompt" in entry:
        if not isinstance(entry["prompt"], str) or not entry["prompt"] or "tools" in entry:
            raise ValueError(f"{where}: `prompt` must be a non-empty string (and has no `tools`)")
        return WarmTemplate(prompt=entry["prompt"])
    messages, tools = entry["messages"], entry.get("tools", [])
    valid = isinstance(messages, list) and messages and isinstance(tools, list)
    if not valid or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages
    ):
        raise ValueError(f"{where}: `messages` must be a non-empty list of {{role, content}} with text content")
    if not all(isinstance(tool, dict) for tool in tools):
        raise ValueError(f"{where}: `tools` must be a list of tool objects")
    return WarmTemplate(messages=tuple(messages), tools=tuple(tools))


async def warm(engine: AsyncEngine, templates: list[WarmTemplate]) -> int:
    """Prefill each template (one token generated, then dropped) in the warm scope, where the
    engine pins its blocks; the prompt tokens warmed in all. A template the model cannot take (too
    long, a template that rejects it) is logged and skipped: the server still starts."""
    params = SamplingParams(max_tokens=1, temperature=0.0)
    num_tokens = num_warmed = 0
    for index, template in enumerate(templates):
        try:
            token_ids = template.token_ids(engine)
            if len(token_ids) >= engine.config.scheduler.max_model_len:
                raise ValueError(f"{len(token_ids)} tokens: longer than the model's context")
            async with engine.submit([(token_ids, params)], share=WARM_SCOPE) as group:
                async for output in group:
                    if output.error is not None:
                        raise ValueError(output.error)
        except Exception as exc:  # one bad template must not keep the server from starting
            log.warning("warm template %d skipped: %s", index, exc)
            continue
        num_tokens += len(token_ids)
        num_warmed += 1
    log.info("warm templates: %d of %d prefilled, %d prompt tokens", num_warmed, len(templates), num_tokens)
    return num_tokens
