"""One way to write a file so that a crash never leaves half of it visible."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

__all__ = ["write_atomic"]


def write_atomic(path: Path, data: bytes) -> None:
    """Writes ``data`` to ``path`` via a temporary file beside it, fsync and rename.

    Raises:
        OSError: the write failed; the temporary file is removed and ``path`` untouched.
            Components translate it into their own error with the knob to turn.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
