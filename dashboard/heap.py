"""The dashboard server's heap, settled after a page's run (:func:`settle`).

Python's collector of reference cycles looks at every object it tracks now and then (its oldest
generation, once enough objects have lived long). In the dashboard's server most of them are the
modules' own: pandas, Altair's schema classes, PyArrow, Streamlit, some 335,000 objects that live as
long as the process. Such a collection held the interpreter for 30-170 ms, growing with the heap,
during about one page load in five (docs/scale.md). Made permanent (``gc.freeze``) once the pages have
imported them, they are left out of every collection, which then looks only at what pages make.

After a page's run, never at the server's start: the pages' modules imported by the server, outside
a page's run, left every chart of the job page without its data (docs/scale.md).
"""

from __future__ import annotations

import gc
import sys
import threading


class _Settled:
    """How many modules were loaded at the last freeze (pages run in threads of one process)."""

    lock = threading.Lock()
    modules = 0


def settle() -> bool:
    """Once a page's run has loaded modules no run loaded before: collects what is garbage now and makes
    every object left permanent. Returns whether it did: a run that loaded nothing new costs nothing."""
    with _Settled.lock:
        if len(sys.modules) <= _Settled.modules:
            return False
        _Settled.modules = len(sys.modules)
        gc.collect()
        gc.freeze()
        return True
