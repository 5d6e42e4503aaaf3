"""What a job sends reaches an alert as data, never as markup, on real parts end to end.

A job whose node is ``<!channel>`` and whose GPU (a MIG device, named ``node/index/mig`` by the
evaluator) is ``<https://evil|https://sso.example.org>``, run by ``<@U024BE7LH>``, idles its
GPU: the real collector stores its records, the real health evaluator opens the finding and writes
its alerts, and ``AlertSender`` sends them through the real Apprise library to

* a local HTTP receiver over Apprise's generic JSON webhook in its three formats (``json://``,
  ``?format=markdown``, ``?format=html``) and its form webhook (``form://``);
* Apprise's own Slack plugin (``slack://``), whose webhook host (``hooks.slack.com``) cannot be
  changed: it goes through a local HTTPS proxy (``HTTPS_PROXY``, honoured by ``requests``) that
  answers the ``CONNECT`` itself with a self-signed certificate (the sink URL says ``verify=no``)
  and records the request Slack would have got.

Each payload is asserted exactly, and then read the way its sink reads it (CommonMark, HTML,
Slack's ``<…>`` control sequences) to show that the only link anywhere is the job page's.
"""

from __future__ import annotations

import html
import json
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from socketserver import StreamRequestHandler, ThreadingTCPServer
from typing import Any
from urllib.parse import parse_qs

import apprise
import psycopg
import pytest
from markdown_it import MarkdownIt
from psycopg.rows import dict_row

from jobsight.collector.config.alerts import AlertSettings
from jobsight.collector.config.health import load_health_settings
from jobsight.collector.passes.alert_messages import (
    HTML,
    MARKDOWN,
    SLACK,
    TEXT,
    compose,
    markdown_escape,
    markup_of,
    message,
    slack_escape,
)
from jobsight.collector.passes.alerts import AlertSender, enqueue
from jobsight.collector.passes.findings import HealthEvaluator
from jobsight.rules import links
from tests.collector.helpers import gz, post
from tests.collector.test_alerts import Receiver, receiver, settings_with, sink_name  # noqa: F401 (the fixture)

NODE = "<!channel>"
MIG = "<https://evil|https://sso.example.org>"
GPU = f"{NODE}/0/{MIG}"
"""The finding's GPU as the evaluator names a MIG device: ``node/index/mig``."""
USER = "<@U024BE7LH>"
DASHBOARD = "http://dash.example:8501"
SLACK_URL = "slack://T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7/?verify=no&footer=no&image=no"
SLACK_PATH = "/services/T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7"
ZW = "\u200b"
REST = ("stayed under 5 % utilisation for the last 30 s or more: allocated and unused. Check that the code runs on "
        "them, or release them.")
"""The idle rule's own words after the GPU's name (idle_util 5, idle_min_s 30)."""


class SlackHooks:
    """``hooks.slack.com`` as seen through a local HTTPS proxy: every request Apprise's Slack
    plugin makes is answered ``ok`` and kept as (host, path, JSON body)."""

    def __init__(self, certificate: Path, key: Path) -> None:
        self.posts: list[tuple[str, str, dict[str, Any]]] = []
        self.tunnels: list[str] = []
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(certificate, key)
        hooks = self

        class Hook(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hooks.posts.append((self.headers["Host"], self.path, json.loads(body)))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        class Tunnel(StreamRequestHandler):
            def handle(self) -> None:
                request = self.rfile.readline().decode("latin-1").split()
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                hooks.tunnels.append(" ".join(request[:2]))
                self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                self.wfile.flush()
                Hook(context.wrap_socket(self.connection, server_side=True), self.client_address, self.server)

        ThreadingTCPServer.allow_reuse_address = True
        self.server = ThreadingTCPServer(("127.0.0.1", 0), Tunnel)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def proxy(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("slack-tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=hooks.slack.com"], check=True, capture_output=True)
    return cert, key


@pytest.fixture
def slack_hooks(certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> Iterator[SlackHooks]:
    hooks = SlackHooks(*certificate)
    for name in ("HTTPS_PROXY", "https_proxy"):
        monkeypatch.setenv(name, hooks.proxy)
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.setenv(name, "127.0.0.1,localhost")  # the JSON and form receivers: straight there
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    yield hooks
    hooks.stop()


def idle_records(job: str, partition: str, now_us: int) -> list[dict[str, Any]]:
    """The job's start (its user and partition) and 40 s of its one MIG device at 0 %."""
    started = {"kind": "job_started", "job": job, "ts": now_us - 60_000_000, "node": NODE, "user": USER,
               "partition": partition, "gpus": ["0"]}
    samples = [{"kind": "gpu_sample", "job": job, "ts": now_us - (40 - tick) * 1_000_000, "node": NODE,
                "gpu_index": 0, "gpu_uuid": "GPU-hostile", "gpu_name": MIG, "mig_uuid": MIG, "util_gpu": 0.0,
                "mem_used": 2**30, "mem_total": 80 * 2**30} for tick in range(41)]
    return [started, *samples]


def open_idle_finding(database_url: str, settings: AlertSettings, now: float) -> None:
    """One pass of the real evaluator, writing alerts as the collector's does."""
    health = load_health_settings(rules=["idle_allocation"], idle_util=5, idle_min_s=30)
    evaluator = HealthEvaluator(health, lambda conn, finding, event, job: enqueue(conn, settings, finding, event, job))
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as conn:
        evaluator.evaluate_once(conn, now)


def finding_link(db: psycopg.Connection[Any], job: str) -> str:
    [(opened_at, at_ts)] = db.execute("SELECT opened_at, at_ts FROM findings WHERE job_id = %s", (job,)).fetchall()
    return links.job_link("default", job, links.finding_moment(at_ts, opened_at), base=DASHBOARD)


def markdown_reading(body: str) -> tuple[str, list[str]]:
    """What a CommonMark reader shows of ``body``: its text, and the targets of its links and images."""
    [paragraph] = [t for t in MarkdownIt("commonmark").parse(body) if t.type == "inline"]
    text, targets = [], []
    for token in paragraph.children or []:
        if token.type in ("link_open", "image"):
            targets.append(str(token.attrs.get("href") or token.attrs.get("src")))
        elif token.type in ("text", "html_inline", "code_inline"):
            text.append(token.content)
    return "".join(text), targets


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_a_hostile_finding_reaches_every_sink_as_escaped_text(
    client: Any, db: psycopg.Connection[Any], database_url: str, job_id: str, receiver: Receiver,  # noqa: F811
    slack_hooks: SlackHooks,
) -> None:
    partition = sink_name()
    names = {kind: sink_name() for kind in ("text", "markdown", "html", "form", "slack")}
    urls = {"text": receiver.url(names["text"]), "markdown": receiver.url(names["markdown"]) + "?format=markdown",
            "html": receiver.url(names["html"]) + "?format=html",
            "form": receiver.url(names["form"]).replace("json://", "form://"), "slack": SLACK_URL}
    settings = settings_with(*({"name": names[kind], "url": url, "partitions": [partition]}
                               for kind, url in urls.items()))
    now = time.time()
    assert post(client, gz(idle_records(job_id, partition, int(now * 1e6)))).status_code == 200
    open_idle_finding(database_url, settings, now)
    assert AlertSender(db, settings, dashboard_url=DASHBOARD).send_due() == 5
    link = finding_link(db, job_id)
    title = f"jobsight: opened on job {job_id}: 1 of 1 GPUs idle"

    # Plain text (JSON and form): as sent, with U+200B after each "<" and "@".
    text = (f"OPENED job {job_id} (<{ZW}@{ZW}U024BE7LH>) [warning] idle_allocation: <{ZW}!channel>/0/"
            f"<{ZW}https://evil|https://sso.example.org> {REST} {link}")
    posts = {path.split("/")[1]: body for path, body in receiver.posts}
    assert posts[names["text"]] == {"version": "1.0", "title": title, "message": text, "attachments": [],
                                    "type": "warning"}
    [(_, form_type, form_body)] = [r for r in receiver.raw if r[0].split("/")[1] == names["form"]]
    assert form_type == "application/x-www-form-urlencoded"
    assert parse_qs(form_body.decode()) == {"version": ["1.0"], "title": [title], "message": [text],
                                            "type": ["warning"]}

    # Markdown: every ASCII punctuation escaped; the job page an autolink.
    escaped_job = job_id.replace("-", "\\-")
    markdown = (f"OPENED job {escaped_job} \\(\\<\\@{ZW}U024BE7LH\\>\\) \\[warning\\] idle\\_allocation\\: "
                "\\<\\!channel\\>\\/0\\/\\<https\\:\\/\\/evil\\|https\\:\\/\\/sso\\.example\\.org\\> "
                "stayed under 5 \\% utilisation for the last 30 s or more\\: allocated and unused\\. "
                f"Check that the code runs on them\\, or release them\\. <{link}>")
    assert posts[names["markdown"]] == {"version": "1.0", "title": title, "message": markdown, "attachments": [],
                                        "type": "warning"}
    shown, targets = markdown_reading(markdown)
    assert targets == [link]  # the one link: the job page's
    user = USER.replace("@", "@" + ZW)
    assert shown == f"OPENED job {job_id} ({user}) [warning] idle_allocation: {GPU} {REST} {link}"

    # HTML: entities; the job page an anchor.
    anchor = html.escape(link)
    html_body = (f"OPENED job {job_id} (&lt;@U024BE7LH&gt;) [warning] idle_allocation: &lt;!channel&gt;/0/"
                 f"&lt;https://evil|https://sso.example.org&gt; {REST} <a href=\"{anchor}\">{anchor}</a>")
    assert posts[names["html"]] == {"version": "1.0", "title": title, "message": html_body, "attachments": [],
                                    "type": "warning"}
    reader = _Reader()
    reader.feed(html_body)
    assert reader.tags == [("a", {"href": link})]
    assert "".join(reader.text) == f"OPENED job {job_id} ({USER}) [warning] idle_allocation: {GPU} {REST} {link}"

    # Slack, through Apprise's own plugin: &, <, > as Slack documents them; only our link is a <…>.
    assert slack_hooks.tunnels == ["CONNECT hooks.slack.com:443"]
    slack_link = link.replace("&", "&amp;")
    slack_text = (f"OPENED job {job_id} (&lt;@{ZW}U024BE7LH&gt;) [warning] idle_allocation: &lt;!channel&gt;/0/"
                  f"&lt;https://evil|https://sso.example.org&gt; {REST} <{slack_link}>")
    assert slack_hooks.posts == [("hooks.slack.com", SLACK_PATH, {
        "mrkdwn": True, "attachments": [{"title": title, "text": slack_text, "color": "#CACF29"}]})]
    controls = [part.split(">")[0] for part in slack_text.split("<")[1:]]
    assert controls == [slack_link]


def test_a_long_or_many_lined_value_is_cut_short_and_stays_on_its_line() -> None:
    node = "n" * 4096
    row = {"event": "opened", "job_id": "j" * 100, "cluster": "default", "user_name": "u" * 50, "finding_id": 7,
           "rule": "idle_allocation", "subject": "", "severity": "warning", "title": "2 of 2 GPUs idle",
           "message": f"{node}/0, x\nRESOLVED job 1 (root) all clear stayed under 5 % utilisation",
           "opened_at": None, "at_ts": None}
    title, body, kind = compose([row], None)
    assert title == f"jobsight: opened on job {'j' * 39}…: 2 of 2 GPUs idle"
    assert body == (f"OPENED job {'j' * 63}… ({'u' * 31}…) [warning] idle_allocation: {'n' * 79}… "
                    "x?RESOLVED job 1 (root) all clear stayed under 5 % utilisation")
    assert kind == "warning"
    long_message = compose([{**row, "message": " ".join(["word"] * 400)}], None)[1]
    assert long_message.endswith(" word word…") and len(long_message.split(": ", 1)[1]) == 600


def test_the_escapes_on_the_reviewed_strings() -> None:
    # Slack's own rules (via Apprise's Slack dialect, which turns \< into &lt;): see the end-to-end test.
    assert slack_escape("<!channel> <@U024BE7LH> <https://evil|https://sso.example.org> & \\<!here>") == (
        "\\<\\!channel\\> \\<@\u200bU024BE7LH\\> \\<https://evil|https://sso.example.org\\> & \\\\\\<\\!here\\>")
    assert markdown_escape("@everyone **[click](https://evil)** <img src=x>") == (
        "\\@\u200beveryone \\*\\*\\[click\\]\\(https\\:\\/\\/evil\\)\\*\\* \\<img src\\=x\\>")
    assert message([{"event": "opened", "job_id": "1", "cluster": "c", "finding_id": 1, "rule": "r",
                     "severity": "info", "title": "<b>t</b> [x](y) @here", "message": "m"}]).title == (
        "jobsight: opened on job 1: ?b?t??b? ?x??y? ?here")


@pytest.mark.parametrize(("url", "markup"), [
    ("json://127.0.0.1:9/x", TEXT), ("json://127.0.0.1:9/x?format=markdown", MARKDOWN),
    ("json://127.0.0.1:9/x?format=html", HTML), ("form://127.0.0.1:9/x", TEXT),
    ("slack://T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7/", SLACK),
    ("slack://T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7/?format=text", TEXT),
    ("discord://1234/abcd", TEXT), ("tgram://123456789:abcdefg_hijklmnop/12315544/", HTML),
    ("rocket://u:p@h/#c", MARKDOWN), ("mailtos://u:p@example.org", TEXT),
])
def test_each_sink_gets_the_markup_it_renders(url: str, markup: Any) -> None:
    service = apprise.Apprise.instantiate(url)
    assert service is not None and markup_of(service) is markup
