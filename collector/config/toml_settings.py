"""What every settings object of jobsight is made of: env vars first, then one table of the TOML
file named by ``JOBSIGHT_CONFIG``; and the error a bad value raises, naming it."""

from __future__ import annotations

import os
import tomllib
from typing import Any, ClassVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource


class SettingsError(RuntimeError):
    """A setting that cannot be used; the message names it."""


class TomlTableSource(PydanticBaseSettingsSource):
    """Reads one table (``[collector]``, ``[dashboard]``) of the file named by ``JOBSIGHT_CONFIG``."""

    def __init__(self, settings_cls: type[BaseSettings], table: str):
        super().__init__(settings_cls)
        self.table = table

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        path = os.environ.get("JOBSIGHT_CONFIG")
        if not path:
            return {}
        try:
            with open(path, "rb") as handle:
                data = tomllib.load(handle)
        except OSError as exc:
            raise SettingsError(f"JOBSIGHT_CONFIG: cannot read {path}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"JOBSIGHT_CONFIG: {path} is not valid TOML: {exc}") from exc
        section = data.get(self.table, {})
        return section if isinstance(section, dict) else {}


class TomlTableSettings(BaseSettings):
    """Settings from env vars, then the ``[toml_table]`` table of the ``JOBSIGHT_CONFIG`` file."""

    toml_table: ClassVar[str]

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, TomlTableSource(settings_cls, cls.toml_table))


def validation_message(component: str, env_prefix: str, exc: ValidationError) -> str:
    """One line naming every bad variable, for a component that must not start with them."""
    problems = "; ".join(
        f"{env_prefix}{'_'.join(str(p) for p in err['loc']).upper()}: {err['msg']}" for err in exc.errors()
    )
    return f"invalid {component} settings: {problems}"
