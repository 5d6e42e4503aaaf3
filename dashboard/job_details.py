"""The job page's details, shown one at a time under its GPUs and steps: training metrics, energy
and epochs, logs, profiles. The choice is kept in the address (``details=logs``), as the page's
other choices are (:mod:`jobsight.dashboard.url_state`), so a link can open a job on its logs.

One at a time because a page that drew all four on every open took as long again to be drawn (a
64-GPU job's page, ``bench/browser_page.py``), while what a researcher opens a job page for first is
its health, its GPUs and its steps."""

from __future__ import annotations

from typing import Final

from jobsight.dashboard import url_state

PARAM: Final = "details"
KEY: Final = "job_details"
METRICS: Final = "Training metrics"
ENERGY: Final = "Energy and epochs"
LOGS: Final = "Logs"
PROFILES: Final = "Profiles"
SECTIONS: Final = (METRICS, ENERGY, LOGS, PROFILES)
TOKENS: Final = {"metrics": METRICS, "energy": ENERGY, "logs": LOGS, "profiles": PROFILES}
"""The address's token of each section."""


def param() -> url_state.Param:
    """The section shown, as a query parameter bound to its widget; the training metrics by default."""
    return url_state.Param(PARAM, KEY, METRICS, url_state.token_choice(TOKENS), url_state.token_text(TOKENS))
