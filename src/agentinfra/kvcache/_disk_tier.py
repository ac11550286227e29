"""`DiskTier`: one file per block under a store directory, bounded in bytes.

Directory layout (format 1)::

    DIR/AGENTINFRA_KV_STORE     marker: {"format": "agentinfra-kv-disk", "version": 1}
    DIR/lock                    flock'd by the owning process; holds its pid
    DIR/blocks/<k[:2]>/<key>.blk  encoded blocks (header + payload)
    DIR/tmp/                    writes in progress
    DIR/quarantine/             blocks that failed their checksum

Invariants: a block becomes visible only by ``rename`` of a fully written file,
so a crash never exposes a half-written block; on open, ``tmp/`` is emptied
and the index is rebuilt from ``blocks/`` (oldest first into the policy). One
process owns a directory (an exclusive ``flock``); other processes may open it
``read_only`` and read blocks concurrently, verifying each checksum. A
directory that holds other files and no marker is refused, and nothing is ever
deleted outside the files this tier wrote.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import cast

from agentinfra._pidlock import try_lock
from agentinfra.errors import ConfigError, StoreLockedError, TierUnavailableError
from agentinfra.kvcache._index import BlockIndex
from agentinfra.kvcache._keys import BlockKey
from agentinfra.kvcache._policies import EvictionPolicy, make_policy
from agentinfra.kvcache._tier import PutResult, TierCounters, TierStats

__all__ = ["DISK_FORMAT_VERSION", "DiskTier"]

logger = logging.getLogger(__name__)

DISK_FORMAT_VERSION = 1
_MARKER = "AGENTINFRA_KV_STORE"
_SUFFIX = ".blk"


class DiskTier:
    """Blocks as files, evicted by a policy when ``capacity_bytes`` is reached."""

    name = "disk"

    def __init__(
        self,
        directory: Path,
        capacity_bytes: int,
        policy: EvictionPolicy | str = "prefix-lru",
        *,
        read_only: bool = False,
        fsync: bool = False,
    ) -> None:
        self.directory = Path(directory)
        self.read_only = read_only
        self._fsync = fsync
        self._index = BlockIndex(
            capacity_bytes, make_policy(policy) if isinstance(policy, str) else policy
        )
        self._counts = TierCounters()
        self._lock_fd: int | None = None
        self._check_or_create()
        if not read_only:
            self._lock()
            self._clear_tmp()
            self._rebuild()

    # -- opening ---------------------------------------------------------------

    def _check_or_create(self) -> None:
        marker = self.directory / _MARKER
        if marker.exists():
            try:
                meta = json.loads(marker.read_text())
            except (OSError, ValueError) as exc:
                raise StoreLockedError(
                    f"{marker} is unreadable ({exc}); not a store directory"
                ) from None
            if (
                meta.get("format") != "agentinfra-kv-disk"
                or meta.get("version") != DISK_FORMAT_VERSION
            ):
                raise StoreLockedError(
                    f"{self.directory} holds a disk store of format {meta.get('format')!r} version "
                    f"{meta.get('version')!r}; this agentinfra reads version {DISK_FORMAT_VERSION}"
                )
            return
        if self.read_only:
            raise StoreLockedError(f"{self.directory} is not a KV store directory (no {_MARKER})")
        if self.directory.exists() and any(self.directory.iterdir()):
            raise StoreLockedError(
                f"{self.directory} is not empty and is not a KV store directory; "
                "choose an empty or new directory for --disk-dir"
            )
        try:
            for sub in ("blocks", "tmp", "quarantine"):
                (self.directory / sub).mkdir(parents=True, exist_ok=True)
            tmp = self.directory / "tmp" / _MARKER
            tmp.write_text(
                json.dumps({"format": "agentinfra-kv-disk", "version": DISK_FORMAT_VERSION})
            )
            os.replace(tmp, marker)
        except OSError as exc:
            raise TierUnavailableError(
                f"cannot create disk store in {self.directory}: {exc.strerror}"
            ) from None

    def _lock(self) -> None:
        held = try_lock(self.directory / "lock")
        if isinstance(held, str):
            raise StoreLockedError(
                f"{self.directory} is owned by another live store (pid {held}); "
                "open it read_only or choose another --disk-dir"
            )
        self._lock_fd = held

    def _clear_tmp(self) -> None:
        for leftover in (self.directory / "tmp").glob(f"*{_SUFFIX}.tmp"):
            leftover.unlink(missing_ok=True)

    def _rebuild(self) -> None:
        found: list[tuple[float, BlockKey, int]] = []
        for path in (self.directory / "blocks").glob(f"*/*{_SUFFIX}"):
            try:
                key = BlockKey(bytes.fromhex(path.name.removesuffix(_SUFFIX)))
                stat = path.stat()
            except (ValueError, OSError):
                continue
            if len(key) == 32:
                found.append((stat.st_mtime, key, stat.st_size))
        for _, key, size in sorted(found):
            self._index.insert(key, size=size)
        if found:
            logger.info("disk tier %s: rebuilt index of %d blocks", self.directory, len(found))

    def close(self) -> None:
        """Releases the directory lock; the blocks stay on disk."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- paths -----------------------------------------------------------------

    def _path(self, key: BlockKey) -> Path:
        name = key.hex()
        return self.directory / "blocks" / name[:2] / f"{name}{_SUFFIX}"

    def _read(self, key: BlockKey) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise TierUnavailableError(
                f"cannot read block from {self.directory}: {exc.strerror}"
            ) from None

    # -- Tier protocol ---------------------------------------------------------

    @property
    def policy_name(self) -> str:
        """Name of the eviction policy."""
        return self._index.policy.name

    def __contains__(self, key: object) -> bool:
        if self.read_only:
            return isinstance(key, bytes) and self._path(BlockKey(key)).exists()
        return key in self._index

    def leading_hits(self, keys: Sequence[BlockKey]) -> int:
        if not self.read_only:
            return self._index.leading_hits(keys)
        count = 0
        for key in keys:
            if key not in self:
                break
            count += 1
        return count

    def get(self, keys: Sequence[BlockKey]) -> list[bytes | None]:
        found = [self._read(key) if key in self else None for key in keys]
        held = [key for key, data in zip(keys, found, strict=True) if data is not None]
        if not self.read_only:
            self._index.touch(held)
        self._counts.count_reads(found)
        return found

    def get_into(
        self, keys: Sequence[BlockKey], buffers: Sequence[bytearray | memoryview]
    ) -> list[int | None]:
        written: list[int | None] = []
        for key, buffer in zip(keys, buffers, strict=True):
            if key not in self:
                written.append(None)
                continue
            try:
                with open(self._path(key), "rb", buffering=0) as handle:
                    size = os.fstat(handle.fileno()).st_size
                    if size > len(buffer):
                        written.append(None)
                        continue
                    count = handle.readinto(memoryview(buffer)[:size])
            except FileNotFoundError:
                written.append(None)
                continue
            written.append(count)
        self._counts.count_reads(written)
        if not self.read_only:
            self._index.touch([k for k, w in zip(keys, written, strict=True) if w is not None])
        return written

    def _write(self, key: BlockKey, data: bytes) -> None:
        final = self._path(key)
        tmp = self.directory / "tmp" / f"{key.hex()}{_SUFFIX}.tmp"
        try:
            final.parent.mkdir(exist_ok=True)
            with open(tmp, "wb") as handle:
                handle.write(data)
                if self._fsync:
                    handle.flush()
                    os.fsync(handle.fileno())
            os.replace(tmp, final)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise TierUnavailableError(
                f"cannot write block to {self.directory}: {exc.strerror}; free space or lower --disk"
            ) from None

    def put(
        self,
        items: Sequence[tuple[BlockKey, bytes]],
        parents: Sequence[BlockKey | None] | None = None,
    ) -> PutResult:
        if self.read_only:
            raise ConfigError(
                f"disk tier {self.directory} was opened read_only; puts go through its owner"
            )
        stored: list[BlockKey] = []
        rejected: list[BlockKey] = []
        evicted: list[tuple[BlockKey, bytes | None]] = []
        for position, (key, data) in enumerate(items):
            if key in self._index:
                self._index.touch([key])
                stored.append(key)
                continue
            parent = parents[position] if parents is not None else None
            result = self._index.insert(key, parent=parent, size=len(data))
            for victim in result.evicted:
                key_out = cast(BlockKey, victim)
                self._path(key_out).unlink(missing_ok=True)
                evicted.append((key_out, None))
            if not result.is_admitted:
                rejected.append(key)
                continue
            try:
                self._write(key, data)
            except TierUnavailableError:
                self._index.remove(key)
                raise
            self._counts.bytes_written += len(data)
            stored.append(key)
        outcome = PutResult(tuple(stored), tuple(rejected), tuple(evicted))
        self._counts.count_put(outcome)
        return outcome

    def remove(self, keys: Sequence[BlockKey]) -> int:
        removed = 0
        for key in keys:
            if self._index.remove(key):
                self._path(key).unlink(missing_ok=True)
                removed += 1
        return removed

    def quarantine(self, key: BlockKey) -> None:
        """Moves a block that failed its checksum aside, out of the index."""
        self._index.remove(key)
        if not self.read_only:
            with contextlib.suppress(FileNotFoundError):
                os.replace(self._path(key), self.directory / "quarantine" / self._path(key).name)

    def watch(self, listener: Callable[[str, BlockKey, bool], None] | None) -> None:
        """Tells ``listener(tier name, key, held)`` of every block this tier starts or stops holding."""
        self._index.watcher = (
            None
            if listener is None
            else lambda key, held: listener(self.name, cast(BlockKey, key), held)
        )

    def stats(self) -> TierStats:
        return self._counts.snapshot(
            self.name,
            blocks=len(self._index),
            used_bytes=self._index.used,
            capacity_bytes=self._index.capacity,
        )
