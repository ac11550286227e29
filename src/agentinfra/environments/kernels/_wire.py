"""Frames between the supervisor and its workers: a fixed header, JSON, raw tensor bytes.

    frame = b"AIKG" || uint32 json_bytes || uint64 payload_bytes || json || payload

The JSON object carries ``tensors``: a list of ``{"dtype", "shape"}`` whose raw
little-endian bytes follow back to back in the payload. Nothing is pickled.
Frames from a candidate worker are untrusted: `read_frame` validates sizes,
dtypes and shapes and raises `WireError` on anything malformed.

No frame is copied whole on the way: `read_frame` reads the payload into one buffer
and each tensor is a read-only view of it, and `frame_parts` lets a sender write the
header and each tensor's bytes as they are (`encode_frame` joins them once). A
supervisor forwarding a call's inputs holds them once, not three times.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import IO, Any

import xxhash

__all__ = [
    "DTYPE_BYTES",
    "Frame",
    "TensorBytes",
    "WireError",
    "digest",
    "encode_frame",
    "frame_parts",
    "read_frame",
]

_HEADER = struct.Struct("<4sIQ")
_MAGIC = b"AIKG"
_MAX_JSON = 16 << 20
DTYPE_BYTES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
    "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}  # fmt: skip


class WireError(Exception):
    """A frame is malformed, truncated or too large."""


@dataclass(frozen=True, slots=True)
class TensorBytes:
    """One tensor as raw bytes: dtype name, shape, data."""

    dtype: str
    shape: tuple[int, ...]
    data: bytes | memoryview
    """The raw bytes; from `read_frame`, a read-only view of the frame's payload."""

    @property
    def numel(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count


@dataclass(frozen=True, slots=True)
class Frame:
    """A decoded frame: its JSON object and its tensors."""

    header: dict[str, Any]
    tensors: list[TensorBytes]


def frame_parts(
    header: dict[str, Any], tensors: list[TensorBytes] | None = None
) -> list[bytes | memoryview]:
    """One frame as the pieces to write in order: the fixed header and JSON, then each
    tensor's bytes, uncopied."""
    tensors = tensors or []
    body = dict(header, tensors=[{"dtype": t.dtype, "shape": list(t.shape)} for t in tensors])
    text = json.dumps(body, separators=(",", ":")).encode()
    payload_bytes = sum(len(t.data) for t in tensors)
    head: list[bytes | memoryview] = [_HEADER.pack(_MAGIC, len(text), payload_bytes) + text]
    return head + [t.data for t in tensors if len(t.data)]


def encode_frame(header: dict[str, Any], tensors: list[TensorBytes] | None = None) -> bytes:
    """Encodes one frame (`frame_parts`, joined)."""
    return b"".join(frame_parts(header, tensors))


def _read_into(stream: IO[bytes], view: memoryview) -> None:
    """Fills ``view`` from ``stream``, in place where the stream can (``readinto``)."""
    filled = 0
    readinto = getattr(stream, "readinto", None)
    while filled < len(view):
        if readinto is not None:
            got = readinto(view[filled:]) or 0
        else:
            chunk = stream.read(len(view) - filled)
            got = len(chunk)
            view[filled : filled + got] = chunk
        if not got:
            raise WireError(f"stream ended with {len(view) - filled} of {len(view)} bytes unread")
        filled += got


def _read_exactly(stream: IO[bytes], count: int) -> bytes:
    buffer = bytearray(count)
    _read_into(stream, memoryview(buffer))
    return bytes(buffer)


def _tensor_specs(
    header: dict[str, Any], payload_bytes: int
) -> list[tuple[str, tuple[int, ...], int]]:
    specs = header.get("tensors")
    if not isinstance(specs, list):
        raise WireError("frame has no tensor list")
    out: list[tuple[str, tuple[int, ...], int]] = []
    total = 0
    for spec in specs:
        if not isinstance(spec, dict) or spec.get("dtype") not in DTYPE_BYTES:
            raise WireError(f"bad tensor spec {str(spec)[:80]}")
        shape = spec.get("shape")
        if (
            not isinstance(shape, list)
            or len(shape) > 8
            or not all(isinstance(d, int) and 0 <= d < 1 << 40 for d in shape)
        ):
            raise WireError(f"bad tensor shape {str(shape)[:80]}")
        count = DTYPE_BYTES[spec["dtype"]]
        for dim in shape:
            count *= dim
        total += count
        out.append((spec["dtype"], tuple(shape), count))
    if total != payload_bytes:
        raise WireError(f"tensor sizes add up to {total} bytes, payload has {payload_bytes}")
    return out


def read_frame(stream: IO[bytes], *, max_payload_bytes: int) -> Frame:
    """Reads and validates one frame.

    Raises:
        WireError: bad magic, oversized, truncated or inconsistent frame.
    """
    magic, json_bytes, payload_bytes = _HEADER.unpack(_read_exactly(stream, _HEADER.size))
    if magic != _MAGIC:
        raise WireError(f"bad frame magic {magic!r}")
    if json_bytes > _MAX_JSON or payload_bytes > max_payload_bytes:
        raise WireError(f"frame too large ({json_bytes} + {payload_bytes} bytes)")
    try:
        header = json.loads(_read_exactly(stream, json_bytes))
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireError(f"frame JSON is malformed: {exc}") from None
    if not isinstance(header, dict):
        raise WireError("frame JSON is not an object")
    specs = _tensor_specs(header, payload_bytes)
    payload = memoryview(bytearray(payload_bytes))
    _read_into(stream, payload)
    payload = payload.toreadonly()
    tensors: list[TensorBytes] = []
    offset = 0
    for dtype, shape, count in specs:
        tensors.append(TensorBytes(dtype, shape, payload[offset : offset + count]))
        offset += count
    return Frame(header, tensors)


def digest(item: TensorBytes) -> str:
    """The commitment to one output: xxh3-128 over dtype, shape and bytes."""
    hasher = xxhash.xxh3_128()
    hasher.update(f"{item.dtype}|{item.shape}|".encode())
    hasher.update(item.data)
    return hasher.hexdigest()
