"""`pdctl demo`: its own topology on free ports under a unique name, and bad flags refused before anything starts.

The whole demo from an installed wheel runs in tests/packaging/test_wheel.py."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from pdctl.cli import app
from pdctl.demo import DemoOptions, write_eviction_topology, write_topology
from pdctl.topology import load


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
        "Error: --conversations must be >= 1, --turns >= 2, --speed > 0 and --sessions >= 1",
        "hint: e.g. pdctl demo --lengths 2000 --turns 2",
    ]
    assert not (tmp_path / "o").exists()
    lengths = CliRunner().invoke(app, ["demo", "--lengths", "2k", "--out", str(tmp_path / "o")])
    assert lengths.exit_code == 2 and "Error: --lengths '2k' is not a list of integers" in lengths.stderr


def test_the_eviction_case_is_2p2d_on_free_ports_with_prefills_too_small_for_the_sessions(tmp_path: Path) -> None:
    """`pdctl demo --eviction` (issue 29): 2 prefills behind 2 decodes, each prefill's KV fewer tokens than its
    sessions' histories (its prefix cache evicts them), the decodes an H200's; a name of its own."""
    opts = DemoOptions(tmp_path, eviction=True)
    topo = load(write_eviction_topology(opts))
    assert topo.name.startswith("demo-") and topo.name.endswith("-eviction")
    assert (len(topo.prefill), len(topo.decode)) == (2, 2)
    ports = [p for i in (*topo.prefill, *topo.decode) for p in (i.port, i.side_channel_port)] + [topo.router.port]
    assert len(set(ports)) == 9 and not set(ports) & {18000, 18100, 18200, 15600, 15601}
    assert topo.extra_args.prefill == ["--num-gpu-blocks", str(opts.eviction_prefill_blocks)]
    # 8 agent sessions of a 6000-token system prompt and growing tool results outgrow 41k tokens per prefill
    assert opts.eviction_prefill_blocks * 256 < opts.eviction_sessions * 6000 < topo.sim.num_blocks * 256
