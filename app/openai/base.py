"""The base of every request body model: unknown fields ignored, null means the default."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


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
