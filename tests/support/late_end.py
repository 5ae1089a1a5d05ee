"""A TCP relay in front of an engine whose SSE streams end late: it passes a response up to its `data: [DONE]`
event at once and the stream's end (the rest of the bytes) `--delay-ms` later, as a vLLM whose event loop is busy
with another request's work when it would send the end. Run: python -m tests.support.late_end PORT TARGET_PORT MS.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import free_port
from tests.support.sim_procs import stop_group, wait_for_health

DONE = b"data: [DONE]\n\n"


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    try:
        while data := await reader.read(65536):
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


async def _serve(port: int, target: int, delay: float) -> None:
    async def relay(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            cw.close()
            return
        await asyncio.gather(_pipe(cr, uw, 0.0), _pipe(ur, cw, delay))

    server = await asyncio.start_server(relay, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


@contextlib.contextmanager
def late_end(log_dir: Path, target: str, delay_ms: float) -> Iterator[str]:
    """The URL of a relay (a real process) to the engine at `target` whose streams end `delay_ms` late."""
    port = free_port()
    log_path = log_dir / f"late-end-{port}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tests.support.late_end", str(port),
                                 target.rsplit(":", 1)[1], str(delay_ms)], stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=Path(__file__).resolve().parents[2])
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health("late-end relay", url, proc, lambda: log_path.read_text(errors="replace"),
                        lambda: stop_group(proc), 30)
        yield url
    finally:
        stop_group(proc)


if __name__ == "__main__":
    asyncio.run(_serve(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]) / 1000))
