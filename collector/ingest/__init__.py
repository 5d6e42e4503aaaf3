"""A batch's way in, from body to commit: the entry the HTTP route calls (``batch.py``), the body read and
checked (``body.py``), what each token may write (``write_rights.py``), a job's own samples kept apart
(``self_reported.py``), its records turned into rows (``rows.py``) and minute rollups (``minute_rollup.py``),
written in a group commit (``group_commit.py``, ``write.py``). Imports jobs, tiers, store and config."""
