"""Settings of the carbon figures (``collector/query/carbon_intensity.py``): ``JOBSIGHT_CARBON_*``
variables, then the ``[carbon]`` table of the ``JOBSIGHT_CONFIG`` file; a bad value stops the
collector with a message naming it.

A job's energy becomes kg CO2e = kWh x PUE x intensity (g/kWh) / 1000. The intensity of an hour is
a time series' value where the site gives one (a CSV file, or an endpoint answering like
Electricity Maps' ``carbon-intensity/history``), else the site's own fixed value, else the yearly
mean of its country or US state / Canadian province from codecarbon's dataset. A series always
needs one of the latter to fall back on: Electricity Maps' history covers the last 24 hours, and
an endpoint can be down.

```toml
[carbon]
pue = 1.3
country = "FRA"                 # or "FR"; or region = "quebec" (a US state or Canadian province)
# intensity_g_per_kwh = 45      # the site's own figure, instead of the country's
# series_url = "https://api.electricitymaps.com/v3/carbon-intensity/history?zone=FR"
# series_token_file = "/etc/jobsight/electricitymaps_token"
# series_ca_file = "/etc/ssl/site-ca.pem"  # an endpoint of the site's own, with a certificate of its CA
```

The endpoint is HTTPS only, its certificate checked (the system's CAs, or ``series_ca_file``): the
token travels with every request, and an ``http://`` URL stops the collector with a message naming
``series_url``.

The yearly dataset is read here (the JSON files codecarbon ships; its package is never imported:
it imports pandas and psutil on the way), so that an unknown country or region stops the start.
"""

from __future__ import annotations

import importlib.util
import json
import ssl
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import SettingsConfigDict

from jobsight.collector.config.toml_settings import SettingsError, TomlTableSettings, validation_message

LBS_PER_MWH_TO_G_PER_KWH = 0.45359237
"""One pound is 453.59237 g; per MWh is per 1000 kWh (eGRID's US rates are in lb/MWh)."""
_REGION_COUNTRIES = {"USA": "usa_emissions.json", "CAN": "canada_energy_mix.json"}
"""The countries codecarbon has regional figures for, and the file of each (in a year's folder)."""
_MIX_FACTOR_NAMES = {"naturalGas": "natural_gas", "hydro": "hydroelectricity"}
"""Canada's mix names -> the names of ``carbon_intensity_per_source.json`` where they differ."""
_MAX_TOKEN_BYTES = 4096


@dataclass(frozen=True)
class YearlyFigure:
    """A place's mean intensity over a year, with words saying where it comes from."""

    g_per_kwh: float
    place: str
    year: int | None
    basis: str
    """How the figure was made (the dataset and, where computed here, how)."""


def codecarbon_data_dir() -> Path | None:
    """``codecarbon/data/private_infra`` of the installed codecarbon, found without importing it."""
    spec = importlib.util.find_spec("codecarbon")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        folder = Path(location) / "data" / "private_infra"
        if folder.is_dir():
            return folder
    return None


@lru_cache(maxsize=8)
def _json(path: Path) -> Any:
    with path.open("rb") as handle:
        return json.load(handle)


def _data_dir() -> Path:
    folder = codecarbon_data_dir()
    if folder is None:
        raise ValueError("the yearly figures need codecarbon's dataset: pip install 'jobsight[collector]'")
    return folder


def _newest(folder: Path, name: str) -> tuple[Path, int]:
    """The newest ``<year>/<name>`` of codecarbon's dataset, and its year."""
    years = sorted((int(p.name) for p in folder.iterdir() if p.name.isdigit() and (p / name).is_file()),
                   reverse=True)
    if not years:
        raise ValueError(f"codecarbon's dataset has no {name}")
    return folder / str(years[0]) / name, years[0]


def country_alpha3(code: str) -> str:
    """An ISO 3166 alpha-3 code from an alpha-3 or alpha-2 one (the latter through pycountry,
    which codecarbon installs)."""
    code = code.strip().upper()
    if len(code) == 3 and code.isalpha():
        return code
    if len(code) == 2 and code.isalpha():
        try:
            import pycountry
        except ImportError:
            raise ValueError("a 2-letter country code needs pycountry; give the 3-letter one (FRA)") from None
        country = pycountry.countries.get(alpha_2=code)
        if country is None:
            raise ValueError("not an ISO 3166 alpha-2 country code")
        return str(country.alpha_3)
    raise ValueError("give an ISO 3166 country code: alpha-3 (FRA) or alpha-2 (FR)")


def _place(region: str) -> str:
    """``newfoundland and labrador`` -> ``Newfoundland and Labrador``."""
    return " ".join(word if word in ("of", "and") else word.capitalize() for word in region.split())


def regions() -> dict[str, str]:
    """Every region of codecarbon's dataset -> its country (alpha-3)."""
    folder = _data_dir()
    found: dict[str, str] = {}
    for country, name in _REGION_COUNTRIES.items():
        path, _ = _newest(folder, name)
        found.update({region: country for region in _json(path) if not region.startswith("_")})
    return found


def yearly_figure(country: str | None, region: str | None) -> YearlyFigure:
    """The yearly mean intensity of ``region`` (a lower-case US state or Canadian province) or else
    ``country`` (alpha-3), from codecarbon's dataset; ``ValueError`` says why there is none.

    A country's figure is its ``carbon_intensity`` (g/kWh, life cycle) of ``global_energy_mix.json``.
    A US state's is eGRID's ``emissions`` (lb/MWh) of ``usa_emissions.json``. A Canadian province
    has only its generation mix (percent per source) in ``canada_energy_mix.json``: its figure is
    the mix weighted by ``carbon_intensity_per_source.json``'s life-cycle factors, every source
    that has one (codecarbon itself counts only coal, oil and gas there, which makes hydro-powered
    Quebec nearly carbon-free), so that it means what a country's figure means."""
    folder = _data_dir()
    if region is not None:
        home = regions().get(region)
        if home is None:
            raise ValueError("not a US state or Canadian province of codecarbon's dataset (e.g. california, quebec)")
        if country is not None and country != home:
            raise ValueError(f"that region is in {home}, not in the country set")
        path, year = _newest(folder, _REGION_COUNTRIES[home])
        entry = _json(path)[region]
        if home == "USA":
            return YearlyFigure(float(entry["emissions"]) * LBS_PER_MWH_TO_G_PER_KWH, f"{_place(region)} (USA)",
                                year, "codecarbon dataset: EPA eGRID")
        factors = _json(folder / "carbon_intensity_per_source.json")
        weighted = sum(float(share) * float(factors[_MIX_FACTOR_NAMES.get(source, source)])
                       for source, share in entry.items()
                       if source != "total" and isinstance(factors.get(_MIX_FACTOR_NAMES.get(source, source)),
                                                           int | float))
        return YearlyFigure(weighted / float(entry["total"]), f"{_place(region)} (CAN)", year,
                            "codecarbon dataset: generation mix x life-cycle factor per source")
    if country is None:
        raise ValueError("no country or region")
    entry = _json(folder / "global_energy_mix.json").get(country)
    if not isinstance(entry, dict) or not isinstance(entry.get("carbon_intensity"), int | float):
        raise ValueError("codecarbon's dataset has no yearly figure for that country")
    stated = entry.get("year")
    return YearlyFigure(float(entry["carbon_intensity"]), str(entry.get("country_name") or country),
                        stated if isinstance(stated, int) else None, "codecarbon dataset")


class CarbonSettings(TomlTableSettings):
    model_config = SettingsConfigDict(env_prefix="JOBSIGHT_CARBON_", extra="ignore")
    toml_table: ClassVar[str] = "carbon"

    pue: float = Field(1.0, ge=1, le=5)
    """The data centre's power usage effectiveness: what the site draws per kWh the GPUs use."""
    intensity_g_per_kwh: float | None = Field(None, ge=0, le=5000)
    """The site's own fixed intensity (g CO2e/kWh); wins over the country's or region's."""
    country: str | None = None
    """ISO 3166 alpha-3 (FRA) or alpha-2 (FR, kept as alpha-3): its yearly mean is the fallback."""
    region: str | None = None
    """A US state or Canadian province of codecarbon's dataset (california, quebec): its yearly mean
    instead of the country's (the country, when given, must be the region's)."""
    series_csv: str | None = None
    """A CSV file of hourly intensities: ``datetime,carbonIntensity`` (ISO 8601 times, UTC where they
    say no zone; g/kWh; ``carbon_intensity`` too), or an Electricity Maps data-portal download
    (``Datetime (UTC)``, ``Carbon Intensity gCO₂eq/kWh (life cycle assessment)``). Re-read when it changes."""
    series_url: str | None = None
    """An ``https://`` endpoint answering like Electricity Maps' ``carbon-intensity/history`` (never
    ``http://``: its token would travel in clear)."""
    series_token_file: str | None = None
    """A file holding the endpoint's token, sent as the ``auth-token`` header (and never logged)."""
    series_ca_file: str | None = None
    """The CA bundle (PEM) that signed the endpoint's certificate; ``None``: the system's CAs."""
    series_cache_s: float = Field(3600.0, gt=0)
    """How long an answer of the endpoint is used, a failure included (no retry storm)."""

    @field_validator("country")
    @classmethod
    def _known_country(cls, value: str | None) -> str | None:
        if value is None:
            return None
        code = country_alpha3(value)
        yearly_figure(code, None)
        return code

    @field_validator("region")
    @classmethod
    def _known_region(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        region = " ".join(value.lower().split())
        yearly_figure(info.data.get("country"), region)
        return region

    @field_validator("series_csv")
    @classmethod
    def _series_file(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        if not Path(value).is_file():
            raise ValueError("no such file")
        _needs_fallback(info)
        return value

    @field_validator("series_url")
    @classmethod
    def _series_endpoint(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)  # the message never quotes the URL: it may carry a key
        if parts.scheme != "https" or not parts.hostname:
            # The token goes with every request: never in clear (the message never quotes the URL).
            raise ValueError("give an https:// URL with a host (not http://: the token would travel in clear)")
        if info.data.get("series_csv") is not None:
            raise ValueError("set series_csv or series_url, not both")
        _needs_fallback(info)
        return value

    @field_validator("series_token_file")
    @classmethod
    def _token_file(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        if info.data.get("series_url") is None:
            raise ValueError("a token file is for series_url, which is not set")
        read_token(value)
        return value

    @field_validator("series_ca_file")
    @classmethod
    def _ca_file(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        if info.data.get("series_url") is None:
            raise ValueError("a CA file is for series_url, which is not set")
        try:
            ssl.create_default_context(cafile=value)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"not a readable PEM CA bundle ({getattr(exc, 'strerror', None) or exc})") from None
        return value

    def series_host(self) -> str | None:
        """The endpoint's scheme, host and port, the one part of its URL that is shown."""
        if self.series_url is None:
            return None
        parts = urlsplit(self.series_url)
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{parts.hostname}{port}"


def _needs_fallback(info: ValidationInfo) -> None:
    if all(info.data.get(name) is None for name in ("intensity_g_per_kwh", "country", "region")):
        raise ValueError("a series needs a fallback for the hours it lacks: set intensity_g_per_kwh, country "
                         "or region")


def read_token(path: str) -> str:
    """The token in ``path`` (stripped); ``ValueError`` (naming the file, never its content) if it
    cannot be read or is empty."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(_MAX_TOKEN_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot read the token file: {exc.strerror or exc}") from None
    if len(raw) > _MAX_TOKEN_BYTES:
        raise ValueError("the token file is too large for a token")
    token = raw.decode("utf-8", "replace").strip()
    if not token or any(c in token for c in "\r\n"):
        raise ValueError("the token file must hold one token on one line")
    return token


def load_carbon_settings(**overrides: Any) -> CarbonSettings:
    """Load and validate; raises :class:`SettingsError` naming the bad value."""
    try:
        return CarbonSettings(**overrides)
    except ValidationError as exc:
        raise SettingsError(validation_message("carbon", "JOBSIGHT_CARBON_", exc)) from exc

