"""KV metering when the engines have no NIXL Prometheus metrics: new `KV Transfer metrics` log lines only."""

from __future__ import annotations

from pathlib import Path

from pdctl.bench.leg.legs import Endpoints
from pdctl.bench.runner.probe import KvMeter
from pdctl.remote.local import LocalTransport

SAMPLES = Path(__file__).parent / "samples"


def test_log_lines_written_during_the_span_are_counted_and_earlier_ones_are_not(tmp_path: Path) -> None:
    log = tmp_path / "prefill-0.log"
    old = (SAMPLES / "prefill-on.kvmetrics.txt").read_text()
    log.write_text(old)
    ep = Endpoints("http://127.0.0.1:9", (), (("local", str(log)),), (), "Qwen")
    meter = KvMeter(ep, {"local": LocalTransport("local")})
    assert not meter.metrics_available()
    meter.start()
    with log.open("a") as f:
        f.write((SAMPLES / "prefill-new-format.log").read_text())
    kv = meter.stop()
    assert kv.source == "log" and kv.transfers == 6 and kv.failed == 4 and kv.expired == 2
    meter.start()
    assert meter.stop().transfers == 0
