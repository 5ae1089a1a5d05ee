from __future__ import annotations

from pathlib import Path

import pytest

from pdctl.bench.runner.collect import EngineUsage, kv_from_log, nixl_delta, usage_delta
from pdctl.engine_metrics import has_nixl, parse_kv_log_line, parse_prometheus

SAMPLES = Path(__file__).parent / "samples"


def test_old_format_log_lines_recorded_on_h200() -> None:
    lines = (SAMPLES / "prefill-on.kvmetrics.txt").read_text().splitlines()
    first = parse_kv_log_line(lines[0])
    assert first is not None and len(first) == 8
    assert first["Num successful transfers"] == 2 and first["Avg xfer time (ms)"] == 37.198
    kv = kv_from_log(lines)
    assert kv.transfers == 16
    assert kv.xfer_ms == pytest.approx(
        2 * 37.198 + 2 * 33.533 + 3 * 126.219 + 2 * 320.029 + 2 * 25.594 + 315.543 + 2 * 311.197 + 2 * 237.116
    )
    assert kv.bytes == pytest.approx((2 * 588 * 2 + 3 * 2064 + 2 * 3088 + 2 * 4088 + 4160 + 2 * 6088 * 2) * 2**20)
    assert kv.failed == 0 and kv.source == "log"


def test_decode_off_log_has_the_6gb_pull() -> None:
    kv = kv_from_log((SAMPLES / "decode-off.kvmetrics.txt").read_text().splitlines())
    lines = (SAMPLES / "decode-off.kvmetrics.txt").read_text().splitlines()
    assert kv.transfers == 23
    assert max(f["Avg MB per transfer"] for x in lines if (f := parse_kv_log_line(x))) == 6000.0


def test_new_format_log_with_noise_and_unknown_keys() -> None:
    lines = (SAMPLES / "prefill-new-format.log").read_text().splitlines()
    assert parse_kv_log_line(lines[0]) is None
    assert parse_kv_log_line(lines[2]) is None
    f = parse_kv_log_line(lines[1])
    assert f is not None and len(f) == 10 and f["Num KV expired reqs"] == 2
    kv = kv_from_log(lines)
    assert kv.transfers == 6
    assert kv.xfer_ms == pytest.approx(4 * 1.381 + 2 * 10.0)
    assert kv.failed == 4 and kv.expired == 2
    assert kv.avg_xfer_ms == pytest.approx((4 * 1.381 + 20.0) / 6)


def test_prometheus_scrape_recorded_from_vllm_0_26() -> None:
    samples = parse_prometheus((SAMPLES / "prefill-metrics.prom").read_text())
    assert has_nixl(samples)
    assert samples["vllm:nixl_xfer_time_seconds_count"] == 2.0
    kv = nixl_delta({}, samples)
    assert kv.transfers == 2 and kv.xfer_ms == pytest.approx(18.899)
    assert kv.bytes == pytest.approx(3.3554432e8) and kv.descriptors == 576 and kv.source == "metrics"
    assert nixl_delta(samples, samples).transfers == 0


def test_prometheus_delta_between_scrapes_and_over_a_restart() -> None:
    before = parse_prometheus(
        'vllm:nixl_xfer_time_seconds_count{engine="0"} 2\nvllm:nixl_xfer_time_seconds_sum{engine="0"} 0.5\n'
        'vllm:nixl_xfer_time_seconds_count{engine="1"} 1\n# HELP x\nnot a sample line\n'
    )
    after = parse_prometheus(
        'vllm:nixl_xfer_time_seconds_count{engine="0"} 5\nvllm:nixl_xfer_time_seconds_sum{engine="0"} 1.25\n'
        'vllm:nixl_xfer_time_seconds_count{engine="1"} 1\nvllm:nixl_bytes_transferred_sum 1e6\n'
    )
    kv = nixl_delta(before, after)
    assert kv.transfers == 3 and kv.xfer_ms == pytest.approx(750.0) and kv.bytes == 1e6
    restarted = parse_prometheus('vllm:nixl_xfer_time_seconds_count{engine="0"} 1\n')
    assert nixl_delta(before, restarted).transfers == 1



SIM_BEFORE = {"pdctl_sim_step_modelled_ms_total": 1000.0, "pdctl_sim_steps_total": 10.0,
              "pdctl_sim_step_prefill_tokens_total": 500.0, "pdctl_sim_step_decode_tokens_total": 40.0,
              "pdctl_sim_kv_blocks_peak": 100.0, "pdctl_sim_kv_num_gpu_blocks": 1000.0}


def test_usage_over_a_span_from_the_sim_step_counters() -> None:
    after = {**SIM_BEFORE, "pdctl_sim_step_modelled_ms_total": 4000.0, "pdctl_sim_steps_total": 60.0,
             "pdctl_sim_step_prefill_tokens_total": 2500.0, "pdctl_sim_step_decode_tokens_total": 90.0,
             "pdctl_sim_kv_blocks_peak": 250.0}
    u = usage_delta("decode-0", SIM_BEFORE, after, span_ms=6000.0)
    assert u == EngineUsage("decode-0", busy=0.5, prefill_tokens=2000, decode_tokens=50, kv_peak=0.25,
                            kv_peak_in_span=True, steps=50)
    assert EngineUsage.from_json(u.to_json()) == u
    # the mark did not move: it was set before the span, whose own peak was at most it
    same = usage_delta("decode-0", after, after, span_ms=6000.0)
    assert same is not None and same.busy == 0.0 and same.steps == 0 and same.kv_peak == 0.25
    assert not same.kv_peak_in_span


def test_usage_is_none_where_the_engine_has_no_such_counters() -> None:
    vllm = {"vllm:num_requests_running": 3.0, "vllm:kv_cache_usage_perc": 0.4}
    assert usage_delta("prefill-0", vllm, vllm, span_ms=1000.0) is None
    # a simulator without the step model: the KV mark, but no busy time rather than 0
    no_steps = {"pdctl_sim_kv_blocks_peak": 50.0, "pdctl_sim_kv_num_gpu_blocks": 500.0}
    u = usage_delta("prefill-0", {}, no_steps, span_ms=1000.0)
    assert u == EngineUsage("prefill-0", busy=None, prefill_tokens=None, decode_tokens=None, kv_peak=0.1,
                            kv_peak_in_span=True)
    # restarted in the span (the step counter went down): the deltas are unknown
    restarted = {**SIM_BEFORE, "pdctl_sim_steps_total": 3.0, "pdctl_sim_step_modelled_ms_total": 90.0}
    u = usage_delta("decode-0", SIM_BEFORE, restarted, span_ms=1000.0)
    assert u is not None and u.busy is None and u.prefill_tokens is None and u.steps is None
