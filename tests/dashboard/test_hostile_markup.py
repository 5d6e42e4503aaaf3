"""What jobs send is shown as text on the dashboard's pages, never rendered as Markdown.

A running job of alice on a cluster of its own, written with SQL as the collector stores it, whose
name is ``**[click](https://evil)** <img src=x>``, whose partition is Streamlit's colour directive
``:red[gpu]`` and a table's cell edge ``|``, whose nodes are ``<!channel>`` and ``www.evil.example``,
with an open finding naming that node and the GPU ``<https://evil|https://sso.example.org>``, and a
profile whose hint is markup too. Through Streamlit's AppTest, every element that renders Markdown holds
the escaped form, and read as CommonMark (markdown-it, the reference parser's port) it shows the
original text and forms no link, image or HTML.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from markdown_it import MarkdownIt
from psycopg.types.json import Jsonb
from streamlit.testing.v1 import AppTest

from jobsight.collector.store.partitions import PartitionKeeper
from jobsight.collector.store.schema import PARTITIONED_TABLES
from jobsight.dashboard.markup import plain
from tests.dashboard.conftest import job_sections
from tests.dashboard.header_facts import header_facts
from tests.dashboard.seed import Seed

UTC = dt.UTC
JOB = "evil-1"
NAME = "**[click](https://evil)** <img src=x>"
NAME_ESCAPED = r"\*\*\[click\]\(https\://evil\)\*\* \<img src=x\>"
PARTITION = ":red[gpu]|x"
NODES = ["<!channel>", "www.evil.example"]
GPU = "<https://evil|https://sso.example.org>"
FINDING_TITLE = "1 of 1 GPUs idle"
FINDING_MESSAGE = f"{NODES[0]}/0 [x](https://evil) stayed under 5 % utilisation for the last 30 s or more."
HINT = "_input_ **bound**: see [the fix](https://evil) ![i](https://evil/i.png) $x$ @everyone"
MARKDOWN_KINDS = ("title", "header", "subheader", "markdown", "caption", "info", "warning", "error", "success")


def _seed(database_url: str) -> str:
    cluster = f"hostile-{uuid.uuid4().hex[:8]}"
    now = dt.datetime.now(UTC).replace(microsecond=0)
    start = now - dt.timedelta(minutes=20)
    with psycopg.connect(database_url, autocommit=True) as conn:
        keeper = PartitionKeeper()
        for table in PARTITIONED_TABLES:
            keeper.ensure(conn, table, {start.date(), now.date()})
        with conn.transaction():
            conn.execute(
                """INSERT INTO jobs (cluster, job_id, user_name, account, partition, name, nodes, node_count, gpus,
                                     start_time, state, last_seen)
                   VALUES (%s, %s, 'alice', 'ml', %s, %s, %s, 2, %s, %s, 'running', %s)""",
                (cluster, JOB, PARTITION, NAME, NODES, [f"{NODES[0]}:0"], start, now))
            conn.execute(
                """INSERT INTO findings (cluster, job_id, rule, subject, node, gpu, severity, state, opened_at,
                                         updated_at, title, message, evidence)
                   VALUES (%s, %s, 'idle_allocation', '', %s, %s, 'warning', 'open', %s, %s, %s, %s, %s)""",
                (cluster, JOB, NODES[0], GPU, now - dt.timedelta(minutes=2), now, FINDING_TITLE, FINDING_MESSAGE,
                 Jsonb({"idle_gpus": [f"{NODES[0]}/0"]})))
            conn.execute(
                """INSERT INTO profiles (cluster, job_id, ts, node, rank, pid, profile_id, step_start, step_end,
                                         summary, diagnosis)
                   VALUES (%s, %s, %s, %s, 0, 1000, 'prof-1', 10, 20, %s, %s)""",
                (cluster, JOB, start + dt.timedelta(minutes=5), NODES[0], Jsonb({}),
                 Jsonb([{"rule": "input_bound", "message": HINT}])))
    return cluster


@pytest.fixture(scope="module")
def hostile_seed(database_url: str) -> str:
    return _seed(database_url)


@pytest.fixture
def hostile(dashboard_env: Seed, hostile_seed: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setenv("JOBSIGHT_DASHBOARD_CLUSTER", hostile_seed)
    yield hostile_seed


def reading(source: str) -> tuple[str, list[str]]:
    """What a CommonMark reader shows of ``source``: its text, and every link, image or HTML it forms."""
    md = MarkdownIt("commonmark").enable(["table", "strikethrough"])
    shown, formed = [], []
    for block in md.parse(source):
        if block.type == "html_block":
            formed.append(block.content)
        for token in block.children or []:
            if token.type in ("link_open", "image", "html_inline"):
                formed.append(f"{token.type} {token.attrs or token.content}")
            elif token.type in ("text", "code_inline"):
                shown.append(token.content)
            elif token.type == "softbreak":
                shown.append("\n")
    return "".join(shown), formed


def markdown_sources(at: AppTest) -> list[str]:
    sources = [str(element.value) for kind in MARKDOWN_KINDS for element in getattr(at, kind)]
    return sources + [str(part) for metric in at.metric for part in (metric.label, metric.value)]


def test_the_job_page_shows_a_hostile_jobs_strings_as_text(app_as: Callable[..., AppTest], hostile: str) -> None:
    sections = job_sections(app_as, "alice", cluster=hostile, job=JOB, t="[x](https://evil)")
    for at in sections.values():
        assert not at.exception, [e.value for e in at.exception]
    at = sections["metrics"]  # the header, health and window, drawn above whichever section is open

    assert [t.value for t in at.title] == [f"Job evil-1 · {NAME_ESCAPED}"]
    assert reading(at.title[0].value) == (f"Job evil-1 · {NAME}", [])
    # The header's facts are a Markdown table: the partition's "|" stays in its own cell, as text.
    facts = header_facts(at, source=True)
    assert list(facts) == ["User", "Partition", "Nodes", "GPUs", "Elapsed", "GPU-hours", "State"]
    assert facts["Partition"] == r"\:red\[gpu\]\|x" and header_facts(at)["Partition"] == PARTITION
    assert r"Nodes: \<\!channel\>, www\.evil.example" in [c.value for c in at.caption]
    assert "The link's moment '\\[x\\]\\(https\\://evil\\)' is not a time; showing the whole run." in [
        c.value for c in at.caption]

    [finding] = [w.value for w in at.warning if "Open since" in w.value]
    head, message, _ = finding.split("  \n")
    assert head == r"**1 of 1 GPUs idle** (node \<\!channel\>, GPU \<https\://evil\|https\://sso.example.org\>)"
    assert message == r"\<\!channel\>/0 \[x\]\(https\://evil\) stayed under 5 % utilisation for the last 30 s or more."
    assert reading(message) == (FINDING_MESSAGE, [])

    [hint] = [w.value for w in sections["profiles"].warning if "input" in w.value]
    assert hint == (r"\_input\_ \*\*bound\*\*\: see \[the fix\]\(https\://evil\) \!\[i\]\(https\://evil/i.png\) "
                    r"\$x\$ \@everyone")
    assert reading(hint) == (HINT, [])

    # Every element that renders Markdown, ours included, in every section: no link, image or HTML anywhere.
    for at in sections.values():
        for source in markdown_sources(at):
            assert reading(source)[1] == [], source


@pytest.mark.parametrize(("text", "source", "shown"), [
    (NAME, NAME_ESCAPED, NAME),
    ("ci_runner a_b_c", "ci_runner a_b_c", "ci_runner a_b_c"),
    ("_x_ __y__", r"\_x\_ \_\_y\_\_", "_x_ __y__"),
    ("1. one\n- two\n# three", r"1\. one - two \# three", "1. one - two # three"),
    ("- item", r"\- item", "- item"),
    ("see www.evil.example or a@b.example", r"see www\.evil.example or a\@b.example",
     "see www.evil.example or a@b.example"),
    ("&lt; &amp; `code` ~~s~~ | t |", r"\&lt; \&amp; \`code\` \~\~s\~\~ \| t \|", "&lt; &amp; `code` ~~s~~ | t |"),
    (":material/warning: :red[x] $y$", r"\:material/warning\: \:red\[x\] \$y\$", ":material/warning: :red[x] $y$"),
    ("\\*", r"\\\*", "\\*"),
])
def test_plain_escapes_every_markup_and_shows_the_text(text: str, source: str, shown: str) -> None:
    assert plain(text) == source
    assert reading(source) == (shown, [])


def test_the_dataframes_keep_the_text_as_it_is(app_as: Callable[..., AppTest], hostile: str) -> None:
    # Data frames render no Markdown: the jobs list shows the name unescaped.
    at = app_as("alice", "views/jobs.py")
    assert not at.exception, [e.value for e in at.exception]
    table = at.dataframe[0].value.set_index("job")
    assert table.loc[JOB, "name"] == NAME and table.loc[JOB, "partition"] == PARTITION
    assert [t.value for t in at.title] == ["Jobs of alice"]
