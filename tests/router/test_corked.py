"""The router's response writer (server/corked.py): uvicorn's protocol as the router builds it, fed a request,
its socket writes recorded. A step's messages are one write, in order; nothing waits for a later step."""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.config import Config
from uvicorn.server import ServerState

from pdctl.router.server.listener import Limits, protocol_class

REQUEST = b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\n\r\n{}"


class Recorder(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.closed, "written after close"
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name in ("peername", "sockname") else default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def exchange(app: Any, request: bytes = REQUEST) -> tuple[Recorder, Any]:
    config = Config(app=app, access_log=False, lifespan="off")
    config.load()
    proto = protocol_class(Limits(5, 100, 65536, 100))(config=config, server_state=ServerState(), app_state={})
    transport = Recorder()
    proto.connection_made(transport)
    proto.data_received(request)
    return transport, proto


async def steps(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_a_steps_messages_are_one_write_in_order_and_a_later_step_is_written_in_its_own() -> None:
    async def main() -> None:
        later = asyncio.Event()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            await receive()
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
            await send({"type": "http.response.body", "body": b"data: 2\n\n", "more_body": True})
            await later.wait()
            await send({"type": "http.response.body", "body": b"data: 3\n\n", "more_body": True})
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

        transport, proto = await exchange(app)
        await steps()
        assert len(transport.writes) == 1  # the head and both events, written before the app's next step
        head, _, body = transport.writes[0].partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"transfer-encoding: chunked" in head
        assert body == chunk(b"data: 1\n\n") + chunk(b"data: 2\n\n")
        later.set()
        await steps()
        assert transport.writes[1:] == [chunk(b"data: 3\n\n") + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"]
        assert proto.cycle.response_complete and not transport.closed  # kept alive for the next request

    asyncio.run(main())


def test_a_short_reply_is_one_write_and_a_closing_one_is_written_before_the_close() -> None:
    async def main() -> None:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            await receive()
            await send({"type": "http.response.start", "status": 404,
                        "headers": [(b"content-length", b"2"), (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": b"{}"})

        transport, _ = await exchange(app)
        await steps()
        assert len(transport.writes) == 1 and transport.closed
        assert transport.writes[0].startswith(b"HTTP/1.1 404 Not Found\r\n")
        assert transport.writes[0].endswith(b"connection: close\r\n\r\n{}")

    asyncio.run(main())


def test_nothing_is_written_once_the_client_has_gone() -> None:
    async def main() -> None:
        gone = asyncio.Event()

        async def app(scope: Any, receive: Any, send: Any) -> None:
            await receive()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"a", "more_body": True})
            await gone.wait()
            await send({"type": "http.response.body", "body": b"b", "more_body": False})

        transport, proto = await exchange(app)
        await steps()
        assert len(transport.writes) == 1
        transport.closed = True
        proto.connection_lost(None)
        gone.set()
        await steps()
        assert len(transport.writes) == 1

    asyncio.run(main())
