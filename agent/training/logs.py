"""A ``logging.Handler`` that ships log lines as wire ``log`` records.

``tid`` is the kernel thread id (``threading.get_native_id()``, what ``top -H``,
``py-spy`` and ``nvidia-smi`` show), taken in ``emit``: logging calls ``emit`` on
the thread that logged, unless a ``QueueHandler`` sits in front, in which case
it is the listener's thread. ``record.thread`` (Python's ident, an address) is
not sent.

Records from the ``jobsight`` loggers are never shipped: the shipper logs its
own trouble, and shipping that through itself could loop.
"""

from __future__ import annotations

import json
import logging
import os
import threading

from jobsight.agent.settings import AgentSettings, load_agent_settings
from jobsight.agent.shipping.shipper import Shipper, get_shipper
from jobsight.agent.training.context import RunContext, current_context
from jobsight.protocol import wire
from jobsight.protocol.json_safe import clip, json_safe

# Attributes every LogRecord has; anything else in __dict__ came from ``extra=``.
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", logging.INFO, "", 0, "", None, None)).keys()) | {
    "message",
    "asctime",
    "taskName",
}
def _is_own(name: str) -> bool:
    return name == "jobsight" or name.startswith("jobsight.")


class JobsightHandler(logging.Handler):
    """Ships every record it handles; ``shipper=None`` means the process-wide one."""

    def __init__(
        self,
        level: int = logging.NOTSET,
        settings: AgentSettings | None = None,
        shipper: Shipper | None = None,
    ) -> None:
        super().__init__(level)
        self._settings = settings
        self._shipper = shipper
        self._context: RunContext | None = None
        self._context_pid = -1

    def _target(self) -> tuple[Shipper, RunContext]:
        pid = os.getpid()
        if self._context is None or self._context_pid != pid:
            settings = self._settings
            if settings is None:
                settings = self._shipper.settings if self._shipper is not None else load_agent_settings()
                self._settings = settings
            self._context = current_context(settings)
            self._context_pid = pid
        shipper = self._shipper if self._shipper is not None else get_shipper(self._settings)
        return shipper, self._context

    def emit(self, record: logging.LogRecord) -> None:
        if _is_own(record.name):
            return
        try:
            shipper, context = self._target()
            exception = None
            if record.exc_info and record.exc_info[0] is not None:
                exception = logging.Formatter().formatException(record.exc_info)
            elif record.exc_text:
                exception = record.exc_text
            if record.stack_info:
                exception = f"{exception}\n{record.stack_info}" if exception else record.stack_info
            if exception is not None:
                exception = clip(exception, wire.MAX_MESSAGE)
            extra = {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS and not k.startswith("_")}
            attrs = json_safe(extra) if extra else None
            if attrs is not None:
                json.dumps(attrs, allow_nan=False)  # keys that are not strings etc. fail here, not at the collector
            shipper.enqueue(
                {
                    "kind": "log",
                    "job": context.job,
                    "ts": int(record.created * 1_000_000),
                    "node": context.node,
                    "rank": context.rank,
                    "pid": record.process if record.process is not None else os.getpid(),
                    "tid": threading.get_native_id(),
                    "thread": clip(record.threadName, wire.MAX_STRING) if record.threadName else None,
                    "level": clip(record.levelname, wire.MAX_STRING),
                    "logger": clip(record.name, wire.MAX_STRING),
                    "message": clip(record.getMessage(), wire.MAX_MESSAGE),
                    "exception": exception,
                    "attrs": attrs,
                }
            )
        except Exception:  # noqa: BLE001 - boundary: logging must never raise into the caller (no handleError noise)
            pass


_attach_lock = threading.Lock()


def attach(level: int = logging.INFO, settings: AgentSettings | None = None) -> JobsightHandler:
    """Add a :class:`JobsightHandler` to the root logger, once; returns the one attached."""
    root = logging.getLogger()
    with _attach_lock:
        for handler in root.handlers:
            if isinstance(handler, JobsightHandler):
                return handler
        handler = JobsightHandler(level, settings)
        root.addHandler(handler)
        if root.level > level:
            root.setLevel(level)
        return handler
