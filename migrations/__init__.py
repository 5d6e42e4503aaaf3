"""Alembic's migrations of the collector's schema (``versions/``): history, never rewritten once
applied. Imports ``jobsight.protocol`` and the collector's ``store`` (the schema)."""
