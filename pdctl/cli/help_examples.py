"""The `Examples:` at the foot of each command's `--help`: a few lines a user can copy, each under 76 columns so
that an 80-column terminal does not wrap them. tests/cli/test_help_examples.py parses every one."""

from __future__ import annotations

import typer

EXAMPLES: dict[str, list[tuple[str, str]]] = {
    "validate": [
        ("pdctl validate", "check ./pdctl.yaml"),
        ("pdctl validate -t cluster.yaml --set model.max_num_seqs=16", ""),
    ],
    "plan": [
        ("pdctl plan", "each process: host, ports, command"),
        ("pdctl plan --json > plan.json", ""),
    ],
    "up": [
        ("pdctl up", "start ./pdctl.yaml, wait for health"),
        ("pdctl up --dry-run", "what would change, per host"),
        ("pdctl up -t cluster.yaml --accept-new-host-keys", "new hosts"),
        ("pdctl up --set connector.bidirectional_kv_xfer=false", ""),
        ("pdctl up --restart --rolling", "one process at a time"),
        ("pdctl up --skip-provision --timeout 300", ""),
    ],
    "status": [
        ("pdctl status", "health, KV use, router hit rate"),
        ("pdctl status --watch 2", "refresh until Ctrl-C"),
        ("pdctl status --json > status.json", ""),
    ],
    "down": [
        ("pdctl down", ""),
        ("pdctl down -t cluster.yaml --timeout 60", "60 s to SIGKILL"),
    ],
    "logs": [
        ("pdctl logs", "the last 50 lines of each process"),
        ("pdctl logs router -f", "follow the router's log"),
        ("pdctl logs decode-0 -n 200", ""),
    ],
    "port-forward": [
        ("pdctl port-forward", "local port = the router's port"),
        ("pdctl port-forward --port 8000", "then: curl localhost:8000/v1/models"),
    ],
    "bench": [
        ("pdctl bench", "OFF vs ON, report in bench-out/"),
        ("pdctl bench --lengths 2000,8000 --conversations 2 --turns 3", ""),
        ("pdctl bench --no-redeploy --out my-run", "the running deployment"),
        ("pdctl bench --sweep sessions=1,2,4,8,16 --slo ttft_p90=500", ""),
    ],
    "demo": [
        ("pdctl demo", "case 1 only: one client on 1P1D"),
        ("pdctl demo --eviction", "both cases, about 2 minutes on 2 cores"),
        ("pdctl demo --eviction --ports 22000-22099", "keep to a port range"),
        ("pdctl demo --out /tmp/demo --turns 3", ""),
    ],
    "doctor": [
        ("pdctl doctor", "what each node lacks, what up would do"),
        ("pdctl doctor -t cluster.yaml --json > doctor.json", ""),
    ],
    "observe": [
        ("pdctl observe", "writes NAME-observe/: prometheus.yml, dashboard"),
        ("pdctl observe --start", "Prometheus on the router's node"),
        ("pdctl observe --out obs --scrape-interval 5s", ""),
    ],
    "top": [
        ("pdctl top", "live, Ctrl-C to stop"),
        ("pdctl top --once --json", "one frame, for scripts"),
    ],
    "init": [
        ("pdctl init", "list the shipped topologies"),
        ("pdctl init --example local-sim", "write ./pdctl.yaml"),
        ("pdctl init -e p5en-1p1d -o cluster.yaml", ""),
    ],
    "tokenizer": [
        ("pdctl tokenizer -o sim-tokenizer", ""),
        ("aiperf profile --tokenizer sim-tokenizer ...", "count as the sim does"),
    ],
}


def epilog(lines: list[tuple[str, str]]) -> str:
    """typer keeps the lines as they are (rich help) but drops a common indent, so none is given."""
    return "Examples:\n\n" + "\n".join(f"{command}  # {note}" if note else command for command, note in lines)


def add_examples(app: typer.Typer) -> None:
    """Give each registered command its examples (run after every module has registered its commands)."""
    for info in app.registered_commands:
        name = info.name or (info.callback.__name__.replace("_", "-") if info.callback else "")
        if name in EXAMPLES and info.epilog is None:
            info.epilog = epilog(EXAMPLES[name])
