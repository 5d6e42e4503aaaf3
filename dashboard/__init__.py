"""The Streamlit dashboard: pages that only display (``views/``), the data they read through the
collector's query room with cached functions (``data.py``), charts (``charts.py``), and who the
viewer is (``identity.py``, ``proxy_trust.py``). Imports ``jobsight.protocol``, ``jobsight.rules`` and
the collector's ``config``, ``store`` and ``query`` rooms; never the agent, ingest, passes or api."""
