"""The run events by which a training process says it started and ended.

A training process sends them as ``log`` records whose ``attrs.event`` names the event
(``agent/training/run_records.py``). The collector reads them twice: the hung rule does not call a
rank hung once it said it is done (``collector/passes/findings.py``), and a run outside Slurm, which
no epilog ends, is ended once every process that said it started has said it ended
(``collector/passes/local_runs.py``).

Standard library only; the collector reads these from records a job wrote and trusts nothing in them
but the event's name, its sender (node, pid) and its time.
"""

from __future__ import annotations

from typing import Final

FIT_START: Final = "fit_start"
"""A framework callback's fit began (Lightning ``on_fit_start``, Keras ``on_train_begin``)."""
RUN_START: Final = "run_start"
"""A plain-PyTorch process opened its run (``agent/training/torch.py``'s first helper call)."""
FIT_END: Final = "fit_end"
"""A framework callback's fit ended (Lightning ``teardown`` of ``fit``, Keras ``on_train_end``)."""
RUN_END: Final = "run_end"
"""A plain-PyTorch run ended (its profiler's ``with`` block, ``finish()``), or a process with a run
still open exited (its interpreter's ``atexit``)."""
EXCEPTION: Final = "exception"
"""A fit or process ended by an exception (Lightning ``on_exception``, an uncaught exception)."""

START_EVENTS: Final[tuple[str, ...]] = (FIT_START, RUN_START)
"""Events that open a process's run: an end heard before the latest of them ended an earlier run."""
END_EVENTS: Final[tuple[str, ...]] = (FIT_END, RUN_END, EXCEPTION)
"""Events by which a process says it is done (or failed): its rank is not hung, and its run is over."""
