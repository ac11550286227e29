"""The cache protocol v1: golden bytes (docs/protocol.md), an independent transcription, fuzzing."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentinfra.errors import ProtocolError
from agentinfra.kvcache import Op, Status
from agentinfra.kvcache._protocol import (
    HEADER,
    block_prefix,
    decode_blocks,
    decode_error,
    decode_hello,
    decode_keys,
    decode_shm_get,
    encode_error,
    encode_header,
    encode_hello,
    encode_keys,
    encode_shm_get,
    encode_u32,
    parse_header,
)
from agentinfra.kvcache._server import tenant_key

GOLDEN = json.loads((Path(__file__).parents[2] / "fixtures" / "kv_protocol_v1.json").read_text())[
    "frames"
]


def spec_header(op: int, request_id: int, length: int, response: bool) -> bytes:
    """docs/protocol.md section 2, transcribed independently of the implementation."""
    return (
        b"AIKP" + bytes([1, op]) + (1 if response else 0).to_bytes(2, "little")
        + request_id.to_bytes(8, "little") + length.to_bytes(4, "little") + bytes(4)
    )  # fmt: skip


@pytest.mark.parametrize("name", sorted(n for n in GOLDEN if n != "tenant_key"))
def test_golden_headers_match_the_spec_and_the_implementation(name: str) -> None:
    case = GOLDEN[name]
    header = bytes.fromhex(case["header"])
    fields = case["fields"]
    response = name.endswith("_response")
    length = len(bytes.fromhex(case["payload"])) if name != "put_request_prefix" else 1012
    assert header == spec_header(fields["op"], fields["request_id"], length, response)
    assert header == encode_header(
        Op(fields["op"]), fields["request_id"], length, response=response
    )
    parsed = parse_header(header, 1 << 30)
    assert (parsed.op, parsed.request_id, parsed.payload_len) == (
        fields["op"],
        fields["request_id"],
        length,
    )


def test_golden_payloads() -> None:
    hello = GOLDEN["hello_request"]
    assert encode_hello("team-a", "s3cret").hex() == hello["payload"]
    assert decode_hello(bytes.fromhex(hello["payload"])) == ("team-a", "s3cret")
    keys = GOLDEN["leading_hits_request"]
    raw = [bytes.fromhex(k) for k in keys["fields"]["keys"]]
    assert encode_keys(raw).hex() == keys["payload"]
    assert keys["payload"] == (struct.pack("<I", 2) + b"".join(raw)).hex()
    assert decode_keys(bytes.fromhex(keys["payload"])) == raw
    assert encode_u32(1).hex() == GOLDEN["leading_hits_response"]["payload"]
    put = GOLDEN["put_request_prefix"]
    assert (encode_u32(1) + block_prefix(1000)).hex() == put["payload"]
    error = GOLDEN["error_response"]
    assert encode_error(Status.UNAUTHORIZED, "unknown token").hex() == error["payload"]
    decoded = decode_error(bytes.fromhex(error["payload"]))
    assert decoded.status is Status.UNAUTHORIZED
    assert "unknown token" in str(decoded)


def test_get_shm_payload_matches_the_spec() -> None:
    """docs/protocol.md section 3: ``u64 offset, u64 capacity``, then ``keys``."""
    keys = [bytes([1]) * 32, bytes([2]) * 32]
    payload = encode_shm_get(4096, 1 << 20, keys)
    assert payload == struct.pack("<QQI", 4096, 1 << 20, 2) + b"".join(keys)
    assert decode_shm_get(payload) == (4096, 1 << 20, keys)
    assert Op.GET_SHM == 11
    with pytest.raises(ProtocolError):
        decode_shm_get(payload[:15])


def test_tenant_key_derivation_matches_the_spec() -> None:
    case = GOLDEN["tenant_key"]
    key = bytes.fromhex(case["key"])
    expected = hashlib.sha256(b"AIKT" + struct.pack("<H", 6) + b"team-a" + key).hexdigest()
    assert tenant_key("team-a", key).hex() == expected == case["store_key"]
    assert tenant_key("team-b", key) != tenant_key("team-a", key)


@pytest.mark.parametrize(
    ("mutate", "status"),
    [
        (lambda h: b"XXXX" + h[4:], Status.BAD_FRAME),
        (lambda h: h[:4] + bytes([2]) + h[5:], Status.UNSUPPORTED_VERSION),
        (lambda h: h[:5] + bytes([0x42]) + h[6:], Status.UNKNOWN_OPCODE),
        (lambda h: h[:16] + (2000).to_bytes(4, "little") + h[20:], Status.FRAME_TOO_LARGE),
    ],
)
def test_bad_headers_name_their_status(mutate: object, status: Status) -> None:
    header = encode_header(Op.GET, 1, 0)
    with pytest.raises(ProtocolError) as caught:
        parse_header(mutate(header), 1024)  # type: ignore[operator]
    assert caught.value.status is status


def test_block_lists_split_without_copying() -> None:
    payload = bytearray(encode_u32(2) + block_prefix(3) + b"abc" + block_prefix(2) + b"de")
    views = decode_blocks(payload)
    assert [bytes(v) for v in views] == [b"abc", b"de"]
    assert all(v.obj is payload for v in views)
    for broken in (payload[:-1], payload + b"x", encode_u32(1) + block_prefix(10) + b"short"):
        with pytest.raises(ProtocolError):
            decode_blocks(broken)


@given(st.binary(max_size=HEADER.size))
def test_header_parser_fuzz(data: bytes) -> None:
    data = data.ljust(HEADER.size, b"\0")
    with contextlib.suppress(ProtocolError):
        parse_header(data, 1 << 20)


@given(st.binary(max_size=200))
def test_payload_parsers_fuzz(data: bytes) -> None:
    for parser in (decode_keys, decode_blocks, decode_hello, decode_shm_get):
        with contextlib.suppress(ProtocolError):
            parser(data)


def test_session_requests_are_checked() -> None:
    from agentinfra.kvcache._protocol import decode_session, encode_session

    key = bytes(range(32))
    body, keys = decode_session(encode_session({"session": "run-1", "action": "begin"}, [key]))
    assert body["session"] == "run-1"
    assert keys == [key]
    for bad, message in [
        ({"session": "", "action": "begin"}, "session id of 1..256"),
        ({"session": "x", "action": "pin"}, "action 'pin' is not one of begin, add, end, close"),
        ({"session": "x", "action": "end", "ttl_s": -1}, "ttl_s=-1 must be a number >= 0"),
    ]:
        with pytest.raises(ProtocolError, match=re.escape(message)):
            decode_session(encode_session(bad))
    with pytest.raises(ProtocolError, match="overruns"):
        decode_session(b"\xff\x00\x00\x00{}")
