"""`pdctl demo`: its own topology on free ports under a unique name, and bad flags refused before anything starts.

The whole demo from an installed wheel runs in tests/packaging/test_wheel.py."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.demo import EVICTION_AGENT, DemoOptions, demo_options, write_eviction_topology, write_topology
from pdctl.topology import load
from tests.conftest import free_port


def test_the_demo_topology_is_local_sim_on_free_ports_and_a_name_of_its_own(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = load(write_topology(DemoOptions(tmp_path / "a")))
    b = load(write_topology(DemoOptions(tmp_path / "b")))
    shipped = load(Path(__file__).resolve().parents[2] / "configs" / "local-sim.yaml")
    assert a.name != b.name and a.name.startswith("demo-")
    ports = [a.prefill[0].port, a.prefill[0].side_channel_port, a.decode[0].port, a.decode[0].side_channel_port,
             a.router.port]
    assert len(set(ports)) == 5
    assert not set(ports) & {18000, 18100, 18200, 15600, 15601}
    assert a.work_dir == str(tmp_path / "a" / "run") and a.sim.speed == 3.0
    assert (a.engine, a.model, a.connector) == (shipped.engine, shipped.model, shipped.connector)


def test_bad_flags_exit_2_before_anything_starts(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["demo", "--turns", "1", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [
        "Error: --conversations must be >= 1, --turns >= 2 and --speed > 0",
        "hint: e.g. pdctl demo --lengths 2000 --turns 2",
    ]
    assert not (tmp_path / "o").exists()
    lengths = CliRunner().invoke(app, ["demo", "--lengths", "2k", "--out", str(tmp_path / "o")])
    assert lengths.exit_code == 2 and "Error: --lengths '2k' is not a list of integers" in lengths.stderr


def test_the_eviction_case_is_2p2d_on_free_ports_with_prefills_too_small_for_the_sessions(tmp_path: Path) -> None:
    """`pdctl demo --eviction` (issues 29, 41): 2 prefills behind 2 decodes, each prefill's KV enough for its share
    of the smaller number of sessions' histories and under half of the larger's (its prefix cache evicts them),
    the decodes an H200's; a name of its own."""
    opts = DemoOptions(tmp_path, eviction=True)
    topo = load(write_eviction_topology(opts))
    assert topo.name.startswith("demo-") and topo.name.endswith("-eviction")
    assert (len(topo.prefill), len(topo.decode)) == (2, 2)
    ports = [p for i in (*topo.prefill, *topo.decode) for p in (i.port, i.side_channel_port)] + [topo.router.port]
    assert len(set(ports)) == 9 and not set(ports) & {18000, 18100, 18200, 15600, 15601}
    assert topo.extra_args.prefill == ["--num-gpu-blocks", str(opts.eviction_prefill_blocks)]
    a = EVICTION_AGENT
    history = a.system_tokens + a.task_tokens + (a.turns - 1) * (a.output_tokens + a.tool_tokens.high)
    few, many = opts.eviction_sessions
    prefill_kv = opts.eviction_prefill_blocks * 256
    assert (few, many) == (4, 16)
    assert few / 2 * history < prefill_kv < many / 2 * (history - a.system_tokens) / 2
    assert many / 2 * history < topo.sim.num_blocks * 256  # the decodes hold them all


def test_ports_keep_every_process_of_both_cases_in_the_range(tmp_path: Path) -> None:
    """--ports START-END: every listening port of either case's topology comes from the range, skipping one that
    something already holds."""
    base = free_port()
    base = min(base, 65535 - 40)
    with socket.socket() as held:
        held.bind(("127.0.0.1", base))
        held.listen()
        opts = demo_options(tmp_path / "o", "2000", 1, 2, 3.0, True, "4,16", f"{base}-{base + 40}")
        (tmp_path / "o").mkdir()
        one, two = load(write_topology(opts)), load(write_eviction_topology(opts))
    for topo in (one, two):
        ports = [p for i in (*topo.prefill, *topo.decode) for p in (i.port, i.side_channel_port)]
        ports.append(topo.router.port)
        assert all(base < p <= base + 40 for p in ports), ports
        assert len(set(ports)) == len(ports)


@pytest.mark.parametrize(("ports", "message"), [
    ("22000", "--ports '22000' is not a range START-END"),
    ("a-b", "--ports 'a-b' is not a range START-END"),
    ("22010-22000", "--ports '22010-22000': the range must lie within 1024-65535 with START <= END"),
    ("80-200", "--ports '80-200': the range must lie within 1024-65535 with START <= END"),
    ("22000-70000", "--ports '22000-70000': the range must lie within 1024-65535 with START <= END"),
    ("22000-22004", "--ports '22000-22004' holds 5 ports; the demo needs 9"),
])
def test_a_bad_port_range_exits_2_before_anything_starts(tmp_path: Path, ports: str, message: str) -> None:
    result = CliRunner().invoke(app, ["demo", "--ports", ports, "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [f"Error: {message}",
                                          "hint: e.g. --ports 22000-22099 (at least 9 ports, 1024-65535)"]
    assert not (tmp_path / "o").exists()


def test_bad_session_counts_exit_2(tmp_path: Path) -> None:
    for bad, message in (("4,x", "--sessions '4,x' is not a list of integers"),
                         ("0,4", "--sessions '0,4': give one or more numbers of sessions, each >= 1")):
        result = CliRunner().invoke(app, ["demo", "--eviction", "--sessions", bad, "--out", str(tmp_path / "o")])
        assert result.exit_code == 2 and result.stderr.splitlines()[0] == f"Error: {message}", result.output
    assert not (tmp_path / "o").exists()


def test_case_2_prints_rich_tables_on_sessions_and_the_ratio(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One style of table on the console (the report's markdown stays in report.md), the axis "sessions", the
    path mix and KV read back per point as summary.json has them, the ON/OFF ratio of warm TTFT p90."""
    from pdctl.bench.output import report
    from pdctl.cli import demo as cli_demo
    from tests.bench.test_report import _eviction_result

    console = Console(record=True, width=160, color_system=None)
    monkeypatch.setattr(cli_demo, "out", console)
    result = _eviction_result()
    files = report.write(result, tmp_path / "eviction")
    cli_demo.print_eviction(DemoOptions(tmp_path), result, files)
    text = console.export_text()
    assert not [line for line in text.splitlines() if line.startswith("|")], text  # no markdown table
    assert "Case 2 (simulated): 4 and 16 agent sessions on 2 prefills + 2 decodes" in text
    heads = [line for line in text.splitlines() if line.startswith("┃ sessions ┃ leg")]
    assert len(heads) == 2 and "TTFT p90" in heads[0] and "path mix (warm turns)" in heads[1], heads
    assert "prefill cache 12" in text and "recompute 48" in text and "local 36, D->P read 12" in text
    assert "on/off warm TTFT p90: 4 sessions 1.00x, 16 sessions 0.1" in text
    assert ("at 16 sessions, off: history from the decode's KV in 0/48 warm turns (local 0, D->P read 0), from the "
            "prefill's cache in 0/48, recomputed in 48/48") in text
    assert "at 16 sessions, on: history from the decode's KV in 48/48 warm turns (local 36, D->P read 12)" in text
    assert "leg off: passed" in text and "leg on: passed" in text
    assert "leg off: OFF\n" in text and "leg on: ON mixed (bidirectional) (local 80%, D->P read 20%)" in text
    assert f"summary: {tmp_path / 'eviction' / 'summary.json'}" in text
    assert (tmp_path / "eviction" / "summary.json").exists()
