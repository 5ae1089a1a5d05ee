"""`pdctl tokenizer`: the simulated model's tokenizer, for benchmark clients that count tokens themselves."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pdctl.cli.output import err, out, say
from pdctl.errors import UsageError
from pdctl.sim import model_dir


def tokenizer(
    output: Annotated[Path, typer.Option("--out", "-o", help="Directory to write (created if missing).")],
) -> None:
    """Write the simulated model's tokenizer (tokenizer.json, tokenizer_config.json, config.json) to a directory
    that transformers.AutoTokenizer loads offline: point AIPerf or GuideLLM at it (--tokenizer DIR). It counts
    tokens as the simulator does. For a real vLLM deployment the model directory is the tokenizer."""
    if output.exists() and not output.is_dir():
        raise UsageError(f"--out {output} is a file", hint="give a directory (it is created if missing)")
    try:
        written = model_dir.write(output)
    except OSError as exc:
        raise UsageError(f"cannot write {output}: {exc.strerror or exc}",
                         hint="pick a directory you can write") from exc
    say(out, f"wrote {output}: " + ", ".join(p.name for p in written))
    say(err, f"next: aiperf profile --tokenizer {output} ... (or guidellm benchmark --processor {output} ...)")


def register(app: typer.Typer) -> None:
    app.command()(tokenizer)
