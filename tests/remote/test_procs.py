from __future__ import annotations

from pdctl.remote.procs import DetachedJob, kill_script, parse_ps, parse_started, start_script, unit_name


def _job() -> DetachedJob:
    return DetachedJob(
        unit=unit_name("demo", "decode-0"),
        argv=("~/.pdctl/venv/bin/vllm", "serve", "Qwen/Qwen3-32B", "--kv-transfer-config", '{"a": 1}'),
        env={"PDCTL_DEPLOYMENT": "demo", "FI_PROVIDER": "efa", "X": "two words"},
        workdir="~/.pdctl/demo",
        log_path="~/.pdctl/demo/logs/decode-0.log",
    )


def test_systemd_branch_runs_a_transient_unit_with_unlimited_memlock() -> None:
    script = start_script(_job())
    line = next(x for x in script.splitlines() if "systemd-run --unit" in x)
    assert "systemd-run --unit pdctl-demo-decode-0 --collect --quiet -p LimitMEMLOCK=infinity" in line
    assert "-p LimitNOFILE=1048576" in line
    assert "--setenv=PDCTL_DEPLOYMENT=demo" in line
    assert "'--setenv=X=two words'" in line
    assert "-p StandardOutput=append:\"$LOG\"" in line
    assert line.rstrip().endswith(
        "-- \"$HOME\"/.pdctl/venv/bin/vllm serve Qwen/Qwen3-32B --kv-transfer-config '{\"a\": 1}' || exit 4"
    )
    assert "if [ -d /run/systemd/system ]" in script


def test_setsid_branch_detaches_and_prints_the_pid() -> None:
    script = start_script(_job())
    assert '  ulimit -n "$(ulimit -Hn)" 2>/dev/null || true' in script.splitlines()
    line = next(x for x in script.splitlines() if " setsid " in x)
    assert line.strip().startswith("env -- PDCTL_DEPLOYMENT=demo FI_PROVIDER=efa 'X=two words' setsid ")
    assert line.strip().endswith('>> "$LOG" 2>&1 < /dev/null &')


def test_parse_started_reads_both_forms() -> None:
    assert parse_started("pid 42\n").pid == 42
    started = parse_started("unit pdctl-demo-router 77\n")
    assert (started.pid, started.unit) == (77, "pdctl-demo-router")


def test_parse_ps_drops_zombies_and_reads_tags() -> None:
    out = "10 S 10 PDCTL_NODE=a PDCTL_PROCESS=router \n11 Z 10 PDCTL_NODE=a PDCTL_PROCESS=router \ngarbage\n"
    procs = parse_ps(out)
    assert [(p.pid, p.pgid, p.node, p.process) for p in procs] == [(10, 10, "a", "router")]


def test_kill_script_targets_pids_and_groups() -> None:
    assert kill_script([5, 6], [5], "TERM") == "kill -TERM 5 6 -5 2>/dev/null; true"
    assert kill_script([], [], "KILL") == "true"
