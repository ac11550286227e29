"""The cache server's wire format, version 1 (spec: docs/protocol.md). Pure: no I/O.

Every frame is a 24-byte little-endian header followed by ``payload_len`` bytes:

    offset size field
         0    4 magic b"AIKP"
         4    1 protocol version (1)
         5    1 opcode (`Op`)
         6    2 flags (bit 0: response)
         8    8 request id (echoed in the response)
        16    4 payload length in bytes
        20    4 reserved (0)

Requests on one connection may be pipelined; responses come back in request
order and carry the request's id. An `Op.ERROR` response carries a `Status` and
a UTF-8 message; the server closes the connection after sending it.
"""

from __future__ import annotations

import enum
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentinfra.errors import ProtocolError
from agentinfra.kvcache._keys import BlockKey

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "FLAG_RESPONSE",
    "HEADER",
    "MAGIC",
    "PROTOCOL_VERSION",
    "SESSION_ACTIONS",
    "FrameHeader",
    "Op",
    "ProtocolError",
    "Status",
    "block_prefix",
    "decode_blocks",
    "decode_error",
    "decode_hello",
    "decode_json",
    "decode_keys",
    "decode_lineage",
    "decode_u32s",
    "decode_session",
    "decode_shm_get",
    "decode_u32",
    "encode_error",
    "encode_header",
    "encode_hello",
    "encode_json",
    "encode_keys",
    "encode_lineage",
    "encode_session",
    "encode_shm_get",
    "encode_u32",
    "parse_header",
]

MAGIC = b"AIKP"
PROTOCOL_VERSION = 1
HEADER = struct.Struct("<4sBBHQII")
FLAG_RESPONSE = 0x0001
DEFAULT_MAX_FRAME_BYTES = 256 * 1024 * 1024
KEY_BYTES = 32
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


class Op(enum.IntEnum):
    """Opcodes. Every request opcode answers with the same opcode or `ERROR`."""

    HELLO = 1
    LEADING_HITS = 2
    GET = 3
    PUT = 4
    REMOVE = 5
    STATS = 6
    EXPLAIN = 7
    SESSION = 8
    LINEAGE = 9
    TIER_HITS = 10
    GET_SHM = 11
    ERROR = 0x7F


class Status(enum.IntEnum):
    """Status codes carried by `Op.ERROR` frames."""

    BAD_FRAME = 1
    UNSUPPORTED_VERSION = 2
    UNKNOWN_OPCODE = 3
    FRAME_TOO_LARGE = 4
    UNAUTHORIZED = 5
    BAD_REQUEST = 6
    BAD_BLOCK = 7
    UNAVAILABLE = 8
    INTERNAL = 9


@dataclass(frozen=True, slots=True)
class FrameHeader:
    version: int
    op: int
    flags: int
    request_id: int
    payload_len: int


def encode_header(op: Op, request_id: int, payload_len: int, *, response: bool = False) -> bytes:
    return HEADER.pack(
        MAGIC, PROTOCOL_VERSION, op, FLAG_RESPONSE if response else 0, request_id, payload_len, 0
    )


def parse_header(data: bytes | bytearray | memoryview, max_frame_bytes: int) -> FrameHeader:
    """Decodes and checks a header.

    Raises:
        ProtocolError: wrong magic, another version, an unknown opcode or a payload over the limit.
    """
    magic, version, op, flags, request_id, length, reserved = HEADER.unpack_from(data)
    if magic != MAGIC or reserved != 0:
        raise ProtocolError(Status.BAD_FRAME, f"bad magic {bytes(magic)!r} (expected {MAGIC!r})")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            Status.UNSUPPORTED_VERSION,
            f"protocol version {version} is not supported; this server speaks {PROTOCOL_VERSION}",
        )
    if op not in Op._value2member_map_:
        raise ProtocolError(Status.UNKNOWN_OPCODE, f"unknown opcode {op}")
    if length > max_frame_bytes:
        raise ProtocolError(
            Status.FRAME_TOO_LARGE,
            f"payload of {length} bytes is over the maximum frame size {max_frame_bytes} "
            "(kv serve --max-frame)",
        )
    return FrameHeader(version, op, flags, request_id, length)


def encode_keys(keys: Sequence[bytes]) -> bytes:
    for key in keys:
        if len(key) != KEY_BYTES:
            raise ProtocolError(Status.BAD_REQUEST, f"block key of {len(key)} bytes (expected 32)")
    return _U32.pack(len(keys)) + b"".join(keys)


def decode_keys(payload: bytes | bytearray | memoryview) -> list[BlockKey]:
    count = _count(payload)
    if len(payload) != 4 + count * KEY_BYTES:
        raise ProtocolError(
            Status.BAD_REQUEST, f"key list says {count} keys but has {len(payload) - 4} bytes"
        )
    view = memoryview(payload)
    return [BlockKey(bytes(view[4 + i * 32 : 36 + i * 32])) for i in range(count)]


def _count(payload: bytes | bytearray | memoryview) -> int:
    if len(payload) < 4:
        raise ProtocolError(Status.BAD_REQUEST, f"payload of {len(payload)} bytes has no count")
    (count,) = _U32.unpack_from(payload)
    return int(count)


def encode_lineage(
    keys: Sequence[bytes], tokens: Sequence[int], *, block_size: int, parent: bytes | None
) -> bytes:
    """A chain's tokens: ``u32 block_size``, the parent key (32 zero bytes: none), ``keys``,
    then ``len(keys) * block_size`` token ids as ``u32``."""
    if block_size < 1 or len(tokens) != len(keys) * block_size:
        raise ProtocolError(
            Status.BAD_REQUEST,
            f"lineage of {len(keys)} blocks of {block_size} tokens got {len(tokens)} tokens",
        )
    if parent is not None and (len(parent) != KEY_BYTES or parent == bytes(KEY_BYTES)):
        raise ProtocolError(Status.BAD_REQUEST, f"lineage parent of {len(parent)} bytes")
    try:
        packed = struct.pack(f"<{len(tokens)}I", *tokens)
    except struct.error:
        raise ProtocolError(Status.BAD_REQUEST, "lineage token ids must be in 0..2**32-1") from None
    return _U32.pack(block_size) + (parent or bytes(KEY_BYTES)) + encode_keys(keys) + packed


def decode_lineage(
    payload: bytes | bytearray | memoryview,
) -> tuple[list[BlockKey], tuple[int, ...], int, BlockKey | None]:
    """(keys, tokens, block_size, parent) of an `encode_lineage` payload."""
    view = memoryview(payload)
    if len(view) < 4 + KEY_BYTES + 4:
        raise ProtocolError(Status.BAD_REQUEST, f"lineage of {len(view)} bytes is truncated")
    (block_size,) = _U32.unpack_from(view)
    parent = bytes(view[4 : 4 + KEY_BYTES])
    count = _count(view[4 + KEY_BYTES :])
    keys_end = 4 + KEY_BYTES + 4 + count * KEY_BYTES
    if block_size < 1 or len(view) != keys_end + 4 * count * block_size:
        raise ProtocolError(
            Status.BAD_REQUEST,
            f"lineage of {count} blocks of {block_size} tokens has {len(view)} bytes",
        )
    keys = decode_keys(view[4 + KEY_BYTES : keys_end])
    tokens = struct.unpack_from(f"<{count * block_size}I", view, keys_end)
    return keys, tokens, block_size, None if parent == bytes(KEY_BYTES) else BlockKey(parent)


def decode_u32s(payload: bytes | bytearray | memoryview, count: int) -> tuple[int, ...]:
    if len(payload) != 4 * count:
        raise ProtocolError(
            Status.BAD_FRAME, f"expected {count} u32 values, got {len(payload)} bytes"
        )
    return struct.unpack(f"<{count}I", payload)


def encode_u32(value: int) -> bytes:
    return _U32.pack(value)


def decode_u32(payload: bytes | bytearray | memoryview) -> int:
    if len(payload) != 4:
        raise ProtocolError(Status.BAD_FRAME, f"expected a 4-byte count, got {len(payload)} bytes")
    return int(_U32.unpack(payload)[0])


def block_prefix(size: int) -> bytes:
    """The 8-byte length that precedes each block in GET responses and PUT requests."""
    return _U64.pack(size)


def decode_blocks(payload: bytes | bytearray | memoryview) -> list[memoryview]:
    """Splits a block list (u32 count, then u64 size + bytes each) into zero-copy views."""
    view = memoryview(payload)
    count = _count(view)
    blocks: list[memoryview] = []
    offset = 4
    for index in range(count):
        if offset + 8 > len(view):
            raise ProtocolError(Status.BAD_REQUEST, f"block list truncated at block {index}")
        (size,) = _U64.unpack_from(view, offset)
        offset += 8
        if offset + size > len(view):
            raise ProtocolError(
                Status.BAD_REQUEST, f"block {index} says {size} bytes, {len(view) - offset} remain"
            )
        blocks.append(view[offset : offset + size])
        offset += size
    if offset != len(view):
        raise ProtocolError(Status.BAD_REQUEST, f"{len(view) - offset} bytes after the last block")
    return blocks


_SHM_GET = struct.Struct("<QQ")


def encode_shm_get(offset: int, capacity: int, keys: Sequence[bytes]) -> bytes:
    """A GET_SHM request: where in the connection's segment the answer goes, then ``keys``."""
    return _SHM_GET.pack(offset, capacity) + encode_keys(keys)


def decode_shm_get(payload: bytes | bytearray | memoryview) -> tuple[int, int, list[BlockKey]]:
    """(offset, capacity, keys) of a GET_SHM request."""
    if len(payload) < _SHM_GET.size:
        raise ProtocolError(
            Status.BAD_REQUEST, f"GET_SHM payload of {len(payload)} bytes is truncated"
        )
    offset, capacity = _SHM_GET.unpack_from(payload)
    return int(offset), int(capacity), decode_keys(memoryview(payload)[_SHM_GET.size :])


def encode_hello(tenant: str, token: str) -> bytes:
    t, k = tenant.encode(), token.encode()
    if len(t) > 0xFFFF or len(k) > 0xFFFF:
        raise ProtocolError(Status.BAD_REQUEST, "tenant and token must each be under 64 KiB")
    return _U16.pack(len(t)) + t + _U16.pack(len(k)) + k


def decode_hello(payload: bytes | bytearray | memoryview) -> tuple[str, str]:
    view = bytes(payload)
    try:
        (tlen,) = _U16.unpack_from(view, 0)
        tenant = view[2 : 2 + tlen]
        (klen,) = _U16.unpack_from(view, 2 + tlen)
        token = view[4 + tlen : 4 + tlen + klen]
        if len(tenant) != tlen or len(token) != klen or 4 + tlen + klen != len(view):
            raise ValueError("lengths do not add up")
        return tenant.decode(), token.decode()
    except (struct.error, ValueError) as exc:
        raise ProtocolError(Status.BAD_REQUEST, f"malformed HELLO payload: {exc}") from exc


def encode_error(status: Status, message: str) -> bytes:
    return _U16.pack(status) + message.encode()[:4096]


def decode_error(payload: bytes | bytearray | memoryview) -> ProtocolError:
    data = bytes(payload)
    if len(data) < 2:
        return ProtocolError(Status.BAD_FRAME, "error frame without a status")
    (code,) = _U16.unpack_from(data)
    status = Status(code) if code in Status._value2member_map_ else Status.INTERNAL
    return ProtocolError(status, data[2:].decode(errors="replace"))


SESSION_ACTIONS = ("begin", "add", "end", "close")


def encode_session(body: dict[str, Any], keys: Sequence[bytes] = ()) -> bytes:
    """A SESSION request: ``u32 len`` and a JSON object, then ``keys``."""
    data = encode_json(body)
    return _U32.pack(len(data)) + data + encode_keys(keys)


def decode_session(
    payload: bytes | bytearray | memoryview,
) -> tuple[dict[str, Any], list[BlockKey]]:
    """The JSON object and keys of a SESSION request, checked.

    Raises:
        ProtocolError: ``BAD_REQUEST`` naming what is wrong.
    """
    if len(payload) < 4:
        raise ProtocolError(Status.BAD_REQUEST, "SESSION payload shorter than its length field")
    (size,) = _U32.unpack_from(payload)
    if 4 + size > len(payload):
        raise ProtocolError(
            Status.BAD_REQUEST, f"SESSION JSON of {size} bytes overruns the payload"
        )
    body = decode_json(memoryview(payload)[4 : 4 + size])
    keys = decode_keys(memoryview(payload)[4 + size :])
    if not isinstance(body, dict):
        raise ProtocolError(Status.BAD_REQUEST, "SESSION JSON must be an object")
    session = body.get("session")
    if not isinstance(session, str) or not 0 < len(session) <= 256:
        raise ProtocolError(
            Status.BAD_REQUEST, f"SESSION needs a session id of 1..256 characters, got {session!r}"
        )
    if body.get("action") not in SESSION_ACTIONS:
        raise ProtocolError(
            Status.BAD_REQUEST,
            f"SESSION action {body.get('action')!r} is not one of {', '.join(SESSION_ACTIONS)}",
        )
    ttl = body.get("ttl_s", 0.0)
    if not isinstance(ttl, int | float) or isinstance(ttl, bool) or ttl < 0:
        raise ProtocolError(Status.BAD_REQUEST, f"SESSION ttl_s={ttl!r} must be a number >= 0")
    return body, keys


def encode_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def decode_json(payload: bytes | bytearray | memoryview) -> Any:
    try:
        return json.loads(bytes(payload))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(Status.BAD_FRAME, f"malformed JSON payload: {exc}") from exc
