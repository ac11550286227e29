"""One jail for everything agentinfra runs on behalf of an adversary.

A jail is a fresh, minimal root filesystem (an allowlist of read-only paths, a
private ``/tmp``, a minimal ``/dev``, a fresh ``/proc``), private pid, network and
mount namespaces, an unprivileged uid with no capabilities and ``no_new_privs``,
CPU affinity and resource limits. The kernel grader runs its candidate and
reference workers in one; other environments (the desktop) build theirs from the
same `JailSpec`, and talk to what runs inside through one channel
(`JailedProcess`: requests with a deadline, the stderr tail, the process tree,
signals, and the end that kills and reaps everything and sweeps the uid).
Importing this package costs only the standard library and `agentinfra.errors`.

What a jail protects against (``namespaces+uid``, the grader or desktop running as root):

- reading or writing the host's files: only the allowlist exists, read-only;
  the old root is detached after ``pivot_root``, so no path leads back to it.
  Writable are the private ``/tmp`` and ``/dev/shm`` (tmpfs, size-capped) and
  the ``rw_binds`` the caller made for the jail (a desktop's home);
- seeing or signalling the host's processes (a private pid namespace) and
  outliving the jail (every process dies with its pid 1; the uid is swept);
- the network (a private network namespace with no interface up; abstract
  Unix sockets are per network namespace too);
- gaining privileges: no capability in any set, ``no_new_privs`` (set-uid
  programs do not elevate), no supplementary groups, a uid that no other
  live process or concurrent jail on the machine uses;
- devices: only null, zero, full, random, urandom and those the caller names
  (GPU nodes for a CUDA worker); a private devpts when asked for terminals;
- runaway resources per process: address space, CPU time, file size, open
  files, no core dumps; and, because the uid is not root, the number of the
  jail's processes (RLIMIT_NPROC).

What it does not protect against:

- the kernel itself: there is no seccomp filter, so the whole system-call
  surface is open, and a kernel bug is an escape;
- total memory, I/O and CPU share: there are no cgroups; ``RLIMIT_AS`` caps
  each process, not their sum (callers reserve their sum in the host's
  `MemoryLedger` and wait for it, but a jail itself is not held to it), and ``/dev/shm`` and ``/tmp`` count against the
  machine's memory up to their size caps;
- wall-clock time: the jail has no deadline; its owner enforces one
  (`JailedProcess` requests take one);
- System V IPC, the hostname and the clocks, which are the host's (no IPC, UTS
  or time namespace): a jail can use SysV objects that the host leaves open to
  every uid, and it can read the time and measure the machine's load;
- reading what is allowlisted: everything bound in (an interpreter's
  site-packages, ``/sys`` for CUDA, the copied-in files) is readable by the
  jailed program, so secrets never go into a jail's allowlist;
- what the program answers: its replies are untrusted bytes; callers cap their
  size and parse them defensively, and never execute or unpickle them;
- the weaker modes: under ``userns`` (no root) the jail keeps the caller's uid
  outside its namespace, so RLIMIT_NPROC counts the caller's processes and
  there is no uid to sweep; ``rlimits-only`` and ``none`` are no jail at all
  (resource limits and a new session only), and verdicts say so.

Public names are re-exported here in one sorted `__all__`, pinned by a test.
"""

from agentinfra.sandbox._channel import JailedProcess, process_tree
from agentinfra.sandbox._forkserver import ForkedProcess, ForkServer
from agentinfra.sandbox._memory import (
    LedgerView,
    MachineMemory,
    MemoryLedger,
    MemoryTooLargeError,
    MemoryWaitTimeoutError,
    Reservation,
    machine_memory,
)
from agentinfra.sandbox._spec import (
    JailLimits,
    JailSpec,
    SandboxMode,
    probe_sandbox_mode,
    python_runtime_paths,
    system_library_paths,
)
from agentinfra.sandbox._uids import (
    UID_RANGE,
    kill_uid,
    pids_by_uid,
    reserve_uid,
    signal_uid,
    uid_is_orphaned,
)

__all__ = [
    "ForkServer",
    "ForkedProcess",
    "JailLimits",
    "JailSpec",
    "JailedProcess",
    "LedgerView",
    "MachineMemory",
    "MemoryLedger",
    "MemoryTooLargeError",
    "MemoryWaitTimeoutError",
    "Reservation",
    "SandboxMode",
    "UID_RANGE",
    "kill_uid",
    "machine_memory",
    "pids_by_uid",
    "probe_sandbox_mode",
    "process_tree",
    "python_runtime_paths",
    "reserve_uid",
    "signal_uid",
    "system_library_paths",
    "uid_is_orphaned",
]
