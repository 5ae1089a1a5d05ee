"""pdctl.engine_metrics: one reader for an engine's /metrics and its `KV Transfer metrics` log lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from pdctl import engine_metrics as em

SAMPLES = Path(__file__).parent / "bench" / "samples"


def test_samples_sum_over_label_sets_and_skip_what_is_not_a_sample() -> None:
    text = (
        "# HELP vllm:num_requests_running Requests.\n"
        'vllm:num_requests_running{engine="0",model_name="a}b"} 3.0\n'  # a quoted `}` in a label value
        'vllm:num_requests_running{engine="1",model_name="say \\"hi\\""} 1.0 1700000000000\n'  # timestamp
        "vllm:nixl_xfer_time_seconds_bucket{le=\"0.1\"} 9\n"
        "vllm:nixl_num_failed_transfers_created 1.7e9\n"
        "vllm:nixl_num_failed_transfers_total 2\n"
        "not a sample line\n"
        "vllm:kv_cache_usage_perc NaNish\n"
        "   \n"
    )
    assert em.parse_prometheus(text) == {em.RUNNING: 4.0, em.NIXL_FAILED: 2.0}


def test_a_scrape_of_the_simulator_format_reads_its_nixl_counters() -> None:
    samples = em.parse_prometheus((SAMPLES / "decode-metrics.prom").read_text())
    assert em.has_nixl(samples) and samples[em.NIXL_XFER_COUNT] > 0


def test_log_lines_read_as_the_counters_a_scrape_would_show() -> None:
    lines = (SAMPLES / "prefill-new-format.log").read_text().splitlines()
    kv = em.kv_log_samples(lines)
    assert kv[em.NIXL_XFER_COUNT] == 6
    assert kv[em.NIXL_XFER_SECONDS] == pytest.approx((4 * 1.381 + 2 * 10.0) / 1000)
    assert kv[em.NIXL_FAILED] == 4 and kv[em.NIXL_EXPIRED] == 2
    assert em.kv_log_samples(["no metrics here"]) == {}


def test_kv_capacity_is_blocks_times_block_size_from_cache_config_info() -> None:
    from pdctl.engine_metrics import kv_capacity_tokens

    text = ('# HELP vllm:cache_config_info x\nvllm:cache_config_info{block_size="256",engine="0",'
            'num_gpu_blocks="160"} 1.0\n')
    assert kv_capacity_tokens(text) == 40960
    assert kv_capacity_tokens("vllm:num_requests_running 0\n") is None
    assert kv_capacity_tokens('vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0') is None
