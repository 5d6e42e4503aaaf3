"""The collector: the FastAPI server that stores what the agents send and answers the reads, plus the
passes that run on timers beside it. Its rooms, bottom first, each importing only itself and the rooms
below it (tests/layout/): ``config`` (settings), ``store`` (connections, schema, partitions, the packed
format's numbers), ``tiers`` (hot rows and packed hours), ``jobs`` (a job's lifecycle and summary),
``ingest`` (a batch from body to commit), ``query`` (reads), ``passes`` (timers: findings, actions,
alerts, compaction) and ``api`` (HTTP). ``app.py`` is the entry that puts them together. Imports
``jobsight.protocol`` and ``jobsight.rules``; never the agent or the dashboard."""
