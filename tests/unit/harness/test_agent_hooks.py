"""What `run_agent` gives an environment through `AgentHooks`, from the run's own journals."""

from __future__ import annotations

from pathlib import Path

from agentinfra.agent import Transcript
from agentinfra.harness._agent_run import _completed_tool_calls


def test_completed_tool_calls_counts_results_of_the_named_tools_across_sessions(
    tmp_path: Path,
) -> None:
    transcript = Transcript.open(tmp_path / "transcript.jsonl")
    transcript.append("tool_started", {"name": "computer", "call_id": "a"})
    transcript.append("tool_result", {"name": "computer", "call_id": "a"})
    transcript.append("tool_result", {"name": "submit", "call_id": "b"})
    transcript.close()
    resumed = Transcript.open(tmp_path / "transcript.jsonl")
    resumed.append("tool_started", {"name": "pyautogui", "call_id": "c"})
    resumed.append("tool_result", {"name": "pyautogui", "call_id": "c"})
    resumed.append("tool_started", {"name": "computer", "call_id": "d"})
    assert _completed_tool_calls(resumed, ("computer", "computer_13", "pyautogui")) == 2
    assert _completed_tool_calls(resumed, ("submit",)) == 1
    assert _completed_tool_calls(resumed, ()) == 0
    resumed.close()
