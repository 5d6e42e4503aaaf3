"""The dashboard server's heap, settled once it has imported what its pages use (:func:`settle`).

Python's collector of reference cycles looks at every object it tracks now and then (its oldest
generation, when enough objects have lived long). In the dashboard's server most of them are the
modules' own: pandas, Altair's schema classes, PyArrow, Streamlit, some 320,000 objects that live as
long as the process. Such a collection held the interpreter for 40-150 ms, growing with the heap,
during about one page load in five (docs/scale.md). Made permanent (``gc.freeze``) once imported,
they are left out of every collection, which then looks only at what pages made.
"""

from __future__ import annotations

import gc
import importlib
from typing import Final

from jobsight.collector.config.settings import SettingsError

PAGE_MODULES: Final = (
    "jobsight.dashboard.data",
    "jobsight.dashboard.charts",
    "jobsight.dashboard.tables",
    "jobsight.dashboard.views.job_health",
    "jobsight.dashboard.views.job_actions",
    "jobsight.dashboard.views.job_epochs",
)
"""What the pages import, and through them pandas, Altair, PyArrow, psycopg and Streamlit's elements."""


def settle() -> int:
    """Imports :data:`PAGE_MODULES`, collects what importing left behind, and makes every object left
    permanent; returns how many that is (``gc.get_freeze_count``). Settings that do not load leave the
    modules that read them unimported: the app says what is wrong with them on every page."""
    for name in PAGE_MODULES:
        try:
            importlib.import_module(name)
        except SettingsError:
            continue
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
