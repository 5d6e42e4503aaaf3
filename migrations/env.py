"""Alembic environment. The DSN comes from the caller (``jobsight.collector.store.migrate``) or
``JOBSIGHT_DATABASE_URL``; daily partitions are the collector's, not Alembic's."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine, pool

from jobsight.collector.store.schema import compare_type, include_name, metadata


def _url() -> str:
    url = context.config.get_main_option("sqlalchemy.url") or os.environ.get("JOBSIGHT_DATABASE_URL")
    if not url:
        raise RuntimeError("no database URL: set JOBSIGHT_DATABASE_URL")
    return url


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=metadata, include_name=include_name, compare_type=compare_type)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=metadata, include_name=include_name, compare_type=compare_type)
        with context.begin_transaction():
            context.run_migrations()


run_migrations_online()
