"""Rollouts on a Ray cluster: each episode a Ray task on a node that has what it declares.

The service (`RolloutService`, on the head node or any machine that can reach the
cluster) keeps the queue, the book and the journal; nothing of its state lives on a
worker. With ``ServiceConfig.ray`` set (`RayPlacement`), a rollout is one Ray task,
`_episode_remote`, that runs the agent loop and its environment (a kernels workspace, a
desktop) on whichever node Ray finds with the episode's resources (`episode_resources`:
CPUs, memory, custom resources), and returns the trajectory. The episode's gradings are
Ray tasks of their own (`agentinfra.harness.RayExecutor`), declaring CPUs, a GPU when the
grading asks for CUDA, and custom resources, so a grading pool can be sized apart from the
rollouts' nodes (``{"grading": 1}`` on the grading nodes).

Run directories stay under the service's ``state_dir/runs``, which every node must see at
the same path (a shared file system): an episode resumed after a crash, here or on another
node, continues from its journals there.

A node (or the episode's worker) that dies mid-episode is detected by Ray and raised at the
service as `ray.exceptions.NodeDiedError` (or a worker crash, a lost raylet or object); the
rollout is then resumed from its run directory, on a node Ray picks, at most
``node_retries`` times; after that it ends labelled ``node_lost``. Either way it ends in the
journal. After each loss the service sweeps every live node (`sweep_cluster`): jails whose
episode worker died are killed there, as the service's own sweep does at start.

Episodes are placed with Ray's ``SPREAD`` strategy (an episode is long and mostly waits on
the model: spreading them balances the nodes' tools and gradings); gradings with Ray's
default (the episode's node first, while it has room).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentinfra._settings import Settings
from agentinfra.agent import EndpointLimiter
from agentinfra.environments import environment_definition
from agentinfra.errors import ConfigError, RolloutError
from agentinfra.harness import RayExecutor
from agentinfra.rollouts._orphans import sweep_orphaned_jails
from agentinfra.rollouts._runner import read_trajectory, run_rollout
from agentinfra.rollouts._spec import Group

__all__ = [
    "DESKTOP_EPISODE_MEMORY_BYTES",
    "RayCluster",
    "RayPlacement",
    "Shortfall",
    "episode_resources",
    "unsatisfiable",
]

logger = logging.getLogger(__name__)

DESKTOP_EPISODE_MEMORY_BYTES = 8 << 30
"""A desktop episode's default memory: its session's memory limit (`DesktopSessionConfig`)."""
_DESKTOP_EPISODE_CPUS = 2.0
_CANCEL_WAIT_S = 5.0
_MAX_UNSTARTED = 3
"""Times an episode lost before it started on a node is placed again (it ran nothing)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RayPlacement:
    """Where the service's rollouts run on a Ray cluster, and what each declares there."""

    address: str
    """``auto`` (the cluster this machine is part of), ``local`` (start one here) or an address
    (``HOST:PORT`` of the head's GCS, ``ray://HOST:10001``)."""
    episode_cpus: float | None = None
    """CPUs an episode holds on its node; None: the environment's default (desktop 2, else 1)."""
    episode_memory_bytes: int | None = None
    """Memory an episode reserves; None: the environment's default (desktop 8 GiB, else none)."""
    episode_resources: Mapping[str, float] = field(default_factory=dict)
    """Custom Ray resources an episode needs (``{"rollout": 1}``)."""
    grading_cpus: float | None = None
    """CPUs a grading holds; None: its settings' ``threads`` (the cores a kernels grading pins)."""
    grading_gpus: float = 1.0
    """GPUs a CUDA grading holds (gradings on CPU declare none)."""
    grading_resources: Mapping[str, float] = field(default_factory=dict)
    """Custom Ray resources a grading needs (``{"grading": 1}``: a pool apart from the rollouts)."""
    node_retries: int = 1
    """Times a rollout whose node died is resumed elsewhere before it ends labelled ``node_lost``."""

    def __post_init__(self) -> None:
        if not self.address.strip():
            raise ConfigError("--ray '' must be auto, local or the cluster's address")
        numbers = {"--ray-episode-cpus": self.episode_cpus, "--ray-grading-cpus": self.grading_cpus,
                   "--ray-grading-gpus": self.grading_gpus,
                   "--ray-episode-memory-gib": self.episode_memory_bytes,
                   "--ray-node-retries": self.node_retries}  # fmt: skip
        for knob, value in numbers.items():
            if value is not None and not value >= 0:
                raise ConfigError(f"{knob} {value!r} must be >= 0")
        for knob, resources in (("--ray-episode-resource", self.episode_resources),
                                ("--ray-grading-resource", self.grading_resources)):  # fmt: skip
            for name, amount in resources.items():
                if not name or name in ("CPU", "GPU", "memory") or not amount > 0:
                    raise ConfigError(
                        f"{knob} {name}={amount!r}: a custom resource needs a name other than "
                        "CPU, GPU or memory and an amount > 0"
                    )


def episode_resources(placement: RayPlacement, environment: str) -> dict[str, float]:
    """What one episode of ``environment`` declares, in Ray's names (``CPU``, ``memory``, custom)."""
    is_desktop = environment == "desktop"
    cpus = placement.episode_cpus
    if cpus is None:
        cpus = _DESKTOP_EPISODE_CPUS if is_desktop else 1.0
    memory = placement.episode_memory_bytes
    if memory is None:
        memory = DESKTOP_EPISODE_MEMORY_BYTES if is_desktop else 0
    need = {"CPU": float(cpus), **placement.episode_resources}
    if memory:
        need["memory"] = float(memory)
    return need


def _amount(name: str, value: float) -> str:
    if name == "memory" or name == "object_store_memory":
        return f"{value / 2**30:.3g} GiB"
    return f"{value:g}"


@dataclass(frozen=True, slots=True)
class Shortfall:
    """Why no live node can ever hold a demand."""

    resource: str | None
    """The resource no node has enough of; None when each fits somewhere but not all on one node."""
    message: str


def unsatisfiable(
    need: Mapping[str, float], nodes: Sequence[Mapping[str, float]], what: str
) -> Shortfall | None:
    """Why no node of ``nodes`` (their total resources) can ever hold ``need``; None when one can.

    The message names the first resource no node has enough of, the need and the largest
    node's amount (or, when each fits somewhere but not all on one node, the whole need).
    """
    wanted = {k: v for k, v in need.items() if v > 0}
    if any(all(node.get(k, 0.0) >= v for k, v in wanted.items()) for node in nodes):
        return None
    for name, amount in wanted.items():
        largest = max((node.get(name, 0.0) for node in nodes), default=0.0)
        if largest < amount:
            return Shortfall(name, f"{what} needs {name}={_amount(name, amount)} but the largest "
                             f"live node has {name}={_amount(name, largest)}")  # fmt: skip
    shown = ", ".join(f"{k}={_amount(k, v)}" for k, v in wanted.items())
    return Shortfall(None, f"{what} needs {shown} on one node and no live node has all of it")


def _knob(side: str, resource: str | None) -> str:
    """The flag that sets ``resource`` for ``side`` (episode, grading)."""
    flags = {"CPU": f"--ray-{side}-cpus", "GPU": "--ray-grading-gpus",
             "memory": "--ray-episode-memory-gib"}  # fmt: skip
    if resource is None:
        return f"--ray-{side}-* or the cluster's nodes"
    return flags.get(resource, f"--ray-{side}-resource")


def _ray_options(need: Mapping[str, float]) -> dict[str, Any]:
    custom = {k: v for k, v in need.items() if k not in ("CPU", "GPU", "memory")}
    options: dict[str, Any] = {"num_cpus": need.get("CPU", 0.0), "num_gpus": need.get("GPU", 0.0),
                               "resources": custom}  # fmt: skip
    if need.get("memory"):
        options["memory"] = int(need["memory"])
    return options


@dataclass(frozen=True, slots=True)
class _EpisodeJob:
    """What travels to the node: everything `run_rollout` needs, and nothing of the service's state."""

    runs_dir: str
    group: dict[str, Any]
    rollout_id: str
    settings: Settings
    api_key: str
    eval_workers: int
    grading_cpus: float | None
    grading_gpus: float
    grading_resources: dict[str, float]


def _episode_remote(job: _EpisodeJob) -> Iterator[Any]:
    """Runs on a Ray node: yields the node's id, then the rollout's trajectory (`run_rollout`).

    A ``ray.cancel`` arrives as KeyboardInterrupt: the run is cancelled (its jails killed, its
    journals closed) and nothing more is yielded; the service reads the partial trajectory.
    """
    import ray

    yield ray.get_runtime_context().get_node_id()
    grader = RayExecutor(num_cpus_per_grading=job.grading_cpus, num_gpus_per_grading=job.grading_gpus,
                         resources=job.grading_resources)  # fmt: skip
    group = Group.from_json(job.group)

    async def episode() -> dict[str, Any]:
        return await run_rollout(
            Path(job.runs_dir), group, job.rollout_id, settings=job.settings, api_key=job.api_key,
            limiter=EndpointLimiter(max_in_flight=1), eval_workers=job.eval_workers, grader=grader,
        )  # fmt: skip

    try:
        trajectory = asyncio.run(episode())
    except KeyboardInterrupt:
        return
    yield trajectory


def _sweep_remote() -> list[int]:
    """Runs on one node: `sweep_orphaned_jails` there."""
    return sweep_orphaned_jails()


def _node_lost_errors() -> tuple[type[BaseException], ...]:
    from ray import exceptions as rex

    return (rex.NodeDiedError, rex.WorkerCrashedError, rex.LocalRayletDiedError,
            rex.ObjectLostError, rex.RaySystemError)  # fmt: skip


class RayCluster:
    """The service's handle on the cluster: feasibility checks, episodes as Ray tasks, sweeps."""

    def __init__(self, placement: RayPlacement) -> None:
        """Connects to (or, for ``local``, starts) the cluster.

        Raises:
            RolloutError: Ray is not installed, or the cluster cannot be reached.
        """
        try:
            import ray
        except ImportError:
            raise RolloutError("--ray needs Ray: pip install 'agentinfra[ray]'") from None
        self.placement = placement
        self._ray = ray
        if not ray.is_initialized():
            address = None if placement.address == "local" else placement.address
            if address is not None:
                _probe(address)
            try:
                ray.init(address=address, include_dashboard=False, log_to_driver=False)
            except Exception as exc:  # Ray raises many types for an unreachable cluster
                raise RolloutError(
                    f"cannot reach the Ray cluster at --ray {placement.address}: "
                    f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
                ) from None
        self._episode = ray.remote(_episode_remote)
        self._sweep = ray.remote(_sweep_remote)
        self._lost = _node_lost_errors()
        self.lost_nodes: set[str] = set()
        self._background: set[asyncio.Task[list[int]]] = set()

    def nodes(self) -> dict[str, dict[str, float]]:
        """Live node id -> its total resources."""
        listed: list[dict[str, Any]] = self._ray.nodes()  # type: ignore[no-untyped-call]
        return {n["NodeID"]: dict(n["Resources"]) for n in listed if n["Alive"]}

    def check(self, environment: str, settings: Settings, *, concurrency: int = 1) -> None:
        """Refuses a group no live node could ever run: its episode or its grading fits no node, or
        ``concurrency`` episodes would hold every CPU a grading could get.

        Raises:
            ConfigError: one line naming the resource, the need, what the cluster has and the knob.
        """
        nodes = list(self.nodes().values())
        grading_settings = environment_definition(environment).new_settings(settings)
        grading = RayExecutor.resources_of(grading_settings, num_cpus=self.placement.grading_cpus,
                                           num_gpus=self.placement.grading_gpus,
                                           resources=self.placement.grading_resources)  # fmt: skip
        for side, need in (("episode", episode_resources(self.placement, environment)),
                           ("grading", grading)):  # fmt: skip
            short = unsatisfiable(need, nodes, f"a {environment} {side}")
            if short is not None:
                raise ConfigError(f"{short.message} ({_knob(side, short.resource)})")
        episode_cpus = episode_resources(self.placement, environment)["CPU"]
        total = sum(node.get("CPU", 0.0) for node in nodes)
        if grading["CPU"] > 0 and concurrency * episode_cpus + grading["CPU"] > total:
            raise ConfigError(
                f"--concurrency {concurrency} {environment} episodes (CPU={episode_cpus:g} each) and "
                f"a grading (CPU={grading['CPU']:g}) need CPU={concurrency * episode_cpus + grading['CPU']:g} "
                f"but the live nodes have CPU={total:g} in all: gradings would wait forever for CPUs "
                "the episodes hold (lower --concurrency or --ray-episode-cpus)"
            )

    async def sweep(self) -> list[int]:
        """`sweep_orphaned_jails` on every live node; the uids swept (sorted, once each)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        refs = [
            self._sweep.options(
                num_cpus=0, max_retries=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            ).remote()
            for node in self.nodes()
        ]  # fmt: skip
        swept: set[int] = set()
        for ref in refs:
            try:
                uids: list[int] = await asyncio.wait_for(asyncio.wrap_future(ref.future()), 60.0)
                swept.update(uids)
            except Exception as exc:  # a node that died meanwhile has nothing left to sweep
                logger.warning("sweep on a node failed: %s: %s", type(exc).__name__, exc)
        return sorted(swept)

    async def run_rollout(
        self,
        runs_dir: Path,
        group: Group,
        rollout_id: str,
        *,
        settings: Settings,
        api_key: str,
        eval_workers: int,
        cancel_reason: Callable[[], str | None],
    ) -> dict[str, Any]:
        """Runs one rollout as a Ray task to its trajectory, resumed after a lost node (``node_retries``).

        The trajectory's ``rollout`` record gains ``node_id`` (the node that ran it, or the last
        one lost) and ``lost_nodes``. A cancel with ``cancel_reason()`` set cancels the task and
        returns the partial trajectory labelled ``cancelled``; any other cancel propagates.
        """
        placement = self.placement
        job = _EpisodeJob(
            str(runs_dir), group.to_json(), rollout_id, settings, api_key, eval_workers,
            placement.grading_cpus, placement.grading_gpus, dict(placement.grading_resources),
        )  # fmt: skip
        options = _ray_options(episode_resources(placement, group.request.environment))
        lost: list[str] = []
        unstarted = 0
        started = time.monotonic()
        trajectory: dict[str, Any] | None = None
        while True:
            node: list[str] = []
            failure: dict[str, str] | None = None
            try:
                trajectory = await self._attempt(job, options, node, cancel_reason)
            except self._lost as exc:
                if (
                    not node and unstarted < _MAX_UNSTARTED
                ):  # lost on its way to a node: nothing ran
                    unstarted += 1
                    continue
                lost.append(node[0] if node else "?")
                self.lost_nodes.update(lost)
                logger.warning(
                    "rollout %s: node %s lost (%s)", rollout_id, lost[-1], type(exc).__name__
                )
                self._sweep_soon()
                if len(lost) <= placement.node_retries:
                    continue  # resumed from its run directory on a node Ray picks
                failure, trajectory = _failure("node_lost", exc), None
            except (
                Exception
            ) as exc:  # the task itself failed (not the episode: run_rollout labels that)
                logger.exception("rollout %s: its Ray task failed", rollout_id)
                failure, trajectory = _failure("internal", exc), None
            break
        if trajectory is None:
            trajectory = await asyncio.to_thread(
                read_trajectory, runs_dir / rollout_id, group, failure=failure,
                cancelled=cancel_reason(),
            )  # fmt: skip
        record = trajectory.setdefault("rollout", {})
        if "service_wall_s" in record:  # the episode's own time on its node
            record["node_wall_s"] = record["service_wall_s"]
        record["service_wall_s"] = round(time.monotonic() - started, 3)  # placement included
        record["node_id"] = node[0] if node else (lost[-1] if lost else None)
        record["lost_nodes"] = lost
        return trajectory

    def _sweep_soon(self) -> None:
        """Sweeps every live node in the background (a resumed episode need not wait for it)."""
        task = asyncio.create_task(self.sweep())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _attempt(
        self,
        job: _EpisodeJob,
        options: dict[str, Any],
        node: list[str],
        cancel_reason: Callable[[], str | None],
    ) -> dict[str, Any] | None:
        """One Ray task of the episode; its node id goes into ``node`` as soon as it starts.

        Returns None when cancelled with a reason (the caller reads the partial trajectory).
        """
        stream = self._episode.options(
            num_returns="streaming", max_retries=0, scheduling_strategy="SPREAD", **options
        ).remote(job)
        try:
            node.append(await _next(stream))
            trajectory: dict[str, Any] = await _next(stream)
            return trajectory
        except asyncio.CancelledError:
            self._ray.cancel(stream)
            if cancel_reason() is None:
                raise
            with contextlib.suppress(Exception):  # the worker closes the run's journals, then ends
                await asyncio.wait_for(_next(stream), _CANCEL_WAIT_S)
            return None

    def close(self) -> None:
        """Disconnects from the cluster: Ray ends this service's episode tasks with it."""
        with contextlib.suppress(Exception):
            self._ray.shutdown()


def _probe(address: str, timeout_s: float = 10.0) -> None:
    """Refuses a ``HOST:PORT`` (or ``ray://HOST:PORT``) nothing listens on: `ray.init` would wait forever.

    Raises:
        RolloutError: the address does not accept a TCP connection within ``timeout_s``.
    """
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # "auto" and other forms Ray resolves itself
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise RolloutError(
            f"cannot reach the Ray cluster at --ray {address}: {exc.strerror or exc} "
            "(start its head with `ray start --head`, or give its address)"
        ) from None


def _failure(kind: str, exc: BaseException) -> dict[str, str]:
    return {"kind": kind, "message": f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:2000]}


async def _next(stream: Any) -> Any:
    ref = await stream.__anext__()
    return await ref
