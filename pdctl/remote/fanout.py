"""Doing the same thing on many hosts at once: the one thread pool pdctl uses."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from pdctl.errors import PdctlError

K = TypeVar("K")
T = TypeVar("T")

MAX_WORKERS = 16


def parallel(items: Iterable[K], fn: Callable[[K], T], max_workers: int = MAX_WORKERS) -> dict[K, T]:
    """`fn` on every item in threads; results by item, in the items' order. Every item finishes before the first
    error is raised, with the others' messages appended, so no host is left half-done unnoticed."""
    keys = list(items)
    if not keys:
        return {}
    results: dict[K, T] = {}
    errors: list[BaseException] = []
    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(keys)))) as pool:
        futures = {k: pool.submit(fn, k) for k in keys}
        for k, fut in futures.items():
            try:
                results[k] = fut.result()
            except BaseException as exc:
                errors.append(exc)
    if errors:
        first = errors[0]
        if len(errors) > 1 and isinstance(first, PdctlError):
            more = "; ".join(str(e).splitlines()[0] for e in errors[1:])
            first.message = f"{first.message}\n(also: {more})"
            first.args = (first.message,)
        raise first
    return results
