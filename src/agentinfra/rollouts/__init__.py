"""RL rollouts: G agent episodes of one task as a group, each ending in a trajectory a trainer can use.

- `GroupRequest` (what a trainer asks: environment, task, G, its endpoint, model, policy
  version, budgets) becomes a `Group` (`new_group`: ids and the hidden grading seed the
  G rollouts share; nothing else is shared: each rollout is its own run directory,
  workspace and desktop).
- `run_rollout` runs one rollout as an agent run (`agentinfra.harness.run_agent`) graded
  with the group's seed, and returns its trajectory (`agentinfra.harness.trajectory_of`,
  docs/trajectory.md), an infra failure or a cancel labelled in it; `run_groups` runs
  many (``agentinfra rollouts run``).
- `RolloutService` serves groups, cancels and idempotent gradings over HTTP with a bounded
  queue, bearer tokens, Prometheus metrics and a journal that survives ``kill -9``
  (``agentinfra rollouts serve``); `AsyncRolloutClient` and `RolloutClient` are its clients.
  With a `RayPlacement` (``--ray``) it runs each rollout as a Ray task on a node that has
  the resources the episode declares, and its gradings as Ray tasks of their own.

This package sits beside `harness` and uses it, `environments`, `agent` and `sandbox`;
only `cli` imports it. Public names are re-exported here in one sorted `__all__`.
"""

from agentinfra.rollouts._book import Admission, GradeClaim, GradeLedger, RolloutBook, RolloutState
from agentinfra.rollouts._client import AsyncRolloutClient, RolloutClient
from agentinfra.rollouts._grading import GradeDesk, grade_key
from agentinfra.rollouts._orphans import sandbox_processes, sweep_orphaned_jails
from agentinfra.rollouts._ray import RayPlacement
from agentinfra.rollouts._runner import (
    SeededExecutor,
    infra_failure_of,
    read_trajectory,
    run_groups,
    run_rollout,
)
from agentinfra.rollouts._service import RolloutService, ServiceConfig
from agentinfra.rollouts._slots import GradingSlots, grading_cost
from agentinfra.rollouts._spec import (
    MAX_GROUP_SIZE,
    ROLLOUT_SCHEMA_VERSION,
    Group,
    GroupRequest,
    new_group,
)
from agentinfra.rollouts._thread import ServiceThread

__all__ = [
    "Admission",
    "AsyncRolloutClient",
    "GradeClaim",
    "GradeDesk",
    "GradeLedger",
    "GradingSlots",
    "Group",
    "GroupRequest",
    "MAX_GROUP_SIZE",
    "ROLLOUT_SCHEMA_VERSION",
    "RayPlacement",
    "RolloutBook",
    "RolloutClient",
    "RolloutService",
    "RolloutState",
    "SeededExecutor",
    "ServiceConfig",
    "ServiceThread",
    "grade_key",
    "grading_cost",
    "infra_failure_of",
    "new_group",
    "read_trajectory",
    "run_groups",
    "run_rollout",
    "sandbox_processes",
    "sweep_orphaned_jails",
]
