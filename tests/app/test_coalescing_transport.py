"""``CoalescingTransport``: what one turn of the event loop writes goes out as one ``write``, in order,
and nothing written is lost when the connection closes (or sent when it is aborted)."""

from __future__ import annotations

import asyncio

from app.service.server import CoalescingTransport


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


def test_one_turn_of_writes_is_one_write_in_order() -> None:
    async def scenario() -> list[bytes]:
        real = RecordingTransport()
        transport = CoalescingTransport(real, asyncio.get_running_loop())  # type: ignore[arg-type]
        transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
        transport.write(b"{}")
        assert real.writes == []  # held until the loop turns
        await asyncio.sleep(0)
        transport.write(b"next")
        await asyncio.sleep(0)
        return real.writes

    assert asyncio.run(scenario()) == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}", b"next"]


def test_close_sends_what_is_pending_and_abort_drops_it() -> None:
    async def scenario() -> tuple[RecordingTransport, RecordingTransport]:
        loop = asyncio.get_running_loop()
        closing, aborting = RecordingTransport(), RecordingTransport()
        first = CoalescingTransport(closing, loop)  # type: ignore[arg-type]
        first.write(b"bye")
        first.close()
        second = CoalescingTransport(aborting, loop)  # type: ignore[arg-type]
        second.write(b"never")
        second.abort()
        await asyncio.sleep(0)  # the scheduled flushes find nothing left to send
        return closing, aborting

    closing, aborting = asyncio.run(scenario())
    assert closing.writes == [b"bye"] and closing.closed
    assert aborting.writes == [] and aborting.aborted


def test_everything_else_reaches_the_real_transport() -> None:
    async def scenario() -> None:
        real = RecordingTransport()
        transport = CoalescingTransport(real, asyncio.get_running_loop())  # type: ignore[arg-type]
        assert transport.get_extra_info("peername") == "info:peername"
        assert transport.is_closing() is False

    asyncio.run(scenario())
