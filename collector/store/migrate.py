"""Applying and checking the Alembic schema from code (CONTRIBUTING rule 5)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, pool

from jobsight.collector.store.schema import compare_type, include_name, metadata

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"


def sqlalchemy_url(database_url: str) -> str:
    """SQLAlchemy needs the driver named; psycopg and libpq do not."""
    for prefix in ("postgresql://", "postgres://"):
        if database_url.startswith(prefix):
            return "postgresql+psycopg://" + database_url[len(prefix) :]
    return database_url


def libpq_url(database_url: str) -> str:
    return database_url.replace("postgresql+psycopg://", "postgresql://", 1)


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", sqlalchemy_url(database_url).replace("%", "%%"))
    return config


def upgrade(database_url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(database_url), revision)


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config("postgresql://unused")).get_current_head()


def current_revision(database_url: str) -> str | None:
    engine = create_engine(sqlalchemy_url(database_url), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def schema_is_current(database_url: str) -> bool:
    return current_revision(database_url) == head_revision()


def autogenerate_diff(database_url: str) -> list[Any]:
    """Differences between the models and the database; empty when they agree."""
    engine = create_engine(sqlalchemy_url(database_url), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            opts = {"include_name": include_name, "compare_type": compare_type}
            context = MigrationContext.configure(conn, opts=opts)
            return list(compare_metadata(context, metadata))
    finally:
        engine.dispose()


def schema_revision(conn: psycopg.Connection[dict[str, Any]]) -> str | None:
    """The Alembic revision the database is at; ``None`` when it has none stamped."""
    row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    return row["version_num"] if row else None
