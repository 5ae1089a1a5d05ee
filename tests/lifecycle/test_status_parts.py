from __future__ import annotations

from pdctl.lifecycle.smoke import Reuse
from pdctl.lifecycle.status import EngineMetrics, parse_metrics

METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen"} 3.0
vllm:num_requests_running{engine="1",model_name="Qwen"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen"} 0.25
# TYPE vllm:nixl_xfer_time_seconds histogram
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="0.1"} 4.0
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="+Inf"} 5.0
vllm:nixl_xfer_time_seconds_count{engine="0"} 5.0
vllm:nixl_xfer_time_seconds_sum{engine="0"} 0.4
# TYPE vllm:nixl_bytes_transferred histogram
vllm:nixl_bytes_transferred_count{engine="0"} 5.0
vllm:nixl_bytes_transferred_sum{engine="0"} 1000.0
# TYPE vllm:nixl_num_failed_transfers counter
vllm:nixl_num_failed_transfers_total{engine="0"} 1.0
# TYPE vllm:nixl_num_kv_expired_reqs counter
vllm:nixl_num_kv_expired_reqs_total{engine="0"} 2.0
"""


def test_parse_metrics_sums_engines_and_reads_histograms_and_counters() -> None:
    assert parse_metrics(METRICS) == EngineMetrics(
        running=4, waiting=2, kv_cache_usage=0.25, nixl_transfers=5, nixl_bytes=1000, nixl_failures=1,
        kv_expired=2,
    )


def test_reuse_header_parsing() -> None:
    assert Reuse.parse("hit;tokens=212;reason=verified") == Reuse("hit", 212, "verified")
    assert Reuse.parse("miss;reason=first_turn") == Reuse("miss", 0, "first_turn")
    assert Reuse.parse(None).kind == "absent"


def test_smoke_reads_a_streamed_reply_and_rejects_error_streams() -> None:
    from pdctl.lifecycle.smoke import _streamed_content

    ok = ('data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
          'data: {"choices":[{"delta":{"content":"Hel"}}]}\n\ndata: {"choices":[{"delta":{"content":"lo"}}]}\n\n'
          'data: {"choices":[],"usage":{"completion_tokens":2}}\n\ndata: [DONE]\n\n')
    assert _streamed_content(ok) == "Hello"
    failed = 'data: {"choices":[{"delta":{"content":"Hel"}}]}\n\ndata: {"error":{"message":"x","code":502}}\n\n'
    assert _streamed_content(failed) is None
    assert _streamed_content('{"id":"not a stream"}') is None
