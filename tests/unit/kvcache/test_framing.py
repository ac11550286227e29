"""FrameConnection over a real socket: frames arrive whole and in order, however the bytes are cut.

A large payload is read on past the event loop's one read per wakeup; these check that
nothing of the stream is lost or reordered by it: a small frame right behind a large
one, a large one received into the caller's buffer, and a stream cut at random points.
"""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import time

import pytest

from agentinfra.kvcache._framing import FrameConnection
from agentinfra.kvcache._protocol import FrameHeader, Op, encode_header


def _frames(sizes: list[int], seed: int) -> list[tuple[int, bytes]]:
    rng = random.Random(seed)
    return [(i + 1, rng.randbytes(size)) for i, size in enumerate(sizes)]


def _stream_bytes(frames: list[tuple[int, bytes]]) -> int:
    return sum(len(payload) for _, payload in frames) + len(frames) * len(
        encode_header(Op.GET, 1, 0)
    )


def _received(
    frames: list[tuple[int, bytes]], cuts: int, seed: int, sinks: dict[int, int] | None = None
) -> tuple[list[tuple[int, bytes]], FrameConnection, dict[int, bytearray]]:
    """Sends ``frames`` through a socket pair in ``cuts`` random pieces; returns what arrived."""
    stream = b"".join(
        encode_header(Op.GET, request_id, len(payload), response=True) + payload
        for request_id, payload in frames
    )
    rng = random.Random(seed)
    points = sorted(rng.sample(range(1, len(stream)), cuts))
    pieces = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    ours, theirs = socket.socketpair()
    got: list[tuple[int, bytes]] = []
    buffers = {rid: bytearray(size) for rid, size in (sinks or {}).items()}

    async def main() -> FrameConnection:
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def on_frame(header: FrameHeader, payload: bytearray | memoryview) -> None:
            got.append((header.request_id, bytes(payload)))
            if len(got) == len(frames) and not done.done():
                done.set_result(None)

        def on_error(error: Exception) -> None:
            if not done.done():
                done.set_exception(error)

        protocol = FrameConnection(1 << 30, on_frame, on_error, lambda exc: None)
        for rid, buffer in buffers.items():
            protocol.sinks[rid] = memoryview(buffer)
        await loop.create_connection(lambda: protocol, sock=ours)

        def send() -> None:
            for piece in pieces:
                theirs.sendall(piece)
                if rng.random() < 0.3:
                    time.sleep(0.001)

        sender = threading.Thread(target=send)
        sender.start()
        await asyncio.wait_for(done, 20)
        sender.join()
        assert protocol.transport is not None
        protocol.transport.close()
        return protocol

    try:
        protocol = asyncio.run(main())
    finally:
        theirs.close()
    return got, protocol, buffers


def test_a_small_frame_right_behind_a_large_one_arrives_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drained = []
    drain = FrameConnection._drain_payload

    def counted(self: FrameConnection, payload: bytearray | memoryview) -> None:
        before = self.bytes_received
        drain(self, payload)
        drained.append(self.bytes_received - before)

    monkeypatch.setattr(FrameConnection, "_drain_payload", counted)
    frames = _frames([3 << 20, 40, 2 << 20, 0, 17], seed=1)
    got, protocol, _ = _received(frames, cuts=5, seed=2)
    assert got == frames
    assert protocol.bytes_received == _stream_bytes(frames)
    assert sum(drained) > 0  # part of the large payloads came in past the loop's own reads


def test_a_large_answer_lands_in_the_callers_buffer() -> None:
    frames = _frames([1 << 20, 300_000, 64], seed=3)
    got, _, buffers = _received(frames, cuts=40, seed=4, sinks={1: 1 << 20, 2: 400_000})
    assert got == frames
    assert bytes(buffers[1]) == frames[0][1]  # received in place, not into a copy
    assert bytes(buffers[2][:300_000]) == frames[1][1]


def test_streams_cut_anywhere_arrive_whole_and_in_order() -> None:
    for seed in range(8):
        rng = random.Random(seed)
        sizes = [rng.choice([0, 1, 100, 70_000, 300_000, 1 << 20]) for _ in range(12)]
        frames = _frames(sizes, seed)
        got, protocol, _ = _received(frames, cuts=rng.randrange(1, 200), seed=seed)
        assert got == frames, seed
        assert protocol.bytes_received == _stream_bytes(frames)
