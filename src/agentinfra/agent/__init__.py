"""The agent loop over OpenAI-compatible models, tool-call formats and training-data export.

- `AgentLoop` drives one agent through a `ModelClient` (the official `openai`
  client, retries honouring Retry-After, an `EndpointLimiter` shared per endpoint)
  with `Tool`s, budgets and context management, journalled in a `Transcript` so
  a crashed run resumes from its last completed turn.
- `parse_minimax_reply`, `parse_hermes_calls`: tool calls (MiniMax XML, Hermes JSON) and reasoning
  in raw text, for servers that leave them there.
- `ModelProfile`: sampling defaults per model family (MiniMax: 1.0 / 0.95 / top_k 40).
- `split_segments`: an episode's engine ids merged into segments with loss masks, broken
  exactly where the exact-prefix property fails, with the cause.
- `ScriptedModelServer`: an OpenAI-compatible server on loopback for tests and demos.

Public names are re-exported here in one sorted `__all__`, pinned by a test.
"""

from agentinfra.agent._content import ContentPart, ImagePart, TextPart, ToolResult, check_png
from agentinfra.agent._loop import AgentLoop, AgentOutcome, LoopConfig
from agentinfra.agent._model import (
    Completion,
    EndpointLimiter,
    ModelClient,
    TokenSupport,
    Usage,
    preflight,
    probe_tokens,
)
from agentinfra.agent._profiles import PROFILES, ModelProfile, profile_for
from agentinfra.agent._scripted import Reply, ScriptedModelServer
from agentinfra.agent._segments import CallTokens, Segment, call_tokens_of, split_segments
from agentinfra.agent._toolcalls import (
    ParsedReply,
    ToolCall,
    looks_like_tool_call,
    parse_hermes_calls,
    parse_minimax_reply,
    split_reasoning,
)
from agentinfra.agent._tools import Tool, tool_schemas, workspace_tools
from agentinfra.agent._transcript import Transcript

__all__ = [
    "AgentLoop",
    "AgentOutcome",
    "CallTokens",
    "Completion",
    "ContentPart",
    "EndpointLimiter",
    "ImagePart",
    "LoopConfig",
    "ModelClient",
    "ModelProfile",
    "PROFILES",
    "ParsedReply",
    "Reply",
    "ScriptedModelServer",
    "Segment",
    "TextPart",
    "TokenSupport",
    "Tool",
    "ToolCall",
    "ToolResult",
    "Transcript",
    "Usage",
    "call_tokens_of",
    "check_png",
    "looks_like_tool_call",
    "parse_hermes_calls",
    "parse_minimax_reply",
    "preflight",
    "probe_tokens",
    "profile_for",
    "split_reasoning",
    "split_segments",
    "tool_schemas",
    "workspace_tools",
]
