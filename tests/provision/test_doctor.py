"""`pdctl doctor` through the CLI on a local host whose hardware tools are the fakes: a checklist, `--json`, and
exit 1 when something fails, with the fix named; what `pdctl up` provisions itself is marked `up`, not a failure"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from typer.testing import CliRunner

from pdctl.cli import app

from .support import FAKEBIN


def _topology(tmp_path: Path, *, efa_required: bool = True, **efa: object) -> Path:
    data = {
        "name": "doc",
        "engine": "vllm",
        "nodes": [{"name": "a", "transport": "local", "gpus": 8}],
        "model": {"id": "Qwen/Qwen3-32B", "local_dir": str(tmp_path / "model")},
        "prefill": [{"node": "a", "gpus": [0], "port": 18100, "side_channel_port": 15600}],
        "decode": [{"node": "a", "gpus": [1], "port": 18200, "side_channel_port": 15601}],
        "router": {"node": "a", "port": 18000},
        "connector": {"backend": "LIBFABRIC"},
        "efa": {"required": efa_required, "installer_version": "1.47.0", **efa},
        "python": {"venv": str(tmp_path / "venv"), "vllm_version": "0.26.0"},
        "work_dir": str(tmp_path / "work"),
    }
    path = tmp_path / "topo.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_doctor_on_a_fresh_gpu_host_lists_what_is_missing(tmp_path: Path, host: Path) -> None:
    result = CliRunner().invoke(app, ["doctor", "-t", str(_topology(tmp_path)), "--json"])
    assert result.exit_code == 1, result.output
    report = json.loads(result.stdout)
    [checks] = report["hosts"]
    by_name = {c["name"]: c for c in checks["checks"]}
    assert report["ok"] is False
    assert by_name["gpus"] == {"name": "gpus", "status": "ok", "value": "8/8 NVIDIA H200", "fix": ""}
    assert by_name["driver"]["value"] == "595.71.05"
    assert by_name["efa devices"]["status"] == "fail"
    assert by_name["efa devices"]["value"] == "0/16 provider none (fi_getinfo: -61 (No data available))"
    assert by_name["efa installer"] == {
        "name": "efa installer", "status": "fail", "value": "not installed",
        "fix": "`pdctl up` installs 1.47.0 (set efa.sha256)",
    }
    assert by_name["python"]["status"] == "up"  # what `up` provisions itself is no failure
    assert by_name["kv_transfer_params streaming"] == {
        "name": "kv_transfer_params streaming", "status": "up", "value": "vllm not installed yet",
        "fix": "`pdctl up` installs vllm 0.26.0 and patches it if it must",
    }
    assert by_name["prefix check at the prefill"] == {
        "name": "prefix check at the prefill", "status": "up", "value": "vllm not installed yet",
        "fix": "`pdctl up` installs vllm 0.26.0 and patches it if it must",
    }
    assert by_name["model"]["status"] == "fail"  # model.local_dir does not exist: `up` refuses
    assert by_name["ports"]["status"] == "ok"


def test_doctor_on_a_provisioned_efa_host_is_green_for_efa(tmp_path: Path, host: Path) -> None:
    (host / "opt/amazon/efa/bin").mkdir(parents=True)
    (host / "opt/amazon/efa_installed_packages").write_text("# EFA installer version: 1.47.0\n")
    (host / "opt/amazon/efa/bin/fi_info").symlink_to(FAKEBIN / "fi_info")
    (host / "fake/efa-kmod").write_text("3.0.0g\n")
    for mod, version in (("efa", "3.0.0g"), ("efa_nv_peermem", "1.2.3")):
        (host / "sys/module" / mod).mkdir(parents=True)
        (host / "sys/module" / mod / "version").write_text(version + "\n")
    result = CliRunner().invoke(app, ["doctor", "-t", str(_topology(tmp_path))])
    text = result.stdout
    assert result.exit_code == 1  # no venv, no model yet
    assert re.search(r"✓\s+efa devices\s+16/16 provider efa", text)
    assert re.search(r"✗\s+model", text)
    assert "some checks fail" in text
    as_json = CliRunner().invoke(app, ["doctor", "-t", str(_topology(tmp_path)), "--json"])
    checks = {c["name"]: (c["status"], c["value"]) for c in json.loads(as_json.stdout)["hosts"][0]["checks"]}
    assert checks["efa module"] == ("ok", "loaded 3.0.0g, installed 3.0.0g")
    assert checks["efa_nv_peermem"] == ("ok", "1.2.3")
    assert checks["efa installer"] == ("ok", "1.47.0")


def test_doctor_reports_a_pending_reboot_and_the_way_out(tmp_path: Path, host: Path) -> None:
    (host / "fake/efa-kmod").write_text("3.3.0g\n")
    (host / "sys/module/efa").mkdir(parents=True)
    (host / "sys/module/efa/version").write_text("3.0.0g\n")
    result = CliRunner().invoke(app, ["doctor", "-t", str(_topology(tmp_path)), "--json"])
    checks = {c["name"]: c for c in json.loads(result.stdout)["hosts"][0]["checks"]}
    assert checks["efa module"] == {
        "name": "efa module", "status": "fail", "value": "loaded 3.0.0g, installed 3.3.0g",
        "fix": "reboot the node (`pdctl up --allow-reboot`)",
    }


def test_what_up_provisions_is_marked_and_does_not_fail(tmp_path: Path, host: Path) -> None:
    """A GPU host with nothing of pdctl's yet, and the model in place: every missing piece is one `up` installs, so
    doctor exits 0, marks them, and says `up` does them; the model taken away, it exits 1 again."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    topo = str(_topology(tmp_path, efa_required=False))
    result = CliRunner().invoke(app, ["doctor", "-t", topo, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    statuses = {c["name"]: c["status"] for c in report["hosts"][0]["checks"]}
    assert report["ok"] is True
    marked = sorted(n for n, st in statuses.items() if st == "up")
    assert marked == ["kv_transfer_params streaming", "nixl", "pdctl", "prefix check at the prefill", "python",
                      "vllm"]
    assert "fail" not in statuses.values() and statuses["model"] == "ok"

    text = CliRunner().invoke(app, ["doctor", "-t", topo], terminal_width=200)
    assert text.exit_code == 0
    assert re.search(r"↑\s+vllm\s+vllm missing\s+`pdctl up` installs", text.stdout)
    assert text.stdout.rstrip().endswith("all checks pass; `pdctl up` does the 6 marked ↑")

    (model / "config.json").unlink()
    failing = CliRunner().invoke(app, ["doctor", "-t", topo], terminal_width=200)
    assert failing.exit_code == 1
    assert re.search(r"✗\s+model", failing.stdout)
    assert failing.stdout.rstrip().endswith("some checks fail: see the last column; `pdctl up` does the 6 marked ↑")
