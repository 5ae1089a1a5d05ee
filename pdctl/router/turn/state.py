"""Everything one router instance holds: config, the shared HTTP client, pools, policies, handles, kept
responses, metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

from pdctl.router.config import RouterConfig
from pdctl.router.kv.affinity import AffinityTable, EngineChoice
from pdctl.router.kv.capacity import Capacities
from pdctl.router.kv.conversation import DerivedIndex
from pdctl.router.kv.handles import Handle, HandleTable
from pdctl.router.kv.journal import Journal
from pdctl.router.kv.release import Releaser
from pdctl.router.kv.response_store import ResponseStore
from pdctl.router.kv.retention import Retention
from pdctl.router.kv.usage import KvUse
from pdctl.router.turn.choices import Choices
from pdctl.router.turn.metrics import RouterMetrics
from pdctl.router.turn.rates import Rates
from pdctl.router.turn.trace import Tracer
from pdctl.router.upstream.admission import Gate
from pdctl.router.upstream.client import LeanClient
from pdctl.router.upstream.pools import AffinityRing, HolderFirst, Pool, Selector


@dataclass
class RouterState:
    config: RouterConfig
    prefill: Pool
    decode: Pool
    prefill_policy: Selector
    decode_policy: Selector
    index: DerivedIndex
    handles: HandleTable
    responses: ResponseStore
    metrics: RouterMetrics
    prefill_gate: Gate
    decode_gate: Gate
    releaser: Releaser
    capacities: Capacities
    affinity: AffinityTable  # aggregated mode's conversation -> engine (disaggregated: the handles say it)
    engine_choice: EngineChoice
    kv_use: KvUse  # each engine's KV in use (overflow.py's signal)
    overflowed: AffinityTable  # conversation -> the prefill its turns run whole on (overflow.py)
    retention: Retention  # retained KV judged against each decode's own use; the pin journal (kv/retention.py)
    rates: Rates  # what the cost model predicts with (turn/rates.py, turn/cost.py)
    choices: Choices  # each warm turn's KV source, predicted and measured (turn/choices.py)
    client: LeanClient | None = field(default=None)
    unchecked: set[str] = field(default_factory=set)  # prefills warned about: they do not run pdctl's prefix check
    tracer: Tracer | None = None  # --otlp-endpoint: the turns' traces (turn/trace.py); None: tracing off

    @classmethod
    def create(cls, config: RouterConfig) -> RouterState:
        prefill = Pool("prefill", config.prefill, config.eject_after)
        decode = Pool("decode", config.decode, config.eject_after)
        index = DerivedIndex()
        metrics = RouterMetrics()
        rates = Rates()
        releaser = Releaser(prefill, decode, config.model, metrics.releases, config.release_concurrency,
                            config.release, config.block_size, config.release_carry_ms / 1000,
                            config.release_calm_carry_s, config.decoder_kv_blocks_ttl)
        capacities = Capacities(config.pin_budget_tokens, config.pin_budget_fraction if config.release else 0.0)
        journal = (Journal(config.state_dir, config.decoder_kv_blocks_ttl)
                   if config.state_dir and config.release and config.mode == "disaggregated" else None)
        releaser.journal = journal
        handles = HandleTable(config.max_handles, index=index, on_drop=releaser.submit,
                              budget=capacities.budget if config.release else None,
                              block_size=config.block_size, journal=journal)
        retention = Retention(handles, releaser, decode, config.retain_high_kv, config.retain_target_kv,
                              config.block_size, metrics.registry, journal)
        releaser.calm = retention.calm
        return cls(
            config=config,
            prefill=prefill,
            decode=decode,
            prefill_policy=AffinityRing(prefill, config.load_factor),
            decode_policy=HolderFirst(config.load_factor),
            index=index,
            handles=handles,
            responses=ResponseStore(config.handle_lifetime, config.max_handles),
            metrics=metrics,
            prefill_gate=Gate(prefill, config.max_inflight_per_instance, config.max_queue, config.queue_timeout,
                              metrics.refusal),
            decode_gate=Gate(decode, config.max_inflight_per_instance, config.max_queue, config.queue_timeout,
                             metrics.refusal),
            releaser=releaser,
            capacities=capacities,
            affinity=AffinityTable(config.max_handles, index=index),
            engine_choice=EngineChoice(),
            kv_use=KvUse(),
            overflowed=AffinityTable(config.max_handles, index=index),
            retention=retention,
            rates=rates,
            choices=Choices(metrics.registry, rates, config.itl_slo_ms, config.local_stall_ratio),
            tracer=Tracer(config.trace_queue, metrics.traced) if config.otlp_endpoint else None,
        )

    @property
    def http(self) -> LeanClient:
        if self.client is None:
            raise RuntimeError("the router's HTTP client is opened by the app's lifespan")
        return self.client

    def stale(self, h: Handle) -> bool:
        """Whether the decode that issued `h` may have died since (ejected, restarted, gone from the config)."""
        u = self.decode.by_url(h.decode_url)
        return u is None or not u.healthy or u.draining or u.generation != h.generation

    def held(self) -> dict[str, int]:
        """Per decode URL: its live handles plus the releases to it still in flight."""
        return {u.url: self.handles.on(u.url) + self.releaser.pending[u.url] for u in self.decode.members}

    def exposition(self) -> bytes:
        """The /metrics text."""
        self.choices.exposition()
        if self.config.mode == "disaggregated":
            self.retention.gauges()  # as of now, not of the last poll (up to POLL_S old): /metrics agrees with /stats
        return self.metrics.exposition(len(self.handles), self.prefill, self.decode, self.handles.pinned(),
                                       self.capacities.budgets(self.decode) if self.config.release else {},
                                       (self.prefill_gate, self.decode_gate))

    def stats(self) -> dict[str, object]:
        return self.metrics.stats(len(self.handles), self.prefill, self.decode, self.handles.pinned(),
                                  self.capacities.budgets(self.decode) if self.config.release else {},
                                  self.kv_use.snapshot((self.prefill, self.decode)), self.held(),
                                  self.retention.stats() if self.config.mode == "disaggregated" else None,
                                  self.choices.stats() if self.config.mode == "disaggregated" else None)
