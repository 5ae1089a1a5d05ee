"""The fast httpx transport (the router's upstream calls, the simulator's side channel) against a real asyncio HTTP
server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest

from pdctl.fasthttp import FastTransport


async def serve(handler_delay: float = 0.0) -> tuple[asyncio.Server, list[int]]:
    connections = [0]

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections[0] += 1
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            body = await reader.readexactly(length)
            await asyncio.sleep(handler_delay)
            if b"/stream" in head.split(b"\r\n")[0]:
                writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                for part in (b"data: 1\n\n", b"data: 2\n\n"):
                    writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                    await writer.drain()
                writer.write(b"0\r\n\r\n")
            else:
                writer.write(b"HTTP/1.1 201 Created\r\ncontent-length: %d\r\nx-echo: yes\r\n\r\n%s" % (len(body), body))
            await writer.drain()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, connections


def test_keep_alive_streaming_and_status() -> None:
    async def main() -> None:
        server, connections = await serve()
        port = server.sockets[0].getsockname()[1]
        async with httpx.AsyncClient(transport=FastTransport()) as client:
            for i in range(3):
                r = await client.post(f"http://127.0.0.1:{port}/echo", content=b"hello %d" % i)
                assert (r.status_code, r.content, r.headers["x-echo"]) == (201, b"hello %d" % i, "yes")
            async with client.stream("POST", f"http://127.0.0.1:{port}/stream", content=b"{}") as r:
                chunks = [c async for c in r.aiter_raw()]
            assert b"".join(chunks) == b"data: 1\n\ndata: 2\n\n"
        assert connections[0] == 1  # one connection, reused
        server.close()

    asyncio.run(main())


def test_refused_and_slow_upstreams_raise_httpx_errors(port: object) -> None:
    async def main() -> None:
        server, _ = await serve(handler_delay=1.0)
        live = server.sockets[0].getsockname()[1]
        async with httpx.AsyncClient(transport=FastTransport()) as client:
            with pytest.raises(httpx.ConnectError):
                await client.post(f"http://127.0.0.1:{port()}/x", content=b"")  # type: ignore[operator]
            with pytest.raises(httpx.ReadTimeout):
                await client.post(f"http://127.0.0.1:{live}/x", content=b"", timeout=0.1)
        server.close()

    asyncio.run(main())


def test_pooled_connections_the_upstream_closes_are_retried_never_raised() -> None:
    """An upstream that closes every connection right after answering (keep-alive promised, not kept), on uvloop
    as the router runs: no request fails, nothing escapes as a non-httpx error or an unretrieved future."""
    import gc

    import uvloop

    problems: list[str] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: problems.append(str(ctx.get("message"))))

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                await reader.readuntil(b"\r\n\r\n")
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()
            writer.transport.abort()  # a reset, as a dying engine's sockets send

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with httpx.AsyncClient(transport=FastTransport()) as client:
            for burst in range(20):
                replies = await asyncio.gather(*(client.get(f"http://127.0.0.1:{port}/x") for _ in range(10)))
                assert [r.content for r in replies] == [b"ok"] * 10, burst
                if burst % 2:
                    await asyncio.sleep(0)  # sometimes let the resets land before the next burst, sometimes not
        server.close()
        gc.collect()
        await asyncio.sleep(0.05)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())
    assert problems == []


class _DeadUnderUs:
    """A pooled connection's transport in uvloop's race: not yet `is_closing()`, but its handler is gone, so
    `write` raises RuntimeError (not an OSError, not an httpx error)."""

    def __init__(self, real: asyncio.BaseTransport) -> None:
        self.real = real

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        raise RuntimeError("unable to perform operation on <TCPTransport closed=True>; the handler is closed")

    def close(self) -> None:
        self.real.close()


def test_a_pooled_connection_whose_write_raises_runtime_error_is_retried_on_a_fresh_one() -> None:
    async def main() -> None:
        server, connections = await serve()
        port = server.sockets[0].getsockname()[1]
        transport = FastTransport()
        async with httpx.AsyncClient(transport=transport) as client:
            assert (await client.post(f"http://127.0.0.1:{port}/echo", content=b"one")).content == b"one"
            [pooled] = transport._idle[("127.0.0.1", port)]
            pooled.transport = _DeadUnderUs(pooled.transport)  # type: ignore[assignment]
            r = await client.post(f"http://127.0.0.1:{port}/echo", content=b"two")
            assert (r.status_code, r.content) == (201, b"two")
        assert connections[0] == 2  # the dead one was dropped and a new one made
        server.close()

    asyncio.run(main())


def test_lean_client_posts_straight_to_the_transport_with_its_default_headers() -> None:
    """LeanClient's fast path: the client's default headers (the engine key), the call's headers, the body and a
    Host header reach the upstream; whole and streamed answers, one pooled connection; a timeout in seconds holds;
    another transport takes httpx's own path."""
    from pdctl.router.upstream.client import LeanClient, raw_chunks

    heads: list[bytes] = []

    async def main() -> None:
        server, connections = await serve()
        slow, _ = await serve(handler_delay=1.0)
        port, slow_port = server.sockets[0].getsockname()[1], slow.sockets[0].getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        transport = FastTransport()
        original = transport.exchange

        async def spy(key: tuple[str, int], payload: bytes, *a: object) -> object:
            heads.append(payload)
            return await original(key, payload, *a)  # type: ignore[arg-type]

        transport.exchange = spy  # type: ignore[method-assign,assignment]
        async with LeanClient(transport=transport, headers={"Authorization": "Bearer k"},
                              timeout=httpx.Timeout(5.0, connect=1.0)) as client:
            r = await client.post(f"{url}/echo", content=b'{"a":1}', headers={"x-request-id": "r1"})
            assert (r.status_code, r.content, r.headers["x-echo"]) == (201, b'{"a":1}', "yes")
            r = await client.stream_post(f"{url}/stream", b"{}", {"content-type": "application/json"})
            try:
                assert r.status_code == 200
                assert b"".join([c async for c in raw_chunks(r)]) == b"data: 1\n\ndata: 2\n\n"
            finally:
                await r.aclose()
            with pytest.raises(httpx.ReadTimeout):
                await client.post(f"http://127.0.0.1:{slow_port}/x", content=b"", timeout=0.1)
        assert connections[0] == 1  # both calls on one pooled connection
        head = heads[0].split(b"\r\n\r\n")[0].lower().split(b"\r\n")
        assert head[0] == b"post /echo http/1.1"
        assert {f"host: 127.0.0.1:{port}".encode(), b"authorization: bearer k", b"x-request-id: r1",
                b"content-length: 7"} <= set(head)
        assert len(heads) == 3  # every call took the fast path

        async with LeanClient(transport=httpx.AsyncHTTPTransport(), timeout=httpx.Timeout(5.0)) as other:
            r = await other.post(f"{url}/echo", content=b"x")
            assert (r.status_code, r.content) == (201, b"x")
            r = await other.stream_post(f"{url}/stream", b"{}", {})
            try:
                assert b"".join([c async for c in raw_chunks(r)]) == b"data: 1\n\ndata: 2\n\n"
            finally:
                await r.aclose()
        server.close()
        slow.close()

    asyncio.run(main())


def test_chunks_already_arrived_are_read_as_one_in_order_and_later_ones_apart() -> None:
    """Upstream chunks that came in one burst are one read (one rewrite, one client write); a chunk that comes
    later is its own read: nothing waits for more than what is there."""
    later = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        burst = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (b"data: 1\n\n", b"data: 2\n\n", b"data: 3\n\n"))
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + burst)  # one write: one read
        await writer.drain()
        await later.wait()
        writer.write(b"9\r\ndata: 4\n\n\r\n0\r\n\r\n")
        await writer.drain()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport = FastTransport()
        status, _, body = await transport.exchange(("127.0.0.1", port), b"POST /s HTTP/1.1\r\nhost: x\r\n"
                                                   b"content-length: 0\r\n\r\n", 5, 5)
        assert status == 200
        await asyncio.sleep(0.2)  # the burst is in: one read must return all of it
        reads = [await body.__anext__()]
        later.set()
        reads += [chunk async for chunk in body]
        assert reads == [b"data: 1\n\ndata: 2\n\ndata: 3\n\n", b"data: 4\n\n"]
        await body.aclose()
        await transport.aclose()
        server.close()

    asyncio.run(main())
