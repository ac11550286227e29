"""`vf-eval agentinfra-kernels`: agentinfra's kernel problems as a verifiers taskset.

One task per problem file (KernelBench format: a reference ``Model`` with ``get_inputs`` and
``get_init_inputs``) under ``--env.taskset.problems-dir`` (default: this repository's
``examples/kernels/problems``; a KernelBench checkout's ``KernelBench/level1`` works as is).
The model replies once (`OneReplyHarness`) with a file defining ``ModelNew``; the reward is
agentinfra's kernel reward for that file, graded by the rollout service
(``--env.taskset.task.service-url``) in its jails with secret inputs: the measured speedup
when the submission passed, 0 when it failed or was hack-flagged. A grader infra failure is
raised, so verifiers records the rollout as errored instead of scoring it 0.
"""

from agentinfra_verifiers import LocalEnv, OneReplyHarness

from agentinfra_kernels._taskset import (
    KernelsData,
    KernelsTask,
    KernelsTaskConfig,
    KernelsTaskset,
    KernelsTasksetConfig,
    kernel_reward,
)

__all__ = [
    "KernelsData",
    "KernelsTask",
    "KernelsTaskConfig",
    "KernelsTaskset",
    "KernelsTasksetConfig",
    "LocalEnv",
    "OneReplyHarness",
    "kernel_reward",
]
