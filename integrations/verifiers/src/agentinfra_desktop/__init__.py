"""`vf-eval agentinfra-desktop`: agentinfra's desktop tasks (OSWorld JSON) as a verifiers taskset.

One task per task file under ``--env.taskset.tasks-dir`` (default: this repository's
``examples/desktop/tasks``). A desktop's submission is its end state, made by an agent that
acts on it, so each rollout is a whole agentinfra rollout run by the rollout service
(`ServiceRolloutHarness`: a group of one, agentinfra's agent loop in a jailed desktop, the
run's model at the run's endpoint) and graded there in isolation. The reward is that
trajectory's reward (1 when the final verdict passed, else 0; 0 when hack-flagged); a
trajectory labelled with an ``infra_failure`` raises, so verifiers records the rollout as
errored instead of scoring it 0.

The service reads the endpoint's key from its own environment, in the variable the run's
client names (``--client.api-key-var``): keys never travel. The model calls go from the
service to the endpoint directly, so verifiers' trace holds no turns; the trajectory's
run id, reward, labels and per-turn rewards are in ``trace.info["agentinfra_rollout"]``.
"""

from agentinfra_verifiers import LocalEnv, ServiceRolloutHarness

from agentinfra_desktop._taskset import (
    DesktopData,
    DesktopTask,
    DesktopTaskConfig,
    DesktopTaskset,
    DesktopTasksetConfig,
)

__all__ = [
    "DesktopData",
    "DesktopTask",
    "DesktopTaskConfig",
    "DesktopTaskset",
    "DesktopTasksetConfig",
    "LocalEnv",
    "ServiceRolloutHarness",
]
