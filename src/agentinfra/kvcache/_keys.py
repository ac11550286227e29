"""Canonical block keys, version 1 (the spec is docs/kv-block-keys.md).

A block is ``block_size_tokens`` consecutive tokens. Its key is a SHA-256 digest
chained over its parent's key, so a prefix lookup is one probe per block and two
requests share a key only when they share the whole prefix up to that block:

    root      = SHA-256(b"AIKN" || namespace encoding)
    key[i]    = SHA-256(b"AIKB" || key[i-1] (root for i = 0) || u32 token count
                        || token ids as little-endian u32 || extra-keys encoding)

Everything is a fixed, explicit byte encoding: never Python's ``hash()``, pickle or
anything that depends on ``PYTHONHASHSEED``. Golden vectors in
tests/fixtures/kv_block_keys_v1.json pin the spec.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NewType

import numpy as np
import numpy.typing as npt

from agentinfra.errors import ConfigError

__all__ = [
    "KEY_SPEC_VERSION",
    "BlockKey",
    "Namespace",
    "block_keys",
]

KEY_SPEC_VERSION = 1
BlockKey = NewType("BlockKey", bytes)
"""A 32-byte SHA-256 digest naming one block (and, through the chain, its prefix)."""

_NAMESPACE_MAGIC = b"AIKN"
_BLOCK_MAGIC = b"AIKB"
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_MAX_TOKEN_ID = 0xFFFFFFFF


def _field(data: bytes) -> bytes:
    return _U32.pack(len(data)) + data


@dataclass(frozen=True, slots=True, kw_only=True)
class Namespace:
    """Everything besides the tokens that decides whether KV bytes can be reused.

    Two engines may share a block only when every field is equal: the same model
    and weights, the same KV dtype and layout, the same block size, the same tenant.
    """

    model_id: str
    """Model identifier, e.g. ``"MiniMaxAI/MiniMax-M3"``."""
    weights_revision: str = ""
    """Revision or content hash of the weights; empty when unknown."""
    kv_dtype: str = "bfloat16"
    """Element type of the stored KV tensors."""
    kv_layout: str = "layer_kv_token_head_dim"
    """Memory layout of a block's payload (see docs/kv-block-keys.md)."""
    block_size_tokens: int = 256
    """Tokens per block."""
    tenant_salt: bytes = b""
    """Per-tenant salt: tenants with different salts never share a key."""

    def __post_init__(self) -> None:
        if not self.model_id:
            raise ConfigError("Namespace.model_id must not be empty")
        if not 0 < self.block_size_tokens <= 1 << 20:
            raise ConfigError(
                f"Namespace.block_size_tokens={self.block_size_tokens} must be in 1..1048576"
            )

    def encode(self) -> bytes:
        """The canonical byte encoding of this namespace (spec section 2)."""
        return b"".join(
            [
                _NAMESPACE_MAGIC,
                _U16.pack(KEY_SPEC_VERSION),
                _field(self.model_id.encode()),
                _field(self.weights_revision.encode()),
                _field(self.kv_dtype.encode()),
                _field(self.kv_layout.encode()),
                _U32.pack(self.block_size_tokens),
                _field(self.tenant_salt),
            ]
        )

    def root_key(self) -> BlockKey:
        """The parent key of every first block in this namespace."""
        return BlockKey(hashlib.sha256(self.encode()).digest())


def _extra_encoding(extra: Sequence[bytes]) -> bytes:
    return _U32.pack(len(extra)) + b"".join(_field(item) for item in extra)


def _token_bytes(token_ids: Sequence[int] | npt.NDArray[np.integer]) -> bytes:
    array = np.asarray(token_ids)
    if array.ndim != 1:
        raise ConfigError(f"token_ids must be one-dimensional, got shape {array.shape}")
    if array.size and (array.min() < 0 or array.max() > _MAX_TOKEN_ID):
        raise ConfigError("token ids must be in 0..2**32-1 (spec: little-endian uint32)")
    return array.astype("<u4", copy=False).tobytes()


def block_keys(
    namespace: Namespace,
    token_ids: Sequence[int] | npt.NDArray[np.integer],
    *,
    extra_keys: Sequence[Sequence[bytes]] | None = None,
    parent: BlockKey | None = None,
) -> list[BlockKey]:
    """Keys of the full blocks of ``token_ids``; a trailing partial block has none.

    Args:
        namespace: model, dtype, layout, block size and tenant.
        token_ids: the prompt's token ids (each in 0..2**32-1).
        extra_keys: per-block extra keys (LoRA name, multimodal content hashes), one
            sequence per full block, or None for none on any block.
        parent: key of the block before ``token_ids[0]`` when continuing a chain;
            the namespace root when None.
    """
    size = namespace.block_size_tokens
    data = _token_bytes(token_ids)
    count = len(data) // 4 // size
    if extra_keys is not None and len(extra_keys) < count:
        raise ConfigError(f"extra_keys has {len(extra_keys)} entries for {count} full blocks")
    previous = namespace.root_key() if parent is None else parent
    prefix = _BLOCK_MAGIC
    token_count = _U32.pack(size)
    no_extra = _extra_encoding(())
    stride = size * 4
    sha256 = hashlib.sha256
    keys: list[BlockKey] = []
    for index in range(count):
        chunk = data[index * stride : (index + 1) * stride]
        extra = no_extra if extra_keys is None else _extra_encoding(extra_keys[index])
        previous = BlockKey(
            sha256(b"".join((prefix, previous, token_count, chunk, extra))).digest()
        )
        keys.append(previous)
    return keys
