from __future__ import annotations

from pdctl.lifecycle.watch.status import EngineMetrics, parse_metrics
from pdctl.router.wire import Reuse

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
    assert Reuse.parse(None).outcome == "absent"


def test_smoke_reads_a_streamed_reply_and_rejects_error_streams() -> None:
    from pdctl.lifecycle.bringup.smoke import _streamed_content

    ok = ('data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
          'data: {"choices":[{"delta":{"content":"Hel"}}]}\n\ndata: {"choices":[{"delta":{"content":"lo"}}]}\n\n'
          'data: {"choices":[],"usage":{"completion_tokens":2}}\n\ndata: [DONE]\n\n')
    assert _streamed_content(ok) == "Hello"
    failed = 'data: {"choices":[{"delta":{"content":"Hel"}}]}\n\ndata: {"error":{"message":"x","code":502}}\n\n'
    assert _streamed_content(failed) is None
    assert _streamed_content('{"id":"not a stream"}') is None


def test_status_names_a_shared_gpu_and_what_its_processes_hold() -> None:
    import io

    from rich.console import Console

    from pdctl.lifecycle.watch.status import ProcessStatus, StatusReport
    from pdctl.lifecycle.watch.status_view import render_status

    def proc(name: str, mib: int | None, gpus: list[int]) -> ProcessStatus:
        return ProcessStatus(name, "decode", "gpu-host", "127.0.0.1", "http://x", 1, None, True, "ok", 1.0, "log",
                             gpu_memory_mib=mib, gpus=gpus)

    report = StatusReport("one", None, [proc("decode-0", 63818, [0]), proc("prefill-0", 63818, [0]),
                                        proc("router", None, [])])
    out = io.StringIO()
    render_status(report, Console(file=out, width=200, color_system=None))
    assert "GPU 0 of gpu-host is shared by decode-0, prefill-0: 127636 MiB together" in out.getvalue()
    assert report.to_json()["processes"][0]["gpus"] == [0]
