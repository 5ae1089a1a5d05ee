"""Secrets: values that reach a process but show as `***` in every display (plan, JSON, errors, logs).

A `Secret` has no string form but the mask; code that must hand the value to a process calls `reveal()`.
Env values are secrets when their name says so (HF_TOKEN, *_TOKEN, *_KEY, *_SECRET, *PASSWORD*, ...) or the
topology lists the name under `env.secret`. `scrub()` removes revealed values from text a host sent back
(a failed start's stderr may echo its own command line).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

MASK = "***"
_SECRET_NAME = re.compile(r"(?i)(.*_)?(TOKEN|KEY|SECRET)|.*PASSW(OR)?D.*|.*CREDENTIALS?")


class Secret:
    """A value whose every rendering (`str`, `repr`, f-string, JSON via `shown`) is `***`."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __str__(self) -> str:
        return MASK

    def __repr__(self) -> str:
        return f"Secret({MASK!r})"

    def __format__(self, spec: str) -> str:
        return MASK

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", self._value))


EnvValue = str | Secret


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.fullmatch(name))


def mark(env: Mapping[str, str], secret_names: Iterable[str] = ()) -> dict[str, EnvValue]:
    """`env` with the values of secret names wrapped in `Secret`."""
    listed = set(secret_names)
    return {k: Secret(v) if (k in listed or is_secret_name(k)) and v else v for k, v in env.items()}


def reveal(value: EnvValue) -> str:
    return value.reveal() if isinstance(value, Secret) else value


def shown(value: EnvValue) -> str:
    return MASK if isinstance(value, Secret) else value


def secret_values(env: Mapping[str, EnvValue]) -> list[str]:
    return [v.reveal() for v in env.values() if isinstance(v, Secret)]


def scrub(text: str, secrets: Iterable[str]) -> str:
    """`text` with every occurrence of each secret value replaced by the mask, longest first."""
    for value in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(value, MASK)
    return text


def bearer(key: str | None) -> dict[str, str]:
    """The `Authorization: Bearer` header that carries an API key (the router's, or the engines'); none without one."""
    return {"Authorization": f"Bearer {key}"} if key else {}
