"""scripts/gpu/prefix_check_vllm.py against simulated engines that want an API key: the simulated prefill runs the
same check as patched vLLM, so every case passes; with --no-prefix-check (an unpatched vLLM) the verified cases
fail and the script exits 1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.sim_procs import sim_pair

SCRIPT = Path(__file__).parents[2] / "scripts" / "gpu" / "prefix_check_vllm.py"
KEY = "prefix-check-test-key"


def _run(tmp_path: Path, *prefill_args: str, wait: float = 5) -> tuple[int, list[str], list[dict[str, object]]]:
    key_file = tmp_path / "engine.key"
    key_file.write_text(KEY + "\n")
    auth = ("--api-key", KEY)
    with sim_pair(tmp_path, speed=1000, block_size=256, threshold=64, prefill_args=(*auth, *prefill_args),
                  decode_args=auth) as pd:
        result = subprocess.run(
            [sys.executable, str(SCRIPT), "--prefill", pd.prefill.url, "--decode", pd.decode.url,
             "--engine-key-file", str(key_file), "--settle", "0.5", "--wait", f"{wait:g}",
             "--json", str(tmp_path / "out.json")],
            capture_output=True, text=True, timeout=120, check=False,
        )
    rows = json.loads((tmp_path / "out.json").read_text()) if (tmp_path / "out.json").exists() else []
    assert KEY not in result.stdout + result.stderr
    return result.returncode, result.stdout.splitlines(), rows


def test_every_case_passes_on_a_prefill_that_checks(tmp_path: Path) -> None:
    rc, lines, rows = _run(tmp_path)

    assert rc == 0, lines
    assert [line.split(":")[0] for line in lines] == [
        "PASS turn-1", "PASS hit", "PASS partial (token 266 edited)", "PASS miss (token 5 edited)", "PASS no-spec",
        "INFO control"]
    assert lines[0].startswith("PASS turn-1: D holds 2015 tokens in 8 blocks (block size 256)")
    assert ('pdctl_reuse={"outcome": "hit", "tokens": 2015, "reason": "verified", "cached": 0, "read": 2015}, '
            'P read 1 transfers') in lines[1]
    partial = ('{"outcome": "partial", "tokens": 256, "reason": "prefix_diverged", "cached": 0, "read": 256, '
               '"diverged_at": 256} (want partial 256), P read 1 ')
    assert partial in lines[2]
    assert lines[2].endswith("D's 16 tokens = the cold run's")
    assert "(want miss 0), P read 0 transfers 0 MB; D's 16 tokens = the cold run's" in lines[3]
    assert "P read 0 transfers 0 MB" in lines[4]
    assert [row["ok"] for row in rows] == [True, True, True, True, True, None]


def test_a_prefill_without_the_check_fails_the_verified_cases(tmp_path: Path) -> None:
    # The reads the verified cases wait for never come here: each sits through --wait, so 1 s (twice the settle
    # after which the script takes no growth as no read; a simulated read lands within milliseconds).
    rc, lines, _ = _run(tmp_path, "--no-prefix-check", wait=1)

    assert rc == 1
    assert [line.split(":")[0] for line in lines] == [
        "PASS turn-1", "FAIL hit", "FAIL partial (token 266 edited)", "FAIL miss (token 5 edited)", "PASS no-spec",
        "INFO control"]
    assert lines[1].startswith("FAIL hit: pdctl_reuse=null, P read 0 transfers 0 MB")
