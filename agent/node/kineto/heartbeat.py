"""Saying the Kineto service serves: its status, in the node daemon's status file.

While it serves, the answering thread rewrites the status file (``/run/jobsight/agent-status.json``,
named by :mod:`jobsight.agent.node.kineto.hooks`) every few seconds; the task prolog turns
``KINETO_USE_DAEMON`` on only while it is fresh. Admins read the same file.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobsight.agent.atomic_files import write_atomically
from jobsight.agent.node.kineto.hooks import status_path_for
from jobsight.agent.settings import AgentSettings

log = logging.getLogger("jobsight.agent.kineto")


@dataclass
class ServiceStatus:
    serving: bool = False
    message: str = "not started"
    configs_given: int = 0
    profiles_shipped: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    errors: int = 0
    """Requests whose handling failed (answered "no config")."""
    traces_failed: int = 0


def status_path(settings: AgentSettings) -> Path:
    """The node daemon's status file, beside the registrations: ``/run/jobsight/agent-status.json``."""
    return status_path_for(settings.registration_dir)


def write_status(settings: AgentSettings, status: dict[str, Any], path: Path | None = None) -> None:
    """Write the daemon's status for admins (``cat /run/jobsight/agent-status.json``) and the task
    prolog (:func:`~jobsight.agent.node.kineto.hooks.kineto_serving`), stamped ``updated_at``; best effort."""
    path = path or status_path(settings)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps({**status, "updated_at": time.time()}, indent=2) + "\n", 0o644)
    except OSError as exc:
        log.warning("jobsight agent: cannot write %s: %s", path, exc)
