"""The store's contents as vLLM KV events, so a router can count the store as a tier.

Dynamo, llm-d and the SGLang router learn which engine holds which prefix from
vLLM's KV events: ``BlockStored`` (block hashes, parent hash, the block's token
ids, block size, medium) and ``BlockRemoved``, msgpack-encoded batches on a ZMQ
PUB socket as ``(topic, 8-byte big-endian sequence, payload)``, with an optional
ROUTER socket that replays the batches since a sequence number. The cache server
publishes the same format for its memory and disk tiers (mediums ``CPU`` and
``STORAGE``), so a router subscribes to it as it does to an engine.

A block's key is a digest: the store does not know the block's tokens. An engine
*announces* a chain's tokens (`Op.LINEAGE`) when it saves it; a block is published
once it is both held by a tier and announced, in whichever order those arrive,
and its removal is published only after its store. Blocks nobody announced are
counted, not published: a router could not place them.

Tier changes arrive under the tiers' locks, so `StoreEvents.changed` only appends
to a queue; one thread turns the queue into batches, encodes and sends them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq

from agentinfra.errors import ConfigError
from agentinfra.kvcache._keys import BlockKey

__all__ = [
    "MEDIA",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EventsConfig",
    "KVEventBatch",
    "StoreEvents",
]

logger = logging.getLogger(__name__)

MEDIA = {"memory": "CPU", "disk": "STORAGE"}
"""The medium each tier's blocks are published under: vLLM's names (its engine publishes ``GPU``,
its offloading ``CPU`` and ``STORAGE``)."""

END_SEQ = (-1).to_bytes(8, "big", signed=True)
"""The replay socket's end-of-replay marker, as vLLM's publisher sends it."""


# The wire types: field for field as vLLM 0.32 defines them (vllm.distributed.kv_events),
# so vLLM's own decoder reads what this module sends (tests/integration/test_kv_events_vllm.py).
class _Batch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class _Event(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """A KV event: tagged with its class name on the wire, as vLLM's are."""


class BlockStored(_Event):
    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(_Event):
    block_hashes: list[bytes]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(_Event):
    """Everything the publisher held before is gone (sent first by a (re)started server)."""


class KVEventBatch(_Batch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


@dataclass(frozen=True, slots=True, kw_only=True)
class EventsConfig:
    """Where and how the server publishes its KV events."""

    endpoint: str
    """ZMQ address the PUB socket binds, e.g. ``tcp://127.0.0.1:5557`` (``--events``)."""
    replay_endpoint: str | None = None
    """ROUTER address for replays of missed batches; None for none (``--events-replay``)."""
    topic: str = ""
    flush_s: float = 0.02
    """How long changes gather into one batch."""
    replay_batches: int = 10_000
    """Past batches kept for replay."""
    lineage_limit: int = 1_000_000
    """Announced blocks remembered (their tokens, for re-publishing after a promotion)."""

    def __post_init__(self) -> None:
        for name, value in (("endpoint", self.endpoint), ("replay_endpoint", self.replay_endpoint)):
            if value is not None and not value.startswith(("tcp://", "ipc://", "inproc://")):
                raise ConfigError(
                    f"events {name}={value!r} must be a ZMQ address (tcp://HOST:PORT, ipc://PATH) "
                    "(--events / --events-replay)"
                )
        if self.flush_s <= 0 or self.replay_batches < 1 or self.lineage_limit < 1:
            raise ConfigError(
                f"events flush_s={self.flush_s}, replay_batches={self.replay_batches} and "
                f"lineage_limit={self.lineage_limit} must be positive"
            )


@dataclass(frozen=True, slots=True)
class _Lineage:
    parent: BlockKey | None
    tokens: tuple[int, ...]
    salt: str | None


class StoreEvents:
    """Publishes the store's tier changes; `changed` and `announce` are safe from any thread."""

    def __init__(self, config: EventsConfig) -> None:
        self.config = config
        self._queue: deque[tuple[Any, ...]] = deque()
        self._wake = threading.Event()
        self._closed = False
        self._lineage: OrderedDict[BlockKey, _Lineage] = OrderedDict()
        self._published: dict[BlockKey, set[str]] = {}
        """Mediums each announced block was published in (and not yet removed from)."""
        self._unannounced: OrderedDict[BlockKey, set[str]] = OrderedDict()
        """Mediums holding blocks no engine has announced yet."""
        self.counts = dict.fromkeys(("batches", "stored", "removed", "unannounced"), 0)
        self._seq = 0
        self._replay_buffer: deque[tuple[int, bytes]] = deque(maxlen=config.replay_batches)
        self._encoder = msgspec.msgpack.Encoder()
        self._context = zmq.Context()
        self._pub = self._context.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.set_hwm(100_000)
        self._replay: zmq.Socket[bytes] | None = None
        try:
            self._pub.bind(config.endpoint)
            if config.replay_endpoint is not None:
                self._replay = self._context.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._replay.bind(config.replay_endpoint)
        except zmq.ZMQError as exc:
            self._close_sockets()
            raise ConfigError(
                f"cannot bind KV events at {config.endpoint!r} / {config.replay_endpoint!r}: "
                f"{exc} (--events / --events-replay)"
            ) from None
        self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        """The bound address (a ``:0`` port resolved)."""
        self.replay_endpoint = (
            self._replay.getsockopt_string(zmq.LAST_ENDPOINT) if self._replay else None
        )
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()
        self.clear()  # a (re)started server: subscribers drop what they knew of it

    # -- inputs (any thread; cheap: they only queue) ----------------------------

    def changed(self, tier: str, key: BlockKey, held: bool) -> None:
        """A tier now holds ``key`` (``held``) or no longer does."""
        medium = MEDIA.get(tier)
        if medium is not None:
            self._queue.append(("held" if held else "gone", key, medium))

    def announce(
        self,
        keys: Sequence[BlockKey],
        tokens: Sequence[int],
        *,
        block_size: int,
        parent: BlockKey | None,
        salt: str | None = None,
    ) -> None:
        """The tokens of a chain of ``keys`` (``block_size`` tokens each), after ``parent``."""
        if len(tokens) != len(keys) * block_size:
            raise ConfigError(
                f"announce of {len(keys)} blocks of {block_size} tokens got {len(tokens)} tokens"
            )
        self._queue.append(("announce", tuple(keys), tuple(tokens), block_size, parent, salt))
        self._wake.set()

    def clear(self) -> None:
        """Publishes ``AllBlocksCleared`` (after everything queued before it)."""
        self._queue.append(("clear",))
        self._wake.set()

    def close(self, timeout_s: float = 2.0) -> None:
        """Sends what is queued, then closes the sockets."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        self._thread.join(timeout_s)
        self._close_sockets()

    def _close_sockets(self) -> None:
        self._pub.close(0)
        if self._replay is not None:
            self._replay.close(0)
        self._context.term()

    # -- the publishing thread -------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                self._wake.wait(self.config.flush_s)
                self._wake.clear()
                if self._replay is not None:
                    while self._replay.poll(0):
                        self._serve_replay()
                events = self._drain()
                if events:
                    self._send(events)
                if self._closed and not self._queue:
                    return
        except Exception:  # a publisher that dies says so; the store goes on without it
            logger.exception("kv events: the publishing thread stopped")

    def _drain(self) -> list[BlockStored | BlockRemoved | AllBlocksCleared]:
        events: list[BlockStored | BlockRemoved | AllBlocksCleared] = []
        while self._queue:
            item = self._queue.popleft()
            kind = item[0]
            if kind == "held":
                self._held(item[1], item[2], events)
            elif kind == "gone":
                self._gone(item[1], item[2], events)
            elif kind == "announce":
                self._announced(item[1], item[2], item[3], item[4], item[5], events)
            else:
                events.append(AllBlocksCleared())
        return _merged(events)

    def _held(self, key: BlockKey, medium: str, events: list[Any]) -> None:
        lineage = self._lineage.get(key)
        if lineage is None:
            self._unannounced.setdefault(key, set()).add(medium)
            self._unannounced.move_to_end(key)
            while len(self._unannounced) > self.config.lineage_limit:
                self._unannounced.popitem(last=False)
            self.counts["unannounced"] += 1
            return
        self._lineage.move_to_end(key)
        media = self._published.setdefault(key, set())
        if medium not in media:
            media.add(medium)
            events.append(_stored(key, lineage, medium))

    def _gone(self, key: BlockKey, medium: str, events: list[Any]) -> None:
        media = self._published.get(key)
        if media is not None and medium in media:
            media.discard(medium)
            if not media:
                del self._published[key]
            events.append(BlockRemoved(block_hashes=[key], medium=medium))
            return
        waiting = self._unannounced.get(key)
        if waiting is not None:
            waiting.discard(medium)
            if not waiting:
                del self._unannounced[key]

    def _announced(
        self,
        keys: tuple[BlockKey, ...],
        tokens: tuple[int, ...],
        block_size: int,
        parent: BlockKey | None,
        salt: str | None,
        events: list[Any],
    ) -> None:
        for index, key in enumerate(keys):
            lineage = _Lineage(
                keys[index - 1] if index else parent,
                tokens[index * block_size : (index + 1) * block_size],
                salt,
            )
            self._lineage[key] = lineage
            self._lineage.move_to_end(key)
            for medium in sorted(self._unannounced.pop(key, ())):
                self._published.setdefault(key, set()).add(medium)
                events.append(_stored(key, lineage, medium))
        while len(self._lineage) > self.config.lineage_limit:
            self._lineage.popitem(last=False)

    def _send(self, events: list[BlockStored | BlockRemoved | AllBlocksCleared]) -> None:
        payload = self._encoder.encode(KVEventBatch(ts=time.time(), events=events))
        seq = self._seq
        self._seq += 1
        self._pub.send_multipart((self.config.topic.encode(), seq.to_bytes(8, "big"), payload))
        self._replay_buffer.append((seq, payload))
        self.counts["batches"] += 1
        for event in events:
            if isinstance(event, BlockStored):
                self.counts["stored"] += len(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                self.counts["removed"] += len(event.block_hashes)

    def _serve_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            logger.warning("kv events: a replay request of %d frames ignored", len(frames))
            return
        identity, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in self._replay_buffer:
            if seq >= first:
                self._replay.send_multipart((identity, b"", seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((identity, b"", END_SEQ, b""))


def _stored(key: BlockKey, lineage: _Lineage, medium: str) -> BlockStored:
    return BlockStored(
        block_hashes=[key],
        parent_block_hash=lineage.parent,
        token_ids=list(lineage.tokens),
        block_size=len(lineage.tokens),
        lora_id=None,
        medium=medium,
        lora_name=None,
        extra_keys=[(lineage.salt,)]
        if lineage.salt is not None and lineage.parent is None
        else None,
    )


def _merged(events: list[Any]) -> list[Any]:
    """Consecutive stores of one chain in one medium become one event, as vLLM sends them."""
    out: list[Any] = []
    for event in events:
        last = out[-1] if out else None
        if (
            isinstance(event, BlockStored)
            and isinstance(last, BlockStored)
            and last.medium == event.medium
            and last.block_size == event.block_size
            and event.parent_block_hash == last.block_hashes[-1]
            and event.extra_keys is None
        ):
            last.block_hashes.append(event.block_hashes[0])
            last.token_ids.extend(event.token_ids)
            if last.extra_keys is not None:
                last.extra_keys.append(None)
        elif (
            isinstance(event, BlockRemoved)
            and isinstance(last, BlockRemoved)
            and last.medium == event.medium
        ):
            last.block_hashes.extend(event.block_hashes)
        else:
            out.append(event)
    return out
