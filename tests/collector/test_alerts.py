"""Alerts for findings, end to end on real parts: findings rows in the session's PostgreSQL, the
outbox written by ``alerts.enqueue``, sent by ``AlertSender`` through the real Apprise library to
a real local HTTP receiver over Apprise's JSON webhook URL (``json://127.0.0.1:PORT/path``).

Every test names its sinks uniquely: the outbox is shared by the session's tests, and a sender
sends only to the sinks its settings name.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from jobsight.collector.config.alerts import AlertSettings, load_alert_settings
from jobsight.collector.config.settings import SettingsError
from jobsight.collector.passes.alert_messages import redact
from jobsight.collector.passes.alerts import AlertSender, enqueue
from jobsight.collector.store.embedded_db import free_port
from jobsight.protocol.wire import now_us
from tests.collector.helpers import gz
from tests.conftest import LiveCollector

REPO = Path(__file__).resolve().parents[2]
SECRET_PATH = "hook-tok3n-s3cret"
"""A word in every sink URL's path: no log line or stored error may repeat it."""


class Receiver:
    """A real HTTP server on a fixed port that records every POST: path and JSON body in
    ``posts``, path, content type and raw body of every one (a form's too) in ``raw``; it can be
    left down (nothing listens on the port) and started later."""

    def __init__(self) -> None:
        self.port = free_port()
        self.posts: list[tuple[str, dict[str, Any]]] = []
        self.raw: list[tuple[str, str, bytes]] = []
        self._server: ThreadingHTTPServer | None = None

    def url(self, path: str = "alerts") -> str:
        return f"json://127.0.0.1:{self.port}/{path}/{SECRET_PATH}"

    def start(self) -> None:
        posts, raw = self.posts, self.raw

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                content_type = self.headers.get("Content-Type", "")
                raw.append((self.path, content_type, body))
                if content_type.startswith("application/json"):
                    posts.append((self.path, json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def titles(self) -> list[str]:
        return [body["title"] for _, body in self.posts]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def down_receiver() -> Iterator[Receiver]:
    """A receiver whose port nothing listens on until the test starts it."""
    server = Receiver()
    yield server
    server.stop()


def sink_name() -> str:
    return f"s{uuid.uuid4().hex[:10]}"


def add_job(db: psycopg.Connection[Any], job_id: str, user: str = "alice", account: str | None = "physics",
            partition: str | None = "gpu") -> dict[str, Any]:
    db.execute("INSERT INTO jobs (cluster, job_id, user_name, account, partition) VALUES ('default', %s, %s, %s, %s)",
               (job_id, user, account, partition))
    return {"user_name": user, "account": account, "partition": partition}


def open_finding(conn: psycopg.Connection[Any], job_id: str, rule: str = "hung_rank", severity: str = "critical",
                 subject: str = "rank 1") -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(
            """INSERT INTO findings (cluster, job_id, rule, subject, rank, severity, opened_at, updated_at, title,
                                     message, evidence)
               VALUES ('default', %s, %s, %s, 1, %s, now(), now(), %s, %s, '{}') RETURNING *""",
            (job_id, rule, subject, severity, f"{rule} on {subject}", f"{subject} has made no step for 14 min"),
        ).fetchone()
    assert row is not None
    return row


def resolve_finding(conn: psycopg.Connection[Any], finding: dict[str, Any]) -> dict[str, Any]:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute("UPDATE findings SET state = 'resolved', resolved_at = now() WHERE job_id = %s AND id = %s"
                          " RETURNING *", (finding["job_id"], finding["id"])).fetchone()
    assert row is not None
    return row


def outbox(db: psycopg.Connection[Any], job_id: str) -> list[dict[str, Any]]:
    with db.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT *, next_try_at - now() AS wait FROM alert_outbox WHERE job_id = %s ORDER BY id",
                           (job_id,)).fetchall()


def settings_with(*sinks: dict[str, Any], **values: Any) -> AlertSettings:
    return load_alert_settings(sinks=list(sinks), **{"group_window_s": 0, **values})


def test_one_message_when_a_finding_opens_and_one_when_it_resolves(
    db: psycopg.Connection[Any], job_id: str, receiver: Receiver
) -> None:
    job = add_job(db, job_id)
    settings = settings_with({"name": sink_name(), "url": receiver.url()})
    sender = AlertSender(db, settings, dashboard_url="http://dash.example:8501")

    with db.transaction():  # as the findings evaluator does: the finding and its alerts together
        finding = open_finding(db, job_id)
        assert enqueue(db, settings, finding, "opened", job) == 1
    assert enqueue(db, settings, finding, "opened", job) == 0  # the same event again writes nothing
    assert sender.send_due() == 1
    assert sender.send_due() == 0
    assert len(receiver.posts) == 1
    body = receiver.posts[0][1]
    assert body["title"] == f"jobsight: opened on job {job_id}: hung_rank on rank 1"
    assert f"OPENED job {job_id} (alice) [critical] hung_rank rank 1: rank 1 has made no step" in body["message"]
    assert f"http://dash.example:8501/job?cluster=default&job={job_id}" in body["message"]
    assert body["type"] == "failure"

    with db.transaction():
        resolved = resolve_finding(db, finding)
        assert enqueue(db, settings, resolved, "resolved", job) == 1
    assert sender.send_due() == 1
    assert sender.send_due() == 0
    assert len(receiver.posts) == 2
    assert receiver.posts[1][1]["message"].startswith(f"RESOLVED job {job_id} (alice) hung_rank rank 1")
    assert receiver.posts[1][1]["type"] == "success"
    rows = outbox(db, job_id)
    assert [(row["event"], row["attempts"], row["sent_at"] is not None) for row in rows] == [
        ("opened", 1, True), ("resolved", 1, True)]


def test_filters_and_the_user_map_route_each_finding(db: psycopg.Connection[Any], receiver: Receiver) -> None:
    names = {kind: sink_name() for kind in ("all", "hung", "critical", "gpu", "physics")}
    settings = settings_with(
        {"name": names["all"], "url": receiver.url(names["all"])},
        {"name": names["hung"], "url": receiver.url(names["hung"]), "rules": ["hung_rank"]},
        {"name": names["critical"], "url": receiver.url(names["critical"]), "min_severity": "critical"},
        {"name": names["gpu"], "url": receiver.url(names["gpu"]), "partitions": ["gpu"]},
        {"name": names["physics"], "url": receiver.url(names["physics"]), "accounts": ["physics"]},
        notify_users=True,
        user_addresses={"alice": receiver.url("user-alice")},
    )
    jobs = [f"test-{uuid.uuid4().hex[:12]}" for _ in range(3)]
    cases = [  # (job facts, rule, severity) -> the sinks that must get it
        (add_job(db, jobs[0], "alice", "physics", "gpu"), "hung_rank", "critical",
         {"all", "hung", "critical", "gpu", "physics", "user-alice"}),
        (add_job(db, jobs[1], "bob", "chemistry", "cpu"), "idle_gpu", "warning", {"all"}),
        (add_job(db, jobs[2], "alice", None, None), "straggler", "info", {"all", "user-alice"}),
    ]
    for (job, rule, severity, expected), job_id in zip(cases, jobs, strict=True):
        finding = open_finding(db, job_id, rule=rule, severity=severity)
        assert enqueue(db, settings, finding, "opened", job) == len(expected)
    assert AlertSender(db, settings).send_due() == 9
    received: dict[str, list[str]] = {}
    for path, body in receiver.posts:
        received.setdefault(path.split("/")[1], []).extend(body["message"].splitlines())
    by_kind = {kind: received.get(name, []) for kind, name in {**names, "user-alice": "user-alice"}.items()}
    for (_, rule, _, expected), job_id in zip(cases, jobs, strict=True):
        got = {kind for kind, lines in by_kind.items() if any(f"job {job_id} " in line for line in lines)}
        assert got == expected, rule
    assert len(by_kind["user-alice"]) == 2 and len(by_kind["all"]) == 3

    # Without notify_users the map is not used.
    quiet = settings_with({"name": sink_name(), "url": receiver.url()}, user_addresses={"alice": receiver.url()})
    job_id = f"test-{uuid.uuid4().hex[:12]}"
    assert enqueue(db, quiet, open_finding(db, job_id), "opened", add_job(db, job_id)) == 1


def test_findings_opened_within_the_window_go_as_one_message(
    db: psycopg.Connection[Any], job_id: str, receiver: Receiver
) -> None:
    job = add_job(db, job_id)
    sink = sink_name()
    settings = settings_with({"name": sink, "url": receiver.url()}, group_window_s=60)
    sender = AlertSender(db, settings)
    enqueue(db, settings, open_finding(db, job_id, subject="rank 0"), "opened", job)
    assert sender.send_due() == 1  # the first alert to a quiet sink goes at once

    for rank in range(1, 6):
        enqueue(db, settings, open_finding(db, job_id, subject=f"rank {rank}"), "opened", job)
    assert sender.send_due() == 0  # the window of the first message is still open
    assert len(receiver.posts) == 1

    # The window ends (the first message was sent 61 s ago): the five go together.
    db.execute("UPDATE alert_outbox SET sent_at = sent_at - interval '61 s' WHERE sink = %s AND sent_at IS NOT NULL",
               (sink,))
    assert sender.send_due() == 5
    assert sender.send_due() == 0
    assert len(receiver.posts) == 2
    grouped = receiver.posts[1][1]
    assert grouped["title"] == "jobsight: 5 findings opened"
    lines = grouped["message"].splitlines()
    assert len(lines) == 5
    assert [line.split("hung_rank ")[1].split(":")[0] for line in lines] == [f"rank {r}" for r in range(1, 6)]


def test_a_sink_that_is_down_gets_the_alert_once_it_is_up(
    db: psycopg.Connection[Any], job_id: str, down_receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    job = add_job(db, job_id)
    settings = settings_with({"name": sink_name(), "url": down_receiver.url()}, retry_base_s=30, retry_max_s=45)
    sender = AlertSender(db, settings)
    enqueue(db, settings, open_finding(db, job_id), "opened", job)

    assert sender.send_due() == 0
    [row] = outbox(db, job_id)
    assert row["attempts"] == 1 and row["sent_at"] is None
    assert 25 < row["wait"].total_seconds() <= 30  # first backoff: retry_base_s
    assert "Connection error" in row["last_error"] and "127.0.0.1" not in row["last_error"]  # no part of the URL
    assert sender.send_due() == 0  # not due yet: no try
    assert outbox(db, job_id)[0]["attempts"] == 1

    db.execute("UPDATE alert_outbox SET next_try_at = now() WHERE job_id = %s", (job_id,))  # the backoff passes
    assert sender.send_due() == 0
    [row] = outbox(db, job_id)
    assert row["attempts"] == 2 and 40 < row["wait"].total_seconds() <= 45  # doubled, capped at retry_max_s

    down_receiver.start()
    db.execute("UPDATE alert_outbox SET next_try_at = now() WHERE job_id = %s", (job_id,))
    assert sender.send_due() == 1
    assert sender.send_due() == 0
    assert len(down_receiver.posts) == 1
    [row] = outbox(db, job_id)
    assert row["attempts"] == 3 and row["sent_at"] is not None and row["last_error"] is None
    for text in [r["last_error"] or "" for r in outbox(db, job_id)] + [r.getMessage() for r in caplog.records]:
        assert SECRET_PATH not in text and str(down_receiver.port) not in text


def test_an_alert_is_given_up_after_max_attempts_and_logged_once_without_its_url(
    db: psycopg.Connection[Any], job_id: str, down_receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    job = add_job(db, job_id)
    settings = settings_with({"name": sink_name(), "url": down_receiver.url()}, max_attempts=2)
    sender = AlertSender(db, settings)
    enqueue(db, settings, open_finding(db, job_id), "opened", job)
    for _ in range(3):
        db.execute("UPDATE alert_outbox SET next_try_at = now() WHERE job_id = %s", (job_id,))
        sender.send_due()
    [row] = outbox(db, job_id)
    assert row["attempts"] == 2 and row["sent_at"] is None
    given_up = [r.getMessage() for r in caplog.records if "given up" in r.getMessage()]
    assert len(given_up) == 1 and job_id in given_up[0]
    for text in [r.getMessage() for r in caplog.records]:
        assert SECRET_PATH not in text and str(down_receiver.port) not in text


def wait_for(condition: Callable[[], bool], what: str, live: LiveCollector) -> None:
    deadline = time.monotonic() + 90
    while not condition():
        if live.process is not None and live.process.poll() is not None:
            raise AssertionError(f"collector exited: {live.log_path.read_text()[-2000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} never happened: {live.log_path.read_text()[-2000:]}")
        time.sleep(0.1)


def ingest(live: LiveCollector, records: list[dict[str, Any]]) -> None:
    request = urllib.request.Request(
        f"{live.url}/v1/ingest", data=gz(records), method="POST",
        headers={"Content-Encoding": "gzip", "Authorization": f"Bearer {live.token}"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200


def test_a_collector_killed_between_opening_and_sending_sends_after_restart_once(
    db: psycopg.Connection[Any], database_url: str, data_dir: Path, admin_token: str, job_id: str,
    down_receiver: Receiver, tmp_path: Path,
) -> None:
    # The real collector, configured by a JOBSIGHT_CONFIG file: its evaluator opens a hung-rank
    # finding from the steps below and writes the alert with it; the sink is down, so the
    # collector is killed with SIGKILL holding an unsent alert, then started again.
    sink = sink_name()
    config = tmp_path / "jobsight.toml"
    config.write_text(f"""
[health]
interval_s = 0.5
hung_min_s = 2
[alerts]
group_window_s = 0
poll_interval_s = 0.2
retry_base_s = 0.2
retry_max_s = 0.5
[[alerts.sinks]]
name = "{sink}"
url = "{down_receiver.url()}"
partitions = ["{sink}"]
""")
    # The partition is this test's own: the collector evaluates (and resolves) every job of the
    # shared database, and only this job's alerts may reach this sink.
    live = LiveCollector(database_url, data_dir, admin_token, tmp_path / "collector.log",
                         env={"JOBSIGHT_CONFIG": str(config)})
    live.start()
    try:
        t0 = now_us() - 20_000_000
        ingest(live, [
            {"kind": "job_started", "job": job_id, "ts": t0, "node": "n1", "user": "alice", "partition": sink},
            *({"kind": "step", "job": job_id, "ts": t0 + i * 100_000, "node": "n1", "rank": rank, "step": i,
               "duration_s": 0.1} for rank in (0, 1) for i in range(20)),
        ])
        wait_for(lambda: bool(outbox(db, job_id)) and outbox(db, job_id)[0]["attempts"] >= 2, "two failed tries", live)
        live.kill()
        assert [row["sent_at"] for row in outbox(db, job_id)] == [None]
        down_receiver.start()
        live.start()
        wait_for(lambda: len(down_receiver.posts) >= 1, "the alert", live)
        time.sleep(2)  # several more evaluations and sender passes: nothing is opened or sent again
        assert len(down_receiver.posts) == 1
        ingest(live, [{"kind": "job_ended", "job": job_id, "ts": now_us(), "node": "n1", "state": "COMPLETED"}])
        wait_for(lambda: len(down_receiver.posts) >= 2, "the resolve alert", live)
        time.sleep(1)
    finally:
        live.kill()
    assert [body["message"].split()[0] for _, body in down_receiver.posts] == ["OPENED", "RESOLVED"]
    opened = down_receiver.posts[0][1]
    assert "Job looks hung" in opened["title"] and "hung_rank" in opened["message"]
    assert all(row["sent_at"] is not None for row in outbox(db, job_id))
    text = live.log_path.read_text()
    assert SECRET_PATH not in text and str(down_receiver.port) not in text


def test_bad_settings_stop_with_a_message_naming_them_and_never_the_url(receiver: Receiver) -> None:
    good = {"name": "ops", "url": receiver.url()}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"sinks": [good, good]}, "JOBSIGHT_ALERTS_SINKS: Value error, two sinks are named 'ops'"),
        ({"sinks": [{**good, "url": f"nosuchscheme://{SECRET_PATH}@host/x"}]}, "JOBSIGHT_ALERTS_SINKS_0_URL"),
        ({"sinks": [{**good, "min_severity": "loud"}]}, "JOBSIGHT_ALERTS_SINKS_0_MIN_SEVERITY"),
        ({"sinks": [{**good, "name": "user:alice"}]}, "JOBSIGHT_ALERTS_SINKS_0_NAME"),
        ({"user_addresses": {"bob": f"nosuchscheme://{SECRET_PATH}"}}, "JOBSIGHT_ALERTS_USER_ADDRESSES"),
        ({"retry_base_s": 60, "retry_max_s": 10}, "JOBSIGHT_ALERTS_RETRY_MAX_S"),
        ({"group_window_s": -1}, "JOBSIGHT_ALERTS_GROUP_WINDOW_S"),
    ]
    for values, expected in cases:
        with pytest.raises(SettingsError) as caught:
            load_alert_settings(**values)
        assert expected in str(caught.value)
        assert SECRET_PATH not in str(caught.value) and caught.value.__cause__ is None
    settings = load_alert_settings(sinks=[good])
    assert SECRET_PATH not in repr(settings) and settings.group_window_s == 60


def test_settings_come_from_the_environment_as_json(monkeypatch: pytest.MonkeyPatch, receiver: Receiver) -> None:
    monkeypatch.setenv("JOBSIGHT_ALERTS_SINKS", json.dumps([{"name": "ops", "url": receiver.url(),
                                                              "rules": ["hung_rank"]}]))
    monkeypatch.setenv("JOBSIGHT_ALERTS_NOTIFY_USERS", "true")
    monkeypatch.setenv("JOBSIGHT_ALERTS_USER_ADDRESSES", json.dumps({"alice": receiver.url()}))
    settings = load_alert_settings()
    assert [sink.rules for sink in settings.sinks] == [["hung_rank"]]
    assert sorted(settings.sink_urls()) == ["ops", "user:alice"]


def test_a_failure_reason_keeps_no_part_of_the_url() -> None:
    url = "mailtos://ops:p%40ss-w0rd@smtp.example.org:465/?to=alice@example.org&from=hpc-bot"
    said = ("login failed for ops:p@ss-w0rd at smtp.example.org:465 (p%40ss-w0rd) sending to alice@example.org"
            f" from hpc-bot; whole: {url}")
    cleaned = redact(said, url)
    for part in ("p@ss-w0rd", "p%40ss-w0rd", "smtp.example.org", "alice@example.org", "hpc-bot", "mailtos://"):
        assert part not in cleaned
    assert cleaned.startswith("login failed for ")
