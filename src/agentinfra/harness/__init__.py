"""Long-horizon runs: journal, submissions, grading queue (`_queue`), executors (`_executors`),
metrics, wall time (`_walltime`), regrade and reports.

The harness works with any registered environment through the seam in
`agentinfra.environments`; it imports no particular environment.

Public names are re-exported here in one sorted `__all__`, pinned by a test.
"""

from agentinfra.harness._agent_run import (
    AgentRunState,
    agent_run_spec,
    api_key_from_env,
    run_agent,
    run_agents,
)
from agentinfra.harness._executors import (
    EvaluationRequest,
    Executor,
    LocalExecutor,
    make_executor,
    open_environment,
)
from agentinfra.harness._export import EXPORT_SCHEMA_VERSION, export_record
from agentinfra.harness._journal import JOURNAL_SCHEMA_VERSION, Event, Journal
from agentinfra.harness._metrics import SubmissionRecord, anomalies, best_so_far, compute_metrics
from agentinfra.harness._progress import OnProgress, Progress
from agentinfra.harness._queue import Receipt, RunHarness, RunState, graded_score
from agentinfra.harness._ray import RayExecutor
from agentinfra.harness._recording import load_recording, replay_recording
from agentinfra.harness._regrade import Change, regrade, remeasure_best
from agentinfra.harness._report import (
    REPORT_SCHEMA_VERSION,
    build_report,
    load_records,
    write_report,
)
from agentinfra.harness._run_records import episode_reward, submission_reward
from agentinfra.harness._rundir import FINISH_MARKER, RunDirectory, RunLayout, StoredSubmission
from agentinfra.harness._spec import Budget, RunInfo, RunSpec
from agentinfra.harness._summary import (
    SUMMARY_SCHEMA_VERSION,
    find_anomalies,
    run_view,
    summarize,
    write_summary,
)
from agentinfra.harness._trajectory import TRAJECTORY_SCHEMA_VERSION, error_failure, trajectory_of

__all__ = [
    "AgentRunState",
    "Budget",
    "Change",
    "EXPORT_SCHEMA_VERSION",
    "EvaluationRequest",
    "Event",
    "Executor",
    "FINISH_MARKER",
    "JOURNAL_SCHEMA_VERSION",
    "Journal",
    "LocalExecutor",
    "OnProgress",
    "Progress",
    "REPORT_SCHEMA_VERSION",
    "RayExecutor",
    "Receipt",
    "RunDirectory",
    "RunHarness",
    "RunInfo",
    "RunLayout",
    "RunSpec",
    "RunState",
    "SUMMARY_SCHEMA_VERSION",
    "StoredSubmission",
    "SubmissionRecord",
    "TRAJECTORY_SCHEMA_VERSION",
    "agent_run_spec",
    "anomalies",
    "api_key_from_env",
    "best_so_far",
    "build_report",
    "compute_metrics",
    "episode_reward",
    "error_failure",
    "export_record",
    "find_anomalies",
    "graded_score",
    "load_recording",
    "load_records",
    "make_executor",
    "open_environment",
    "regrade",
    "remeasure_best",
    "replay_recording",
    "run_agent",
    "run_agents",
    "run_view",
    "submission_reward",
    "summarize",
    "trajectory_of",
    "write_report",
    "write_summary",
]
