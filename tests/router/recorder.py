"""A TCP relay in front of an engine that appends every byte the router sends it to a file, so a test can read
what an engine was asked. Run: python -m tests.router.recorder PORT TARGET_PORT FILE.
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


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, record: Path | None) -> None:
    try:
        while data := await reader.read(65536):
            if record is not None:
                with record.open("ab") as f:
                    f.write(data)
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def _serve(port: int, target: int, record: Path) -> None:
    async def relay(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", target)
        except OSError:
            cw.close()
            return
        await asyncio.gather(_pipe(cr, uw, record), _pipe(ur, cw, None))

    server = await asyncio.start_server(relay, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


@contextlib.contextmanager
def recorder(log_dir: Path, target: str) -> Iterator[tuple[str, Path]]:
    """The URL of a relay (a real process) to the engine at `target`, and the file of what it was sent."""
    port = free_port()
    log_path, record = log_dir / f"recorder-{port}.log", log_dir / f"recorded-{port}.bin"
    record.touch()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tests.router.recorder", str(port),
                                 target.rsplit(":", 1)[1], str(record)], stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=Path(__file__).resolve().parents[2])
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health("recorder", url, proc, lambda: log_path.read_text(errors="replace"),
                        lambda: stop_group(proc), 30)
        yield url, record
    finally:
        stop_group(proc)


if __name__ == "__main__":
    asyncio.run(_serve(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])))
