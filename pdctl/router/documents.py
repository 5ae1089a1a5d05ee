"""The router's documents: `GET /stats` (RouterStats, one UpstreamStats per engine) and the members file
(Members), each with a reader that names the first field that is wrong. Part of the router's public signals:
`pdctl.router.wire` re-exports every name. Imports nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class UpstreamStats:
    """One prefill or decode instance as the router sees it."""

    url: str
    healthy: bool
    outstanding: int
    failures: int
    generation: int
    work: int = 0  # prompt tokens of its in-flight requests not yet computed (router.placement's estimate)
    draining: bool = False  # leaving: no new turns (the router's members file, pdctl.router.upstream.members)
    held: int = 0  # decodes: live handles on it plus releases to it still in flight (a drain waits for 0)


@dataclass(frozen=True)
class DecodeRetention:
    """One decode as the router's retention sees it (pdctl.router.kv.retention)."""

    url: str
    kv_usage: float | None = None  # its own KV use at the router's last poll (None: not known)
    waiting: int | None = None  # requests waiting on it at that poll
    capacity_tokens: int | None = None
    retained_blocks: int = 0  # what this router's live handles pin there
    retained_tokens: int = 0
    handles: int = 0
    releases_queued: int = 0


@dataclass(frozen=True)
class RetentionStats:
    """The `retention` section of /stats (disaggregated mode): retained KV against each decode's own use."""

    high_kv: float
    target_kv: float
    handles: int = 0
    release_queue: int = 0  # releases submitted and not yet done
    pressure_events: int = 0  # polls that found a decode under pressure and released something
    releases: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # reason -> result -> releases
    journal: Mapping[str, object] | None = None  # path, pins, written, lines (None: no --state-dir)
    decodes: tuple[DecodeRetention, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"high_kv": self.high_kv, "target_kv": self.target_kv, "handles": self.handles,
                "release_queue": self.release_queue, "pressure_events": self.pressure_events,
                "releases": {k: dict(v) for k, v in self.releases.items()},
                "journal": dict(self.journal) if self.journal is not None else None,
                "decodes": [{"url": d.url, "kv_usage": d.kv_usage, "waiting": d.waiting,
                             "capacity_tokens": d.capacity_tokens, "retained_blocks": d.retained_blocks,
                             "retained_tokens": d.retained_tokens, "handles": d.handles,
                             "releases_queued": d.releases_queued} for d in self.decodes]}

    @classmethod
    def from_json(cls, doc: object) -> RetentionStats:
        d = _object(doc, "`retention`")
        by_reason = _object(d.get("releases") or {}, "`retention.releases`")
        releases = {reason: _counts(by_reason, reason) for reason in by_reason}
        journal = d.get("journal")
        decodes = []
        for i, item in enumerate(_list(d, "decodes")):
            u = _object(item, f"`retention.decodes[{i}]`")
            usage, waiting, capacity = u.get("kv_usage"), u.get("waiting"), u.get("capacity_tokens")
            decodes.append(DecodeRetention(
                _str(u, "url"), _float(u, "kv_usage") if usage is not None else None,
                _int(u, "waiting") if waiting is not None else None,
                _int(u, "capacity_tokens") if capacity is not None else None,
                _int(u, "retained_blocks"), _int(u, "retained_tokens"), _int(u, "handles"),
                _int(u, "releases_queued")))
        return cls(_float(d, "high_kv"), _float(d, "target_kv"), _int(d, "handles"), _int(d, "release_queue"),
                   _int(d, "pressure_events"), releases,
                   dict(_object(journal, "`retention.journal`")) if journal is not None else None, tuple(decodes))


@dataclass(frozen=True)
class KvChoiceStats:
    """The `kv_choice` section of /stats (disaggregated mode): the KV source the router chose for its warm turns
    (pdctl.router.turn.cost), how well it predicted their time to first token, and the rates it predicts with."""

    itl_slo_ms: float
    mix: Mapping[str, int] = field(default_factory=dict)  # source chosen -> turns (decode_cache, decode_read, ...)
    basis: Mapping[str, int] = field(default_factory=dict)  # model | default (rates not yet measured) | probe -> turns
    local_refused: Mapping[str, int] = field(default_factory=dict)  # itl | stall | slower | cap | unmeasured -> turns
    measured_turns: int = 0  # model-chosen streamed turns whose TTFT was compared with the prediction
    error_window: int = 0  # of them, the last this many are summarised below
    error_mean_ms: float = 0.0  # measured - predicted TTFT, mean (> 0: the model is optimistic)
    error_abs_p50_ms: float = 0.0
    error_abs_p90_ms: float = 0.0
    rates: Mapping[str, object] = field(default_factory=dict)  # engines (tokens_per_s, step_ms), links
    local_stall_ratio: float | None = None  # router.local_stall_ratio (0: no stall bound); None: a router before it

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {} if self.local_stall_ratio is None else {"local_stall_ratio": self.local_stall_ratio}
        return {"itl_slo_ms": self.itl_slo_ms, **doc, "mix": dict(self.mix), "basis": dict(self.basis),
                "local_refused": dict(self.local_refused), "measured_turns": self.measured_turns,
                "error_window": self.error_window, "error_mean_ms": self.error_mean_ms,
                "error_abs_p50_ms": self.error_abs_p50_ms, "error_abs_p90_ms": self.error_abs_p90_ms,
                "rates": dict(self.rates)}

    @classmethod
    def from_json(cls, doc: object) -> KvChoiceStats:
        d = _object(doc, "`kv_choice`")
        return cls(_float(d, "itl_slo_ms"), _counts(d, "mix"), _counts(d, "basis"), _counts(d, "local_refused"),
                   _int(d, "measured_turns"), _int(d, "error_window"), _float(d, "error_mean_ms"),
                   _float(d, "error_abs_p50_ms"), _float(d, "error_abs_p90_ms"),
                   dict(_object(d.get("rates") or {}, "`kv_choice.rates`")),
                   _float(d, "local_stall_ratio") if d.get("local_stall_ratio") is not None else None)


@dataclass(frozen=True)
class RouterStats:
    """The router's `GET /stats` document. `from_json(x.to_json()) == x`."""

    requests_total: int
    reuse: Mapping[str, int]  # outcome -> turns (hit, partial, miss)
    reuse_reasons: Mapping[str, int] = field(default_factory=dict)
    reused_tokens_total: int = 0
    local_turns: int = 0
    whole_prefill_turns: int = 0  # turns served whole on a prefill (router.overflow_kv)
    hit_rate: float = 0.0  # (hit + partial) / eligible_turns, 4 decimals
    eligible_turns: int = 0
    reused_turns: int = 0  # hit + partial: hit_rate's numerator
    # The same over the last recent_window_s seconds (a rate since start mixes settings changed live).
    recent_window_s: float = 0.0
    recent_eligible_turns: int = 0
    recent_reused_turns: int = 0
    recent_hit_rate: float = 0.0
    live_handles: int = 0
    pinned_tokens: Mapping[str, int] = field(default_factory=dict)  # decode URL -> tokens its live handles pin
    pin_budget_tokens: Mapping[str, int] = field(default_factory=dict)  # decode URL -> its budget (none: absent)
    releases: Mapping[str, int] = field(default_factory=dict)  # why -> releases sent (pdctl.router.kv.release)
    releases_failed: int = 0  # releases that did not reach a prefill or that it refused
    kv_use: Mapping[str, float] = field(default_factory=dict)  # engine URL -> its KV in use as the router sees it
    prefill: tuple[UpstreamStats, ...] = ()
    decode: tuple[UpstreamStats, ...] = ()
    uptime_s: float = 0.0
    version: str = ""
    retention: RetentionStats | None = None  # disaggregated mode only
    kv_choice: KvChoiceStats | None = None  # disaggregated mode only

    @property
    def hit(self) -> int:
        return self.reuse.get("hit", 0)

    @property
    def partial(self) -> int:
        return self.reuse.get("partial", 0)

    @property
    def miss(self) -> int:
        return self.reuse.get("miss", 0)

    def to_json(self) -> dict[str, Any]:
        return {
            "requests_total": self.requests_total,
            "reuse": dict(self.reuse),
            "reuse_reasons": dict(self.reuse_reasons),
            "reused_tokens_total": self.reused_tokens_total,
            "local_turns": self.local_turns,
            "whole_prefill_turns": self.whole_prefill_turns,
            "hit_rate": self.hit_rate,
            "eligible_turns": self.eligible_turns,
            "reused_turns": self.reused_turns,
            "recent_window_s": self.recent_window_s,
            "recent_eligible_turns": self.recent_eligible_turns,
            "recent_reused_turns": self.recent_reused_turns,
            "recent_hit_rate": self.recent_hit_rate,
            "live_handles": self.live_handles,
            "pinned_tokens": dict(self.pinned_tokens),
            "pin_budget_tokens": dict(self.pin_budget_tokens),
            "releases": dict(self.releases),
            "releases_failed": self.releases_failed,
            "kv_use": dict(self.kv_use),
            "prefill": [_upstream_json(u) for u in self.prefill],
            "decode": [_upstream_json(u) for u in self.decode],
            "uptime_s": self.uptime_s,
            "version": self.version,
            **({"retention": self.retention.to_json()} if self.retention is not None else {}),
            **({"kv_choice": self.kv_choice.to_json()} if self.kv_choice is not None else {}),
        }

    @classmethod
    def from_json(cls, doc: object) -> RouterStats:
        """Raises ValueError naming the first field that is missing or of the wrong type. `requests_total` and
        `reuse` are required; the rest default, so a router one release older still reads."""
        d = _object(doc, "the document")
        return cls(
            requests_total=_int(d, "requests_total", required=True),
            reuse=_counts(d, "reuse", required=True),
            reuse_reasons=_counts(d, "reuse_reasons"),
            reused_tokens_total=_int(d, "reused_tokens_total"),
            local_turns=_int(d, "local_turns"),
            whole_prefill_turns=_int(d, "whole_prefill_turns"),
            hit_rate=_float(d, "hit_rate"),
            eligible_turns=_int(d, "eligible_turns"),
            reused_turns=_int(d, "reused_turns"),
            recent_window_s=_float(d, "recent_window_s"),
            recent_eligible_turns=_int(d, "recent_eligible_turns"),
            recent_reused_turns=_int(d, "recent_reused_turns"),
            recent_hit_rate=_float(d, "recent_hit_rate"),
            live_handles=_int(d, "live_handles"),
            pinned_tokens=_counts(d, "pinned_tokens"),
            pin_budget_tokens=_counts(d, "pin_budget_tokens"),
            releases=_counts(d, "releases"),
            releases_failed=_int(d, "releases_failed"),
            kv_use=_fractions(d, "kv_use"),
            prefill=_upstreams(d, "prefill"),
            decode=_upstreams(d, "decode"),
            uptime_s=_float(d, "uptime_s"),
            version=_str(d, "version"),
            retention=RetentionStats.from_json(d["retention"]) if d.get("retention") is not None else None,
            kv_choice=KvChoiceStats.from_json(d["kv_choice"]) if d.get("kv_choice") is not None else None,
        )


def _upstream_json(u: UpstreamStats) -> dict[str, object]:
    return {"url": u.url, "healthy": u.healthy, "outstanding": u.outstanding, "work": u.work,
            "failures": u.failures, "generation": u.generation, "draining": u.draining, "held": u.held}


def _bad(what: str, want: str, got: object) -> ValueError:
    return ValueError(f"router /stats: {what} is not {want}: {got!r:.80}")


def _object(value: object, what: str) -> Mapping[str, object]:
    if not isinstance(value, dict):
        raise _bad(what, "a JSON object", value)
    return value


def _get(d: Mapping[str, object], key: str, required: bool) -> object:
    if key not in d and required:
        raise ValueError(f"router /stats: `{key}` is missing (is this a pdctl router?)")
    return d.get(key)


def _int(d: Mapping[str, object], key: str, required: bool = False) -> int:
    v = _get(d, key, required)
    if v is None and not required:
        return 0
    if not isinstance(v, int) or isinstance(v, bool):
        raise _bad(f"`{key}`", "an integer", v)
    return v


def _float(d: Mapping[str, object], key: str) -> float:
    v = d.get(key)
    if v is None:
        return 0.0
    if not isinstance(v, int | float) or isinstance(v, bool):
        raise _bad(f"`{key}`", "a number", v)
    return float(v)


def _str(d: Mapping[str, object], key: str) -> str:
    v = d.get(key, "")
    if not isinstance(v, str):
        raise _bad(f"`{key}`", "a string", v)
    return v


def _counts(d: Mapping[str, object], key: str, required: bool = False) -> dict[str, int]:
    v = _get(d, key, required)
    if v is None and not required:
        return {}
    out: dict[str, int] = {}
    for k, n in _object(v, f"`{key}`").items():
        if not isinstance(n, int) or isinstance(n, bool):
            raise _bad(f"`{key}.{k}`", "an integer", n)
        out[k] = n
    return out


def _fractions(d: Mapping[str, object], key: str) -> dict[str, float]:
    v = d.get(key)
    if v is None:
        return {}
    out: dict[str, float] = {}
    for k, n in _object(v, f"`{key}`").items():
        if not isinstance(n, int | float) or isinstance(n, bool):
            raise _bad(f"`{key}.{k}`", "a number", n)
        out[k] = float(n)
    return out


def _list(d: Mapping[str, object], key: str) -> list[object]:
    v = d.get(key, [])
    if not isinstance(v, list):
        raise _bad(f"`{key}`", "a list", v)
    return v


def _upstreams(d: Mapping[str, object], key: str) -> tuple[UpstreamStats, ...]:
    v = d.get(key, [])
    if not isinstance(v, list):
        raise _bad(f"`{key}`", "a list", v)
    out: list[UpstreamStats] = []
    for i, item in enumerate(v):
        u = _object(item, f"`{key}[{i}]`")
        url, healthy = u.get("url"), u.get("healthy")
        if not isinstance(url, str):
            raise _bad(f"`{key}[{i}].url`", "a string", url)
        if not isinstance(healthy, bool):
            raise _bad(f"`{key}[{i}].healthy`", "true or false", healthy)
        draining = u.get("draining", False)
        if not isinstance(draining, bool):
            raise _bad(f"`{key}[{i}].draining`", "true or false", draining)
        out.append(UpstreamStats(url, healthy, _int(u, "outstanding"), _int(u, "failures"), _int(u, "generation"),
                                 _int(u, "work"), draining, _int(u, "held")))
    return tuple(out)


@dataclass(frozen=True)
class Members:
    """The router's members file (`--members-file`, re-read on SIGHUP; pdctl.router.server.membership):

        {"prefill": [URL...], "decode": [URL...], "draining": [URL...]}

    `draining` members serve what they already have and take no new turn; members left out are removed once idle.
    """

    prefill: tuple[str, ...]
    decode: tuple[str, ...]
    draining: frozenset[str] = frozenset()

    def to_json(self) -> dict[str, list[str]]:
        return {"prefill": list(self.prefill), "decode": list(self.decode), "draining": sorted(self.draining)}

    @classmethod
    def from_json(cls, doc: object) -> Members:
        """Raises ValueError naming the part that is wrong."""
        d = _object(doc, "the members file")
        lists: dict[str, tuple[str, ...]] = {}
        for key in ("prefill", "decode", "draining"):
            v = d.get(key, [])
            if not isinstance(v, list) or not all(isinstance(u, str) and u.startswith(("http://", "https://"))
                                                  for u in v):
                raise ValueError(f"`{key}` must be a list of http(s) URLs, got {v!r:.80}")
            lists[key] = tuple(u.rstrip("/") for u in v)
        return cls(lists["prefill"], lists["decode"], frozenset(lists["draining"]))
