"""The agent loop over OpenAI-compatible models, tool-call formats and training-data export.

Built so far (issue 5, in progress): MiniMax XML tool-call parsing and reasoning
splitting (`_toolcalls`), per-family sampling profiles (`_profiles`). The loop,
tools, budgets, resume and export are not built yet.

Public names are re-exported here in one sorted `__all__`, pinned by a test.
"""

from agentinfra.agent._profiles import PROFILES, ModelProfile, profile_for
from agentinfra.agent._toolcalls import ParsedReply, ToolCall, parse_minimax_reply, split_reasoning

__all__ = [
    "ModelProfile",
    "PROFILES",
    "ParsedReply",
    "ToolCall",
    "parse_minimax_reply",
    "profile_for",
    "split_reasoning",
]
