"""The same-host shared-memory path (docs/protocol.md section 9) against a real server:
loads through a client's sealed segment, tenants kept apart, and every bad hand-over refused
in one line while the server goes on serving."""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from agentinfra.errors import ConfigError, ProtocolError, TierUnavailableError
from agentinfra.kvcache import (
    BlockKey,
    CacheClient,
    MemoryTier,
    Namespace,
    ServerConfig,
    ServerThread,
    TieredStore,
    block_keys,
    encode_block,
)
from agentinfra.kvcache._block import LAYOUT_ENGINE_NATIVE
from agentinfra.kvcache._protocol import (
    HEADER,
    Op,
    Status,
    decode_error,
    encode_header,
    encode_hello,
    encode_shm_get,
    parse_header,
)
from agentinfra.kvcache._reader import BlockReader
from agentinfra.kvcache._shm import PREAMBLE, create_segment

PAYLOAD = 2 * 16 * 4 * 8 * 4  # (2, 16 tokens, 4 heads, 8 dims) float32 per block, one layer
TOKENS = 16


@pytest.fixture
def shm_path() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="kv-shm-"))  # short: a socket path is at most 107 bytes
    yield folder / "kv.sock"
    for child in folder.iterdir():
        child.unlink()
    folder.rmdir()


def start(shm_path: Path, **options: object) -> ServerThread:
    config = ServerConfig(port=0, shm_socket=shm_path, **options)  # type: ignore[arg-type]
    return ServerThread(TieredStore(MemoryTier(32 << 20)), config)


def save(
    port: int, count: int, seed: int, *, token: str = ""
) -> tuple[list[BlockKey], list[bytes]]:
    ns = Namespace(model_id=f"shm-{seed}", kv_dtype="float32", block_size_tokens=TOKENS)
    keys = list(block_keys(ns, np.random.default_rng(seed).integers(0, 1000, count * TOKENS)))
    generator = torch.Generator().manual_seed(seed)
    contents = [torch.randn(1, 2, TOKENS, 4, 8, generator=generator) for _ in keys]
    with CacheClient("127.0.0.1", port, token=token) as client:
        client.put_encoded(
            [
                (k, encode_block(k, c, layout=LAYOUT_ENGINE_NATIVE))
                for k, c in zip(keys, contents, strict=True)
            ]
        )
    return keys, [c.numpy().tobytes() for c in contents]


def read(
    reader: BlockReader, keys: list[BlockKey], *, chunk_blocks: int = 16, depth: int = 2
) -> tuple[list[bytearray], str]:
    """Reads ``keys`` into one buffer per block; returns the buffers and the failure."""
    buffers = [bytearray(PAYLOAD) for _ in keys]
    report = reader.read_into(
        keys, lambda i: [memoryview(buffers[i])[: PAYLOAD // 2], memoryview(buffers[i])[PAYLOAD // 2 :]],
        payload_bytes=PAYLOAD, chunk_blocks=chunk_blocks, depth=depth,
    )  # fmt: skip
    return buffers[: report.verified], report.failure


def refusal(shm_path: Path, send: object) -> str:
    """What the server answers a hand-over made by ``send(sock)``: its ERROR frame's message."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(str(shm_path))
        send(sock)  # type: ignore[operator]
        header = parse_header(sock.recv(HEADER.size, socket.MSG_WAITALL), 1 << 20)
        payload = sock.recv(header.payload_len, socket.MSG_WAITALL)
        with contextlib.suppress(ConnectionResetError):  # a reset when it left bytes unread
            assert sock.recv(1) == b""  # the server closed it
    assert (header.op, header.request_id) == (Op.ERROR, 0)
    error = decode_error(payload)
    assert error.status == Status.BAD_REQUEST
    return str(error)


def test_loads_come_through_the_segment_in_chunks_and_match_tcp(shm_path: Path) -> None:
    server = start(shm_path)
    try:
        keys, contents = save(server.port, 12, seed=1)
        slot = 4 + 4 * (8 + 80 + PAYLOAD)  # 4 blocks a slot, a slot per GET in flight
        with BlockReader(shm_socket=str(shm_path), segment_bytes=3 * slot) as shared:
            got, failure = read(shared, keys, chunk_blocks=16, depth=3)
            assert failure == ""
            assert [bytes(b) for b in got] == contents
            assert shared.read_into(keys, lambda i: [memoryview(bytearray(PAYLOAD))],
                                    payload_bytes=PAYLOAD, depth=3).requests == 3  # fmt: skip
        with BlockReader("127.0.0.1", server.port) as tcp:
            assert [bytes(b) for b in read(tcp, keys)[0]] == contents
        assert server.server is not None
        assert server.server.metrics.shm_bytes._value.get() >= 2 * 12 * PAYLOAD
    finally:
        server.close()
    assert not shm_path.exists()


def test_tenants_stay_apart_through_shared_memory(shm_path: Path) -> None:
    server = start(shm_path, tokens={"ta": "a", "tb": "b"})
    try:
        keys, contents = save(server.port, 4, seed=2, token="ta")
        with BlockReader(shm_socket=str(shm_path), token="ta", segment_bytes=1 << 16) as reader:
            assert [bytes(b) for b in read(reader, keys)[0]] == contents
        with BlockReader(shm_socket=str(shm_path), token="tb", segment_bytes=1 << 16) as other:
            got, failure = read(other, keys)
        assert (got, failure) == ([], "missing: the server holds 0 of the chunk's 4 blocks")
        with pytest.raises(ProtocolError, match="unknown token"):
            BlockReader(shm_socket=str(shm_path), token="nobody", segment_bytes=1 << 16)
    finally:
        server.close()


def test_every_bad_hand_over_is_refused_in_one_line_and_the_server_goes_on(
    shm_path: Path, tmp_path: Path
) -> None:
    server = start(shm_path, shm_max_bytes=1 << 20)
    try:
        keys, contents = save(server.port, 2, seed=3)
        hello = encode_hello("", "")
        no_preamble = refusal(
            shm_path, lambda s: s.sendall(encode_header(Op.HELLO, 1, len(hello)) + hello)
        )
        assert "expects the b'AIKPSHM1' preamble" in no_preamble
        assert "--port" in no_preamble
        assert "0 descriptors" in refusal(shm_path, lambda s: s.sendall(PREAMBLE))
        regular = tmp_path / "plain"
        regular.write_bytes(bytes(8192))
        with open(regular, "r+b") as handle:
            message = refusal(shm_path, lambda s: socket.send_fds(s, [PREAMBLE], [handle.fileno()]))
        assert "not a memfd" in message
        unsealed = os.memfd_create("unsealed", os.MFD_ALLOW_SEALING)
        os.ftruncate(unsealed, 8192)
        message = refusal(shm_path, lambda s: socket.send_fds(s, [PREAMBLE], [unsealed]))
        assert "F_SEAL_SHRINK | F_SEAL_GROW" in message
        os.close(unsealed)
        large = create_segment(2 << 20)
        message = refusal(shm_path, lambda s: socket.send_fds(s, [PREAMBLE], [large.fd]))
        assert "2097152 bytes is over this server's 1048576 (kv serve --shm-max)" in message
        large.close()
        assert "\n" not in no_preamble + message
        with BlockReader(shm_socket=str(shm_path), segment_bytes=1 << 16) as reader:
            assert [bytes(b) for b in read(reader, keys)[0]] == contents
        assert server.server is not None
        deadline = time.monotonic() + 5
        while server.server.metrics.shm_segments._value.get() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.server.metrics.shm_segments._value.get() == 0  # unmapped when each closed
    finally:
        server.close()


def test_a_client_can_neither_resize_its_segment_nor_send_a_range_outside_it(
    shm_path: Path,
) -> None:
    server = start(shm_path)
    try:
        keys, _ = save(server.port, 2, seed=4)
        reader = BlockReader(shm_socket=str(shm_path), segment_bytes=1 << 16)
        assert reader.segment is not None
        for size in (0, 1 << 17):
            with pytest.raises(PermissionError):  # sealed: the server's writes can never fault
                os.ftruncate(reader.segment.fd, size)
        request = reader._send(Op.GET_SHM, encode_shm_get((1 << 16) - 8, 64, keys))
        with pytest.raises(
            ProtocolError, match=r"GET_SHM range \[65528, 65592\) is outside the 65536-byte"
        ):
            reader._answer(request, Op.GET_SHM)
        reader.close()
    finally:
        server.close()


def test_get_shm_on_a_tcp_connection_is_refused(shm_path: Path) -> None:
    server = start(shm_path)
    try:
        keys, _ = save(server.port, 1, seed=5)
        with BlockReader("127.0.0.1", server.port) as tcp:
            request = tcp._send(Op.GET_SHM, encode_shm_get(0, 4096, keys))
            with pytest.raises(
                ProtocolError, match="needs a connection on the shared-memory socket"
            ):
                tcp._answer(request, Op.GET_SHM)
    finally:
        server.close()


def test_a_server_gone_mid_session_is_unavailable_not_wrong(shm_path: Path) -> None:
    server = start(shm_path)
    keys, _ = save(server.port, 3, seed=6)
    reader = BlockReader(shm_socket=str(shm_path), segment_bytes=1 << 16)
    server.close()
    with pytest.raises(TierUnavailableError, match=str(shm_path)):
        read(reader, keys)
    with pytest.raises(TierUnavailableError, match="kv serve --shm-socket"):
        BlockReader(shm_socket=str(shm_path), segment_bytes=1 << 16)


def test_the_socket_path_is_checked_at_start(shm_path: Path) -> None:
    shm_path.write_text("not a socket")
    with pytest.raises(
        ConfigError, match="exists and is not a socket; choose another --shm-socket"
    ):
        start(shm_path)
    shm_path.unlink()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(shm_path))  # a crashed server's: bound, nobody listening
    stale.close()
    server = start(shm_path)
    try:
        assert shm_path.stat().st_mode & 0o777 == 0o600
        with pytest.raises(ConfigError, match=f"another server listens on {shm_path}"):
            start(shm_path)
        assert shm_path.is_socket()  # the refused second server left the first one's socket
    finally:
        server.close()
