"""`PagedKVLoader` against a real cache server: chunked, pipelined loads into paged KV tensors,
received in place (`BlockReader`, over TCP or the same-host shared segment) or through staging
buffers."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from agentinfra.engines._connector_plan import ConnectorCounters, ConnectorSettings
from agentinfra.engines._connector_remote import CacheRemote
from agentinfra.engines._kv_loader import PagedKVLoader
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
from agentinfra.kvcache._reader import BlockReader
from agentinfra.kvcache._server import tenant_key

LAYERS, BLOCKS, TOKENS, HEADS, DIM = 3, 40, 16, 2, 8
BLOCK_DIM = 1  # (2, blocks, tokens, heads, dim) per layer, as vLLM's CPU backend holds it


SHM = Path(tempfile.gettempdir()) / f"agentinfra-test-loader-{id(object())}.sock"
"""The servers' shared-memory socket (a short path: a Unix socket's is at most 107 bytes)."""


@pytest.fixture
def remote() -> Iterator[tuple[ServerThread, CacheRemote]]:
    server = ServerThread(TieredStore(MemoryTier(64 << 20)), ServerConfig(port=0, shm_socket=SHM))
    remote = CacheRemote(ConnectorSettings(port=server.port, timeout_s=5), ConnectorCounters())
    yield server, remote
    remote.close()
    server.close()
    assert not SHM.exists()  # the server removes its socket


def paged(dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    return [torch.zeros(2, BLOCKS, TOKENS, HEADS, DIM, dtype=dtype) for _ in range(LAYERS)]


def stored(
    server: ServerThread, count: int, seed: int, dtype: torch.dtype = torch.float32
) -> tuple[list[BlockKey], list[torch.Tensor]]:
    """``count`` blocks saved as the connector saves them; returns their keys and contents."""
    ns = Namespace(model_id=f"loader-{seed}", kv_dtype=str(dtype).removeprefix("torch."),
                   block_size_tokens=TOKENS)  # fmt: skip
    keys = block_keys(ns, np.random.default_rng(seed).integers(0, 1000, count * TOKENS))
    generator = torch.Generator().manual_seed(seed)
    contents = [torch.randn(LAYERS, 2, TOKENS, HEADS, DIM, generator=generator).to(dtype)
                for _ in keys]  # fmt: skip
    with CacheClient("127.0.0.1", server.port) as client:
        client.put_encoded([(k, encode_block(k, c, layout=LAYOUT_ENGINE_NATIVE))
                            for k, c in zip(keys, contents, strict=True)])  # fmt: skip
    return list(keys), contents


@pytest.fixture(params=["in-place", "shm", "staged"])
def path(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def loader(
    remote: CacheRemote, layers: list[torch.Tensor], path: str, port: int, **options: int
) -> PagedKVLoader:
    depth = options.get("depth", 3)
    chunk = options.get("chunk_bytes", 32 << 20)

    def connect() -> BlockReader:
        if path == "shm":  # a slot per GET in flight, each a chunk
            return BlockReader(
                shm_socket=str(SHM), segment_bytes=depth * (chunk + 4096), timeout_s=5
            )
        return BlockReader("127.0.0.1", port, timeout_s=5)

    made = PagedKVLoader(layers, BLOCK_DIM, remote.call, timeout_s=5,
                         connect=None if path == "staged" else connect, **options)  # fmt: skip
    assert made.path == ("in-place" if path == "shm" else path)
    return made


def in_cache(layers: list[torch.Tensor], block_id: int) -> torch.Tensor:
    return torch.stack([layer.select(BLOCK_DIM, block_id) for layer in layers])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("per_chunk", [1, 3, 64])
def test_every_block_lands_in_its_slot(
    remote: tuple[ServerThread, CacheRemote], path: str, dtype: torch.dtype, per_chunk: int
) -> None:
    server, client = remote
    keys, contents = stored(server, 10, seed=per_chunk, dtype=dtype)
    layers = paged(dtype)
    block_bytes = LAYERS * 2 * TOKENS * HEADS * DIM * layers[0].element_size() + 88
    load = loader(client, layers, path, server.port, chunk_bytes=per_chunk * block_bytes, depth=2)
    slots = [int(i) for i in np.random.default_rng(1).permutation(BLOCKS)[:10]]
    report = load.load(keys, slots)
    assert (report.loaded, report.failure) == (10, "")
    assert report.chunks == -(-10 // min(per_chunk, 10))
    assert report.bytes == 10 * (block_bytes - 88)
    for content, slot in zip(contents, slots, strict=True):
        assert torch.equal(in_cache(layers, slot), content)
    untouched = sorted(set(range(BLOCKS)) - set(slots))
    assert all(not in_cache(layers, s).any() for s in untouched)
    again = load.load(keys, slots)  # the staging buffers or the connection are reused
    assert again.loaded == 10
    load.close()


def test_a_missing_block_ends_the_load_there(
    remote: tuple[ServerThread, CacheRemote], path: str
) -> None:
    server, client = remote
    keys, contents = stored(server, 8, seed=7)
    with CacheClient("127.0.0.1", server.port) as raw:
        assert raw.remove([keys[5]]) == 1
    layers = paged()
    block_bytes = LAYERS * 2 * TOKENS * HEADS * DIM * 4 + 88
    load = loader(client, layers, path, server.port, chunk_bytes=2 * block_bytes, depth=3)
    report = load.load(keys, range(8))
    assert report.loaded == 5
    assert report.failure.startswith("missing")
    for slot in range(5):
        assert torch.equal(in_cache(layers, slot), contents[slot])
    assert all(not in_cache(layers, slot).any() for slot in range(5, 8))
    assert load.load(keys[:5], range(5)).loaded == 5  # the connection is still in step
    load.close()


def test_a_block_corrupted_in_the_servers_memory_is_caught_where_it_lands(
    remote: tuple[ServerThread, CacheRemote], path: str
) -> None:
    """The server does not re-hash memory-resident blocks on GET: the loader's check is the one."""
    server, client = remote
    keys, contents = stored(server, 6, seed=9)
    memory = server.server.store.memory
    name = tenant_key("default", keys[3])  # a client without a token is tenant "default"
    flipped = bytearray(memory._data[name])
    flipped[-1] ^= 0x40
    memory._data[name] = bytes(flipped)
    layers = paged()
    load = loader(client, layers, path, server.port)
    report = load.load(keys, range(6))
    assert report.loaded == 3
    assert report.failure.startswith("corrupt")
    for slot in range(3):
        assert torch.equal(in_cache(layers, slot), contents[slot])
    assert load.load(keys[:3], range(3)).loaded == 3
    load.close()


def test_a_block_of_another_shape_is_not_loaded(
    remote: tuple[ServerThread, CacheRemote], path: str
) -> None:
    server, client = remote
    keys, _ = stored(server, 4, seed=8, dtype=torch.bfloat16)  # the engine holds float32
    layers = paged(torch.float32)
    load = loader(client, layers, path, server.port)
    report = load.load(keys, range(4))
    load.close()
    assert (report.loaded, report.failure.split(":")[0]) == (0, "not loadable")
    assert all(not layer.any() for layer in layers)


def test_an_unreachable_server_loads_nothing(path: str) -> None:
    remote = CacheRemote(ConnectorSettings(port=1, timeout_s=1), ConnectorCounters())
    try:
        layers = paged()
        load = loader(remote, layers, path, 1)
        report = load.load([BlockKey(bytes(32))], [0])
        load.close()
        assert report.loaded == 0
        assert report.failure.startswith("unreachable")
    finally:
        remote.close()
