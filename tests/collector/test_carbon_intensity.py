"""Carbon intensity: codecarbon's yearly figures as its JSON says them, a CSV series, an HTTPS series
served by a real server here with a certificate made by the ``openssl`` CLI (token checked, answers
cached, failures falling back and saying so, a certificate of another CA refused before the token is
sent), and bad settings named (an ``http://`` endpoint among them)."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from jobsight.collector.config.carbon import CarbonSettings
from jobsight.collector.config.settings import SettingsError, load_collector_settings
from jobsight.collector.query.carbon_intensity import CarbonIntensity, Intensity, emissions_kg

TOKEN = "s3cret-token-for-tests"
T0 = datetime(2026, 11, 24, 10, tzinfo=UTC)
HOUR = timedelta(hours=1)


def _dataset(name: str) -> Any:
    """A file of codecarbon's dataset, read here on its own to compare with what the collector says."""
    spec = importlib.util.find_spec("codecarbon")
    assert spec is not None and spec.submodule_search_locations
    folder = Path(next(iter(spec.submodule_search_locations))) / "data" / "private_infra"
    return json.loads((folder / name).read_text())


def _carbon(**fields: Any) -> CarbonIntensity:
    return CarbonIntensity(CarbonSettings(**fields))


# --- the yearly figures ------------------------------------------------------------------------


@pytest.mark.parametrize(("given", "iso3", "name"), [("FRA", "FRA", "France"), ("DE", "DEU", "Germany")])
def test_a_countrys_yearly_figure_is_the_datasets(given: str, iso3: str, name: str) -> None:
    entry = _dataset("global_energy_mix.json")[iso3]
    carbon = _carbon(country=given)
    yearly = carbon.yearly()
    assert yearly is not None
    assert yearly.g_per_kwh == entry["carbon_intensity"]
    assert yearly.source == f"{name} yearly mean {entry['year']} (codecarbon dataset)"
    assert carbon.settings.country == iso3
    # Without a series every hour has the yearly figure.
    assert carbon.for_hours([T0, T0 + HOUR]) == [yearly, yearly]


def test_a_us_states_figure_is_egrids_rate_in_grams() -> None:
    pounds_per_mwh = _dataset("2023/usa_emissions.json")["california"]["emissions"]
    yearly = _carbon(region="California").yearly()
    assert yearly is not None
    assert yearly.g_per_kwh == pytest.approx(pounds_per_mwh * 453.59237 / 1000)
    assert yearly.source.startswith("California (USA) yearly mean 2023")


def test_a_hydro_province_is_far_below_its_country() -> None:
    quebec, canada = _carbon(region="quebec", country="CA").yearly(), _carbon(country="CAN").yearly()
    assert quebec is not None and canada is not None
    assert 0 < quebec.g_per_kwh < canada.g_per_kwh / 3
    assert "Quebec (CAN)" in quebec.source


def test_the_sites_own_value_wins() -> None:
    carbon = _carbon(country="FRA", intensity_g_per_kwh=123.0, pue=1.4)
    assert carbon.yearly() == Intensity(123.0, "site value")
    assert carbon.describe()["pue"] == 1.4


def test_nothing_configured_gives_no_figure() -> None:
    carbon = _carbon()
    assert carbon.yearly() is None and carbon.for_hours([T0]) == []
    assert carbon.describe() == {"configured": False, "pue": 1.0, "yearly": None, "series": None,
                                 "series_cache_s": None}


def test_emissions() -> None:
    assert emissions_kg(10.0, 56.0, 1.5) == pytest.approx(0.84)


# --- a CSV series -------------------------------------------------------------------------------


def test_a_csv_series_gives_each_hour_the_value_at_or_before_it(tmp_path: Path) -> None:
    path = tmp_path / "intensity.csv"
    path.write_text("datetime,carbonIntensity\n"
                    "2026-11-24T11:00:00.000Z,80\n"  # out of order on purpose
                    "2026-11-24T10:00:00.000Z,50\n"
                    "2026-11-24T13:00:00+00:00,120\n")
    carbon = _carbon(series_csv=str(path), country="FRA")
    france = carbon.yearly()
    assert france is not None
    hours = [T0 - HOUR, T0, T0 + HOUR, T0 + 2 * HOUR, T0 + 3 * HOUR, T0 + 6 * HOUR, T0 + 7 * HOUR]
    got = carbon.for_hours(hours)
    assert [i.g_per_kwh for i in got] == [france.g_per_kwh, 50, 80, 80, 120, 120, france.g_per_kwh]
    assert got[1].source == f"time series file {path}"
    assert got[0].source.startswith(france.source) and "no value in the 3 h up to this hour" in got[0].source
    # Another zone's clock: the same instant.
    assert carbon.for_hours([datetime.fromisoformat("2026-11-24T12:00:00+01:00")])[0].g_per_kwh == 80


def test_a_csv_series_is_read_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "intensity.csv"
    path.write_text("datetime,carbon_intensity\n2026-11-24T10:00:00Z,50\n")
    carbon = _carbon(series_csv=str(path), intensity_g_per_kwh=300.0)
    assert carbon.for_hours([T0])[0].g_per_kwh == 50
    path.write_text("datetime,carbon_intensity\n2026-11-24T10:00:00Z,70\n")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert carbon.for_hours([T0])[0].g_per_kwh == 70
    path.write_text("datetime,carbon_intensity\n2026-11-24T10:00:00Z,lots\n")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 2 * 10**9))
    broken = carbon.for_hours([T0])[0]
    assert broken == Intensity(300.0, "site value (the series failed: line 2: could not convert string to "
                                      "float: 'lots')")


def test_the_data_portals_csv_is_read(tmp_path: Path) -> None:
    path = tmp_path / "FR_2023_hourly.csv"
    path.write_text("Datetime (UTC),Country,Zone Name,Zone Id,Carbon Intensity gCO₂eq/kWh (direct),"
                    "Carbon Intensity gCO₂eq/kWh (life cycle assessment),Low Carbon Percentage\n"
                    "2026-11-24 10:00:00,France,France,FR,21.5,45.25,95\n", encoding="utf-8")
    assert _carbon(series_csv=str(path), country="FRA").for_hours([T0])[0].g_per_kwh == 45.25


# --- an HTTP series -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str]]:
    """Two self-signed certificates for 127.0.0.1: the endpoint's (its own CA) and another."""
    where = tmp_path_factory.mktemp("certs")
    made = {}
    for name in ("endpoint", "other"):
        cert, key = where / f"{name}.crt", where / f"{name}.key"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
                        "-addext", "subjectAltName=IP:127.0.0.1", "-days", "1", "-keyout", str(key),
                        "-out", str(cert)], check=True, capture_output=True)
        made[name] = (str(cert), str(key))
    return made


class Endpoint:
    """A real HTTPS server answering like Electricity Maps' ``carbon-intensity/history``."""

    def __init__(self, cert: tuple[str, str]) -> None:
        self.requests = 0
        self.status = 200
        self.history = [{"datetime": "2026-11-24T10:00:00.000Z", "carbonIntensity": 52, "isEstimated": False},
                        {"datetime": "2026-11-24T11:00:00.000Z", "carbonIntensity": 61, "isEstimated": True},
                        {"datetime": "2026-11-24T12:00:00.000Z", "carbonIntensity": None}]
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                endpoint.requests += 1
                if self.headers.get("auth-token") != TOKEN:
                    self._answer(401, {"error": "bad token"})
                elif endpoint.status != 200:
                    self._answer(endpoint.status, {"error": "down"})
                else:
                    self._answer(200, {"zone": "FR", "history": endpoint.history})

            def _answer(self, status: int, body: object) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that rejects the certificate ends its handshake here

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*cert)
        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True, do_handshake_on_connect=False)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"https://127.0.0.1:{self.server.server_port}/v3/carbon-intensity/history?zone=FR"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def endpoint(certs: dict[str, tuple[str, str]]) -> Iterator[Endpoint]:
    served = Endpoint(certs["endpoint"])
    yield served
    served.stop()


@pytest.fixture
def http_carbon(endpoint: Endpoint, certs: dict[str, tuple[str, str]],
                tmp_path: Path) -> Callable[..., CarbonIntensity]:
    """A :class:`CarbonIntensity` of the endpoint, trusting its certificate as the site's CA."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")

    def make(**fields: Any) -> CarbonIntensity:
        return _carbon(**{"series_url": endpoint.url, "series_token_file": str(token_file), "country": "FRA",
                          "series_ca_file": certs["endpoint"][0], **fields})
    return make


def test_an_https_series_is_fetched_once_per_cache_period(endpoint: Endpoint,
                                                         http_carbon: Callable[..., CarbonIntensity]) -> None:
    carbon = http_carbon()
    france = carbon.yearly()
    assert france is not None
    first = carbon.for_hours([T0, T0 + HOUR, T0 + 2 * HOUR, T0 + 5 * HOUR])
    host = f"https://127.0.0.1:{endpoint.server.server_port}"
    assert first[:3] == [Intensity(52, f"time series ({host})"), Intensity(61, f"time series ({host})"),
                         Intensity(61, f"time series ({host})")]  # a null hour: the value before it
    assert first[3].g_per_kwh == france.g_per_kwh and "no value" in first[3].source
    assert carbon.for_hours([T0]) == first[:1]
    assert endpoint.requests == 1
    described = json.dumps(carbon.describe())
    assert host in described and "zone=FR" not in described and TOKEN not in described


def test_a_failing_endpoint_falls_back_once_per_cache_period(endpoint: Endpoint,
                                                              http_carbon: Callable[..., CarbonIntensity],
                                                              caplog: pytest.LogCaptureFixture) -> None:
    endpoint.status = 500
    carbon = http_carbon(series_cache_s=0.2)
    france = carbon.yearly()
    assert france is not None
    with caplog.at_level(logging.WARNING, logger="jobsight.collector.query.carbon_intensity"):
        failed = carbon.for_hours([T0])
        assert failed == [Intensity(france.g_per_kwh, f"{france.source} (the series failed: HTTP 500)")]
        assert carbon.for_hours([T0]) == failed and endpoint.requests == 1  # the failure is cached
        time.sleep(0.25)
        assert carbon.for_hours([T0]) == failed and endpoint.requests == 2
        endpoint.status = 200
        time.sleep(0.25)
        assert carbon.for_hours([T0])[0].g_per_kwh == 52 and endpoint.requests == 3
    messages = [record.getMessage() for record in caplog.records]
    assert len([m for m in messages if "failed" in m]) == 1, messages  # once per outage
    assert len([m for m in messages if "answers again" in m]) == 1, messages
    assert not [m for m in messages if TOKEN in m or "zone=FR" in m]


def test_a_stopped_endpoint_falls_back(endpoint: Endpoint, http_carbon: Callable[..., CarbonIntensity]) -> None:
    carbon = http_carbon()
    endpoint.stop()
    france = carbon.yearly()
    assert france is not None
    (got,) = carbon.for_hours([T0])
    assert got.g_per_kwh == france.g_per_kwh
    assert got.source.startswith(f"{france.source} (the series failed: ") and "refused" in got.source.lower()


def test_a_wrong_token_falls_back(endpoint: Endpoint, http_carbon: Callable[..., CarbonIntensity],
                                  tmp_path: Path) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-token")
    (got,) = http_carbon(series_token_file=str(wrong), intensity_g_per_kwh=200.0).for_hours([T0])
    assert got == Intensity(200.0, "site value (the series failed: HTTP 401)")
    assert endpoint.requests == 1


def test_a_certificate_of_another_ca_is_refused_before_the_token_is_sent(
        endpoint: Endpoint, http_carbon: Callable[..., CarbonIntensity], certs: dict[str, tuple[str, str]]) -> None:
    for ca_file in (None, certs["other"][0]):  # the system's CAs, and a CA that did not sign it
        (got,) = http_carbon(series_ca_file=ca_file, intensity_g_per_kwh=200.0).for_hours([T0])
        assert got.g_per_kwh == 200.0 and "certificate" in got.source.lower(), got.source
        assert TOKEN not in got.source
    assert endpoint.requests == 0  # no request was ever made: the token never left


def test_an_http_endpoint_stops_the_collector_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """``http://`` would send the token in clear: refused at start, the URL (and its key) never quoted."""
    monkeypatch.setenv("JOBSIGHT_CARBON_COUNTRY", "FRA")
    monkeypatch.setenv("JOBSIGHT_CARBON_SERIES_URL", "http://api.example.org/v3/history?zone=FR&key=k")
    with pytest.raises(SettingsError, match="JOBSIGHT_CARBON_SERIES_URL") as caught:
        load_collector_settings()
    assert "https://" in str(caught.value) and "key=k" not in str(caught.value)
    assert "api.example.org" not in str(caught.value)


# --- settings -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("env", "named"), [
    ({"JOBSIGHT_CARBON_PUE": "0.5"}, "JOBSIGHT_CARBON_PUE"),
    ({"JOBSIGHT_CARBON_SERIES_CACHE_S": "0"}, "JOBSIGHT_CARBON_SERIES_CACHE_S"),
    ({"JOBSIGHT_CARBON_COUNTRY": "XYZ"}, "JOBSIGHT_CARBON_COUNTRY"),
    ({"JOBSIGHT_CARBON_COUNTRY": "France"}, "JOBSIGHT_CARBON_COUNTRY"),
    ({"JOBSIGHT_CARBON_REGION": "atlantis"}, "JOBSIGHT_CARBON_REGION"),
    ({"JOBSIGHT_CARBON_COUNTRY": "FRA", "JOBSIGHT_CARBON_REGION": "quebec"}, "JOBSIGHT_CARBON_REGION"),
    ({"JOBSIGHT_CARBON_SERIES_URL": "https://example.org/h"}, "JOBSIGHT_CARBON_SERIES_URL"),  # no fallback
    ({"JOBSIGHT_CARBON_SERIES_URL": "file:///etc/passwd", "JOBSIGHT_CARBON_COUNTRY": "FRA"},
     "JOBSIGHT_CARBON_SERIES_URL"),
    ({"JOBSIGHT_CARBON_SERIES_URL": "https://example.org/h?key=k", "JOBSIGHT_CARBON_COUNTRY": "FRA",
      "JOBSIGHT_CARBON_SERIES_TOKEN_FILE": "/nonexistent/token"}, "JOBSIGHT_CARBON_SERIES_TOKEN_FILE"),
    ({"JOBSIGHT_CARBON_SERIES_CSV": "/nonexistent.csv", "JOBSIGHT_CARBON_COUNTRY": "FRA"},
     "JOBSIGHT_CARBON_SERIES_CSV"),
    ({"JOBSIGHT_CARBON_SERIES_URL": "https://example.org/h?key=k", "JOBSIGHT_CARBON_COUNTRY": "FRA",
      "JOBSIGHT_CARBON_SERIES_CA_FILE": "/nonexistent/ca.pem"}, "JOBSIGHT_CARBON_SERIES_CA_FILE"),
    ({"JOBSIGHT_CARBON_COUNTRY": "FRA", "JOBSIGHT_CARBON_SERIES_CA_FILE": "/etc/hostname"},
     "JOBSIGHT_CARBON_SERIES_CA_FILE"),
])
def test_a_bad_setting_stops_the_collector_naming_it(env: dict[str, str], named: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError, match=named) as caught:
        load_collector_settings()
    assert "key=k" not in str(caught.value)


def test_the_carbon_table_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "jobsight.toml"
    config.write_text('[carbon]\npue = 1.25\ncountry = "FR"\n')
    monkeypatch.setenv("JOBSIGHT_CONFIG", str(config))
    monkeypatch.setenv("JOBSIGHT_CARBON_PUE", "1.5")
    carbon = load_collector_settings().carbon
    assert (carbon.pue, carbon.country, carbon.region) == (1.5, "FRA", None)
