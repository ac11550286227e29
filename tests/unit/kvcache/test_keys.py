"""Block keys v1: golden vectors, an independent re-implementation of the spec, hash-seed independence."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from agentinfra.errors import ConfigError
from agentinfra.kvcache import Namespace, block_keys

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "kv_block_keys_v1.json"


def _spec_keys(
    ns: dict[str, object], tokens: list[int], extra: list[list[bytes]] | None
) -> list[str]:
    """The spec (docs/kv-block-keys.md) written out independently of the implementation."""

    def field(data: bytes) -> bytes:
        return struct.pack("<I", len(data)) + data

    encoded = (
        b"AIKN"
        + struct.pack("<H", 1)
        + field(str(ns["model_id"]).encode())
        + field(str(ns["weights_revision"]).encode())
        + field(str(ns["kv_dtype"]).encode())
        + field(str(ns["kv_layout"]).encode())
        + struct.pack("<I", int(ns["block_size_tokens"]))  # type: ignore[call-overload]
        + field(bytes.fromhex(str(ns["tenant_salt_hex"])))
    )
    parent = hashlib.sha256(encoded).digest()
    size = int(ns["block_size_tokens"])  # type: ignore[call-overload]
    out = []
    for index in range(len(tokens) // size):
        chunk = tokens[index * size : (index + 1) * size]
        items = extra[index] if extra else []
        extra_bytes = struct.pack("<I", len(items)) + b"".join(field(e) for e in items)
        payload = (
            b"AIKB"
            + parent
            + struct.pack("<I", size)
            + struct.pack(f"<{size}I", *chunk)
            + extra_bytes
        )
        parent = hashlib.sha256(payload).digest()
        out.append(parent.hex())
    return out


def _namespace(ns: dict[str, object]) -> Namespace:
    return Namespace(
        model_id=str(ns["model_id"]),
        weights_revision=str(ns["weights_revision"]),
        kv_dtype=str(ns["kv_dtype"]),
        kv_layout=str(ns["kv_layout"]),
        block_size_tokens=int(ns["block_size_tokens"]),  # type: ignore[call-overload]
        tenant_salt=bytes.fromhex(str(ns["tenant_salt_hex"])),
    )


VECTORS = json.loads(FIXTURE.read_text())["vectors"]


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_golden_vectors(vector: dict[str, object]) -> None:
    ns = vector["namespace"]
    tokens = list(vector["tokens"])  # type: ignore[call-overload]
    extra_hex = vector.get("extra_keys_hex")
    extra = [[bytes.fromhex(e) for e in blk] for blk in extra_hex] if extra_hex else None  # type: ignore[union-attr]
    got = [k.hex() for k in block_keys(_namespace(ns), tokens, extra_keys=extra)]  # type: ignore[arg-type]
    assert got == vector["keys"]
    assert _spec_keys(ns, tokens, extra) == vector["keys"]  # type: ignore[arg-type]


def test_chain_shares_prefix_and_drops_partial_block() -> None:
    ns = Namespace(model_id="m", block_size_tokens=4)
    a = block_keys(ns, list(range(10)))
    b = block_keys(ns, [*range(8), 99, 99, 99, 99])
    assert len(a) == 2
    assert a == b[:2]
    assert len(b) == 3
    assert block_keys(ns, [1, 2, 3]) == []


def test_continuing_a_chain_equals_one_call() -> None:
    ns = Namespace(model_id="m", block_size_tokens=4)
    whole = block_keys(ns, list(range(16)))
    first = block_keys(ns, list(range(8)))
    assert first + block_keys(ns, list(range(8, 16)), parent=first[-1]) == whole


@pytest.mark.parametrize(
    "change",
    [
        {"model_id": "other"},
        {"weights_revision": "r2"},
        {"kv_dtype": "float16"},
        {"kv_layout": "other"},
        {"tenant_salt": b"t"},
    ],
)
def test_every_namespace_field_changes_the_keys(change: dict[str, object]) -> None:
    base = Namespace(model_id="m", block_size_tokens=4)
    fields = {"model_id": "m", "block_size_tokens": 4, **change}
    assert block_keys(base, range(4)) != block_keys(Namespace(**fields), range(4))  # type: ignore[arg-type]


def test_extra_keys_change_the_keys() -> None:
    ns = Namespace(model_id="m", block_size_tokens=4)
    assert block_keys(ns, range(4), extra_keys=[[b"lora:a"]]) != block_keys(ns, range(4))
    with pytest.raises(ConfigError, match="extra_keys"):
        block_keys(ns, range(8), extra_keys=[[b"x"]])


def test_numpy_and_list_inputs_agree() -> None:
    ns = Namespace(model_id="m", block_size_tokens=8)
    tokens = list(range(100, 132))
    assert block_keys(ns, np.array(tokens, dtype=np.int64)) == block_keys(ns, tokens)


@pytest.mark.parametrize("bad", [[-1, 0, 0, 0], [2**32, 0, 0, 0]])
def test_out_of_range_tokens_are_refused(bad: list[int]) -> None:
    with pytest.raises(ConfigError, match="uint32"):
        block_keys(Namespace(model_id="m", block_size_tokens=4), bad)


def test_independent_of_python_hash_seed() -> None:
    code = (
        "from agentinfra.kvcache import Namespace, block_keys;"
        "print(block_keys(Namespace(model_id='m', block_size_tokens=4), list(range(8)))[-1].hex())"
    )
    outputs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("0", "1", "12345")
    }
    assert len(outputs) == 1
