"""The kernel environment's tools for an agent, and its prompts.

- ``read_problem``: the reference ``Model`` the agent must beat.
- workspace tools: list, read, write and edit files in the agent's private directory.
- ``check``: the same grader on the agent's file, with **agent-visible** seeds
  and quick settings; what it reports is a hint, not the score.
- ``submit``: hands the file to the run harness, which grades it with hidden
  seeds and the full protocol; the official verdict arrives later, appended to a
  tool result.
- ``results``: the official verdicts of the agent's submissions so far, waiting
  (up to a limit) for the ones still being graded.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agentinfra.agent import Tool, workspace_tools
from agentinfra.environments import AgentHooks, Evaluation, Submission, Task
from agentinfra.errors import ToolError

__all__ = ["AGENT_VISIBLE_SEED", "KERNEL_SYSTEM_PROMPT", "kernel_task_prompt", "kernel_tools"]

AGENT_VISIBLE_SEED = 20_251_129
"""Seed of `check`: fixed and known to the agent; the harness grades with other, secret seeds."""

KERNEL_SYSTEM_PROMPT = """\
You optimise PyTorch programs. You are given a reference `Model` (a torch.nn.Module with
`get_inputs()` and `get_init_inputs()`). Write a file that defines `ModelNew` with the same
constructor arguments and the same outputs, faster. Work in your workspace with the file
tools, use `check` to test a file (agent-visible seeds, quick timing: a hint only), and
`submit` a file when you want it scored, and `results` to see the scores. Every submission is graded on its own with secret
inputs; outputs must match the reference within tolerance, and tricks that fake speed
(caching results, skipping work, touching the timer) are detected and scored zero. You may
submit many times; the best honest submission counts. Reply without a tool call when you
are finished."""


def kernel_task_prompt(problem_name: str) -> str:
    return (
        f"Task: make the reference in `{problem_name}` faster. Call read_problem to see it. "
        "Name your files as you like (for example solution.py) and submit the best one."
    )


def kernel_tools(
    task: Task,
    workspace: Path,
    hooks: AgentHooks,
    check: Callable[[Submission], Awaitable[Evaluation]],
) -> list[Tool]:
    """The tools of one kernel task.

    ``check(submission)`` grades with agent-visible seeds; ``hooks.submit`` hands a
    file to the run and returns the receipt text; ``hooks.results(wait_s)`` the verdicts so far.
    """
    files = workspace_tools(workspace)
    by_name = {t.name: t for t in files}
    source = task.data.decode(errors="replace")

    async def read_problem(args: dict[str, Any]) -> str:
        return f"# {task.name}\n{source}"

    def resolve(args: dict[str, Any]) -> Path:
        name = args.get("path")
        if not isinstance(name, str):
            raise ToolError(f"argument 'path' must be a string, got {name!r}")
        path = (workspace / name).resolve()
        if workspace.resolve() not in path.parents:
            raise ToolError(f"path {name!r} leaves the workspace")
        if not path.is_file():
            raise ToolError(f"no file {name!r} in the workspace (list_files shows what exists)")
        return path

    def read(args: dict[str, Any]) -> Submission:
        path = resolve(args)
        return Submission(path.read_bytes(), name=path.name, media_type="text/x-python")

    async def check_tool(args: dict[str, Any]) -> str:
        evaluation = await check(read(args))
        view = {
            "outcome": evaluation.outcome.value,
            "correct": evaluation.correct,
            "speedup": evaluation.score,
            "error": evaluation.error,
            "findings": [{"check": f.check, "message": f.message} for f in evaluation.findings][
                :10
            ],
            "note": "agent-visible seeds and quick timing; the submitted score is measured separately",
        }
        return json.dumps(view, default=str)

    async def submit_tool(args: dict[str, Any]) -> str:
        return await hooks.submit(read(args))

    async def results_tool(args: dict[str, Any]) -> str:
        wait = args.get("wait_s", 0)
        if not isinstance(wait, (int, float)) or isinstance(wait, bool) or not 0 <= wait <= 600:
            raise ToolError(f"wait_s must be a number of seconds in 0..600, got {wait!r}")
        return await hooks.results(float(wait))

    path_schema = {
        "type": "object",
        "properties": {"path": {"type": "string", "description": "A file in your workspace."}},
        "required": ["path"],
    }
    return [
        Tool(
            "read_problem",
            "Show the reference program to optimise.",
            {"type": "object", "properties": {}},
            read_problem,
        ),
        by_name["list_files"],
        by_name["read_file"],
        by_name["write_file"],
        by_name["edit_file"],
        Tool(
            "check",
            "Grade a workspace file now with agent-visible seeds and quick timing (a hint, not the score).",
            path_schema,
            check_tool,
        ),
        Tool(
            "submit",
            "Submit a workspace file to be scored (secret seeds, full timing). Safe to repeat: "
            "identical files are graded once.",
            path_schema,
            submit_tool,
        ),
        Tool(
            "results",
            "Show the official scores of your submissions; wait up to wait_s seconds for pending ones.",
            {
                "type": "object",
                "properties": {"wait_s": {"type": "number", "description": "0 to 600."}},
            },
            results_tool,
        ),
    ]
