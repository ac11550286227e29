"""Kernel optimisation: KernelBench-format problems and a grader hardened against reward hacking.

Public names are re-exported here in one sorted `__all__`, pinned by a test.
"""

from agentinfra.environments.kernels._agent_tools import (
    AGENT_VISIBLE_SEED,
    KERNEL_SYSTEM_PROMPT,
    kernel_task_prompt,
    kernel_tools,
)
from agentinfra.environments.kernels._environment import (
    ENVIRONMENT,
    SCORE,
    KernelEnvironment,
    evaluation_of,
    load_kernel_task,
)
from agentinfra.environments.kernels._grader import GRADER_VERSION, GradeOptions, grade, grade_async
from agentinfra.environments.kernels._problem import ProblemMeta, load_problem_meta
from agentinfra.environments.kernels._settings import KernelSettings
from agentinfra.environments.kernels._static import static_findings
from agentinfra.environments.kernels._verdict import (
    Provenance,
    Utilisation,
    Verdict,
)

__all__ = [
    "AGENT_VISIBLE_SEED",
    "ENVIRONMENT",
    "GRADER_VERSION",
    "GradeOptions",
    "KERNEL_SYSTEM_PROMPT",
    "KernelEnvironment",
    "KernelSettings",
    "ProblemMeta",
    "Provenance",
    "SCORE",
    "Utilisation",
    "Verdict",
    "evaluation_of",
    "grade",
    "grade_async",
    "kernel_task_prompt",
    "kernel_tools",
    "load_kernel_task",
    "load_problem_meta",
    "static_findings",
]
