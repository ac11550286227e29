from __future__ import annotations

import contextlib
import struct

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agentinfra.errors import BlockFormatError
from agentinfra.kvcache import BLOCK_FORMAT_VERSION, BlockKey, encode_block, parse_block
from agentinfra.kvcache._block import HEADER_BYTES, decode_header

KEY = BlockKey(bytes(range(32)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_torch_round_trip_shares_memory(dtype: torch.dtype) -> None:
    kv = torch.randn(3, 2, 4, 2, 8).to(dtype)
    data = encode_block(KEY, kv)
    assert len(data) == HEADER_BYTES + kv.numel() * kv.element_size()
    block = parse_block(data)
    assert block is not None
    out = block.as_torch()
    assert out.dtype == dtype
    assert torch.equal(out, kv)
    assert block.header.shape == (3, 2, 4, 2, 8)
    assert block.header.key == KEY
    assert (
        out.untyped_storage().data_ptr() == np.frombuffer(block.payload, dtype=np.uint8).ctypes.data
    )


def test_numpy_round_trip() -> None:
    kv = np.arange(2 * 2 * 3 * 1 * 4, dtype=np.float32).reshape(2, 2, 3, 1, 4)
    block = parse_block(encode_block(KEY, kv))
    assert block is not None
    np.testing.assert_array_equal(block.as_numpy(), kv)


def test_flipped_payload_bit_is_a_miss_not_wrong_data() -> None:
    data = bytearray(encode_block(KEY, np.ones((1, 2, 2, 1, 4), dtype=np.float32)))
    data[-1] ^= 1
    assert parse_block(bytes(data)) is None


def test_wrong_key_is_a_miss() -> None:
    data = encode_block(KEY, np.ones((1, 2, 2, 1, 4), dtype=np.float32))
    assert parse_block(data, expected_key=BlockKey(b"\x00" * 32)) is None


def test_other_format_version_is_refused() -> None:
    data = bytearray(encode_block(KEY, np.ones((1, 2, 2, 1, 4), dtype=np.float32)))
    struct.pack_into("<H", data, 4, BLOCK_FORMAT_VERSION + 1)
    with pytest.raises(BlockFormatError, match="version 2"):
        parse_block(bytes(data))


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda d: d[:10], "shorter"),
        (lambda d: b"XXXX" + d[4:], "magic"),
        (lambda d: d[:-4], "bytes, header says"),
    ],
)
def test_malformed_blocks(mutate: object, match: str) -> None:
    data = encode_block(KEY, np.ones((1, 2, 2, 1, 4), dtype=np.float32))
    with pytest.raises(BlockFormatError, match=match):
        parse_block(mutate(data))  # type: ignore[operator]


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(BlockFormatError, match="shape"):
        encode_block(KEY, np.ones((2, 3, 4), dtype=np.float32))
    with pytest.raises(BlockFormatError, match="dtype"):
        encode_block(KEY, np.ones((1, 2, 1, 1, 1), dtype=np.int64))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_decoder_fuzz_only_raises_block_format_error(data: bytes) -> None:
    with contextlib.suppress(BlockFormatError):
        decode_header(data)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=0, max_value=HEADER_BYTES - 1), st.integers(min_value=1, max_value=255)
)
def test_any_header_byte_flip_is_refused_or_a_miss(position: int, flip: int) -> None:
    data = bytearray(encode_block(KEY, np.ones((1, 2, 2, 1, 4), dtype=np.float32)))
    data[position] ^= flip
    try:
        block = parse_block(bytes(data), expected_key=KEY)
    except BlockFormatError:
        return
    # Only the reserved/flags bytes may change without detection; the KV itself never does.
    assert block is None or block.as_numpy().tolist() == np.ones((1, 2, 2, 1, 4)).tolist()
