"""The load path, stage by stage, against the raw limits of the same machine, in one run.

Paths, for blocks of 256 KiB and 2 MiB (each a paged KV block of every layer, as
the vLLM connector stores it):

- ``raw_socket_8``: a loopback socket moving 8 blocks' bytes per request into a
  reused buffer (sender in another process): the ceiling of an 8-block GET.
- ``client_get_8``: `AsyncCacheClient.get` of 8 blocks into a reused buffer,
  against ``agentinfra kv serve`` in its own process.
- ``raw_get_prefix``: one GET of a whole ~96 MiB prefix into a reused buffer:
  the ceiling of a connector load.
- ``loader``: `PagedKVLoader` (the connector's load) of the same prefix into
  paged torch KV tensors shaped as vLLM's CPU backend holds them, received in
  place by a `BlockReader`, with its stages;
- ``loader_shm``: the same load over the same-host path (``kv serve --shm-socket``): the
  server writes each chunk into a segment the loader shares with it, and the loader copies
  each block out into the paged cache, hashing each piece as it copies it;
- ``loader_staged``: the same through staging buffers over `CacheRemote` (the
  connector's background loop thread): the path for caches that are not
  contiguous CPU tensors;
- ``loader_before``: the load as the connector did it before (one GET into a
  fresh buffer, then one copy per layer and block), for comparison.

Rounds interleave the paths, so a noisy neighbour slows all of them alike; each
figure is the median over rounds, and each ratio the median of the per-round
ratios. One JSON line per path and size.

    .venv/bin/python benchmarks/kvcache/bench_load_path.py [--rounds 7] [--out results/load_path.jsonl]
    .venv/bin/python benchmarks/kvcache/bench_load_path.py --smoke
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import emit, environment, free_port
from bench_transfer import raw_socket_session, server_process

from agentinfra.engines._connector_plan import ConnectorCounters, ConnectorSettings
from agentinfra.engines._connector_remote import CacheRemote
from agentinfra.engines._kv_loader import PagedKVLoader
from agentinfra.kvcache import AsyncCacheClient, BlockKey, Namespace, block_keys, encode_block
from agentinfra.kvcache._block import LAYOUT_ENGINE_NATIVE
from agentinfra.kvcache._reader import BlockReader

MiB = 1 << 20
TOKENS, HEADS, DIM = 16, 8, 128  # a 16-token block of 8 KV heads of 128: 64 KiB per layer in fp16
LAYERS = {256 * 1024: 4, 2 * MiB: 32}
PREFIX_BYTES = 96 * MiB


def prefix(block_bytes: int, seed: int) -> tuple[list[BlockKey], list[bytes], int]:
    layers = LAYERS[block_bytes]
    count = PREFIX_BYTES // block_bytes
    ns = Namespace(model_id=f"load-path-{block_bytes}-{seed}", kv_dtype="float16",
                   block_size_tokens=TOKENS)  # fmt: skip
    keys = list(block_keys(ns, np.random.default_rng(seed).integers(0, 50_000, count * TOKENS)))
    generator = torch.Generator().manual_seed(seed)
    blocks = []
    for key in keys:
        kv = torch.randn(layers, 2, TOKENS, HEADS, DIM, generator=generator).to(torch.float16)
        blocks.append(encode_block(key, kv, layout=LAYOUT_ENGINE_NATIVE))
    return keys, blocks, layers


def paged(layers: int, blocks: int) -> list[torch.Tensor]:
    """vLLM CPU's KV caches: one (2, blocks, tokens, heads, dim) tensor per layer (blocks on dim 1)."""
    return [torch.zeros(2, blocks, TOKENS, HEADS, DIM, dtype=torch.float16) for _ in range(layers)]


def timed(op: Callable[[], Any], ops: int) -> float:
    started = time.perf_counter()
    for _ in range(ops):
        op()
    return (time.perf_counter() - started) / ops


def before(remote: CacheRemote, layers: list[torch.Tensor], keys: list[BlockKey]) -> int:
    """The connector's load before `PagedKVLoader`: one GET into a fresh buffer, a copy per layer and block."""
    blocks = remote.call(lambda c: c.get(keys)).result(60)
    per_layer = layers[0].select(1, 0).numel()
    for block_id, block in enumerate(blocks):
        flat = torch.frombuffer(block.payload, dtype=torch.uint8).view(torch.float16)
        for index, layer in enumerate(layers):
            target = layer.select(1, block_id)
            target.copy_(flat[index * per_layer : (index + 1) * per_layer].view(target.shape))
    return len(blocks)


def run_size(port: int, shm: Path, block_bytes: int, rounds: int, ops: int) -> list[dict[str, Any]]:
    keys, blocks, layer_count = prefix(block_bytes, seed=block_bytes % 97)
    encoded = len(blocks[0])
    loop = asyncio.new_event_loop()
    client = loop.run_until_complete(AsyncCacheClient.connect("127.0.0.1", port))
    loop.run_until_complete(client.put_encoded(list(zip(keys, blocks, strict=True))))
    eight = keys[:8]
    small = bytearray(4 + 8 * (8 + encoded))
    whole = bytearray(4 + len(keys) * (8 + encoded))
    for buffer in (small, whole):
        buffer[::4096] = b"\x01" * len(range(0, len(buffer), 4096))

    def get(wanted: list[BlockKey], into: bytearray) -> None:
        got = loop.run_until_complete(client.get(wanted, into=into))
        assert len(got) == len(wanted), f"the server returned {len(got)} of {len(wanted)} blocks"

    remote = CacheRemote(ConnectorSettings(port=port, timeout_s=60), ConnectorCounters())
    layers = paged(layer_count, len(keys) + 8)
    loader = PagedKVLoader(layers, 1, remote.call, timeout_s=60,
                           connect=lambda: BlockReader("127.0.0.1", port, timeout_s=60))  # fmt: skip
    segment = 3 * (32 * MiB + 4096)  # the connector's default: 3 GETs of 32 MiB in flight
    shared = PagedKVLoader(layers, 1, remote.call, timeout_s=60, connect=lambda: BlockReader(
        shm_socket=str(shm), segment_bytes=segment, timeout_s=60))  # fmt: skip
    staged = PagedKVLoader(layers, 1, remote.call, timeout_s=60)
    ids = list(range(len(keys)))
    reports: dict[str, list[Any]] = {"loader": [], "loader_shm": [], "loader_staged": []}

    def load(which: PagedKVLoader = loader, name: str = "loader") -> None:
        report = which.load(keys, ids)
        assert report.loaded == len(keys), report.failure
        reports[name].append(report)

    def load_before() -> None:
        assert before(remote, layers, keys) == len(keys)

    per_round: dict[str, list[float]] = {}
    with raw_socket_session(8 * encoded) as raw:
        paths: dict[str, tuple[Callable[[], Any], int, int]] = {
            "raw_socket_8": (raw, 8 * encoded, ops),
            "client_get_8": (lambda: get(eight, small), 8 * encoded, ops),
            "raw_get_prefix": (lambda: get(keys, whole), len(keys) * encoded, max(2, ops // 40)),
            "loader": (load, len(keys) * encoded, max(2, ops // 40)),
            "loader_shm": (
                lambda: load(shared, "loader_shm"),
                len(keys) * encoded,
                max(2, ops // 40),
            ),
            "loader_staged": (
                lambda: load(staged, "loader_staged"),
                len(keys) * encoded,
                max(2, ops // 40),
            ),
            "loader_before": (load_before, len(keys) * encoded, max(2, ops // 40)),
        }
        for op, _, _ in paths.values():
            op()  # warm: connections, staging buffers, page faults
        for kept in reports.values():
            kept.clear()
        for _ in range(rounds):
            for name, (op, size, count) in paths.items():
                per_round.setdefault(name, []).append(size / timed(op, count) / 1e9)
    loader.close()
    shared.close()
    remote.close()
    loop.run_until_complete(client.close())
    loop.close()
    rows = []
    ratios = {
        "client_get_8": "raw_socket_8",
        "loader": "raw_get_prefix",
        "loader_shm": "raw_get_prefix",
        "loader_staged": "raw_get_prefix",
        "loader_before": "raw_get_prefix",
    }
    for name, speeds in per_round.items():
        row: dict[str, Any] = {
            "bench": "kv_load_path", "path": name, "block_bytes": block_bytes, "layers": layer_count,
            "rounds": rounds, "gb_per_s": round(statistics.median(speeds), 3),
            "gb_per_s_min": round(min(speeds), 3), "gb_per_s_max": round(max(speeds), 3),
        }  # fmt: skip
        if name in ratios:
            base = per_round[ratios[name]]
            row["of"] = ratios[name]
            row["ratio"] = round(
                statistics.median(s / b for s, b in zip(speeds, base, strict=True)), 3
            )
        if name in reports:
            row["stages_s"] = {
                stage: round(statistics.median(getattr(r, stage) for r in reports[name]), 4)
                for stage in ("wall_s", "get_wait_s", "verify_s", "copy_s")
            }
            row["gets_per_load"] = reports[name][-1].chunks
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--smoke", action="store_true", help="two short rounds; for CI")
    parser.add_argument("--out", type=Path, help="also append the JSON lines to this file")
    args = parser.parse_args()
    rounds, ops = (2, 20) if args.smoke else (args.rounds, 200)
    env = environment()
    port = free_port()
    shm = Path(tempfile.mkdtemp(prefix="kv-load-")) / "shm.sock"
    server = server_process(port, None, shm)
    try:
        deadline = time.monotonic() + 10
        while not shm.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        for block_bytes in LAYERS:
            for row in run_size(port, shm, block_bytes, rounds, ops):
                emit({**row, **env}, args.out)
    finally:
        server.terminate()
        server.wait(20)


if __name__ == "__main__":
    main()
