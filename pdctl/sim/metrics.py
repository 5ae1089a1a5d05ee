"""Prometheus metrics under vLLM's names, the step model's own under pdctl_sim_ names (what the capacity report's
busy fraction and KV peak read), and the periodic `KV Transfer metrics:` log line."""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, GCCollector, Histogram, ProcessCollector
from prometheus_client.metrics import MetricWrapperBase

M = TypeVar("M", bound=MetricWrapperBase)

log = logging.getLogger("vllm.distributed.kv_transfer.kv_connector.v1.metrics")

XFER_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
BYTES_BUCKETS = tuple(float(2**k) for k in range(11, 35, 2))
# vLLM's bucket bounds for these histograms (vllm/v1/metrics/loggers.py), with finer ones below 10 ms for ITL:
# a simulator at speed > 1 steps faster than any GPU
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                   40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
               2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
DESC_BUCKETS = (1.0, 10.0, 100.0, 1000.0, 10000.0, 100000.0, 1000000.0)


class SimMetrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        r = self.registry
        ProcessCollector(registry=r)  # process_cpu_seconds_total, as vLLM's /metrics has: the bench warns near 1 core
        GCCollector(registry=r)  # python_gc_collections_total by generation, as vLLM's /metrics has
        self._values = {"model_name": model_name, "engine": "0"}
        self._children: dict[int, MetricWrapperBase] = {}  # lab(): each metric's child for _values, by id
        self.running = Gauge("vllm:num_requests_running", "Requests running.", labels, registry=r)
        self.waiting = Gauge("vllm:num_requests_waiting", "Requests waiting.", labels, registry=r)
        self.kv_usage = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 1 = full.", labels, registry=r)
        self.prompt_tokens = Counter("vllm:prompt_tokens", "Prefill tokens processed.", labels, registry=r)
        self.generation_tokens = Counter("vllm:generation_tokens", "Tokens generated.", labels, registry=r)
        self.cache_queries = Counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                                     labels, registry=r)
        self.cache_hits = Counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.", labels,
                                  registry=r)
        self.xfer_time = Histogram(
            "vllm:nixl_xfer_time_seconds", "NIXL read time.", labels, buckets=XFER_BUCKETS, registry=r
        )
        self.post_time = Histogram(
            "vllm:nixl_post_time_seconds", "NIXL post time.", labels, buckets=XFER_BUCKETS, registry=r
        )
        self.xfer_bytes = Histogram(
            "vllm:nixl_bytes_transferred", "Bytes per NIXL read.", labels, buckets=BYTES_BUCKETS, registry=r
        )
        self.descriptors = Histogram(
            "vllm:nixl_num_descriptors", "Descriptors per NIXL read.", labels, buckets=DESC_BUCKETS, registry=r
        )
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token, from the engine's start "
                              "of the request.", labels, buckets=LATENCY_BUCKETS, registry=r)
        self.inter_token = Histogram("vllm:inter_token_latency_seconds", "Time between a request's tokens.", labels,
                                     buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Request latency, start to last token.", labels,
                             buckets=LATENCY_BUCKETS, registry=r)
        self.failed = Counter("vllm:nixl_num_failed_transfers", "Failed NIXL reads.", labels, registry=r)
        self.failed_notifs = Counter(
            "vllm:nixl_num_failed_notifications", "Failed NIXL notifications.", labels, registry=r
        )
        self.expired = Counter("vllm:nixl_num_kv_expired_reqs", "Remote reads declined as expired.", labels, registry=r)
        self.corrupt = Counter(
            "pdctl_sim_corrupt_reuse", "KV reuses whose blocks did not hold the prompt's prefix.", labels, registry=r
        )
        self.aborted = Counter("pdctl_sim_aborted_requests", "Requests aborted before they finished (client gone).",
                               labels, registry=r)
        self.tokenize_calls = Counter("pdctl_sim_tokenize_requests", "/tokenize requests answered.", labels,
                                      registry=r)
        self.tokenize_bytes = Counter("pdctl_sim_tokenize_response_bytes", "Bytes of /tokenize response bodies.",
                                      labels, registry=r)
        self.encoded = Counter("pdctl_sim_encoded_prompt_tokens",
                               "Prompt tokens of generation requests encoded from text or a chat rendering "
                               "(token-id prompts skip the tokenizer).", labels, registry=r)
        self.step_ms = Counter("pdctl_sim_step_modelled_ms", "Modelled time of every engine step, ms at speed 1 "
                               "(--step-model).", labels, registry=r)
        self.steps = Counter("pdctl_sim_steps", "Engine steps run (--step-model).", labels, registry=r)
        self.step_prefill = Counter("pdctl_sim_step_prefill_tokens", "Prompt tokens computed in engine steps.",
                                    labels, registry=r)
        self.step_decode = Counter("pdctl_sim_step_decode_tokens", "Decode tokens computed in engine steps.",
                                   labels, registry=r)
        self.kv_in_use = Gauge("pdctl_sim_kv_blocks_in_use", "KV blocks held by requests or kept for a peer.",
                               labels, registry=r)
        self.kv_peak = Gauge("pdctl_sim_kv_blocks_peak", "Most KV blocks in use at once since the engine started.",
                             labels, registry=r)
        self.kv_blocks = Gauge("pdctl_sim_kv_num_gpu_blocks", "KV blocks the engine has.", labels, registry=r)
        self.retained_requests = Gauge(
            "pdctl_sim_kv_retained_requests", "Finished requests whose KV blocks are kept for a peer (a prefill's "
            "lease for a decode's pull, a decode's TTL for a prefill's readback).", labels, registry=r)
        self.retained_blocks = Gauge("pdctl_sim_kv_retained_blocks", "KV blocks kept for a peer (part of "
                                     "pdctl_sim_kv_blocks_in_use and vllm:kv_cache_usage_perc).", labels, registry=r)
        self.retained_freed = Counter(
            "pdctl_sim_kv_retained_freed", "Retained requests whose blocks were freed, by how: expired (lease or "
            "TTL ran out), read (a peer's read spent the handle), released (a peer's notify).",
            [*labels, "how"], registry=r)
        self.expiry_heap = Gauge("pdctl_sim_kv_expiry_heap_entries", "Entries in the retained requests' expiry "
                                 "heap (bounded by twice the retained requests plus a constant).", labels, registry=r)
        self.kv_waits = Counter("pdctl_sim_kv_waits", "Requests that waited for free KV blocks (counted in "
                                "vllm:num_requests_waiting while they wait).", labels, registry=r)
        self.side_peers = Gauge("pdctl_sim_side_channel_peers", "Peers this engine has a side-channel client for.",
                                labels, registry=r)
        self.side_in_flight = Gauge("pdctl_sim_side_channel_in_flight", "Side-channel requests in flight now.",
                                    labels, registry=r)
        self.side_in_flight_peak = Gauge("pdctl_sim_side_channel_in_flight_peak", "Most side-channel requests in "
                                         "flight at once since the engine started.", labels, registry=r)
        self.notify_requests = Counter("pdctl_sim_side_channel_notify_requests", "Notify requests sent to peers "
                                       "(each carries a batch of request ids).", labels, registry=r)
        self.notify_ids = Counter("pdctl_sim_side_channel_notified_ids", "Request ids sent in notify requests.",
                                  labels, registry=r)
        self.gc_frozen = Gauge("pdctl_sim_gc_frozen_objects", "Objects of the startup heap (the KV blocks) frozen "
                               "out of the garbage collector's scans, as vLLM freezes its own.", registry=r)
        self._peak = 0
        self._in_flight = 0
        self._in_flight_peak = 0
        for how in ("expired", "read", "released"):
            self.retained_freed.labels(**self._values, how=how)
        for metric in (self.retained_requests, self.retained_blocks, self.expiry_heap, self.kv_waits,
                       self.side_peers, self.side_in_flight, self.side_in_flight_peak, self.notify_requests,
                       self.notify_ids,
                       self.kv_in_use, self.kv_peak, self.kv_blocks, self.aborted, self.running, self.waiting,
                       self.kv_usage, self.prompt_tokens, self.generation_tokens,
                       self.cache_queries, self.cache_hits,
                       self.xfer_time, self.post_time, self.xfer_bytes, self.descriptors, self.failed,
                       self.failed_notifs, self.expired, self.corrupt, self.ttft, self.inter_token, self.e2e,
                       self.tokenize_calls, self.tokenize_bytes,
                       self.encoded):
            metric.labels(**self._values)
        self.stats = TransferStats()

    def lab(self, metric: M) -> M:
        """The metric's child for this engine's labels. Cached: prometheus-client's labels() validates and locks
        on every call, and an engine sets its gauges several times a request (a tenth of a zero-delay prefill's
        CPU went there)."""
        child = self._children.get(id(metric))
        if child is None:
            child = self._children[id(metric)] = metric.labels(**self._values)
        return child  # type: ignore[return-value]  # labels() of an M is an M

    def enable_steps(self) -> None:
        """Show the step counters (at 0) only on an engine that runs the step model: without them a reader knows
        the engine's busy time is not modelled, rather than reading 0."""
        for metric in (self.step_ms, self.steps, self.step_prefill, self.step_decode):
            self.lab(metric)

    def record_step(self, ms: float, prefill_tokens: int, decode_tokens: int) -> None:
        self.lab(self.step_ms).inc(ms)
        self.lab(self.steps).inc()
        self.lab(self.step_prefill).inc(prefill_tokens)
        self.lab(self.step_decode).inc(decode_tokens)

    def record_kv(self, in_use: int, num_blocks: int) -> None:
        self._peak = max(self._peak, in_use)
        self.lab(self.kv_in_use).set(in_use)
        self.lab(self.kv_peak).set(self._peak)
        self.lab(self.kv_blocks).set(num_blocks)

    def record_retained(self, requests: int, blocks: int, heap_entries: int) -> None:
        self.lab(self.retained_requests).set(requests)
        self.lab(self.retained_blocks).set(blocks)
        self.lab(self.expiry_heap).set(heap_entries)

    def record_freed(self, how: str, requests: int) -> None:
        self.retained_freed.labels(**self._values, how=how).inc(requests)

    def side_channel_started(self) -> None:
        self._in_flight += 1
        if self._in_flight > self._in_flight_peak:
            self._in_flight_peak = self._in_flight
            self.lab(self.side_in_flight_peak).set(self._in_flight_peak)
        self.lab(self.side_in_flight).set(self._in_flight)

    def side_channel_ended(self) -> None:
        self._in_flight -= 1
        self.lab(self.side_in_flight).set(self._in_flight)

    def record_notify_batch(self, ids: int) -> None:
        self.lab(self.notify_requests).inc()
        self.lab(self.notify_ids).inc(ids)

    def record_transfer(self, seconds: float, post_s: float, nbytes: int, descriptors: int) -> None:
        self.lab(self.xfer_time).observe(seconds)
        self.lab(self.post_time).observe(post_s)
        self.lab(self.xfer_bytes).observe(nbytes)
        self.lab(self.descriptors).observe(descriptors)
        self.stats.add(seconds, post_s, nbytes, descriptors)

    def record_failure(self) -> None:
        self.lab(self.failed).inc()
        self.stats.failed += 1

    def record_expired(self) -> None:
        self.lab(self.expired).inc()
        self.stats.expired += 1

    def cache_config(self, block_size: int, num_gpu_blocks: int) -> None:
        """vLLM's info gauge of the KV cache's shape (the router reads the decode's capacity from it)."""
        info = Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig.",
                     ["engine", "block_size", "num_gpu_blocks"], registry=self.registry)
        info.labels("0", str(block_size), str(num_gpu_blocks)).set(1)


@dataclass
class TransferStats:
    """What one stats interval saw, reduced as NixlKVConnectorStats.reduce() does: sums and counts, and the last
    SAMPLE_WINDOW times for the P90s, so an interval with many transfers holds no more than one with few."""

    SAMPLE_WINDOW = 1024

    count: int = 0
    xfer_total_s: float = 0.0
    post_total_s: float = 0.0
    bytes_total: int = 0
    descriptors_total: int = 0
    xfer_s: deque[float] = field(default_factory=lambda: deque(maxlen=TransferStats.SAMPLE_WINDOW))
    post_s: deque[float] = field(default_factory=lambda: deque(maxlen=TransferStats.SAMPLE_WINDOW))
    failed: int = 0
    expired: int = 0

    def add(self, xfer_s: float, post_s: float, nbytes: int, descriptors: int) -> None:
        self.count += 1
        self.xfer_total_s += xfer_s
        self.post_total_s += post_s
        self.bytes_total += nbytes
        self.descriptors_total += descriptors
        self.xfer_s.append(xfer_s)
        self.post_s.append(post_s)

    def empty(self) -> bool:
        return not self.count and not self.failed and not self.expired

    def line(self) -> str:
        n = self.count
        if n:
            mb = self.bytes_total / 2**20
            total_s = self.xfer_total_s
            values = [n, round(total_s * 1e3 / n, 3), round(_p90([x * 1e3 for x in self.xfer_s]), 3),
                      round(self.post_total_s * 1e3 / n, 3), round(_p90([x * 1e3 for x in self.post_s]), 3),
                      round(mb / n, 3), round(mb / total_s, 3) if total_s > 0 else 0.0,
                      round(self.descriptors_total / n, 1)]
        else:
            values = [0, 0, 0, 0, 0, 0, 0, 0]
        keys = ["Num successful transfers", "Avg xfer time (ms)", "P90 xfer time (ms)", "Avg post time (ms)",
                "P90 post time (ms)", "Avg MB per transfer", "Throughput (MB/s)", "Avg number of descriptors",
                "Num failed transfers", "Num KV expired reqs"]
        values += [self.failed, self.expired]
        return "KV Transfer metrics: " + ", ".join(f"{k}={v}" for k, v in zip(keys, values, strict=True))


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def log_stats(metrics: SimMetrics) -> None:
    """Log the interval's line (only if something happened) and start a new interval."""
    stats, metrics.stats = metrics.stats, TransferStats()
    if not stats.empty():
        log.info("%s", stats.line())
