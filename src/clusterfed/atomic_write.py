"""Replace a file whole: write a temporary sibling, then rename it over the target."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path


def write_atomically(path: str | Path, write: Callable[[Path], None], suffix: str = ".tmp") -> None:
    """Call ``write(tmp)`` on a sibling of ``path`` named for this call alone, then rename
    it to ``path``.

    A reader never sees half a file. The temporary name is unique so that processes
    writing the same file at once (the seeds of a sweep share their output folder's
    schedule.json) each replace it whole; with one fixed name, one process renamed the
    other's file away and the other failed. ``suffix`` ends the temporary name, for
    writers that append their own extension (NumPy adds .npz to any other name). A
    failed ``write`` leaves ``path`` as it was and no temporary file behind.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}{suffix}")
    try:
        write(tmp)
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
