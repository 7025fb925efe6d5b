"""A TCP proxy on loopback between eqrisk and a real backend (PostgreSQL, Redis), that the tests
cut and pause, and that can lose a PostgreSQL COMMIT or its acknowledgement on purpose.

- `cut()`: every connection reset (RST) and new ones refused (nothing listens); `restore()`.
- `pause()`: a partition: no byte goes through in either direction, on open connections and
  on new ones (accepted by the kernel, never served); `resume()` lets the held bytes go on.
- `arm(action)` (PostgreSQL, whose messages the proxy then reads): `drop_ack` loses the
  acknowledgement of the next COMMIT (the server committed; the client's connection is reset);
  `drop_commit` loses the next COMMIT itself (never applied; reset); `drop_ack_and_pause`
  loses the acknowledgement and pauses everything (the client cannot even ask what happened);
  `hold_commit` holds the next COMMIT and pauses everything; `resume()` then delivers it late.

It runs an asyncio loop in a thread of its own. PostgreSQL must be reached without TLS (the
test server has `ssl = off`; an SSLRequest is answered `N` and passed through).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

NEGOTIATION_CODES = {80877103, 80877104}  # SSLRequest, GSSENCRequest: one-byte answers


@dataclass(eq=False)  # compared (and hashed) by identity: kept in a set
class _Link:
    """One proxied connection: its two sockets and how far its PostgreSQL stream was read."""

    client: asyncio.StreamWriter
    server: asyncio.StreamWriter | None = None
    c2s: bytearray = field(default_factory=bytearray)
    s2c: bytearray = field(default_factory=bytearray)
    started: bool = False  # the client's startup message went by (typed messages from then)
    negotiating: int = 0  # one-byte answers the server owes (SSL / GSS requests)


class Proxy:
    def __init__(self, target_port: int, *, pg: bool = False, host: str = "127.0.0.1") -> None:
        self.target = (host, target_port)
        self.pg = pg
        self.port = 0
        self.armed: str | None = None
        self.fired: list[str] = []  # actions done, in order
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._flowing: asyncio.Event | None = None
        self._held: list[tuple[_Link, bytes]] = []

    # -- control (from the test's thread) -------------------------------------------------
    def __enter__(self) -> Proxy:
        self._thread.start()
        self._call(self._start)
        return self

    def __exit__(self, *exc: object) -> None:
        self._call(self._shutdown)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    def cut(self) -> None:
        self._call(self._cut)

    def restore(self) -> None:
        self._call(self._listen)

    def pause(self) -> None:
        self._call(self._pause)

    def resume(self) -> None:
        self._call(self._resume)

    def arm(self, action: str) -> None:
        assert self.pg and action in {
            "drop_ack",
            "drop_commit",
            "drop_ack_and_pause",
            "hold_commit",
        }
        self.armed = action

    def _call(self, fn: Callable[[], Any]) -> Any:
        async def run() -> Any:
            result = fn()
            if asyncio.iscoroutine(result):
                result = await result
            return result

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=30)

    # -- the loop's side ----------------------------------------------------------------------
    async def _start(self) -> None:
        self._flowing = asyncio.Event()
        self._flowing.set()
        await self._listen()

    async def _listen(self) -> None:
        if self._server is not None:
            return
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port or 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _shutdown(self) -> None:
        await self._cut()
        for task in asyncio.all_tasks(self._loop):
            if task is not asyncio.current_task():
                task.cancel()

    async def _cut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for link in list(self._links):
            self._reset(link)

    def _pause(self) -> None:
        assert self._flowing is not None
        self._flowing.clear()

    def _resume(self) -> None:
        assert self._flowing is not None
        for link, message in self._held:  # a COMMIT delivered late
            if link.server is not None and not link.server.is_closing():
                link.server.write(message)
        self._held.clear()
        self._flowing.set()

    def _reset(self, link: _Link) -> None:
        """Close both sides with a reset (SO_LINGER 0): no FIN handshake, unsent bytes lost."""
        self._links.discard(link)
        for writer in (link.client, link.server):
            if writer is None:
                continue
            sock = writer.get_extra_info("socket")
            with contextlib.suppress(OSError):
                if sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        self.connections += 1
        link = _Link(writer)
        self._links.add(link)
        try:
            await self._flowing.wait()  # a partition: the connection is never served
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except (OSError, asyncio.CancelledError):
            self._reset(link)
            return
        link.server = up_writer
        with contextlib.suppress(asyncio.CancelledError):  # the proxy shuts down
            await asyncio.gather(
                self._pump(link, reader, up_writer, True),
                self._pump(link, up_reader, writer, False),
                return_exceptions=True,
            )
        self._links.discard(link)
        for w in (writer, up_writer):
            w.close()

    async def _pump(
        self,
        link: _Link,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        to_server: bool,
    ) -> None:
        assert self._flowing is not None
        while True:
            await self._flowing.wait()
            data = await reader.read(65536)
            if not data:
                with contextlib.suppress(OSError):
                    writer.write_eof()
                return
            await self._flowing.wait()  # bytes read as a pause began are held, not sent
            if link not in self._links:
                return
            out = self._inspect(link, data, to_server) if self.pg else data
            if out is None:
                return
            writer.write(out)
            await writer.drain()

    # -- PostgreSQL's messages ----------------------------------------------------------------
    def _inspect(self, link: _Link, data: bytes, to_server: bool) -> bytes | None:
        """The bytes to pass on (whole messages), or None when this link was just cut."""
        buf = link.c2s if to_server else link.s2c
        buf += data
        out = bytearray()
        while True:
            if not to_server and link.negotiating:
                if not buf:
                    break
                out += buf[:1]
                del buf[:1]
                link.negotiating -= 1
                continue
            typed = link.started or not to_server
            head = 5 if typed else 4
            if len(buf) < head:
                break
            length = struct.unpack("!I", buf[head - 4 : head])[0]
            size = length + (1 if typed else 0)
            if len(buf) < size:
                break
            message = bytes(buf[:size])
            del buf[:size]
            if not typed:
                code = struct.unpack("!I", message[4:8])[0] if len(message) >= 8 else 0
                if code in NEGOTIATION_CODES:
                    link.negotiating += 1
                else:
                    link.started = True
                out += message
            elif self._act(link, message, to_server, out):
                return None
            else:
                out += message
        return bytes(out)

    def _act(self, link: _Link, message: bytes, to_server: bool, out: bytearray) -> bool:
        """Carry out the armed action if `message` is its trigger; True when the link is cut
        (or the message held) and nothing more of this read goes through."""
        action = self.armed
        if action is None:
            return False
        commit = message[:1] in (b"Q", b"P") and b"COMMIT" in message[5:].upper()
        ack = message[:1] == b"C" and message[5:].startswith(b"COMMIT")
        if to_server and commit and action in ("drop_commit", "hold_commit"):
            self.armed = None
            self.fired.append(action)
            if action == "drop_commit":
                self._pass(link, out, to_server)
                self._reset(link)
            else:
                self._pass(link, out, to_server)
                self._held.append((link, message))
                self._pause()
            return True
        if not to_server and ack and action in ("drop_ack", "drop_ack_and_pause"):
            self.armed = None
            self.fired.append(action)
            self._pass(link, out, to_server)
            if action == "drop_ack":
                self._reset(link)
            else:
                link.s2c.clear()  # the acknowledgement and what follows it are lost
                self._pause()
            return True
        return False

    @staticmethod
    def _pass(link: _Link, out: bytearray, to_server: bool) -> None:
        """Send what came before the trigger in this read."""
        writer = link.server if to_server else link.client
        if out and writer is not None and not writer.is_closing():
            writer.write(bytes(out))
