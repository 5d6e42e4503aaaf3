"""Whole-file writes that readers never see half-done: a temporary file, then a rename."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(
    path: str | os.PathLike[str],
    text: str,
    mode: int,
    *,
    encoding: str = "utf-8",
    uid: int | None = None,
    gid: int | None = None,
) -> None:
    """Write ``text`` to ``path`` (replacing it) with permission bits ``mode``.

    The file gets its mode (and owner) before it holds anything, so no reader can
    catch it with looser permissions. ``uid``/``gid`` give it to that user and group
    when this process is root; ``None`` keeps the writer's. Raises ``OSError`` (and
    leaves no temporary file behind) when it cannot be written.
    """
    target = Path(path)
    # A dot-name never matches the readers' patterns ("*.json", "<job>.token"),
    # so a half-written file is never read.
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.stem}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        if uid is not None and os.geteuid() == 0:
            os.fchown(fd, uid, gid if gid is not None else -1)
        with os.fdopen(fd, "w", encoding=encoding) as handle:
            handle.write(text)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
