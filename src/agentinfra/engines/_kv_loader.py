"""Loads verified KV blocks from the cache server into an engine's paged KV cache.

The worker half of a connector's load, without vLLM (torch and the cache client
only), so that the load path is measured and tested on its own
(benchmarks/kvcache/bench_load_path.py). Two paths:

- **In place** (CPU caches whose layers are contiguous, as vLLM's CPU backend
  allocates them): a `BlockReader` on the worker's own blocking connection
  receives each block's payload straight into the slices of the paged cache
  that block occupies (``recvmsg_into``), then verifies it there. No staging
  buffer and no copy: the socket's copy is the only one.
- **Staged** (any other cache, a GPU's included): the keys go out in chunks of about ``chunk_bytes``, ``depth`` GETs in flight on
  the connector's connection, each answer received straight into a reused,
  pre-faulted staging buffer (a fresh 100 MB buffer page-faults at about 2 GB/s
  on the dev machine, below the socket);
- while the next chunks arrive, this thread verifies the chunk it has (xxh3 and
  key, as the client would, and the engine's size and dtype), then copies it into
  the paged cache with one ``index_copy_`` per layer, not one copy per layer and
  block;
- a bad or missing block ends the load there: the blocks before it are loaded,
  the rest are reported for recompute; nothing after it is copied.

Either way a block that fails ends the load there, and the blocks from it on are
reported for recompute (in place, a failed block's slots hold garbage until then).

Every stage is timed (`LoadReport`): waiting for GETs, verifying, copying.
See docs/decisions/0028-kv-load-path.md.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from agentinfra.engines._connector_plan import is_loadable
from agentinfra.errors import ConfigError, TierUnavailableError
from agentinfra.kvcache import BLOCK_HEADER_BYTES as HEADER_BYTES
from agentinfra.kvcache import AsyncCacheClient, Block, BlockHeader, BlockKey, BlockReader
from agentinfra.kvcache import block_checksum as checksum

__all__ = ["LoadReport", "PagedKVLoader"]

_ENTRY = 8 + HEADER_BYTES
"""Bytes before each payload in a GET answer: its u64 size and the block header."""


@dataclass
class LoadReport:
    loaded: int = 0
    """Leading blocks copied into the cache."""
    bytes: int = 0
    get_wait_s: float = 0.0
    """Time this thread waited for GET answers (the rest of the GET overlapped the work below)."""
    verify_s: float = 0.0
    copy_s: float = 0.0
    wall_s: float = 0.0
    chunks: int = 0
    failure: str = ""
    """Why the load stopped short, if it did: unreachable, missing, corrupt or not loadable."""

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.wall_s / 1e9 if self.wall_s else 0.0


Call = Callable[[Callable[[AsyncCacheClient], Awaitable[list[Block]]]], Future[list[Block]]]
Connect = Callable[[], BlockReader]


class PagedKVLoader:
    """Loads blocks into ``layers`` (one tensor per layer, blocks on ``block_dim``).

    ``call`` runs a coroutine function on the connection's loop and returns a Future
    (`CacheRemote.call`), for the staged path; ``connect`` opens a `BlockReader`, for
    the in-place path (None: always staged). A block holds every layer's block, layer
    after layer, each as the engine holds it (the engine-native layout the connector saves).
    """

    def __init__(
        self,
        layers: Sequence[torch.Tensor],
        block_dim: int,
        call: Call,
        *,
        timeout_s: float,
        chunk_bytes: int = 32 * 1024 * 1024,
        depth: int = 3,
        connect: Connect | None = None,
    ) -> None:
        if not layers:
            raise ConfigError("PagedKVLoader needs at least one KV layer")
        if chunk_bytes < 1 or depth < 1:
            raise ConfigError(
                f"load_chunk_mib and load_depth must be positive, got {chunk_bytes} bytes and {depth}"
            )
        self.layers = list(layers)
        self.block_dim = block_dim
        self.call = call
        self.timeout_s = timeout_s
        self.depth = depth
        first = self.layers[0].select(block_dim, 0)
        self.block_shape = tuple(first.shape)
        self.dtype = self.layers[0].dtype
        self.layer_bytes = first.numel() * first.element_size()
        self.payload_bytes = self.layer_bytes * len(self.layers)
        self.stride = _ENTRY + self.payload_bytes
        self.per_chunk = max(1, chunk_bytes // self.stride)
        self._staging: list[bytearray] = []
        self._bases: list[torch.Tensor] = []
        self._connect = connect
        self._reader: BlockReader | None = None
        self._retry_at = 0.0
        self._flat = _flat_views(self.layers) if connect is not None else None
        self.path = "in-place" if self._flat is not None else "staged"
        if self._flat is not None:
            shape = self.layers[0].shape
            self._outer = int(torch.Size(shape[:block_dim]).numel())
            self._blocks = int(shape[block_dim])
            self._inner = int(torch.Size(shape[block_dim + 1 :]).numel()) * first.element_size()

    def _buffers(self) -> list[bytearray]:
        if not self._staging:
            size = 4 + self.per_chunk * self.stride
            for _ in range(self.depth):
                buffer = bytearray(size)
                base = torch.frombuffer(buffer, dtype=torch.uint8)
                base[::4096] = 1  # fault every page in now, not during a load
                self._staging.append(buffer)
                self._bases.append(base)
        return self._staging

    def load(self, keys: Sequence[BlockKey], block_ids: Sequence[int]) -> LoadReport:
        if self._flat is not None:
            return self._load_in_place(keys, block_ids)
        return self._load_staged(keys, block_ids)

    def _regions(self, block_id: int) -> list[memoryview]:
        """Where block ``block_id`` lives, in the order the block's payload holds it."""
        assert self._flat is not None
        inner, blocks = self._inner, self._blocks
        return [
            flat[(outer * blocks + block_id) * inner : (outer * blocks + block_id + 1) * inner]
            for flat in self._flat
            for outer in range(self._outer)
        ]

    def _load_in_place(self, keys: Sequence[BlockKey], block_ids: Sequence[int]) -> LoadReport:
        report = LoadReport()
        started = time.perf_counter()
        count = min(len(keys), len(block_ids))
        dtype = str(self.dtype).removeprefix("torch.")

        def accept(header: BlockHeader) -> bool:
            return is_loadable(header, payload_bytes=self.payload_bytes, dtype=dtype)

        try:
            reader = self._reader_now()
            read = reader.read_into(
                keys[:count], lambda i: self._regions(block_ids[i]), payload_bytes=self.payload_bytes,
                chunk_blocks=self.per_chunk, depth=self.depth, accept=accept,
            )  # fmt: skip
        except TierUnavailableError as exc:  # unreachable, dropped or timed out: recomputed
            self._reader = None
            report.failure = f"unreachable: {exc}"
        else:
            report.loaded, report.bytes, report.chunks = read.verified, read.bytes, read.requests
            report.get_wait_s, report.verify_s = read.receive_s, read.verify_s
            report.copy_s = read.copy_s  # out of the shared segment (0 over TCP: no copy)
            report.failure = read.failure
        report.wall_s = time.perf_counter() - started
        return report

    def _reader_now(self) -> BlockReader:
        if self._reader is None:
            assert self._connect is not None
            if time.monotonic() < self._retry_at:
                raise TierUnavailableError("the kv server was unreachable less than a second ago")
            try:
                self._reader = self._connect()
            except TierUnavailableError:
                self._retry_at = time.monotonic() + 1.0
                raise
        return self._reader

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def _load_staged(self, keys: Sequence[BlockKey], block_ids: Sequence[int]) -> LoadReport:
        report = LoadReport()
        started = time.perf_counter()
        buffers = self._buffers()
        starts = range(0, min(len(keys), len(block_ids)), self.per_chunk)
        chunks = [(s, min(s + self.per_chunk, len(keys), len(block_ids))) for s in starts]
        pending: deque[Future[list[Block]]] = deque()

        def submit(index: int) -> None:
            begin, end = chunks[index]
            wanted, into = list(keys[begin:end]), buffers[index % self.depth]
            pending.append(self.call(lambda c: c.get(wanted, into=into, verify=False)))

        for index in range(min(self.depth, len(chunks))):
            submit(index)
        try:
            for index, (begin, end) in enumerate(chunks):
                waited = time.perf_counter()
                try:
                    blocks = pending.popleft().result(self.timeout_s + 1)
                except Exception as exc:  # unreachable, dropped or timed out: recomputed
                    report.failure = f"unreachable: {type(exc).__name__}: {exc}"
                    break
                verified = time.perf_counter()
                report.get_wait_s += verified - waited
                good = self._verified(blocks, end - begin, report)
                copied = time.perf_counter()
                report.verify_s += copied - verified
                self._copy(good, block_ids[begin : begin + len(good)], index % self.depth)
                report.copy_s += time.perf_counter() - copied
                report.loaded += len(good)
                report.bytes += len(good) * self.payload_bytes
                report.chunks += 1
                if len(good) < end - begin:
                    break
                if index + self.depth < len(chunks):
                    submit(index + self.depth)
        finally:
            self._settle(pending)
        report.wall_s = time.perf_counter() - started
        return report

    def _verified(self, blocks: list[Block], wanted: int, report: LoadReport) -> list[Block]:
        good: list[Block] = []
        for block in blocks:
            if checksum(block.payload) != block.header.checksum:
                report.failure = "corrupt: a block failed its checksum"
                return good
            if not is_loadable(
                block.header,
                payload_bytes=self.payload_bytes,
                dtype=str(self.dtype).removeprefix("torch."),
            ):
                report.failure = "not loadable: another layout, size or dtype"
                return good
            good.append(block)
        if len(good) < wanted and not report.failure:
            report.failure = f"missing: the server holds {len(good)} of the chunk's {wanted} blocks"
        return good

    def _copy(self, blocks: list[Block], block_ids: Sequence[int], slot: int) -> None:
        if not blocks:
            return
        base = self._bases[slot] if slot < len(self._bases) else None
        width = self.layers[0].element_size()
        staged = (
            base is not None
            and (4 + _ENTRY) % width == 0
            and self.stride % width == 0
            and all(b.payload.obj is self._staging[slot] for b in blocks)
        )
        if not staged:  # an answer that did not land in the staging buffer: block by block
            for block, block_id in zip(blocks, block_ids, strict=True):
                flat = torch.frombuffer(block.payload, dtype=torch.uint8).view(self.dtype)
                per_layer = self.layer_bytes // self.layers[0].element_size()
                for index, layer in enumerate(self.layers):
                    target = layer.select(self.block_dim, block_id)
                    target.copy_(
                        flat[index * per_layer : (index + 1) * per_layer].view(target.shape)
                    )
            return
        assert base is not None
        ids = torch.tensor(list(block_ids), dtype=torch.long)
        count = len(blocks)
        for index, layer in enumerate(self.layers):
            source = torch.as_strided(
                base, (count, self.layer_bytes), (self.stride, 1),
                4 + _ENTRY + index * self.layer_bytes,
            )  # fmt: skip
            source = source.view(self.dtype).view(count, *self.block_shape)
            layer.index_copy_(self.block_dim, ids, source.movedim(0, self.block_dim))

    def _settle(self, pending: deque[Future[list[Block]]]) -> None:
        """Waits out GETs still in flight after a short load: they write into the staging
        buffers. One that does not end in time leaves its buffers to it; new ones are made."""
        for future in pending:
            try:
                future.result(self.timeout_s + 1)
            except Exception:
                if not future.done():
                    self._staging, self._bases = [], []


def _flat_views(layers: Sequence[torch.Tensor]) -> list[memoryview] | None:
    """Each layer's bytes as one writable memoryview; None unless every layer is a contiguous CPU tensor."""
    if not all(layer.device.type == "cpu" and layer.is_contiguous() for layer in layers):
        return None
    return [memoryview(layer.view(-1).view(torch.uint8).numpy().data).cast("B") for layer in layers]
