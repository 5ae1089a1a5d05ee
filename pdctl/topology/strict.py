"""The base of every topology model: unknown keys refused, values frozen, no coercion."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    # strict: `port: true` is not port 1, and `"8000"` is not a number
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
