"""A raw asyncio HTTP/1.1 server on loopback that misbehaves at one point of a request.

``at="headers"``: it reads the request line and headers, then stalls (reads nothing more,
answers nothing) or drops the connection -- the body never arrives whole, so the server
cannot have acted on it. ``at="body"``: it reads the whole request (counted in
``received``: what the server could act on), then stalls or drops instead of answering.

Its sockets' receive buffers are kept small, and ``small_buffers_transport`` gives the
client small send buffers, so a body of a few hundred kilobytes really is stuck in the
client while the server does not read (loopback's default buffers would swallow it whole).
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Literal

import httpx

Point = Literal["headers", "body"]
Misbehaviour = Literal["stall", "drop"]
BUFFER = 4096


def small_buffers_transport() -> httpx.AsyncHTTPTransport:
    return httpx.AsyncHTTPTransport(
        socket_options=[(socket.SOL_SOCKET, socket.SO_SNDBUF, BUFFER)])


@dataclass
class MisbehavingHTTP:
    at: Point | None = None
    how: Misbehaviour = "stall"
    received: list[bytes] = field(default_factory=list)
    """The body of every request the server read whole."""
    started: int = 0
    """Requests whose headers arrived."""
    port: int = 0
    _release: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/send"

    def release(self) -> None:
        self._release.set()

    async def _misbehave(self, point: Point, writer: asyncio.StreamWriter) -> bool:
        if point != self.at:
            return False
        if self.how == "stall":
            await self._release.wait()
        writer.transport.abort()
        return True

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            self.started += 1
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if await self._misbehave("headers", writer):
                return
            body = await reader.readexactly(length)
            self.received.append(body)
            if await self._misbehave("body", writer):
                return
            answer = json.dumps({"id": f"m-{len(self.received)}"}).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(answer), answer))
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with suppress(ConnectionError):
                await writer.wait_closed()


@asynccontextmanager
async def misbehaving_http(at: Point | None = None,
                           how: Misbehaviour = "stall") -> AsyncIterator[MisbehavingHTTP]:
    server = MisbehavingHTTP(at, how)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUFFER)  # inherited when accepted
    sock.bind(("127.0.0.1", 0))
    # ``limit``: the server's own stream buffer stays small too (it pauses reading at 2x).
    listener = await asyncio.start_server(server.handle, sock=sock, limit=BUFFER)
    server.port = sock.getsockname()[1]
    try:
        yield server
    finally:
        server.release()
        listener.close()
        await listener.wait_closed()
