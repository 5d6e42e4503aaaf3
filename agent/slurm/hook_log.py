"""Where a Slurm hook's problems go: syslog, or ``JOBSIGHT_HOOK_LOG`` when set (CONTRIBUTING rule 13)."""

from __future__ import annotations

import logging
import syslog


class _SyslogHandler(logging.Handler):
    """Through the ``syslog`` module: no socket to manage, silently nothing without a daemon."""

    def __init__(self, ident: str, facility: int):
        super().__init__()
        syslog.openlog(ident, syslog.LOG_PID, facility)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            priority = syslog.LOG_ERR if record.levelno >= logging.ERROR else (
                syslog.LOG_WARNING if record.levelno >= logging.WARNING else syslog.LOG_INFO)
            syslog.syslog(priority, self.format(record))
        except Exception:  # noqa: BLE001 - boundary: logging must never fail a hook
            pass


def setup_hook_logging(hook: str, log_file: str | None) -> None:
    """Send the ``jobsight`` loggers to ``log_file``, or to syslog (facility daemon, user for
    the task prolog) when it is ``None`` or cannot be opened."""
    handler: logging.Handler
    if log_file:
        try:
            handler = logging.FileHandler(log_file, encoding="utf-8")
            fmt = f"%(asctime)s jobsight-{hook}[%(process)d] %(levelname)s %(message)s"
            handler.setFormatter(logging.Formatter(fmt))
        except OSError:
            handler = _SyslogHandler(f"jobsight-{hook}", syslog.LOG_DAEMON)
    else:
        facility = syslog.LOG_USER if hook == "task-prolog" else syslog.LOG_DAEMON
        handler = _SyslogHandler(f"jobsight-{hook}", facility)
    root = logging.getLogger("jobsight")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    root.propagate = False
