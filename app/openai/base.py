"""The base of every request body model: unknown fields ignored, null means the default; and the
fields every generation request has whatever its protocol."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

# vLLM's bound is none; a salt is a secret of ~43 characters (256 bits in base64), not a document.
MAX_CACHE_SALT = 256


class RequestModel(BaseModel):
    # NaN and infinities (Python's json and pydantic read the `NaN` / `Infinity` literals) are
    # rejected as "not a finite number" rather than slipping past a range check or meaning "off".
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data


class CacheSalted(BaseModel):
    """vLLM's `cache_salt`: the request reuses only prefixes cached under the same salt (within its
    API key's own, which a salt never widens). A gateway sets one per tenant where the server sees
    no API keys (docs/fleet.md); random, secret and long, it keeps one tenant from timing its way to
    another's prompts."""

    cache_salt: str | None = Field(None, min_length=1, max_length=MAX_CACHE_SALT)
