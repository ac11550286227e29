"""One jail for everything agentinfra runs on behalf of an adversary.

A jail is a fresh, minimal root filesystem (an allowlist of read-only paths, a
private ``/tmp``, a minimal ``/dev``, a fresh ``/proc``), private pid, network and
mount namespaces, an unprivileged uid with no capabilities and ``no_new_privs``,
CPU affinity and resource limits. The kernel grader runs its candidate and
reference workers in one; other environments (the desktop) build theirs from the
same `JailSpec`. Importing this package costs only the standard library.

Public names are re-exported here in one sorted `__all__`, pinned by a test.
"""

from agentinfra.sandbox._forkserver import ForkedProcess, ForkServer, ForkServerError
from agentinfra.sandbox._spec import (
    JailLimits,
    JailSpec,
    SandboxMode,
    probe_sandbox_mode,
    python_runtime_paths,
    system_library_paths,
)
from agentinfra.sandbox._uids import UID_RANGE, UidExhaustedError, kill_uid, reserve_uid

__all__ = [
    "ForkServer",
    "ForkServerError",
    "ForkedProcess",
    "JailLimits",
    "JailSpec",
    "SandboxMode",
    "UID_RANGE",
    "UidExhaustedError",
    "kill_uid",
    "probe_sandbox_mode",
    "python_runtime_paths",
    "reserve_uid",
    "system_library_paths",
]
