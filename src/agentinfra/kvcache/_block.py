"""The block payload format, version 1: a fixed header, then the KV bytes.

A block holds the K and V tensors of every layer for its tokens in one
contiguous payload laid out as ``[num_layers, 2, num_tokens, num_kv_heads,
head_dim]`` (layout ``layer_kv_token_head_dim``). The 80-byte little-endian header:

    offset size field
         0    4 magic b"AIKV"
         4    2 format version (1)
         6    2 header size in bytes (80)
         8    1 dtype code (see DTYPES)
         9    1 layout code (0: layer_kv_token_head_dim; 1: engine_native)
        10    2 flags (0)
        12    4 num_layers
        16    4 num_tokens
        20    4 num_kv_heads
        24    4 head_dim
        28    4 reserved (0)
        32    8 payload size in bytes
        40    8 xxh3-64 checksum of the payload
        48   32 block key

Layout code 1 (``engine_native``) holds one engine's own block bytes, layer
after layer (for vLLM's CPU backend: each layer's ``[kv_heads, 2, block_size,
head_dim]`` block interior, copied whole); the shape fields still give layers,
tokens, heads and head dim, and the namespace's ``kv_layout`` names the engine
layout, so such a block is only ever read back by the same layout.

The checksum is verified on every read; a mismatch is a miss, never wrong KV.
Views as numpy arrays and torch tensors share the block's memory (no copy).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import xxhash

from agentinfra.errors import BlockFormatError
from agentinfra.kvcache._keys import BlockKey

if TYPE_CHECKING:
    import torch

__all__ = [
    "BLOCK_FORMAT_VERSION",
    "DTYPES",
    "LAYOUT_ENGINE_NATIVE",
    "LAYOUT_LAYER_KV_TOKEN_HEAD_DIM",
    "Block",
    "BlockHeader",
    "encode_block",
    "parse_block",
]

BLOCK_FORMAT_VERSION = 1
_MAGIC = b"AIKV"
_HEADER = struct.Struct("<4sHHBBHIIIIIQQ32s")
HEADER_BYTES = _HEADER.size
LAYOUT_LAYER_KV_TOKEN_HEAD_DIM = 0
LAYOUT_ENGINE_NATIVE = 1
_LAYOUTS = (LAYOUT_LAYER_KV_TOKEN_HEAD_DIM, LAYOUT_ENGINE_NATIVE)

DTYPES: dict[int, tuple[str, int]] = {
    1: ("float16", 2),
    2: ("bfloat16", 2),
    3: ("float32", 4),
    4: ("float8_e4m3fn", 1),
    5: ("uint8", 1),
}
"""dtype code -> (name, bytes per element)."""
_CODE_BY_NAME = {name: code for code, (name, _) in DTYPES.items()}
_NUMPY_VIEW = {
    "float16": "<f2",
    "bfloat16": "<u2",
    "float32": "<f4",
    "float8_e4m3fn": "u1",
    "uint8": "u1",
}


@dataclass(frozen=True, slots=True)
class BlockHeader:
    """The decoded fixed header of a block."""

    dtype: str
    num_layers: int
    num_tokens: int
    num_kv_heads: int
    head_dim: int
    payload_bytes: int
    checksum: int
    key: BlockKey
    layout: int = LAYOUT_LAYER_KV_TOKEN_HEAD_DIM

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        """``(num_layers, 2, num_tokens, num_kv_heads, head_dim)``."""
        return (self.num_layers, 2, self.num_tokens, self.num_kv_heads, self.head_dim)


def checksum(payload: bytes | memoryview) -> int:
    """xxh3-64 of ``payload``."""
    return int(xxhash.xxh3_64_intdigest(payload))


def _tensor_bytes(kv: Any) -> tuple[str, tuple[int, ...], bytes]:
    """(dtype name, shape, raw bytes) of a numpy array or torch tensor."""
    if isinstance(kv, np.ndarray):
        name = (
            "float16"
            if kv.dtype == np.float16
            else "float32"
            if kv.dtype == np.float32
            else str(kv.dtype)
        )
        return name, tuple(kv.shape), np.ascontiguousarray(kv).tobytes()
    import torch

    if isinstance(kv, torch.Tensor):
        name = str(kv.dtype).removeprefix("torch.")
        raw = kv.detach().contiguous().cpu().view(torch.uint8).numpy()
        return name, tuple(kv.shape), raw.tobytes()
    raise BlockFormatError(f"KV must be a numpy array or torch tensor, got {type(kv).__name__}")


def encode_block(key: BlockKey, kv: Any, *, layout: int = LAYOUT_LAYER_KV_TOKEN_HEAD_DIM) -> bytes:
    """Encodes KV of shape ``[layers, 2, tokens, kv_heads, head_dim]`` as one block.

    With ``layout=LAYOUT_ENGINE_NATIVE`` the tensor's bytes are an engine's own
    block layout, viewed with that shape only to state the sizes.

    Raises:
        BlockFormatError: wrong rank, a zero dimension, or a dtype with no code.
    """
    name, shape, raw = _tensor_bytes(kv)
    if name not in _CODE_BY_NAME:
        raise BlockFormatError(
            f"dtype {name} has no block dtype code; use one of {sorted(_CODE_BY_NAME)}"
        )
    if len(shape) != 5 or shape[1] != 2 or 0 in shape:
        raise BlockFormatError(
            f"KV shape {shape} must be [layers, 2, tokens, kv_heads, head_dim], all > 0"
        )
    if len(key) != 32:
        raise BlockFormatError(f"block key must be 32 bytes, got {len(key)}")
    if layout not in _LAYOUTS:
        raise BlockFormatError(f"unknown layout code {layout}; use one of {_LAYOUTS}")
    header = _HEADER.pack(
        _MAGIC, BLOCK_FORMAT_VERSION, HEADER_BYTES, _CODE_BY_NAME[name], layout,
        0, shape[0], shape[2], shape[3], shape[4], 0, len(raw), checksum(raw), key,
    )  # fmt: skip
    return header + raw


def decode_header(
    data: bytes | bytearray | memoryview, *, length: int | None = None
) -> BlockHeader:
    """Decodes and checks the fixed header of a block (``length``: the whole block's size, when
    ``data`` holds only the header because the payload is received elsewhere).

    Raises:
        BlockFormatError: not a block, another format version, or sizes that do not add up.
    """
    if len(data) < HEADER_BYTES:
        raise BlockFormatError(
            f"block of {len(data)} bytes is shorter than the {HEADER_BYTES}-byte header"
        )
    (magic, version, header_bytes, dtype_code, layout, _flags, layers, tokens, heads, head_dim,
     _reserved, payload_bytes, digest, key) = _HEADER.unpack_from(data)  # fmt: skip
    if magic != _MAGIC:
        raise BlockFormatError(f"not a KV block (magic {bytes(magic)!r}, expected {_MAGIC!r})")
    if version != BLOCK_FORMAT_VERSION or header_bytes != HEADER_BYTES:
        raise BlockFormatError(
            f"block format version {version} (header {header_bytes} bytes) is not supported; "
            f"this agentinfra reads version {BLOCK_FORMAT_VERSION}"
        )
    if dtype_code not in DTYPES or layout not in _LAYOUTS:
        raise BlockFormatError(f"unknown dtype code {dtype_code} or layout code {layout}")
    dtype, width = DTYPES[dtype_code]
    if layers * 2 * tokens * heads * head_dim * width != payload_bytes:
        raise BlockFormatError(f"payload size {payload_bytes} does not match the header's shape")
    size = len(data) if length is None else length
    if size != HEADER_BYTES + payload_bytes:
        raise BlockFormatError(f"block is {size} bytes, header says {HEADER_BYTES + payload_bytes}")
    return BlockHeader(
        dtype, layers, tokens, heads, head_dim, payload_bytes, digest, BlockKey(bytes(key)), layout
    )


@dataclass(frozen=True, slots=True)
class Block:
    """A decoded block: its header and a zero-copy view of its payload."""

    header: BlockHeader
    payload: memoryview

    def as_numpy(self) -> npt.NDArray[Any]:
        """A read-only numpy view of the KV (bfloat16 is exposed as raw ``uint16``)."""
        view = np.frombuffer(self.payload, dtype=_NUMPY_VIEW[self.header.dtype])
        return view.reshape(self.header.shape)

    def as_torch(self) -> torch.Tensor:
        """A torch tensor sharing the block's memory, in the block's dtype.

        The tensor must not be written to: the memory belongs to the store.
        """
        import warnings

        import torch

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only buffers warn
            flat = torch.frombuffer(self.payload, dtype=torch.uint8)
        return flat.view(getattr(torch, self.header.dtype)).view(self.header.shape)


def parse_block(
    data: bytes | memoryview, *, expected_key: BlockKey | None = None, verify: bool = True
) -> Block | None:
    """Decodes a block, verifying its checksum (unless ``verify`` is false: bytes verified
    before, by this process) and its key (when given).

    Returns:
        The block, or None when the payload fails its checksum or carries another key.

    Raises:
        BlockFormatError: the bytes are not a version-1 block.
    """
    view = memoryview(data)
    header = decode_header(view)
    payload = view[HEADER_BYTES:]
    if verify and checksum(payload) != header.checksum:
        return None
    if expected_key is not None and header.key != expected_key:
        return None
    return Block(header, payload)
