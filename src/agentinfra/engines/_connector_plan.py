"""The vLLM connector's planning, over token ids and block ids: no vLLM, no torch, no I/O.

The glue (`agentinfra.engines._vllm`) turns vLLM's objects (requests, scheduler
output, KV tensors) into token ids, block ids and counts, calls these functions,
and turns their answers back into vLLM's. What is looked up, loaded, saved,
waited for and hinted is decided here, and tested without vLLM
(tests/unit/engines/test_connector_plan.py). Design: decision 0010.

Invariants of a `RequestPlan`:

- ``keys`` is one chain of block keys over the request's token ids (prompt, then
  output), in our key spec (docs/kv-block-keys.md), extended as tokens arrive.
- Blocks ``[0, next_save)`` were computed by vLLM's own prefix cache, loaded from
  the store, or already planned for saving: no block is saved twice.
- At least one prompt token is always computed (its logits are needed): a lookup
  offers at most ``(prompt_tokens - 1) // block_size`` blocks.
- ``saved`` holds every key planned for saving; a finished request that saved
  anything is held until the worker says its PUTs were answered, and meanwhile a
  lookup that wants one of those keys waits (bounded by ``lookup_timeout_s``).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

from agentinfra.errors import ConfigError
from agentinfra.kvcache import LAYOUT_ENGINE_NATIVE, BlockHeader, BlockKey, Namespace, block_keys

__all__ = [
    "BlockTransfer",
    "ConnectorCounters",
    "ConnectorSettings",
    "FinishPlan",
    "LookupWindow",
    "RequestPlan",
    "SaveTracker",
    "SessionAction",
    "SessionHint",
    "begin_lookup",
    "block_dimension",
    "extend_keys",
    "finish_request",
    "forget_lookup",
    "is_loadable",
    "kv_dtype",
    "lookup_window",
    "matched_tokens",
    "native_block_shape",
    "native_layout_label",
    "plan_load",
    "plan_saves",
    "request_namespace",
    "session_hint",
    "settle_lookup",
    "take_load",
    "take_new_block_ids",
    "waits_for_saves",
    "weights_identity",
]


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
    load_chunk_mib: float = 32.0
    """Bytes per GET of a load; ``load_depth`` of them in flight, each into its own staging buffer."""
    load_depth: int = 3
    shm_socket: str = ""
    """The cache server's same-host socket (``kv serve --shm-socket``): the worker's loads then
    come through a shared segment of ``load_depth`` chunks; lookups and saves stay on TCP."""
    tool_wait_ttl_s: float = 120.0
    """How long an agent's blocks stay in memory after its turn while it runs tools (session hints)."""
    announce: bool = True
    """Send each saved chain's tokens (LINEAGE) for the server's KV events; stops by itself when
    the server publishes none."""

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
            settings = cls(**values)
        except TypeError as exc:
            raise ConfigError(f"kv_connector_extra_config: {exc}") from None
        if not float(settings.load_chunk_mib) > 0 or int(settings.load_depth) < 1:
            raise ConfigError(
                f"kv_connector_extra_config load_chunk_mib={settings.load_chunk_mib!r} must be positive "
                f"and load_depth={settings.load_depth!r} at least 1"
            )
        if not isinstance(settings.shm_socket, str) or len(settings.shm_socket.encode()) > 107:
            raise ConfigError(
                f"kv_connector_extra_config shm_socket={settings.shm_socket!r} must be a Unix "
                "socket path of at most 107 bytes"
            )
        return settings


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
    lookup_s: float = 0.0
    """The scheduler's lookups, from asking to the answer (LEADING_HITS, or SESSION begin)."""
    save_copy_s: float = 0.0
    """Time inside the engine's step copying saved blocks out of the paged cache and encoding
    them; the PUTs go out in the background."""
    loaded_bytes: int = 0
    load_wall_s: float = 0.0
    """The worker's loads, stage by stage (`PagedKVLoader`): wall time, then waiting for GET
    answers, verifying checksums and copying into the paged cache."""
    load_get_wait_s: float = 0.0
    load_verify_s: float = 0.0
    load_copy_s: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in vars(self).items()}


# ---------------------------------------------------------------------- the namespace
def weights_identity(model: str) -> str:
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


def native_layout_label(
    *, device: str, isa: str, block_size: int, kv_heads: int, head_size: int
) -> str:
    """The engine-native layout label of vLLM's KV blocks (part of every key)."""
    return f"vllm-{device}:native-block:isa={isa}:bs={block_size}:h={kv_heads}:d={head_size}"


def kv_dtype(cache_dtype: str, model_dtype: str) -> str:
    """The KV dtype: vLLM's ``cache_dtype``, or the model's dtype when it is ``auto``."""
    if cache_dtype != "auto":
        return cache_dtype
    return model_dtype.removeprefix("torch.")


def request_namespace(base: Namespace, cache_salt: object) -> Namespace:
    """The engine's namespace with a request's ``cache_salt`` as its tenant salt (unchanged without one)."""
    if not cache_salt:
        return base
    return dataclasses.replace(base, tenant_salt=str(cache_salt).encode())


class SessionHint(NamedTuple):
    """``kv_transfer_params["agentinfra"]``: the request is a turn of an agent session."""

    session: str
    parent: str | None
    is_done: bool
    """``"state": "done"``: the session closes when this request finishes."""


def session_hint(kv_transfer_params: object) -> SessionHint | None:
    """The hint in a request's ``kv_transfer_params``, or None without a valid one (ids cut to 200 chars)."""
    params = kv_transfer_params
    hint = params.get("agentinfra") if isinstance(params, dict) else None
    if (
        not isinstance(hint, dict)
        or not isinstance(hint.get("session"), str)
        or not hint["session"]
    ):
        return None
    parent = hint.get("parent")
    return SessionHint(
        str(hint["session"])[:200],
        str(parent)[:200] if isinstance(parent, str) else None,
        hint.get("state") == "done",
    )


# ---------------------------------------------------------------------- the scheduler's plan
class BlockTransfer(NamedTuple):
    """Blocks to move between vLLM's paged cache and the store: keys and block ids, pairwise."""

    keys: list[BlockKey]
    block_ids: list[int]


@dataclass(slots=True)
class RequestPlan:
    """The scheduler's plan for one request (module docstring: its invariants)."""

    namespace: Namespace
    hint: SessionHint | None = None
    keys: list[BlockKey] = field(default_factory=list)
    block_ids: list[int] = field(default_factory=list)
    """The request's blocks in vLLM's paged cache, in token order."""
    next_save: int = 0
    hits: int | None = None
    """The lookup's answer in blocks; None until it has answered (or timed out)."""
    lookup_started_s: float = 0.0
    local_computed: int = 0
    """Tokens vLLM's own prefix cache had at the lookup."""
    pending_load: BlockTransfer | None = None
    saved: set[bytes] = field(default_factory=set)
    """Keys of the blocks planned for saving (the worker sends them in the background)."""
    save_wait_started: float | None = None

    @property
    def block_size(self) -> int:
        return self.namespace.block_size_tokens


def extend_keys(plan: RequestPlan, token_ids: Sequence[int], blocks: int) -> list[BlockKey]:
    """The keys of the request's first ``blocks`` full blocks (the chain, extended as tokens arrive)."""
    have = len(plan.keys)
    if blocks > have:
        tokens = list(token_ids[have * plan.block_size : blocks * plan.block_size])
        parent = plan.keys[-1] if plan.keys else None
        plan.keys += block_keys(plan.namespace, tokens, parent=parent)
    return plan.keys[:blocks]


class LookupWindow(NamedTuple):
    """The prompt's blocks a lookup may offer, and those vLLM already has."""

    usable_blocks: int
    """Full prompt blocks but the one holding the last token (vLLM must compute one token)."""
    computed_blocks: int


def lookup_window(prompt_tokens: int, computed_tokens: int, block_size: int) -> LookupWindow | None:
    """What a lookup could add beyond vLLM's own ``computed_tokens``; None when nothing."""
    usable = (prompt_tokens - 1) // block_size
    have = computed_tokens // block_size
    if usable <= have:
        return None
    return LookupWindow(usable, have)


def waits_for_saves(
    plan: RequestPlan,
    keys: Sequence[BlockKey],
    in_flight: Mapping[str, set[bytes]],
    *,
    now_s: float,
    timeout_s: float,
    counters: ConnectorCounters,
) -> bool:
    """Whether this lookup waits: blocks of its prefix are still being sent by a finished request.

    Without this, a follow-up turn sent the moment the previous one finished looks its
    prefix up before the previous turn's blocks reach the server and misses them all.
    Bounded by ``timeout_s`` from the first wait; each waiting lookup is counted once.
    """
    if not in_flight:
        return False
    wanted = {bytes(key) for key in keys}
    if all(saved.isdisjoint(wanted) for saved in in_flight.values()):
        return False
    if plan.save_wait_started is None:
        plan.save_wait_started = now_s
        counters.save_waits += 1
    return now_s - plan.save_wait_started < timeout_s


def begin_lookup(plan: RequestPlan, *, now_s: float, counters: ConnectorCounters) -> None:
    """A lookup was sent now (counted)."""
    counters.lookups += 1
    plan.lookup_started_s = now_s


def settle_lookup(
    plan: RequestPlan,
    answer: int | None,
    *,
    is_answered: bool,
    now_s: float,
    timeout_s: float,
    counters: ConnectorCounters,
) -> int | None:
    """The lookup's hits in blocks, recorded and counted once it answered or timed out; None while it may still answer.

    ``answer``: the hits it answered, None when it failed (a miss). A lookup unanswered
    ``timeout_s`` after it began is a miss, counted as a timeout.
    """
    if not is_answered:
        if now_s - plan.lookup_started_s < timeout_s:
            return None
        counters.lookup_timeouts += 1
        hits = 0
    else:
        hits = answer if answer is not None else 0
    plan.hits = hits
    counters.hit_blocks += hits
    return hits


def matched_tokens(hits: int, window: LookupWindow, block_size: int) -> int:
    """Tokens the store adds beyond vLLM's own: whole blocks, never past the usable ones."""
    found = min(hits, window.usable_blocks) - window.computed_blocks
    return found * block_size if found > 0 else 0


def plan_load(
    plan: RequestPlan, token_ids: Sequence[int], block_ids: Sequence[int], external_tokens: int
) -> None:
    """After vLLM allocated the request's blocks: what to load into which, and where saves begin.

    ``block_ids``: the request's allocated blocks (needed only when ``external_tokens``).
    """
    start = plan.local_computed // plan.block_size
    if external_tokens > 0:
        count = external_tokens // plan.block_size
        keys = extend_keys(plan, token_ids, start + count)[start:]
        plan.pending_load = BlockTransfer(keys, list(block_ids[start : start + count]))
        plan.next_save = max(plan.next_save, start + count)
    else:
        plan.next_save = max(plan.next_save, start)


def take_load(plan: RequestPlan) -> BlockTransfer | None:
    """The planned load, once: it goes into this step's metadata."""
    load, plan.pending_load = plan.pending_load, None
    return load


def take_new_block_ids(
    plan: RequestPlan, new_block_ids: Sequence[int] | None, *, is_resumed: bool
) -> None:
    """A scheduled request's new blocks: appended, or all of them after a resume from preemption."""
    if is_resumed:
        plan.block_ids = list(new_block_ids) if new_block_ids else []
    elif new_block_ids:
        plan.block_ids += list(new_block_ids)


def plan_saves(
    plan: RequestPlan, token_ids: Sequence[int], computed_tokens: int
) -> BlockTransfer | None:
    """The full blocks this step completed and nothing saved yet (None: none).

    ``computed_tokens``: what the request will have computed after this step
    (``num_computed_tokens + num_scheduled_tokens``), so chunked prefill and
    decode are both followed.
    """
    full = min(computed_tokens, len(token_ids), len(plan.block_ids) * plan.block_size)
    full //= plan.block_size
    if full <= plan.next_save:
        return None
    keys = extend_keys(plan, token_ids, full)
    save = BlockTransfer(keys[plan.next_save : full], plan.block_ids[plan.next_save : full])
    plan.saved.update(bytes(key) for key in save.keys)
    plan.next_save = full
    return save


def forget_lookup(plan: RequestPlan) -> None:
    """A preempted request asks the store again when it is rescheduled."""
    plan.hits = None
    plan.pending_load = None


class SessionAction(NamedTuple):
    """A session hint to send: ``end`` the turn (the agent runs tools) or ``close`` the session."""

    session: str
    action: Literal["close", "end"]
    ttl_s: float | None = None
    """``end`` only: how long the session's blocks stay in memory."""


class FinishPlan(NamedTuple):
    """What a request's end does: its session hint, and the saved keys it waits for."""

    hint: SessionAction | None
    held_keys: set[bytes] | None
    """The request's saved keys: it is held until the worker confirms them; None: freed at once."""


def finish_request(plan: RequestPlan, *, tool_wait_ttl_s: float) -> FinishPlan:
    """A finished request's session hint (``close`` when it said done, else ``end``) and what it waits for."""
    hint = None
    if plan.hint is not None and plan.hint.is_done:
        hint = SessionAction(plan.hint.session, "close")
    elif plan.hint is not None:
        hint = SessionAction(plan.hint.session, "end", tool_wait_ttl_s)
    return FinishPlan(hint, plan.saved or None)


# ---------------------------------------------------------------------- the worker's side
def block_dimension(
    shapes: Sequence[tuple[int, ...]], dtypes: Sequence[str], num_blocks: int
) -> int | None:
    """The dimension of the KV tensors that indexes blocks; None when the layers disagree or none fits.

    With ``num_blocks`` unknown (0), dimension 0.
    """
    shape = shapes[0]
    dims = [i for i, size in enumerate(shape) if size == num_blocks] if num_blocks else [0]
    if not dims or any(
        other != shape or dtype != dtypes[0] for other, dtype in zip(shapes, dtypes, strict=True)
    ):
        return None
    return dims[0]


def native_block_shape(
    *, layers: int, block_size: int, kv_heads: int, head_size: int, block_elements: int
) -> tuple[int, ...]:
    """The block's sizes as the block format states them: (layers, 2, tokens, heads, head_size).

    ``block_elements``: the elements of one layer's block. A padded layout states sizes only:
    (layers, 2, tokens, 1, elements per token and K or V).
    """
    if block_elements != 2 * block_size * kv_heads * head_size:
        return (layers, 2, block_size, 1, block_elements // (2 * block_size))
    return (layers, 2, block_size, kv_heads, head_size)


def is_loadable(header: BlockHeader, *, payload_bytes: int, dtype: str) -> bool:
    """Whether a verified block fits this engine's blocks: engine-native, the same size and dtype."""
    return (
        header.layout == LAYOUT_ENGINE_NATIVE
        and header.payload_bytes == payload_bytes
        and header.dtype == dtype
    )


class SaveTracker:
    """The worker's saves on their way: bytes pending, and each request's PUTs not yet answered.

    A request that saved anything is reported finished (to the scheduler, which held
    it) only once all of its PUTs were answered. Not thread-safe: the glue holds one
    lock around every call, since PUTs are answered on the background thread.
    """

    def __init__(self, limit_bytes: float) -> None:
        self.limit_bytes = limit_bytes
        self.pending_bytes = 0
        self._puts_of: dict[str, int] = {}
        """Request id -> its PUTs not yet answered by the server."""
        self._finished_unsent: set[str] = set()
        self._sent: set[str] = set()

    def expect(self, req_ids: Iterable[str]) -> None:
        """These requests had saves in a step: each is confirmed once, at its finish."""
        for req_id in req_ids:
            self._puts_of.setdefault(req_id, 0)

    def admit(self, req_ids: Iterable[str], size_bytes: int) -> bool:
        """One PUT of ``size_bytes`` for these requests; False (dropped) past the backlog limit."""
        if self.pending_bytes + size_bytes > self.limit_bytes:
            return False
        self.pending_bytes += size_bytes
        for req_id in req_ids:
            self._puts_of[req_id] += 1
        return True

    def answered(self, req_ids: Iterable[str], size_bytes: int) -> None:
        """An admitted PUT was answered (or failed)."""
        self.pending_bytes -= size_bytes
        for req_id in req_ids:
            self._puts_of[req_id] -= 1
            if self._puts_of[req_id] == 0 and req_id in self._finished_unsent:
                self._finished_unsent.discard(req_id)
                del self._puts_of[req_id]
                self._sent.add(req_id)

    def finished(self, req_ids: Iterable[str]) -> set[str]:
        """Requests that finished and whose PUTs have all been answered, each reported once."""
        for req_id in req_ids:
            if req_id not in self._puts_of:
                continue  # never saved anything: the scheduler freed it at once
            if self._puts_of[req_id] == 0:
                del self._puts_of[req_id]
                self._sent.add(req_id)
            else:
                self._finished_unsent.add(req_id)
        done, self._sent = self._sent, set()
        return done
