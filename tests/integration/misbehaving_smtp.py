"""A raw asyncio SMTP server on loopback that misbehaves at one step of the dialogue.

aiosmtpd answers every command correctly; to test what a client does when the server stalls
or hangs up at a precise moment, this server speaks just enough SMTP (greeting, EHLO/HELO,
AUTH PLAIN, MAIL, RCPT, DATA, RSET, NOOP, QUIT) and, at the step named ``at``, either
*stalls* (reads on, answers nothing) or *drops* (closes the connection) instead of answering.

Steps, in dialogue order: ``greeting`` (before the 220), ``ehlo``, ``auth``, ``mail``,
``rcpt``, ``data`` (the DATA command, before the 354), ``dot`` (after the message's final
dot has been read: the server *has* the message and counts it in ``received``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Literal

Step = Literal["greeting", "ehlo", "auth", "mail", "rcpt", "data", "dot"]
STEPS: tuple[Step, ...] = ("greeting", "ehlo", "auth", "mail", "rcpt", "data", "dot")
Misbehaviour = Literal["stall", "drop"]

_COMMANDS: dict[bytes, Step] = {b"EHLO": "ehlo", b"HELO": "ehlo", b"AUTH": "auth",
                                b"MAIL": "mail", b"RCPT": "rcpt", b"DATA": "data"}


@dataclass
class MisbehavingSMTP:
    at: Step | None = None
    how: Misbehaviour = "stall"
    received: list[bytes] = field(default_factory=list)
    """Every message whose final dot the server read: what it could have delivered."""
    reached: list[Step] = field(default_factory=list)
    """Each step the server saw a client get to, in order (the dialogue as it went)."""
    port: int = 0
    _release: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def url(self) -> str:
        return f"smtp://127.0.0.1:{self.port}"

    def release(self) -> None:
        """End every stall: the stalled connections are closed."""
        self._release.set()

    async def _misbehave(self, step: Step, writer: asyncio.StreamWriter) -> bool:
        """True if the server misbehaved at ``step`` (and the connection is over)."""
        self.reached.append(step)
        if step != self.at:
            return False
        if self.how == "stall":
            await self._release.wait()
        writer.close()
        return True

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._dialogue(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with suppress(ConnectionError):
                await writer.wait_closed()

    async def _dialogue(self, reader: asyncio.StreamReader,
                        writer: asyncio.StreamWriter) -> None:
        if await self._misbehave("greeting", writer):
            return
        writer.write(b"220 misbehaving ESMTP\r\n")
        while line := await reader.readline():
            verb = line.split(b" ", 1)[0].strip().upper()
            step = _COMMANDS.get(verb)
            if step is not None and await self._misbehave(step, writer):
                return
            if verb == b"EHLO":
                writer.write(b"250-misbehaving\r\n250-AUTH PLAIN\r\n250 8BITMIME\r\n")
            elif verb == b"AUTH":
                writer.write(b"235 2.7.0 authenticated\r\n")
            elif verb == b"DATA":
                writer.write(b"354 end with <CRLF>.<CRLF>\r\n")
                body = await reader.readuntil(b"\r\n.\r\n")
                self.received.append(body)
                if await self._misbehave("dot", writer):
                    return
                writer.write(b"250 2.0.0 queued\r\n")
            elif verb == b"QUIT":
                writer.write(b"221 bye\r\n")
                await writer.drain()
                return
            else:  # HELO, MAIL, RCPT, RSET, NOOP
                writer.write(b"250 ok\r\n")
            await writer.drain()


@asynccontextmanager
async def misbehaving_smtp(at: Step | None = None,
                           how: Misbehaviour = "stall") -> AsyncIterator[MisbehavingSMTP]:
    server = MisbehavingSMTP(at, how)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    server.port = listener.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        server.release()
        listener.close()
        await listener.wait_closed()
