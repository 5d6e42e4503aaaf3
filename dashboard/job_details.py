"""The job page's details, drawn one at a time when chosen, under what the page always draws (its
header, health, waste actions, the heatmap of every GPU, the steps and throughput): the GPUs of
chosen nodes as lines (utilisation, memory, power, temperature), training metrics, energy and
epochs, logs, profiles. The choice is kept in the address (``details=logs``), as the page's other
choices are (:mod:`jobsight.dashboard.url_state`), so a link can open a job on its logs.

None until chosen: each Vega chart costs the browser about a tenth of a second to draw on a
2-core machine, and a 64-GPU job's page that drew its every section (eight charts, three tables)
took three times as long to open as a bare Streamlit page of three charts
(``bench/browser_page.py``); what a researcher opens a job page for first is its health, the
heatmap and the steps, which are drawn at once."""

from __future__ import annotations

from typing import Final

from jobsight.dashboard import url_state

PARAM: Final = "details"
KEY: Final = "job_details"
NODES: Final = "GPUs by node"
METRICS: Final = "Training metrics"
ENERGY: Final = "Energy and epochs"
LOGS: Final = "Logs"
PROFILES: Final = "Profiles"
SECTIONS: Final = (NODES, METRICS, ENERGY, LOGS, PROFILES)
TOKENS: Final = {"nodes": NODES, "metrics": METRICS, "energy": ENERGY, "logs": LOGS, "profiles": PROFILES}
"""The address's token of each section."""


def param() -> url_state.Param:
    """The section shown, as a query parameter bound to its widget; none by default."""
    return url_state.Param(PARAM, KEY, None, url_state.token_choice(TOKENS), url_state.token_text(TOKENS))
