"""vLLM v1 KV connector: vLLM's paged KV blocks to and from `agentinfra kv serve`.

Use it with ``--kv-transfer-config``::

    {"kv_connector": "AgentinfraConnector", "kv_connector_module_path": "agentinfra.engines.vllm",
     "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
     "kv_connector_extra_config": {"url": "127.0.0.1:7480", "token_file": "...", "tenant": "..."}}

Design (decision 0010):

- **Keys** are ours (docs/kv-block-keys.md), computed from token ids, never
  vLLM's block hashes. The namespace holds the model, the weights identity, the
  KV dtype and an engine-native layout label (engine and device, layout, ISA,
  block size, KV heads, head size), and the request's ``cache_salt`` as the
  tenant salt: blocks never cross models, weights, dtypes or layouts.
- **Whole blocks, native bytes.** A block is every layer's block interior,
  copied whole (layout code 1 in the block format); no re-layout on either side.
- **The scheduler never blocks on the network.** `get_num_new_matched_tokens`
  starts a ``LEADING_HITS`` lookup on a background thread and answers "ask
  again" (None) until it is back (or ``lookup_timeout_s`` passed: a miss).
- **Loads are synchronous in the worker** (`start_load_kv`, before the forward):
  one pipelined GET per request, each block verified (checksum and key) before it
  is copied in. A block that does not come back, or comes back wrong, is reported
  through `get_block_ids_with_load_errors`; with ``kv_load_failure_policy:
  recompute`` (required) vLLM recomputes it. Wrong KV is never used.
- **Saves are copied in the step and sent in the background**: `wait_for_save`
  copies the step's newly completed blocks (prompt and output, full blocks only)
  out of the paged cache, then one PUT goes out on the background thread, so the
  step never waits on the network and freed blocks are never read later. A
  backlog beyond ``max_pending_mib`` drops saves (counted): a cache, not a log.
- **A follow-up sees the previous turn's blocks**: a finished request that saved
  anything is held (``request_finished`` returns True) until the worker reports
  its PUTs answered (``get_finished``); meanwhile a lookup that wants any of its
  blocks is answered "ask again" (bounded by the lookup timeout, counted as
  ``save_waits``). Without this, a turn sent the moment the previous one ended
  looked its prefix up before those blocks reached the server, and missed them.
- **Chunked prefill and preemption**: saves follow what each step computed
  (``num_computed_tokens + num_scheduled_tokens``), block ids follow
  ``new_block_ids`` (replaced on resume from preemption), and a preempted
  request asks the store again when it is rescheduled.
- **Session hints**: a request whose ``kv_transfer_params`` hold
  ``{"agentinfra": {"session": ID, "parent": PARENT?}}`` (the agent loop sends
  its run id) is a turn of that agent session: the lookup is a SESSION ``begin``
  (prefetch and pin the prefix), saved blocks are added to it, and when the
  request finishes the turn ends with ``tool_wait_ttl_s`` (the agent now
  runs tools). ``"state": "done"`` closes it instead (its private blocks leave
  memory); `agentinfra run --kv-hints HOST:PORT` sends that close to the kv server itself when
  an agent stops between requests (vLLM sees hints only on requests).

Counters (lookups, hits, blocks loaded, load errors, blocks saved, dropped saves,
network errors) are logged at shutdown and kept in `ConnectorCounters`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from agentinfra.errors import ConfigError
from agentinfra.kvcache import (
    LAYOUT_ENGINE_NATIVE,
    AsyncCacheClient,
    Block,
    BlockKey,
    Namespace,
    block_keys,
    encode_block,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

__all__ = [
    "AgentinfraConnector",
    "AgentinfraConnectorMetadata",
    "ConnectorCounters",
    "ConnectorSettings",
    "layout_label",
]

log = logging.getLogger("vllm.agentinfra_connector")  # under vLLM's logger: its handlers and format
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectorSettings:
    """``kv_connector_extra_config``, checked."""

    host: str = "127.0.0.1"
    port: int = 7480
    tenant: str = ""
    token: str = ""
    model_id: str = ""
    """The namespace's model; default: vLLM's served model name."""
    weights_revision: str = ""
    """Default: a hash of the checkpoint's config and weight files (name, size), or the revision."""
    timeout_s: float = 5.0
    lookup_timeout_s: float = 2.0
    load: bool = True
    save: bool = True
    max_pending_mib: float = 256.0
    tool_wait_ttl_s: float = 120.0
    """How long an agent's blocks stay in memory after its turn while it runs tools (session hints)."""

    @classmethod
    def from_extra(cls, extra: dict[str, Any]) -> ConnectorSettings:
        known = {"url", "token_file", *cls.__dataclass_fields__}
        unknown = sorted(set(extra) - known)
        if unknown:
            raise ConfigError(
                f"unknown kv_connector_extra_config key(s) {unknown}; known: {sorted(known)}"
            )
        values = {k: v for k, v in extra.items() if k in cls.__dataclass_fields__}
        url = str(extra.get("url", ""))
        if url:
            host, _, port = url.removeprefix("tcp://").rpartition(":")
            if not host or not port.isdigit():
                raise ConfigError(
                    f"kv_connector_extra_config url {url!r} must be HOST:PORT, e.g. 127.0.0.1:7480"
                )
            values |= {"host": host, "port": int(port)}
        token_file = extra.get("token_file")
        if token_file:
            try:
                words = Path(str(token_file)).read_text().split()
            except OSError as exc:
                raise ConfigError(
                    f"cannot read token_file {token_file}: {exc.strerror} (kv_connector_extra_config)"
                ) from None
            if not words:
                raise ConfigError(f"token_file {token_file} is empty (kv_connector_extra_config)")
            values["token"] = words[-1]
        try:
            return cls(**values)
        except TypeError as exc:
            raise ConfigError(f"kv_connector_extra_config: {exc}") from None


@dataclass
class ConnectorCounters:
    lookups: int = 0
    lookup_timeouts: int = 0
    hit_blocks: int = 0
    loaded_blocks: int = 0
    load_errors: int = 0
    saved_blocks: int = 0
    dropped_saves: int = 0
    network_errors: int = 0
    save_waits: int = 0
    """Lookups held back (answered "ask again") until an earlier request's saves of the same
    blocks had reached the server."""

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


class _Remote:
    """One connection to the cache server on a private event-loop thread; each call returns a Future.

    A failed call drops the connection; the next call reconnects, at most once a second.
    """

    def __init__(self, settings: ConnectorSettings, counters: ConnectorCounters) -> None:
        self.settings = settings
        self.counters = counters
        self.loop = asyncio.new_event_loop()
        self._client: AsyncCacheClient | None = None
        self._retry_at = 0.0
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="agentinfra-kv", daemon=True
        )
        self._thread.start()

    async def _connected(self) -> AsyncCacheClient:
        if self._client is None:
            if time.monotonic() < self._retry_at:
                raise ConnectionError("the kv server was unreachable less than a second ago")
            try:
                self._client = await AsyncCacheClient.connect(
                    self.settings.host, self.settings.port, tenant=self.settings.tenant,
                    token=self.settings.token, timeout_s=self.settings.timeout_s,
                )  # fmt: skip
            except Exception:
                self._retry_at = time.monotonic() + 1.0
                raise
        return self._client

    def call(self, fn: Callable[[AsyncCacheClient], Awaitable[_T]]) -> Future[_T]:
        async def run() -> _T:
            client = await self._connected()
            try:
                return await asyncio.wait_for(fn(client), self.settings.timeout_s)
            except Exception:
                self._client = None
                self.counters.network_errors += 1
                with contextlib.suppress(Exception):
                    await client.close()
                raise

        return asyncio.run_coroutine_threadsafe(run(), self.loop)

    def close(self) -> None:
        async def shut() -> None:
            if self._client is not None:
                with contextlib.suppress(Exception):
                    await self._client.close()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shut(), self.loop).result(2)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(2)


def _weights_identity(model: str) -> str:
    """A hash of a local checkpoint's config and weight file names and sizes; '' for a hub name."""
    root = Path(model)
    if not root.is_dir():
        return ""
    digest = hashlib.sha256()
    for path in sorted(root.iterdir()):
        if path.name == "config.json":
            digest.update(path.read_bytes())
        elif path.suffix in (".safetensors", ".bin", ".gguf", ".pt"):
            digest.update(f"{path.name}:{path.stat().st_size}".encode())
    return "files-sha256:" + digest.hexdigest()[:32]


def _isa(dtype: torch.dtype, block_size: int, head_size: int, cache_dtype: str) -> str:
    try:
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
    except ImportError:  # pragma: no cover - another vLLM
        return "unknown"
    try:
        return str(_get_attn_isa(dtype, block_size, head_size, cache_dtype))
    except Exception:
        return "unknown"


def _session_hint(request: Request) -> tuple[str, str | None, bool] | None:
    """(session, parent, done) from ``kv_transfer_params["agentinfra"]``, or None without a valid hint."""
    params = getattr(request, "kv_transfer_params", None)
    hint = params.get("agentinfra") if isinstance(params, dict) else None
    if (
        not isinstance(hint, dict)
        or not isinstance(hint.get("session"), str)
        or not hint["session"]
    ):
        return None
    parent = hint.get("parent")
    return (
        str(hint["session"])[:200],
        str(parent)[:200] if isinstance(parent, str) else None,
        hint.get("state") == "done",
    )


async def _begin(
    client: AsyncCacheClient, session: str, keys: list[BlockKey], parent: str | None
) -> int:
    answer = await client.session(session, "begin", keys, parent=parent)
    return int(answer.get("hits", 0))


def layout_label(vllm_config: VllmConfig) -> str:
    """The engine-native layout label of this engine's KV blocks (part of every key)."""
    from vllm.platforms import current_platform

    model = vllm_config.model_config
    cache = vllm_config.cache_config
    heads = model.get_num_kv_heads(vllm_config.parallel_config)
    head_size = model.get_head_size()
    device = str(current_platform.device_type)
    isa = (
        _isa(model.dtype, cache.block_size, head_size, str(cache.cache_dtype))
        if device == "cpu"
        else device
    )
    return f"vllm-{device}:native-block:isa={isa}:bs={cache.block_size}:h={heads}:d={head_size}"


def _kv_dtype(vllm_config: VllmConfig) -> str:
    cache_dtype = str(vllm_config.cache_config.cache_dtype)
    if cache_dtype != "auto":
        return cache_dtype
    return str(vllm_config.model_config.dtype).removeprefix("torch.")


@dataclass
class AgentinfraConnectorMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """One step's work for the workers: loads and saves, as (request id, keys, block ids)."""

    loads: list[tuple[str, list[bytes], list[int]]] = field(default_factory=list)
    saves: list[tuple[str, list[bytes], list[int]]] = field(default_factory=list)


@dataclass
class _Request:
    request: Request
    namespace: Namespace
    keys: list[BlockKey] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)
    next_save: int = 0
    lookup: Future[int] | None = None
    lookup_started: float = 0.0
    hits: int | None = None
    local_computed: int = 0
    pending_load: tuple[list[bytes], list[int]] | None = None
    session: str | None = None
    parent: str | None = None
    done: bool = False
    saved: set[bytes] = field(default_factory=set)
    """Keys of the blocks planned for saving (the worker sends them in the background)."""
    save_wait_started: float | None = None


class AgentinfraConnector(KVConnectorBase_V1):  # type: ignore[misc]
    """The vLLM v1 connector (module docstring). Two instances: the scheduler's and the worker's."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig | None = None,
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        transfer = vllm_config.kv_transfer_config
        assert transfer is not None  # the base class refused a config without it
        if transfer.kv_load_failure_policy != "recompute":
            raise ConfigError(
                'AgentinfraConnector is a best-effort cache: set "kv_load_failure_policy": "recompute" in '
                "--kv-transfer-config (a block that fails to load is then recomputed, never a failed request)"
            )
        parallel = vllm_config.parallel_config
        if parallel.tensor_parallel_size > 1 or parallel.pipeline_parallel_size > 1:
            raise ConfigError(
                "AgentinfraConnector supports one worker per engine for now "
                f"(tensor_parallel_size={parallel.tensor_parallel_size}, "
                f"pipeline_parallel_size={parallel.pipeline_parallel_size})"
            )
        self.settings = ConnectorSettings.from_extra(dict(transfer.kv_connector_extra_config or {}))
        self.block_size = int(vllm_config.cache_config.block_size)
        model = vllm_config.model_config
        self.namespace = Namespace(
            model_id=self.settings.model_id or str(model.served_model_name or model.model),
            weights_revision=self.settings.weights_revision
            or _weights_identity(str(model.model))
            or str(model.revision or ""),
            kv_dtype=_kv_dtype(vllm_config),
            kv_layout=layout_label(vllm_config),
            block_size_tokens=self.block_size,
        )
        self.kv_heads = int(model.get_num_kv_heads(parallel))
        self.head_size = int(model.get_head_size())
        self.num_blocks = int(kv_cache_config.num_blocks) if kv_cache_config is not None else 0
        self.counters = ConnectorCounters()
        self.remote = _Remote(self.settings, self.counters)
        # scheduler side
        self._requests: dict[str, _Request] = {}
        self._in_flight: dict[str, set[bytes]] = {}
        """Finished requests whose saves the worker has not yet confirmed (blocks held by vLLM)."""
        # worker side
        self._layers: list[torch.Tensor] = []
        self._block_dim = 0
        self._load_errors: set[int] = set()
        self._pending_bytes = 0
        self._pending_lock = threading.Lock()
        self._puts_of: dict[str, int] = {}
        """Request id -> its PUTs not yet answered by the server."""
        self._finished_unsent: set[str] = set()
        self._sent: set[str] = set()
        log.info("AgentinfraConnector %s: %s:%d, namespace %s", role.name, self.settings.host,
                 self.settings.port, self.namespace)  # fmt: skip

    # ------------------------------------------------------------------ scheduler side
    def _state(self, request: Request) -> _Request:
        state = self._requests.get(request.request_id)
        if state is None:
            salt = getattr(request, "cache_salt", None)
            namespace = self.namespace
            if salt:
                namespace = Namespace(
                    model_id=namespace.model_id, weights_revision=namespace.weights_revision,
                    kv_dtype=namespace.kv_dtype, kv_layout=namespace.kv_layout,
                    block_size_tokens=namespace.block_size_tokens, tenant_salt=str(salt).encode(),
                )  # fmt: skip
            state = _Request(request, namespace)
            hint = _session_hint(request)
            if hint is not None:
                state.session, state.parent, state.done = hint
            self._requests[request.request_id] = state
        return state

    def _keys(self, state: _Request, blocks: int) -> list[BlockKey]:
        """The keys of the request's first ``blocks`` full blocks (the chain, extended as tokens arrive)."""
        have = len(state.keys)
        if blocks > have:
            tokens = list(
                state.request.all_token_ids[have * self.block_size : blocks * self.block_size]
            )
            parent = state.keys[-1] if state.keys else None
            state.keys += block_keys(state.namespace, tokens, parent=parent)
        return state.keys[:blocks]

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        prompt = request.prompt_token_ids
        if not self.settings.load or not prompt:
            return 0, False
        usable = (len(prompt) - 1) // self.block_size  # at least one token is computed
        have = num_computed_tokens // self.block_size
        if usable <= have:
            return 0, False
        state = self._state(request)
        state.local_computed = num_computed_tokens
        if state.hits is None:
            if state.lookup is None:
                keys = self._keys(state, usable)
                if self._wait_for_saves(state, keys):
                    return (
                        None,
                        False,
                    )  # ask again once the earlier request's blocks are on the server
                self.counters.lookups += 1
                if (
                    state.session is not None
                ):  # a turn: prefetch and pin the prefix, answer the hits
                    state.lookup = self.remote.call(
                        lambda client: _begin(client, state.session or "", keys, state.parent)
                    )
                else:
                    state.lookup = self.remote.call(lambda client: client.leading_hits(keys))
                state.lookup_started = time.monotonic()
            if not state.lookup.done():
                if time.monotonic() - state.lookup_started < self.settings.lookup_timeout_s:
                    return None, False  # ask again: the scheduler's step never waits on the network
                self.counters.lookup_timeouts += 1
                state.hits = 0
            else:
                try:
                    state.hits = int(state.lookup.result())
                except Exception:
                    state.hits = 0
            self.counters.hit_blocks += state.hits
        found = min(state.hits, usable) - have
        return (found * self.block_size if found > 0 else 0), False

    def _wait_for_saves(self, state: _Request, keys: list[BlockKey]) -> bool:
        """Whether this lookup waits: blocks of its prefix are still being sent by a finished request.

        Without this, a follow-up turn sent the moment the previous one finished looks its
        prefix up before the previous turn's blocks reach the server and misses them all.
        Bounded by the lookup timeout.
        """
        if not self._in_flight:
            return False
        wanted = {bytes(key) for key in keys}
        if all(saved.isdisjoint(wanted) for saved in self._in_flight.values()):
            return False
        now = time.monotonic()
        if state.save_wait_started is None:
            state.save_wait_started = now
            self.counters.save_waits += 1
        return now - state.save_wait_started < self.settings.lookup_timeout_s

    def update_connector_output(self, connector_output: Any) -> None:
        for req_id in getattr(connector_output, "finished_sending", None) or ():
            self._in_flight.pop(req_id, None)

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        state = self._state(request)
        start = state.local_computed // self.block_size
        if num_external_tokens > 0:
            ids = list(blocks.get_block_ids()[0])
            count = num_external_tokens // self.block_size
            keys = self._keys(state, start + count)[start:]
            state.pending_load = ([bytes(k) for k in keys], ids[start : start + count])
            state.next_save = max(state.next_save, start + count)
        else:
            state.next_save = max(state.next_save, start)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = AgentinfraConnectorMetadata()
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            state = self._requests.get(new.req_id)
            if state is None:
                continue
            state.block_ids = list(new.block_ids[0])
            self._take_load(state, new.req_id, meta)
            self._plan_saves(
                state, new.req_id, new.num_computed_tokens + scheduled[new.req_id], meta
            )
        cached = scheduler_output.scheduled_cached_reqs
        resumed = set(getattr(cached, "resumed_req_ids", ()) or ())
        for index, req_id in enumerate(cached.req_ids):
            state = self._requests.get(req_id)
            if state is None:
                continue
            new_ids = cached.new_block_ids[index]
            if req_id in resumed:
                state.block_ids = list(new_ids[0]) if new_ids else []
                log.info("AgentinfraConnector: request %s resumed after preemption", req_id)
            elif new_ids:
                state.block_ids += list(new_ids[0])
            self._take_load(state, req_id, meta)
            computed = cached.num_computed_tokens[index] + scheduled.get(req_id, 0)
            self._plan_saves(state, req_id, computed, meta)
        for req_id in getattr(scheduler_output, "preempted_req_ids", None) or ():
            state = self._requests.get(req_id)
            if state is not None:  # rescheduled later: ask the store again then
                state.hits, state.lookup, state.pending_load = None, None, None
        return meta

    def _take_load(self, state: _Request, req_id: str, meta: AgentinfraConnectorMetadata) -> None:
        if state.pending_load is not None:
            keys, ids = state.pending_load
            meta.loads.append((req_id, keys, ids))
            state.pending_load = None

    def _plan_saves(
        self, state: _Request, req_id: str, computed: int, meta: AgentinfraConnectorMetadata
    ) -> None:
        if not self.settings.save:
            return
        full = min(
            computed, len(state.request.all_token_ids), len(state.block_ids) * self.block_size
        )
        full //= self.block_size
        if full <= state.next_save:
            return
        keys = self._keys(state, full)
        new_keys = keys[state.next_save : full]
        raw = [bytes(k) for k in new_keys]
        meta.saves.append((req_id, raw, state.block_ids[state.next_save : full]))
        state.saved.update(raw)
        state.next_save = full
        if state.session is not None:
            self._hint(state.session, "add", new_keys)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        state = self._requests.pop(request.request_id, None)
        if state is None:
            return False, None
        if state.session is not None:
            if state.done:
                self._hint(state.session, "close")
            else:
                self._hint(state.session, "end", ttl_s=self.settings.tool_wait_ttl_s)
        if not state.saved:
            return False, None
        # The worker confirms (get_finished) once this request's PUTs are answered; until then
        # lookups of the same blocks wait, and vLLM holds the request's blocks (already copied out).
        self._in_flight[request.request_id] = state.saved
        return True, None

    def _hint(
        self, session: str, action: str, keys: list[BlockKey] | None = None, **options: Any
    ) -> None:
        """A session hint on the background thread; a failure costs only the hint."""

        async def send(client: AsyncCacheClient) -> dict[str, Any]:
            return await client.session(session, action, keys or [], **options)

        self.remote.call(send).add_done_callback(
            lambda future: future.exception()
        )  # saves were copied out in the steps that computed them

    # ------------------------------------------------------------------ worker side
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        layers = list(kv_caches.values())
        if not layers:
            return
        shape = tuple(layers[0].shape)
        dims = (
            [i for i, size in enumerate(shape) if size == self.num_blocks]
            if self.num_blocks
            else [0]
        )
        if not dims or any(tuple(t.shape) != shape or t.dtype != layers[0].dtype for t in layers):
            raise ConfigError(
                f"AgentinfraConnector cannot find the block dimension of KV caches shaped {shape} "
                f"(num_blocks={self.num_blocks}); this attention backend is not supported"
            )
        self._block_dim = dims[0]
        self._layers = layers
        log.info(
            "AgentinfraConnector: %d layers of KV %s, blocks on dim %d",
            len(layers),
            shape,
            self._block_dim,
        )

    def _block(self, layer: torch.Tensor, block_id: int) -> torch.Tensor:
        return layer.select(self._block_dim, block_id)

    def _native_shape(self) -> tuple[int, ...]:
        """The block's sizes as the block format states them: (layers, 2, tokens, heads, head_size)."""
        shape = (len(self._layers), 2, self.block_size, self.kv_heads, self.head_size)
        inner = self._block(self._layers[0], 0).numel()
        if (
            inner != 2 * self.block_size * self.kv_heads * self.head_size
        ):  # a padded layout: sizes only
            shape = (len(self._layers), 2, self.block_size, 1, inner // (2 * self.block_size))
        return shape

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        if not self._layers or not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, AgentinfraConnectorMetadata)
        for _req_id, raw_keys, block_ids in meta.loads:
            started = time.perf_counter()
            try:
                blocks = self._get([BlockKey(k) for k in raw_keys])
            except Exception:  # unreachable, dropped or timed out: recomputed, counted
                blocks = []
            fetched = time.perf_counter()
            loaded = 0
            for index, block_id in enumerate(block_ids):
                if index < len(blocks) and self._copy_in(blocks[index], block_id):
                    loaded += 1
                    continue
                self._load_errors.update(block_ids[index:])
                break
            self.counters.loaded_blocks += loaded
            size = sum(b.header.payload_bytes for b in blocks[:loaded])
            log.info(
                "AgentinfraConnector: loaded %d blocks (%d bytes) for request %s: get %.4f s, copy %.4f s",
                loaded, size, _req_id, fetched - started, time.perf_counter() - fetched,
            )  # fmt: skip
            if loaded < len(block_ids):
                self.counters.load_errors += len(block_ids) - loaded
                log.warning(
                    "AgentinfraConnector: %d of %d blocks of request %s did not load (missing, corrupt or "
                    "unreachable); vLLM recomputes them. load_errors=%d",
                    len(block_ids) - loaded, len(block_ids), _req_id, self.counters.load_errors,
                )  # fmt: skip

    def _get(self, keys: list[BlockKey]) -> list[Block]:
        return self.remote.call(lambda client: client.get(keys)).result(self.settings.timeout_s + 1)

    def _copy_in(self, block: Block, block_id: int) -> bool:
        header = block.header
        first = self._block(self._layers[0], block_id)
        expected = first.numel() * first.element_size() * len(self._layers)
        if (
            header.layout != LAYOUT_ENGINE_NATIVE
            or header.payload_bytes != expected
            or header.dtype != str(first.dtype).removeprefix("torch.")
        ):
            return False
        flat = torch.frombuffer(block.payload, dtype=torch.uint8).view(first.dtype)
        per_layer = first.numel()
        for index, layer in enumerate(self._layers):
            target = self._block(layer, block_id)
            target.copy_(flat[index * per_layer : (index + 1) * per_layer].view(target.shape))
        return True

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return  # whole blocks are copied out once the step's forward is done (wait_for_save)

    def wait_for_save(self) -> None:
        if not self._layers or not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, AgentinfraConnectorMetadata)
        items: list[tuple[BlockKey, bytes]] = []
        shape = self._native_shape()
        requests = {req_id for req_id, raw_keys, _ in meta.saves if raw_keys}
        with self._pending_lock:
            for (
                req_id
            ) in requests:  # every request that had a save is confirmed once, at its finish
                self._puts_of.setdefault(req_id, 0)
        for _req_id, raw_keys, block_ids in meta.saves:
            for raw, block_id in zip(raw_keys, block_ids, strict=True):
                data = torch.stack([self._block(layer, block_id) for layer in self._layers])
                key = BlockKey(raw)
                items.append(
                    (key, encode_block(key, data.reshape(shape), layout=LAYOUT_ENGINE_NATIVE))
                )
        if not items:
            return
        size = sum(len(data) for _, data in items)
        with self._pending_lock:
            if self._pending_bytes + size > self.settings.max_pending_mib * (1 << 20):
                self.counters.dropped_saves += len(items)
                return
            self._pending_bytes += size
            for req_id in requests:
                self._puts_of[req_id] += 1

        def sent(future: Future[int]) -> None:
            with self._pending_lock:
                self._pending_bytes -= size
                for req_id in requests:
                    self._puts_of[req_id] -= 1
                    if self._puts_of[req_id] == 0 and req_id in self._finished_unsent:
                        self._finished_unsent.discard(req_id)
                        del self._puts_of[req_id]
                        self._sent.add(req_id)
            if future.exception() is None:
                self.counters.saved_blocks += len(items)
            else:
                self.counters.dropped_saves += len(items)

        self.remote.call(lambda client: client.put_encoded(items)).add_done_callback(sent)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """Requests that finished and whose saves have all been answered (the scheduler delayed them)."""
        with self._pending_lock:
            for req_id in finished_req_ids:
                if req_id not in self._puts_of:
                    continue  # never saved anything: the scheduler freed it at once
                if self._puts_of[req_id] == 0:
                    del self._puts_of[req_id]
                    self._sent.add(req_id)
                else:
                    self._finished_unsent.add(req_id)
            done, self._sent = self._sent, set()
        return (done or None), None

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self) -> None:
        deadline = time.monotonic() + self.settings.timeout_s
        while self._pending_bytes and time.monotonic() < deadline:
            time.sleep(0.01)
        log.info(
            "AgentinfraConnector %s counters: %s",
            self.role.name,
            json.dumps(self.counters.as_dict()),
        )
        self.remote.close()
