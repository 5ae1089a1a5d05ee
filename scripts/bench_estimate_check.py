"""Compare `pdctl bench`'s time estimate with the wall time of real simulated benches on this machine.

    python scripts/bench_estimate_check.py [--name PREFIX] [--speed 10]

Each case writes a local sim topology on free ports, runs `pdctl bench` on it (two legs, each redeployed), and
prints the estimate's parts (per leg: redeploy + warm-up, play) next to what the run took, read from the bench's
progress lines as they arrive. Results are simulated (pdctl.sim), and the numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pdctl.bench.runner.estimate import BENCH_OVERHEAD_S, estimate, leg_overhead_s, play_s, warmup_s
from pdctl.bench.traffic.workload import WorkloadSpec

CASES = {
    "2x2x3": WorkloadSpec(lengths=(2000, 8000), conversations=2, turns=3, user_tokens=150, output_tokens=64),
    "quick": WorkloadSpec(lengths=(2000, 8000, 16000, 24000), conversations=4, turns=5, user_tokens=150,
                          output_tokens=64),
    "long-out": WorkloadSpec(lengths=(4000,), conversations=2, turns=4, user_tokens=150, output_tokens=300),
}
CLIENTS = 2


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _topology(tmp: Path, name: str, speed: float) -> Path:
    p = [_port() for _ in range(5)]
    text = f"""name: {name}
engine: sim
nodes: [{{name: local, address: 127.0.0.1, transport: local}}]
model: {{id: Qwen/Qwen3-32B, served_name: Qwen, max_model_len: 32768, max_num_seqs: 8, block_size: 16}}
prefill: [{{node: local, port: {p[0]}, side_channel_port: {p[1]}}}]
decode: [{{node: local, port: {p[2]}, side_channel_port: {p[3]}}}]
connector: {{backend: UCX, bidirectional_kv_xfer: true, kv_recompute_threshold: 64}}
router: {{node: local, port: {p[4]}}}
sim: {{speed: {speed}}}
python: {{venv: null}}
work_dir: {tmp / "work"}
"""
    path = tmp / f"{name}.yaml"
    path.write_text(text)
    return path


def _run(topo: Path, spec: WorkloadSpec, out: Path) -> tuple[float, list[tuple[float, str]]]:
    """The bench's wall time and its stderr lines, each with the second it arrived."""
    argv = [sys.executable, "-m", "pdctl", "bench", "-t", str(topo), "--lengths", ",".join(map(str, spec.lengths)),
            "--conversations", str(spec.conversations), "--turns", str(spec.turns), "--user-tokens",
            str(spec.user_tokens), "--output-tokens", str(spec.output_tokens), "--clients", str(CLIENTS),
            "--out", str(out)]
    start = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    lines = [(time.monotonic() - start, line.rstrip()) for line in proc.stderr]
    if proc.wait() != 0:
        sys.exit("bench failed:\n" + "\n".join(t for _, t in lines[-20:]))
    return time.monotonic() - start, lines


def _phases(lines: list[tuple[float, str]]) -> tuple[float, float]:
    """Mean seconds per leg spent redeploying + warming up, and playing, from the progress lines."""
    marks = [(t, text) for t, text in lines if text.startswith(("leg ", "restoring "))]
    deploy, play, legs = 0.0, 0.0, 0
    starts = [t for t, text in marks if ": redeploying" in text]
    plays = [t for t, text in marks if text.split(": ", 1)[-1].endswith(" requests")]
    ends = [*starts[1:], next((t for t, text in marks if text.startswith("restoring ")), lines[-1][0])]
    for begin, mid, end in zip(starts, plays, ends, strict=False):
        deploy += mid - begin
        play += end - mid
        legs += 1
    return deploy / max(legs, 1), play / max(legs, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", default="estimate-check", help="deployment name prefix")
    ap.add_argument("--speed", type=float, default=10.0, help="sim.speed")
    args = ap.parse_args()
    print(f"{'case':<9} {'requests':>8} {'estimate s':>10} {'actual s':>8} {'ratio':>6}   per leg: "
          "deploy+warm-up est/actual, play est/actual (s)")
    with tempfile.TemporaryDirectory(prefix="bench-estimate-") as tmp:
        for case, spec in CASES.items():
            topo = _topology(Path(tmp), f"{args.name}-{case}", args.speed)
            guess = estimate(spec, 2, CLIENTS, "sim", args.speed, True)
            wall, lines = _run(topo, spec, Path(tmp) / case)
            deploy, play = _phases(lines)
            print(f"{case:<9} {guess.requests:>8} {guess.seconds:>10.1f} {wall:>8.1f} {guess.seconds / wall:>6.2f}"
                  f"   {leg_overhead_s('sim', args.speed) + warmup_s(spec, 'sim', args.speed):.1f}/{deploy:.1f}, "
                  f"{play_s(spec, CLIENTS, 'sim', args.speed):.1f}/{play:.1f}", flush=True)
    print(f"simulated engines (pdctl.sim, sim.speed {args.speed:g}), {CLIENTS} clients, 2 legs redeployed each; "
          f"plus {BENCH_OVERHEAD_S:g} s once per bench in the estimate (start, closing stop, report and plots)")


if __name__ == "__main__":
    main()
