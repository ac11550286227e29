"""`RolloutService`: groups of rollouts and idempotent gradings over HTTP (aiohttp), crash-safe.

Routes (JSON bodies; every error is ``{"error": "<one line>"}`` with a 4xx status)::

    POST /v1/groups                      GroupRequest -> 202 {group_id, rollout_ids}   (429 + Retry-After when full)
    GET  /v1/groups/{gid}                the group's rollouts and their states
    GET  /v1/groups/{gid}/trajectories   NDJSON: each trajectory as it finishes, until all G have
    GET  /v1/rollouts/{rid}?wait_s=S     {rollout_id, state, trajectory | null} (waits up to S s)
    POST /v1/rollouts/{rid}/cancel       {reason} -> the (partial) trajectory, labelled cancelled
    POST /v1/grade                       {environment, task, submission_b64, name} -> the verdict (idempotent)
    GET  /metrics                        Prometheus text
    GET  /v1/health

Crash safety: every accepted group is journalled (fsync'd) before it is acknowledged;
each trajectory is written (atomically) before its rollout is journalled finished.
On start the journal is replayed: finished rollouts keep their trajectories, a rollout
whose cancel was journalled is finished as cancelled from its run directory, and the
others are queued again and resume from their run directories' journals. Jails left by
a killed service are swept (`sweep_orphaned_jails`) before anything starts.
Answers to ``/v1/grade`` are stored by key, so a repeat after a restart grades nothing.

Bad input never reaches the queue: an unknown environment or task, a group size out of
range, an endpoint that does not answer or does not serve the model are refused with
one line, and an accepted group is never dropped.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from pydantic import ValidationError

from agentinfra._atomic import write_atomic
from agentinfra._journal import Journal
from agentinfra._pidlock import try_lock
from agentinfra._settings import Settings
from agentinfra.agent import EndpointLimiter, preflight, probe_tokens
from agentinfra.environments import environment_definition
from agentinfra.errors import AgentError, AgentInfraError, ConfigError, RolloutError
from agentinfra.rollouts._book import RolloutBook, RolloutState
from agentinfra.rollouts._grading import GradeDesk
from agentinfra.rollouts._orphans import sweep_orphaned_jails
from agentinfra.rollouts._ray import RayCluster, RayPlacement
from agentinfra.rollouts._runner import read_trajectory, run_rollout
from agentinfra.rollouts._slots import GradingSlots
from agentinfra.rollouts._spec import Group, GroupRequest, new_group
from agentinfra.sandbox import MemoryLedger

__all__ = ["PROBE_TTL_S", "RolloutService", "ServiceConfig"]

PROBE_TTL_S = 30.0
"""How long an endpoint's preflight and token probe are trusted before a new group checks again."""

logger = logging.getLogger(__name__)


class _ServiceJournal(Journal):
    error_class = RolloutError


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceConfig:
    """How the rollout service listens, how much it runs at once and how much it queues."""

    state_dir: Path
    """Journal, trajectories, gradings and the rollouts' run directories."""
    host: str = "127.0.0.1"
    port: int = 7490
    concurrency: int = 8
    """Rollouts running at once."""
    max_pending: int = 64
    """Rollouts queued or running; a group that does not fit gets 429."""
    max_grades_in_flight: int = 4
    grade_timeout_s: float = 600.0
    """A grading not done by then is answered as an infra failure (``grader_error``)."""
    cancel_grace_s: float = 4.0
    """How long a cancel waits for the run to end before answering from its journals."""
    tokens: frozenset[str] | None = None
    """Bearer tokens a request must present; None: none needed (loopback only by default)."""
    check_endpoint: bool = True
    """Preflight the trainer's endpoint and model before a group is accepted."""
    eval_workers: int = 1
    grading_slots: int | None = None
    """Cores that gradings (the rollouts' and ``POST /v1/grade``'s) may occupy at once; None:
    the machine's CPUs less one (`GradingSlots`)."""
    ray: RayPlacement | None = None
    """Run each rollout as a task on this Ray cluster (``--ray``; `agentinfra.rollouts._ray`);
    None: in this process. The queue, the book and the journal stay here either way."""
    desktop_pool: int = 0
    """Desktops kept started and ready for desktop episodes (`agentinfra.environments.desktop.DesktopPool`,
    default shape only); 0: each episode starts its own."""

    def __post_init__(self) -> None:
        GradingSlots(self.grading_slots)  # a bad value is refused here, before anything starts
        pool = self.desktop_pool  # 64: the desktop's MAX_POOL_SIZE
        if isinstance(pool, bool) or not isinstance(pool, int) or not 0 <= pool <= 64:
            raise ConfigError(
                f"desktop_pool={self.desktop_pool!r} must be in 0..64 (--desktop-pool)"
            )
        if self.ray is not None and self.desktop_pool:
            raise ConfigError(
                f"--desktop-pool {self.desktop_pool} keeps desktops in the service's process, and with "
                "--ray episodes run on the cluster's nodes: they would never use them (drop one of the two)"
            )
        for name in ("concurrency", "max_pending", "max_grades_in_flight", "eval_workers"):
            if getattr(self, name) < 1:
                raise ConfigError(
                    f"{name}={getattr(self, name)} must be >= 1 (--{name.replace('_', '-')})"
                )
        if self.max_pending < self.concurrency:
            raise ConfigError(
                f"max_pending={self.max_pending} must be >= concurrency={self.concurrency} (--max-pending)"
            )


class _RefusedError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


def _one_line(text: str) -> str:
    return " ".join(str(text).split())[:1000]


@dataclass
class _Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.queue_depth = Gauge("agentinfra_rollouts_queue_depth", "Rollouts waiting to start",
                                 registry=self.registry)  # fmt: skip
        self.http_s = Histogram(
            "agentinfra_rollouts_http_seconds", "Time the service spends answering a request",
            ["route"], registry=self.registry,
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1, 5, 30),
        )  # fmt: skip
        self.call_overhead_s = Histogram(
            "agentinfra_rollouts_call_overhead_seconds",
            "Per model call: a rollout's wall time less model and tool time (gradings overlap them), over its calls",
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1),
        )  # fmt: skip
        self.grade_s = Histogram("agentinfra_grade_seconds", "Gradings of POST /v1/grade",
                                 registry=self.registry)  # fmt: skip
        self.grades = Gauge(
            "agentinfra_grades_total", "Distinct gradings started", registry=self.registry
        )


class _StateCollector:
    def __init__(self, book: RolloutBook, slots: GradingSlots) -> None:
        self.book = book
        self.slots = slots

    def collect(self) -> Any:
        family = GaugeMetricFamily("agentinfra_rollouts", "Rollouts by state", labels=["state"])
        for state, count in sorted(self.book.counts().items()):
            family.add_metric([state], count)
        yield family
        cores = GaugeMetricFamily(
            "agentinfra_grading_slots",
            "Cores of the grading pool (--grading-slots)",
            labels=["state"],
        )
        cores.add_metric(["busy"], self.slots.slots - self.slots.free)
        cores.add_metric(["free"], self.slots.free)
        yield cores
        yield GaugeMetricFamily(
            "agentinfra_gradings_waiting", "Gradings waiting for cores", value=self.slots.waiting
        )
        memory = MemoryLedger().view()  # the host's: every grading process of this user
        yield GaugeMetricFamily(
            "agentinfra_gradings_waiting_memory",
            "Gradings on this host waiting for memory (the host's memory ledger)",
            value=memory.waiting,
        )
        yield GaugeMetricFamily(
            "agentinfra_grading_memory_reserved_bytes",
            "Memory reserved by gradings on this host (the host's memory ledger)",
            value=memory.held_bytes,
        )


class RolloutService:
    """Runs accepted groups, at most ``concurrency`` rollouts at once; answers HTTP; survives kill -9."""

    def __init__(
        self,
        config: ServiceConfig,
        settings: Settings,
        *,
        api_key_of: Callable[[str], str],
        on_group_done: Callable[[Group], Awaitable[None]] | None = None,
    ) -> None:
        self.config = config
        self.settings = settings
        self.api_key_of = api_key_of
        self.on_group_done = on_group_done
        self.book = RolloutBook(config.max_pending, config.concurrency)
        self.slots = GradingSlots(config.grading_slots)
        self.desk = GradeDesk(
            config.state_dir / "grades", settings, max_in_flight=config.max_grades_in_flight,
            timeout_s=config.grade_timeout_s, slots=self.slots,
            observe=lambda s: self.metrics.grade_s.observe(s),
        )  # fmt: skip
        self.groups: dict[str, Group] = {}
        self.group_of: dict[str, str] = {}
        self.metrics = _Metrics()
        self.metrics.registry.register(_StateCollector(self.book, self.slots))
        self.swept_uids: list[int] = []
        self.cluster: RayCluster | None = None
        self._limiter = EndpointLimiter(max_in_flight=config.concurrency)
        self._tasks: dict[str, asyncio.Task[dict[str, Any]]] = {}
        self._cancel_reasons: dict[str, str] = {}
        self._finished: dict[str, asyncio.Event] = {}
        self._group_changed: dict[str, asyncio.Condition] = {}
        self._preflighted: dict[tuple[str, str, bool | None], tuple[float, bool]] = {}
        self._work = asyncio.Event()
        self._workers: list[asyncio.Task[None]] = []
        self._runner: web.AppRunner | None = None
        self._lock_fd: int | None = None
        self._journal: _ServiceJournal | None = None
        self.port = config.port
        self._desktop_pool: Any = None  # a DesktopPool while --desktop-pool N > 0 (below)

    # -- paths ---------------------------------------------------------------------

    @property
    def runs_dir(self) -> Path:
        return self.config.state_dir / "runs"

    def _trajectory_path(self, rid: str) -> Path:
        return self.config.state_dir / "trajectories" / f"{rid}.json"

    # -- life ----------------------------------------------------------------------

    async def start(self) -> None:
        """Locks the state directory, sweeps orphaned jails, replays the journal, starts workers and HTTP.

        Raises:
            RolloutError: another live service holds the state directory, or its journal is corrupt.
        """
        state = self.config.state_dir
        for sub in ("runs", "trajectories", "grades"):
            (state / sub).mkdir(parents=True, exist_ok=True)
        held = try_lock(state / "service.lock")
        if isinstance(held, str):
            raise RolloutError(
                f"{state} is served by live process {held}; stop it or use another --state-dir"
            )
        self._lock_fd = held
        self.swept_uids = await asyncio.to_thread(sweep_orphaned_jails)
        if self.config.ray is not None:
            self.cluster = await asyncio.to_thread(RayCluster, self.config.ray)
            self.swept_uids = sorted({*self.swept_uids, *await self.cluster.sweep()})
        self._journal = _ServiceJournal.open(state / "service.jsonl")
        await self._recover()
        self._workers = [
            asyncio.create_task(self._worker()) for _ in range(self.config.concurrency)
        ]
        app = web.Application(middlewares=[self._middleware], client_max_size=64 * 1024 * 1024)
        app.add_routes([
            web.post("/v1/groups", self._post_group),
            web.get("/v1/groups/{gid}", self._get_group),
            web.get("/v1/groups/{gid}/trajectories", self._stream_group),
            web.get("/v1/rollouts/{rid}", self._get_rollout),
            web.post("/v1/rollouts/{rid}/cancel", self._cancel),
            web.post("/v1/grade", self._grade),
            web.get("/v1/health", self._health),
            web.get("/metrics", self._metrics),
        ])  # fmt: skip
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        await self._start_desktop_pool()  # last: a start that fails before leaves no pool running

    async def close(self) -> None:
        """Stops HTTP and the workers; running rollouts are cancelled and resume on the next start."""
        if self._runner is not None:
            await self._runner.cleanup()
        for task in [*self._workers, *self._tasks.values()]:
            task.cancel()
        for task in [*self._workers, *self._tasks.values()]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._stop_desktop_pool()
        if self._journal is not None:
            self._journal.close()
        if self.cluster is not None:
            self.cluster.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- the desktop pool (issue 31): started last (after the sweep and HTTP), closed after the workers

    async def _start_desktop_pool(self) -> None:
        if self.config.desktop_pool > 0:  # only a service that pools pays the desktop's import
            from agentinfra.environments.desktop import DesktopPool

            self._desktop_pool = DesktopPool(size=self.config.desktop_pool)
            await self._desktop_pool.start()

    async def _stop_desktop_pool(self) -> None:
        pool, self._desktop_pool = self._desktop_pool, None
        if pool is not None:
            await pool.close()

    async def _recover(self) -> None:
        assert self._journal is not None
        finished: dict[str, str] = {}
        cancels: dict[str, str] = {}
        groups: list[Group] = []
        for event in self._journal.events:
            if event.type == "group_accepted":
                groups.append(Group.from_json(event.data))
            elif event.type == "rollout_finished":
                finished[event.data["rollout_id"]] = event.data["label"]
            elif event.type == "cancel_requested":
                cancels[event.data["rollout_id"]] = event.data["reason"]
        resumed: list[str] = []
        for group in groups:
            self._adopt(group, force=True)
            for rid in group.rollout_ids:
                if rid in finished:
                    self.book.finish(rid, finished[rid])
                    self._finished[rid].set()
                elif rid in cancels:
                    trajectory = await asyncio.to_thread(
                        read_trajectory, self.runs_dir / rid, group, cancelled=cancels[rid]
                    )
                    await self._store(rid, trajectory, "cancelled")
                else:
                    resumed.append(rid)
        if groups:
            self._journal.append(
                "service_restarted", {"resumed": resumed, "swept_uids": self.swept_uids}
            )
        self._work.set()

    def _adopt(self, group: Group, *, force: bool) -> bool | int:
        admission = self.book.admit(group.group_id, group.rollout_ids, force=force)
        if not admission.is_accepted:
            return admission.retry_after_s
        self.groups[group.group_id] = group
        self._group_changed[group.group_id] = asyncio.Condition()
        for rid in group.rollout_ids:
            self.group_of[rid] = group.group_id
            self._finished[rid] = asyncio.Event()
        return True

    def _forget(self, group: Group) -> None:
        self.groups.pop(group.group_id, None)
        self._group_changed.pop(group.group_id, None)
        for rid in group.rollout_ids:
            self.group_of.pop(rid, None)
            self._finished.pop(rid, None)

    # -- running -------------------------------------------------------------------

    async def _worker(self) -> None:
        while True:
            rid = self.book.next_queued()
            if rid is None:
                self._work.clear()
                await self._work.wait()
                continue
            self.metrics.queue_depth.set(self.book.queue_depth)
            await self._run_one(rid)

    async def _run_one(self, rid: str) -> None:
        """Runs one rollout to its trajectory and files it (unless a cancel filed it first)."""
        group = self.groups[self.group_of[rid]]
        self.book.started(rid, time.monotonic())
        try:
            api_key = self.api_key_of(group.request.api_key_env)
            task = asyncio.create_task(
                self.cluster.run_rollout(
                    self.runs_dir, group, rid, settings=self.settings, api_key=api_key,
                    eval_workers=self.config.eval_workers,
                    cancel_reason=lambda: self._cancel_reasons.get(rid),
                ) if self.cluster is not None else run_rollout(
                    self.runs_dir, group, rid, settings=self.settings, api_key=api_key,
                    limiter=self._limiter, eval_workers=self.config.eval_workers, slots=self.slots,
                    cancel_reason=lambda: self._cancel_reasons.get(rid),
                )
            )  # fmt: skip
            self._tasks[rid] = task
            trajectory = await asyncio.shield(task)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # run_rollout labels failures; this is a failure around it
            logger.exception("rollout %s", rid)
            failure = {"kind": "internal", "message": _one_line(f"{type(exc).__name__}: {exc}")}
            trajectory = await asyncio.to_thread(
                read_trajectory, self.runs_dir / rid, group, failure=failure
            )
        finally:
            self._tasks.pop(rid, None)
        if self.book.state_of(rid) is not RolloutState.FINISHED:
            await self._store(rid, trajectory, _label(trajectory))

    async def _store(self, rid: str, trajectory: dict[str, Any], label: str) -> None:
        """Files a finished rollout: its trajectory (atomic), then the journal (fsync'd), then the waiters."""
        assert self._journal is not None
        data = json.dumps(trajectory, ensure_ascii=False).encode()
        await asyncio.to_thread(write_atomic, self._trajectory_path(rid), data)
        await self._journal.append_async("rollout_finished", {"rollout_id": rid, "label": label})
        self.book.finish(rid, label, time.monotonic())
        self._observe_overhead(trajectory)
        self._finished[rid].set()
        gid = self.group_of[rid]
        async with self._group_changed[gid]:
            self._group_changed[gid].notify_all()
        group = self.groups[gid]
        if self.on_group_done is not None and all(
            self.book.state_of(r) is RolloutState.FINISHED for r in group.rollout_ids
        ):
            with contextlib.suppress(Exception):
                await self.on_group_done(group)

    def _observe_overhead(self, trajectory: dict[str, Any]) -> None:
        times, calls = trajectory.get("time"), trajectory.get("calls") or []
        if not isinstance(times, dict) or not calls:
            return
        try:
            rest = float(times["wall_s"]) - sum(
                float(times.get(k) or 0.0) for k in ("model_s", "tools_s")
            )
        except (KeyError, TypeError, ValueError):
            return
        self.metrics.call_overhead_s.observe(max(0.0, rest) / len(calls))

    def _trajectory(self, rid: str) -> dict[str, Any] | None:
        path = self._trajectory_path(rid)
        if self.book.state_of(rid) is not RolloutState.FINISHED or not path.is_file():
            return None
        result: dict[str, Any] = json.loads(path.read_bytes())
        return result

    # -- HTTP ----------------------------------------------------------------------

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        started = time.perf_counter()
        route = (
            request.match_info.route.resource.canonical
            if request.match_info.route.resource
            else "?"
        )
        try:
            if self.config.tokens is not None and request.path != "/v1/health":
                auth = request.headers.get("Authorization", "")
                if not auth.startswith("Bearer ") or auth[7:].strip() not in self.config.tokens:
                    raise _RefusedError(
                        401, "missing or unknown bearer token (the service runs with --token-file)"
                    )
            return await handler(request)
        except _RefusedError as refused:
            return web.json_response({"error": _one_line(str(refused))}, status=refused.status,
                                     headers=refused.headers)  # fmt: skip
        except web.HTTPException as exc:
            return web.json_response(
                {"error": _one_line(exc.reason or str(exc))}, status=exc.status
            )
        finally:
            self.metrics.http_s.labels(route).observe(time.perf_counter() - started)

    async def _body(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError) as exc:
            raise _RefusedError(400, f"the body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise _RefusedError(400, f"the body must be a JSON object, not {type(body).__name__}")
        return body

    async def _post_group(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        try:
            group_request = GroupRequest.model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            raise _RefusedError(
                422, f"{where}: {first['msg']} (got {first.get('input')!r:.80})"
            ) from None
        capture_tokens = await self._check(group_request)
        group = new_group(group_request, capture_tokens=capture_tokens)
        retry = self._adopt(group, force=False)
        if retry is not True:
            raise _RefusedError(
                429, f"the queue is full ({self.book.pending} rollouts pending, max {self.config.max_pending}); "
                f"retry after {retry} s", {"Retry-After": str(retry)},
            )  # fmt: skip
        assert self._journal is not None
        try:
            await self._journal.append_async("group_accepted", group.to_json())
        except BaseException:
            self.book.withdraw(group.group_id)  # not acknowledged, so not run: the client may retry
            self._forget(group)
            raise
        self._work.set()
        self.metrics.queue_depth.set(self.book.queue_depth)
        return web.json_response(
            {"group_id": group.group_id, "rollout_ids": list(group.rollout_ids)}, status=202
        )

    async def _check(self, request: GroupRequest) -> bool:
        """Refuses (400) what could never run: environment, task, options, loop values, endpoint, model.

        Returns whether the group's rollouts ask the engine for token ids (`probe_tokens`,
        once per endpoint and model every `PROBE_TTL_S`).
        """
        try:
            definition = environment_definition(request.environment)
            task = Path(request.task)
            if not task.is_file():
                raise ConfigError(f"no task file at {request.task} (task)")
            await asyncio.to_thread(definition.load_task, task)
            definition.options_of(request.options, knob="options")
            request.loop_config()
            key = self.api_key_of(request.api_key_env)
            if self.cluster is not None:
                await asyncio.to_thread(self.cluster.check, request.environment, self.settings,
                                        concurrency=self.config.concurrency)  # fmt: skip
        except ConfigError as exc:
            raise _RefusedError(400, str(exc)) from None
        except AgentInfraError as exc:
            raise _RefusedError(400, f"{type(exc).__name__}: {exc}") from None
        if request.tokens is False:
            capture: bool | None = False
        elif not self.config.check_endpoint:
            capture = bool(request.tokens)
        else:
            capture = None
        if not self.config.check_endpoint:
            return bool(capture)
        checked = (request.base_url.rstrip("/"), request.model, request.tokens)
        known = self._preflighted.get(checked)
        if known is not None and time.monotonic() - known[0] < PROBE_TTL_S:
            return known[1] if capture is None else capture
        try:
            await preflight(base_url=checked[0], model=request.model, api_key=key,
                            api_key_env=request.api_key_env, timeout_s=10.0)  # fmt: skip
        except AgentError as exc:
            raise _RefusedError(400, str(exc)) from None
        if capture is None:
            support = await probe_tokens(base_url=checked[0], model=request.model, api_key=key,
                                         force=bool(request.tokens))  # fmt: skip
            capture = support.is_available
            logger.info("tokens at %s: %s", checked[0], support.detail)
        self._preflighted[checked] = (time.monotonic(), capture)
        return capture

    def _group(self, request: web.Request) -> Group:
        gid = request.match_info["gid"]
        group = self.groups.get(gid)
        if group is None:
            raise _RefusedError(404, f"no group {gid!r} here")
        return group

    async def _get_group(self, request: web.Request) -> web.Response:
        group = self._group(request)
        rollouts = []
        for rid in group.rollout_ids:
            entry = self.book.entries[rid]
            rollouts.append({"rollout_id": rid, "state": entry.state.value, "label": entry.label})
        return web.json_response({"group_id": group.group_id, "rollouts": rollouts,
                                  "finished": sum(r["state"] == "finished" for r in rollouts)})  # fmt: skip

    async def _stream_group(self, request: web.Request) -> web.StreamResponse:
        group = self._group(request)
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        sent: set[str] = set()
        condition = self._group_changed[group.group_id]
        while len(sent) < len(group.rollout_ids):
            for rid in group.rollout_ids:
                if rid not in sent and self.book.state_of(rid) is RolloutState.FINISHED:
                    trajectory = await asyncio.to_thread(self._trajectory, rid)
                    await response.write(
                        json.dumps(trajectory, ensure_ascii=False).encode() + b"\n"
                    )
                    sent.add(rid)
            if len(sent) < len(group.rollout_ids):
                async with condition:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(condition.wait(), 5.0)
        await response.write_eof()
        return response

    def _rollout_id(self, request: web.Request) -> str:
        rid = request.match_info["rid"]
        if rid not in self.group_of:
            raise _RefusedError(404, f"no rollout {rid!r} here")
        return rid

    async def _get_rollout(self, request: web.Request) -> web.Response:
        rid = self._rollout_id(request)
        try:
            wait_s = min(float(request.query.get("wait_s", "0")), 300.0)
        except ValueError:
            raise _RefusedError(
                400, f"wait_s={request.query['wait_s']!r} must be a number of seconds"
            ) from None
        if wait_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._finished[rid].wait(), wait_s)
        state = self.book.state_of(rid)
        assert state is not None
        trajectory = await asyncio.to_thread(self._trajectory, rid)
        return web.json_response(
            {"rollout_id": rid, "state": state.value, "trajectory": trajectory}
        )

    async def _cancel(self, request: web.Request) -> web.Response:
        rid = self._rollout_id(request)
        body = await self._body(request) if request.can_read_body else {}
        reason = _one_line(str(body.get("reason") or "cancelled by the trainer"))
        state = self.book.state_of(rid)
        group = self.groups[self.group_of[rid]]
        if state is RolloutState.FINISHED:
            trajectory = await asyncio.to_thread(self._trajectory, rid)
            return web.json_response(
                {"rollout_id": rid, "state": "finished", "trajectory": trajectory}
            )
        assert self._journal is not None
        await self._journal.append_async("cancel_requested", {"rollout_id": rid, "reason": reason})
        self._cancel_reasons[rid] = reason
        task = self._tasks.get(rid)
        if task is not None:
            task.cancel()
            with contextlib.suppress(TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(
                    asyncio.shield(self._finished[rid].wait()), self.config.cancel_grace_s
                )
        if self.book.state_of(rid) is not RolloutState.FINISHED:  # queued, or still cleaning up
            trajectory = await asyncio.to_thread(
                read_trajectory, self.runs_dir / rid, group, cancelled=reason
            )
            await self._store(rid, trajectory, "cancelled")
            late = self._tasks.get(rid)  # a worker took it while the cancel was being journalled
            if late is not None and late is not task:
                late.cancel()
        trajectory = await asyncio.to_thread(self._trajectory, rid)
        return web.json_response({"rollout_id": rid, "state": "finished", "trajectory": trajectory})

    async def _grade(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        fields = (body.get("environment"), body.get("task"), body.get("name", "submission"))
        environment, task, name = fields
        if not all(isinstance(f, str) for f in fields):
            raise _RefusedError(422, "environment, task and name must be strings")
        try:
            data = base64.b64decode(str(body.get("submission_b64", "")), validate=True)
        except (binascii.Error, ValueError):
            raise _RefusedError(422, "submission_b64 must be base64") from None
        if not data:
            raise _RefusedError(422, "submission_b64 is empty")
        try:
            answer = await self.desk.grade(str(environment), str(task), str(name), data)
        except AgentInfraError as exc:
            raise _RefusedError(400, str(exc)) from None
        finally:
            self.metrics.grades.set(self.desk.ledger.gradings)
        if answer is None:
            raise _RefusedError(
                429, f"{self.config.max_grades_in_flight} gradings are running; retry after 5 s",
                {"Retry-After": "5"},
            )  # fmt: skip
        return web.json_response(answer)

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"ok": True, "pending": self.book.pending, "queue_depth": self.book.queue_depth}
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        self.metrics.queue_depth.set(self.book.queue_depth)
        return web.Response(body=generate_latest(self.metrics.registry),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})  # fmt: skip


def _label(trajectory: dict[str, Any]) -> str:
    failure = trajectory.get("infra_failure")
    if isinstance(failure, dict) and failure.get("kind"):
        return str(failure["kind"])
    return "ok"
