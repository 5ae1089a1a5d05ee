"""The NIXL log check after launch, on log lines in the formats of the reference (efa-provisioning.md 2.5)."""

from __future__ import annotations

import pytest

from pdctl.errors import LaunchError
from pdctl.lifecycle.bringup.nixl_check import check_engine_logs, nixl_problems

from .support import topology

HEALTHY = """\
I1130 17:02:11.104520 2101 nixl_plugin_manager.cpp:461] Discovered and loaded backend plugin: LIBFABRIC
I1130 17:02:11.231002 2101 libfabric_topology.cpp:88] Discovered 16 EFA devices
I1130 17:02:11.23 2101 libfabric_topology.cpp:214] Topology: 2 NUMA nodes, 16 NICs, 8 NVIDIA GPUs, 0 AWS accelerators
I1130 17:02:11.402118 2101 libfabric_rail_manager.cpp:141] Created 16 rails using provider=efa
"""
TCP = """\
I1130 17:02:11.231002 2101 libfabric_topology.cpp:71] Discovered 1 tcp devices (TCP fallback)
I1130 17:02:11.23 2101 libfabric_topology.cpp:75] Using simplified topology for tcp devices (no topology mapping needed)
I1130 17:02:11.402118 2101 libfabric_rail_manager.cpp:141] Created 1 rails using provider=tcp
"""
OLD_FORMAT_12 = "D1130 17:02 2101 r.cpp:1] Successfully created 12 data rails and 1 control rails using provider=efa\n"


def test_healthy_p5en_log_has_no_problems() -> None:
    assert nixl_problems(HEALTHY, 16) == []


def test_tcp_fallback_is_reported() -> None:
    assert nixl_problems(TCP, 16) == [
        "NIXL fell back to TCP: libfabric found no EFA device",
        "NIXL rails use provider=tcp, not efa",
    ]


def test_fewer_rails_than_devices_in_the_0_10_format() -> None:
    assert nixl_problems(OLD_FORMAT_12, 16) == ["NIXL created 12 rails, fewer than the 16 EFA devices"]


def test_no_rail_line_says_how_to_see_it() -> None:
    assert nixl_problems("INFO vllm started\n", 16) == [
        "no NIXL rail line in the log (is NIXL_LOG_LEVEL at least INFO, the backend LIBFABRIC?)"
    ]


def test_check_engine_logs_fails_up_only_on_efa_topologies() -> None:
    efa = topology(efa={"required": True})
    check_engine_logs(efa, {"prefill-0": HEALTHY, "decode-0": HEALTHY})
    with pytest.raises(LaunchError) as failed:
        check_engine_logs(efa, {"prefill-0": HEALTHY, "decode-0": TCP})
    assert failed.value.message.splitlines() == [
        "KV transfer is not on EFA:",
        "  decode-0: NIXL fell back to TCP: libfabric found no EFA device; NIXL rails use provider=tcp, not efa",
    ]
    check_engine_logs(topology(efa={"required": False}), {"decode-0": TCP})


def test_aggregated_engines_have_no_nixl_to_check() -> None:
    two = [{"node": "a", "port": 18200}, {"node": "a", "port": 18201, "side_channel_port": 5700}]
    check_engine_logs(topology(efa={"required": True}, mode="aggregated", decode=two),
                      {"aggregated-0": "INFO vllm started\n", "aggregated-1": TCP})
