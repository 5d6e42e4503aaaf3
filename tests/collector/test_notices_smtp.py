"""The e-mails people get arrive at a real SMTP server (aiosmtpd), through Apprise's ``mailto://`` and the
alerts' address template: a policy's two warnings and its cancellation, a job's end-of-job report, the
monthly reports of a user and of an account's sponsor; a server that is down is tried again later, as
alerts are, and nothing is lost meanwhile."""

from __future__ import annotations

import datetime as dt
import email
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.message import Message as EmailMessage
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiosmtpd.controller import Controller
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from jobsight.collector.config.alerts import load_alert_settings
from jobsight.collector.config.notices import load_notice_settings
from jobsight.collector.passes.actions import Notify, WasteActions
from jobsight.collector.passes.notices import NoticeSender
from jobsight.collector.passes.reports import Reports, closed_period
from jobsight.collector.store.db import Connection, open_pool
from tests.collector.helpers import gz, now_us, post
from tests.collector.test_actions import idle_job, settings, slurm  # noqa: F401 (slurm: the fixture)

S = 1_000_000
DASHBOARD = "https://hpc.example.org/jobsight"


@dataclass
class Mailbox:
    """What the SMTP server received: (recipients, the parsed message)."""

    port: int
    received: list[tuple[list[str], EmailMessage]] = field(default_factory=list)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802 - aiosmtpd's name
        self.received.append((list(envelope.rcpt_tos), email.message_from_bytes(envelope.content)))
        return "250 OK"

    def to(self, address: str, subject_holds: str) -> list[EmailMessage]:
        return [m for rcpt, m in self.received if address in rcpt and subject_holds in str(m["Subject"])]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start(mailbox: Mailbox) -> Controller:
    controller = Controller(mailbox, hostname="127.0.0.1", port=mailbox.port)
    controller.start()
    return controller


@pytest.fixture
def mailbox() -> Iterator[Mailbox]:
    box = Mailbox(_free_port())
    controller = _start(box)
    yield box
    controller.stop()


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection[dict[str, Any]]]:
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as c:
        yield c


@pytest.fixture
def pool(database_url: str) -> Iterator[ConnectionPool[Connection]]:
    opened = open_pool(database_url, 2)
    yield opened
    opened.close()


def alerts_at(port: int) -> Any:
    template = f"mailto://127.0.0.1:{port}?from=hpc-bot@example.org&to={{user}}@example.org"
    return load_alert_settings(user_address_template=template, retry_base_s=30, retry_max_s=60, max_attempts=5)


def body(message: EmailMessage) -> str:
    parts = [p for p in message.walk() if p.get_content_type() == "text/plain"] or [message]
    payload = parts[0].get_payload(decode=True)
    return payload.decode() if isinstance(payload, bytes) else str(payload)


def test_two_warnings_then_the_cancellation_reach_the_job_s_user(
    client: Any, conn: psycopg.Connection[dict[str, Any]], pool: ConnectionPool[Connection],
    slurm: tuple[Path, Path], mailbox: Mailbox,  # noqa: F811 (the fixture)
) -> None:
    folder, _ = slurm
    job = idle_job(client, conn, idle_minutes=200)
    alerts = alerts_at(mailbox.port)
    actions = WasteActions(settings(folder), Notify(alerts, DASHBOARD))
    sender = NoticeSender(pool, alerts, 1.0)
    for _ in range(3):
        actions.act_once(conn)
        sender.send_due()
    first = mailbox.to("alice@example.org", f"job {job}: GPUs idle 3.3 h (first warning)")
    second = mailbox.to("alice@example.org", f"job {job}: GPUs idle 3.3 h (second warning)")
    cancelled = mailbox.to("alice@example.org", f"job {job} cancelled")
    assert len(first) == len(second) == len(cancelled) == 1, [str(m["Subject"]) for _, m in mailbox.received]
    assert "jobsight will cancel it at" in body(first[0]) and "(policy gpu-idle)" in body(first[0])
    assert "jobsight: GPUs idle 3.3 h (policy gpu-idle)" in body(cancelled[0])
    for message in (first[0], second[0], cancelled[0]):
        assert f"{DASHBOARD}/job?cluster=default&job={job}" in body(message)
        assert str(message["To"]) == "alice@example.org" and "hpc-bot@example.org" in str(message["From"])
    assert conn.execute("SELECT end_reason FROM jobs WHERE job_id = %s", (job,)).fetchone() == {
        "end_reason": "jobsight: GPUs idle 3.3 h (policy gpu-idle)"}
    # Sent once: another pass of the sender finds nothing of this job's left to send.
    sender.send_due()
    assert len(mailbox.to("alice@example.org", f"job {job}")) == 3


def test_a_dry_run_mails_nobody(client: Any, conn: psycopg.Connection[dict[str, Any]],
                                pool: ConnectionPool[Connection], slurm: tuple[Path, Path],  # noqa: F811
                                mailbox: Mailbox) -> None:
    folder, _ = slurm
    job = idle_job(client, conn, idle_minutes=200)
    alerts = alerts_at(mailbox.port)
    actions = WasteActions(settings(folder, dry_run=True), Notify(alerts, DASHBOARD))
    for _ in range(3):
        actions.act_once(conn)
    NoticeSender(pool, alerts, 1.0).send_due()
    assert conn.execute("SELECT count(*) AS n FROM actions WHERE job_id = %s", (job,)).fetchone() == {"n": 3}
    assert mailbox.to("alice@example.org", f"job {job}") == []


def _ended_job(client: Any, user: str) -> str:
    job = f"end-{uuid.uuid4().hex[:10]}"
    t0 = now_us() - 600 * S
    records: list[dict[str, Any]] = [
        {"kind": "job_started", "job": job, "ts": t0, "node": "n1", "user": user, "account": "physics",
         "partition": "gpu", "name": "train <b>big</b>", "nodes": ["n1"], "gpus": ["0"]}]
    records += [{"kind": "gpu_sample", "job": job, "ts": t0 + i * 10 * S, "node": "n1", "gpu_index": 0,
                 "gpu_uuid": "GPU-0", "util_gpu": 2.0, "mem_used": 1, "mem_total": 80} for i in range(6)]
    records.append({"kind": "job_ended", "job": job, "ts": t0 + 60 * S, "node": "n1", "exit_code": 0})
    assert post(client, gz(records)).status_code == 200
    return job


def test_a_job_end_report_reaches_a_user_who_asked_and_no_one_else(
    client: Any, conn: psycopg.Connection[dict[str, Any]], pool: ConnectionPool[Connection], mailbox: Mailbox,
) -> None:
    asked, other = _ended_job(client, "alice"), _ended_job(client, "bob")
    alerts = alerts_at(mailbox.port)
    reports = Reports(load_notice_settings(job_end_summary="listed", job_end_users=["alice"]), alerts, DASHBOARD)
    written = reports.job_end_reports(conn, conn.execute("SELECT now() AS now").fetchone()["now"])  # type: ignore[index]
    assert asked in written and other not in written
    NoticeSender(pool, alerts, 1.0).send_due()
    [report] = mailbox.to("alice@example.org", f"job {asked} ended: COMPLETED")
    text = body(report)
    # jobsight report's text: the same layout, the job's name as data, the link to its page.
    assert f"Job ID: {asked}" in text and "Job Statistics (jobsight)" in text and "State: COMPLETED" in text
    # The name is the user's data: shown, with the plain-text markup's guard after each '<'.
    assert "Job Name: train <\u200bb>big<\u200b/b>" in text
    assert f"{DASHBOARD}/job?cluster=default&job={asked}" in text
    assert mailbox.to("bob@example.org", f"job {other}") == []
    # The next pass (a restart too) writes nothing twice.
    assert asked not in Reports(reports.settings, alerts, DASHBOARD).job_end_reports(
        conn, conn.execute("SELECT now() AS now").fetchone()["now"])  # type: ignore[index]


def _month_job(conn: psycopg.Connection[dict[str, Any]], user: str, account: str, ended: dt.datetime,
               gpu_hours: float, mean_util: float, idle_fraction: float) -> str:
    job = f"month-{uuid.uuid4().hex[:10]}"
    conn.execute("""INSERT INTO jobs (cluster, job_id, user_name, account, partition, name, state, exit_code,
                                      start_time, end_time)
                    VALUES ('default', %s, %s, %s, 'gpu', 'sweep', 'completed', 0, %s, %s)""",
                 (job, user, account, ended - dt.timedelta(hours=gpu_hours), ended))
    conn.execute("""INSERT INTO job_summaries (cluster, job_id, gpu_count, gpu_hours, mean_util, energy_kwh, flags,
                                               summary)
                    VALUES ('default', %s, 1, %s, %s, %s, '{}', %s)""",
                 (job, gpu_hours, mean_util, gpu_hours * 0.5, Jsonb({"gpus": [{"idle_fraction": idle_fraction}]})))
    return job


def test_the_monthly_reports_of_a_user_and_an_account_sponsor(
    conn: psycopg.Connection[dict[str, Any]], pool: ConnectionPool[Connection], mailbox: Mailbox,
) -> None:
    now = dt.datetime.now(dt.UTC)
    start, end, label = closed_period("monthly", now)
    user, account = f"carol{uuid.uuid4().hex[:6]}", f"lab{uuid.uuid4().hex[:6]}"
    busy = _month_job(conn, user, account, start + dt.timedelta(days=3), 10.0, 90.0, 0.0)
    idle = _month_job(conn, user, account, start + dt.timedelta(days=9), 4.0, 1.0, 1.0)
    _month_job(conn, user, account, end + dt.timedelta(hours=1), 99.0, 1.0, 1.0)  # this month: not in it
    alerts = alerts_at(mailbox.port)
    notice = load_notice_settings(report_period="monthly", account_sponsors={account: ["prof_x"]})
    written = Reports(notice, alerts, DASHBOARD).periodic_reports(conn, now)
    assert f"user {user}" in written and f"account {account}" in written
    NoticeSender(pool, alerts, 1.0).send_due()
    [mine] = mailbox.to(f"{user}@example.org", f"GPU report for {user}, {label}")
    text = body(mine)
    assert "Jobs: 2" in text and "GPU-hours: 14.0" in text and "Idle GPU-hours: 4.0" in text
    assert "Mean GPU utilisation: 65 %" in text and "Energy of the GPUs: 7.00 kWh" in text  # (10*90 + 4*1) / 14
    assert f"{DASHBOARD}/job?cluster=default&job={idle}" in text and busy not in text
    [sponsor] = mailbox.to("prof_x@example.org", f"GPU report for account {account}, {label}")
    assert "Jobs: 2" in body(sponsor)


def test_a_mail_server_that_is_down_is_tried_again_and_nothing_is_lost(
    client: Any, conn: psycopg.Connection[dict[str, Any]], pool: ConnectionPool[Connection],
    slurm: tuple[Path, Path],  # noqa: F811
) -> None:
    folder, _ = slurm
    box = Mailbox(_free_port())  # nothing listens there yet
    job = idle_job(client, conn, idle_minutes=200)
    alerts = alerts_at(box.port)
    WasteActions(settings(folder), Notify(alerts, DASHBOARD)).act_once(conn)
    sender = NoticeSender(pool, alerts, 1.0)
    sender.send_due()
    row = conn.execute("""SELECT attempts, sent_at, last_error, next_try_at > now() + interval '20 seconds' AS later
                          FROM notices WHERE job_id = %s""", (job,)).fetchone()
    assert row is not None and row["attempts"] == 1 and row["sent_at"] is None and row["later"]
    assert str(box.port) not in row["last_error"] and "127.0.0.1" not in row["last_error"]
    controller = _start(box)
    try:
        sender.send_due()
        assert box.to("alice@example.org", f"job {job}") == []  # not before its next try
        conn.execute("UPDATE notices SET next_try_at = now() WHERE job_id = %s", (job,))
        deadline = time.monotonic() + 10
        while not box.to("alice@example.org", f"job {job}") and time.monotonic() < deadline:
            sender.send_due()
        assert len(box.to("alice@example.org", f"job {job}: GPUs idle 3.3 h (first warning)")) == 1
    finally:
        controller.stop()


@pytest.mark.parametrize("name", ["eve&to=boss@example.org", "a,b", "x@evil.org", "../etc", "", "-rf"])
def test_a_user_name_never_becomes_part_of_an_address(name: str) -> None:
    alerts = alerts_at(25)
    assert alerts.address_of(name) is None and alerts.user_sink(name) is None
    assert alerts.address_of("alice") is not None


def test_a_notify_only_policy_sends_a_final_notice_and_cancels_nothing(
    client: Any, conn: psycopg.Connection[dict[str, Any]], pool: ConnectionPool[Connection],
    slurm: tuple[Path, Path], mailbox: Mailbox,  # noqa: F811 (the fixture)
) -> None:
    folder, calls = slurm
    job = idle_job(client, conn, idle_minutes=200)
    alerts = alerts_at(mailbox.port)
    actions = WasteActions(settings(folder, action="notify-only"), Notify(alerts, DASHBOARD))
    sender = NoticeSender(pool, alerts, 1.0)
    for _ in range(3):
        actions.act_once(conn)
        sender.send_due()
    [final] = mailbox.to("alice@example.org", f"job {job}: GPUs idle 3.3 h (final notice)")
    assert "This is a notice only" in body(final)
    assert not calls.exists() or job not in calls.read_text()
