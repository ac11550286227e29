"""The one exception tree of agentinfra.

Raise only when agentinfra itself cannot do what it was asked; expected outcomes
(a cache miss, a failed or cheating submission, a timed-out candidate) are values,
never exceptions. Third-party exceptions are translated at the component boundary
(``raise TierUnavailableError(...) from exc``).

::

    AgentInfraError
    ├── ConfigError              a setting or argument has a bad value
    ├── KVCacheError             kvcache/
    │   ├── BlockFormatError     a block's bytes are not a block this version reads
    │   ├── ProtocolError        a frame broke the cache protocol, or the server answered an error
    │   ├── StoreLockedError     a store directory is owned by another store, or is not a store
    │   ├── TierUnavailableError a tier (disk, server, Redis) cannot be reached
    │   └── TraceFormatError     a request trace line is malformed
    ├── HarnessError             harness/ (runs, journal, queue, reports)
    ├── RolloutError             rollouts/ (the service's journal, or its answer to a client)
    ├── SandboxError             sandbox/ (jails, uids, the fork server, the channel)
    │   ├── ChannelClosedError   a jailed process closed its end of the channel
    │   ├── ChannelTimeoutError  a jailed process did not answer before the deadline
    │   ├── ForkServerError      the fork server could not be started, or did not answer a spawn
    │   ├── UidExhaustedError    no free sandbox uid: too many jails at once on this machine
    │   ├── MemoryTooLargeError     (agentinfra.sandbox) a memory reservation this machine can never grant
    │   └── MemoryWaitTimeoutError  (agentinfra.sandbox) a memory reservation not granted within its bound
    ├── TaskEnvironmentError     environments/ (problems, graders)
    └── AgentError               agent/ (model endpoint, tools, loop)
        └── ToolError            the model called a tool wrongly (the message goes back to it)

Every message says what happened, the offending value, and the knob to change.
"""

from __future__ import annotations

import enum

__all__ = [
    "AgentError",
    "AgentInfraError",
    "BlockFormatError",
    "ChannelClosedError",
    "ChannelTimeoutError",
    "ConfigError",
    "ForkServerError",
    "HarnessError",
    "KVCacheError",
    "ProtocolError",
    "RolloutError",
    "SandboxError",
    "StoreLockedError",
    "TaskEnvironmentError",
    "TierUnavailableError",
    "ToolError",
    "TraceFormatError",
    "UidExhaustedError",
]


class AgentInfraError(Exception):
    """Root of every exception agentinfra raises on purpose."""


class ConfigError(AgentInfraError, ValueError):
    """A setting, environment variable or argument has a value agentinfra cannot use."""


class KVCacheError(AgentInfraError):
    """Base of the KV-cache store's errors."""


class BlockFormatError(KVCacheError):
    """A block's header or payload is not in a format this version reads."""


class ProtocolError(KVCacheError):
    """A frame broke the cache protocol, or the server answered with an error frame.

    ``status`` is the protocol's status code (`agentinfra.kvcache.Status`).
    """

    def __init__(self, status: enum.IntEnum, message: str) -> None:
        super().__init__(f"{status.name}: {message}")
        self.status = status


class StoreLockedError(KVCacheError):
    """A store directory is held by another live store, or is not a store directory."""


class TierUnavailableError(KVCacheError):
    """A tier's backing service or device cannot be reached."""


class TraceFormatError(KVCacheError):
    """A request trace has a malformed line; the message names the line."""


class HarnessError(AgentInfraError):
    """Base of the run harness's errors (runs, journal, grading queue, reports)."""


class RolloutError(AgentInfraError):
    """The rollout service failed, or refused a request (``status``: its HTTP status, 0 when none;
    ``retry_after_s``: a 429's ``Retry-After``)."""

    def __init__(
        self, message: str, *, status: int = 0, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s


class SandboxError(AgentInfraError):
    """Base of the sandbox's errors (jails, uid reservation, the fork server)."""


class ChannelClosedError(SandboxError):
    """A jailed process closed its end of the channel (it exited, or closed its stdin)."""


class ChannelTimeoutError(SandboxError):
    """A jailed process did not answer (or read a request) before the deadline."""


class ForkServerError(SandboxError):
    """The fork server could not be started, or did not answer a spawn."""


class UidExhaustedError(SandboxError, RuntimeError):
    """No free uid was found: too many jails at once on this machine."""


class TaskEnvironmentError(AgentInfraError):
    """Base of the problem environments' errors (problem loading, grader failures)."""


class AgentError(AgentInfraError):
    """Base of the agent loop's errors (endpoint configuration, loop failures)."""


class ToolError(AgentError):
    """The model called a tool wrongly; the message goes back to the model as the result."""
