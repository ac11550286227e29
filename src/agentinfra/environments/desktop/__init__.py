"""Desktop computer use: OSWorld-format tasks on a real X desktop in a jail, graded in isolation.

A fresh Xvfb desktop per episode (openbox, D-Bus and AT-SPI, LibreOffice, an
editor, a terminal) runs inside an `agentinfra.sandbox` jail as its own uid with
a home made from a pristine template at ``/home/user``. Actions come in three
spaces (``computer_13``, ``pyautogui`` code on the ``gui-only`` or ``code`` track,
``computer_use``); the episode's home is frozen and graded by OSWorld's getters
and metrics in a second jail. Threat model: `agentinfra.environments.desktop._grading`.

Public names are re-exported here in one sorted `__all__`, pinned by a test.
"""

from agentinfra.environments.desktop._actions import ACTION_SPACES, TRACKS, ActionError
from agentinfra.environments.desktop._environment import (
    ENVIRONMENT,
    SCORE,
    AuditRow,
    DesktopEnvironment,
    audit,
    audit_task,
    default_mirror,
    load_actions,
    run_scripted,
)
from agentinfra.environments.desktop._grading import GRADER_VERSION, DesktopVerdict, grade_episode
from agentinfra.environments.desktop._options import DesktopAgentOptions, DesktopSettings
from agentinfra.environments.desktop._pool import DesktopPool, PoolStats
from agentinfra.environments.desktop._session import DesktopConfig, DesktopSession
from agentinfra.environments.desktop._task import (
    DesktopTask,
    load_desktop_task,
    mirror_path,
    selected_task_files,
    support,
)

__all__ = [
    "ACTION_SPACES",
    "ActionError",
    "AuditRow",
    "DesktopAgentOptions",
    "DesktopConfig",
    "DesktopEnvironment",
    "DesktopPool",
    "DesktopSession",
    "DesktopSettings",
    "DesktopTask",
    "DesktopVerdict",
    "ENVIRONMENT",
    "GRADER_VERSION",
    "PoolStats",
    "SCORE",
    "TRACKS",
    "audit",
    "audit_task",
    "default_mirror",
    "grade_episode",
    "load_actions",
    "load_desktop_task",
    "mirror_path",
    "run_scripted",
    "selected_task_files",
    "support",
]
