"""A TCP relay (a real process) in front of an engine, for tests that need to see or shape what passes.

- `late_end`: SSE streams end late: a response passes up to its `data: [DONE]` event at once and the stream's end
  (the rest of the bytes) `delay_ms` later, as a vLLM whose event loop is busy with another request's work when it
  would send the end.
- `recorder`: every byte the router sends the engine is appended to a file, so a test can read what an engine was
  asked.

Run: python -m tests.support.relay PORT TARGET_PORT DELAY_MS [RECORD_FILE].
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.support.ports import free_port
from tests.support.sim_procs import stop_group, wait_for_health

DONE = b"data: [DONE]\n\n"


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float = 0.0,
                record: Path | None = None) -> None:
    try:
        while data := await reader.read(65536):
            if record is not None:
                with record.open("ab") as f:
                    f.write(data)
            at = data.find(DONE) if delay else -1
            if at >= 0:
                writer.write(data[:at + len(DONE)])
                await writer.drain()
                await asyncio.sleep(delay)
                data = data[at + len(DONE):]
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def _serve(port: int, target: int, delay: float, record: Path | None) -> None:
    async def relay(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            cw.close()
            return
        await asyncio.gather(_pipe(cr, uw, record=record), _pipe(ur, cw, delay=delay))

    server = await asyncio.start_server(relay, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


@contextlib.contextmanager
def _relay(log_dir: Path, target: str, name: str, delay_ms: float, record: Path | None = None) -> Iterator[str]:
    port = free_port()
    log_path = log_dir / f"{name}-{port}.log"
    argv = [sys.executable, "-m", "tests.support.relay", str(port), target.rsplit(":", 1)[1], str(delay_ms)]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([*argv, *([str(record)] if record is not None else [])], stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                cwd=Path(__file__).resolve().parents[2])
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(f"{name} relay", url, proc, lambda: log_path.read_text(errors="replace"),
                        lambda: stop_group(proc), 30)
        yield url
    finally:
        stop_group(proc)


@contextlib.contextmanager
def late_end(log_dir: Path, target: str, delay_ms: float) -> Iterator[str]:
    """The URL of a relay to the engine at `target` whose streams end `delay_ms` late."""
    with _relay(log_dir, target, "late-end", delay_ms) as url:
        yield url


@contextlib.contextmanager
def recorder(log_dir: Path, target: str) -> Iterator[tuple[str, Path]]:
    """The URL of a relay to the engine at `target`, and the file of what it was sent."""
    record = log_dir / f"recorded-{free_port()}.bin"
    record.touch()
    with _relay(log_dir, target, "recorder", 0.0, record) as url:
        yield url, record


if __name__ == "__main__":
    asyncio.run(_serve(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]) / 1000,
                       Path(sys.argv[4]) if len(sys.argv) > 4 else None))
