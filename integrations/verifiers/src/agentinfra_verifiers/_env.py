"""`LocalEnv`: one agent seat whose runtime defaults to a local subprocess.

verifiers' agents default to a remote Prime sandbox. `OneReplyHarness` runs nothing in its
runtime (one HTTP call, in process; the grading happens in agentinfra's jails), so a remote
box would only add a tunnel and a login; ``--env.agent.runtime.type`` still overrides it.
"""

from __future__ import annotations

from typing import Any

import verifiers.v1 as vf

__all__ = ["LocalEnv", "LocalEnvConfig"]


class LocalEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig(runtime=vf.SubprocessConfig())
    """The one seat, as `SingleAgentEnv`'s (`--env.agent.*`), on the local runtime."""


class LocalEnv(vf.Env[LocalEnvConfig]):
    async def run(self, task: vf.Task[Any, Any, Any], agents: vf.Agents) -> None:
        await agents.agent.run(task)
