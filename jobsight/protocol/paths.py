"""Where a local install keeps its files: both sides need them.

``jobsight up`` writes the admin token and cluster secret under the data directory,
and a local agent reads the admin token there when the collector URL is on loopback.
"""

from __future__ import annotations

import os
from typing import Final

ADMIN_TOKEN_FILE: Final = "admin_token"


def default_data_dir() -> str:
    """``JOBSIGHT_DATA_DIR``, else ``$XDG_DATA_HOME/jobsight`` (``~/.local/share/jobsight``)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.environ.get("JOBSIGHT_DATA_DIR") or os.path.join(base, "jobsight")
