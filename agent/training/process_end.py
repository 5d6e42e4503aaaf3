"""What a training process says when it ends, whichever way it ends.

Each run (:class:`~jobsight.agent.training.run_records.TrainingRun`) ends with one end event
(:mod:`jobsight.protocol.run_events`): a framework callback sends it from its own end hook (Lightning
``teardown``, Keras ``on_train_end``), the plain-PyTorch helpers from their profiler's ``with`` block or
``finish()``. A run still open when the process ends is ended here:

* an uncaught exception ends it with an ``exception`` event carrying the traceback, then the
  ``sys.excepthook`` that was there before prints it as it always did;
* a normal exit (the script's end, ``sys.exit``) ends it with ``run_end``, from ``atexit``. This
  module registers after the shipper's module, and ``atexit`` runs handlers in reverse order, so the
  event is queued before the shipper's own ``atexit`` shutdown sends what is queued.

A forked child (a DataLoader worker that returns through ``atexit``, an ``os.fork``) ends no run of
its parent's: that run's records carry the parent's pid, and would say the parent ended.

Outside Slurm these events are how the collector learns that a run is over (no epilog ends it:
``collector/passes/local_runs.py``); inside Slurm they tell the hung rule that the rank is done. A
process killed without a word (SIGKILL, the OOM killer) sends nothing: the collector ends such a run
as ``silent`` after a while.
"""

from __future__ import annotations

import atexit
import os
import sys
from types import TracebackType
from typing import Final, Protocol

# Imported first, so the shipper's atexit shutdown is registered before ours and runs after it.
import jobsight.agent.shipping.shipper  # noqa: F401
from jobsight.protocol.run_events import EXCEPTION, RUN_END


class EndableRun(Protocol):
    """What is ended here (:class:`~jobsight.agent.training.run_records.TrainingRun`, whose module imports this one)."""

    @property
    def pid(self) -> int:
        """The process whose run it is: the pid its records carry."""
        ...

    def end(self, message: str, event: str, *, level: str = "INFO", exception: BaseException | None = None,
            flush_timeout_s: float = 2.0) -> None: ...

EXIT_FLUSH_TIMEOUT_S: Final = 1.0
"""How long ending a run at exit waits for its records; the shipper's own shutdown spools the rest."""

_open: dict[int, EndableRun] = {}
"""Runs not ended yet, by ``id()``. Written under the GIL by whole-dict operations only."""
_previous_hook = sys.excepthook
_hook_installed = False


def track(run: EndableRun) -> None:
    """``run`` is open: end it when the process ends, if nothing ended it before."""
    global _hook_installed
    _open[id(run)] = run
    if not _hook_installed:
        _install_excepthook()
        _hook_installed = True


def untrack(run: EndableRun) -> None:
    """``run`` was ended by its own integration."""
    _open.pop(id(run), None)


def open_runs() -> list[EndableRun]:
    """This process's runs not ended yet (a forked child's list holds none of its parent's)."""
    pid = os.getpid()
    return [run for run in list(_open.values()) if run.pid == pid]


def end_open_runs(message: str, event: str, exception: BaseException | None = None) -> None:
    """End every open run of this process with ``event``. Never raises."""
    for run in open_runs():
        if exception is None:
            run.end(message, event, flush_timeout_s=EXIT_FLUSH_TIMEOUT_S)
        else:
            run.end(message, event, level="ERROR", exception=exception, flush_timeout_s=EXIT_FLUSH_TIMEOUT_S)


def _excepthook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    try:
        end_open_runs(f"process ended by {kind.__name__}: {exc}", EXCEPTION, exc)
    except Exception:  # noqa: BLE001 - boundary: the user's traceback must still be printed
        pass
    _previous_hook(kind, exc, tb)


def _install_excepthook() -> None:
    global _previous_hook
    _previous_hook = sys.excepthook
    sys.excepthook = _excepthook


def _at_exit() -> None:
    end_open_runs("process exited", RUN_END)


atexit.register(_at_exit)
