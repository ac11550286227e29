"""Problem environments and their graders, behind one seam.

The seam (`Environment`, `EnvironmentDefinition`, `Submission`, `Evaluation`, ...)
and the registry live here and know no particular environment; each environment
is a subpackage (`environments.kernels`) registered by name, loaded when asked for.

Public names are re-exported here in one sorted `__all__`, pinned by a test.
"""

from agentinfra.environments._registry import (
    ENTRY_POINT_GROUP,
    environment_definition,
    environment_names,
    register_environment,
    unregister_environment,
)
from agentinfra.environments._types import (
    EVALUATION_SCHEMA_VERSION,
    AgentHooks,
    AgentSetup,
    Anomaly,
    Environment,
    EnvironmentDefinition,
    Evaluation,
    Finding,
    NoSettings,
    Outcome,
    RunView,
    ScoreSpec,
    Severity,
    Submission,
    Task,
)

__all__ = [
    "AgentHooks",
    "AgentSetup",
    "Anomaly",
    "ENTRY_POINT_GROUP",
    "EVALUATION_SCHEMA_VERSION",
    "Environment",
    "EnvironmentDefinition",
    "Evaluation",
    "Finding",
    "NoSettings",
    "Outcome",
    "RunView",
    "ScoreSpec",
    "Severity",
    "Submission",
    "Task",
    "environment_definition",
    "environment_names",
    "register_environment",
    "unregister_environment",
]
