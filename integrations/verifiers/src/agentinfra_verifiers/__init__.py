"""What agentinfra's verifiers tasksets share: the rollout service's grade client, a
one-reply harness, and how a submission is cut out of a reply.

verifiers 0.4.0 loads a taskset by id (`vf-eval agentinfra-kernels`) by importing the
module of that name (`agentinfra_kernels`) and taking the `Taskset` (and, if exported, the
`Harness`) subclass its `__all__` names. This package talks to agentinfra over HTTP only:
agentinfra is not installed beside verifiers (their `openai` pins differ), and nothing
here imports, runs or parses a model's output as code.
"""

from agentinfra_verifiers._env import LocalEnv, LocalEnvConfig
from agentinfra_verifiers._harness import OneReplyHarness, OneReplyHarnessConfig
from agentinfra_verifiers._rollout_harness import (
    RolloutTaskData,
    ServiceRolloutHarness,
    ServiceRolloutHarnessConfig,
    rollout_reward,
)
from agentinfra_verifiers._service import (
    DEFAULT_SERVICE_URL,
    DEFAULT_TOKEN_VAR,
    AgentinfraService,
    ServiceError,
    ServiceTaskConfig,
)
from agentinfra_verifiers._submission import python_submission

__all__ = [
    "DEFAULT_SERVICE_URL",
    "DEFAULT_TOKEN_VAR",
    "AgentinfraService",
    "LocalEnv",
    "LocalEnvConfig",
    "OneReplyHarness",
    "OneReplyHarnessConfig",
    "ServiceError",
    "ServiceTaskConfig",
    "python_submission",
    "RolloutTaskData",
    "ServiceRolloutHarness",
    "ServiceRolloutHarnessConfig",
    "rollout_reward",
]
