"""``jobsight report JOBID``: a jobstats-style efficiency report, read from the collector.

Reads ``GET /v1/jobs/{job}`` and ``GET /v1/jobs/{job}/summary`` with the token from
the agent settings (``JOBSIGHT_TOKEN``, ``JOBSIGHT_TOKEN_FILE``, or the local admin
token when the collector is on loopback): inside a job, the task prolog's job token
reads that job. Standard library only. Problems are one line on stderr (exit 1 for
an unreachable collector or an unknown job, 2 for a refused token).

What it prints came from a job and its user (a name, a node, a finding's message): the report text is
terminal-safe (:mod:`jobsight.protocol.terminal_text`), ``--json`` writes every character outside
ASCII and every control character as a JSON escape, and the collector's words in an error are made
terminal-safe too (they may quote the job).

The dashboard links (the job's page, each finding's moment on it, the audit of the job's days)
are built by :mod:`jobsight.rules.links` under the dashboard's public URL, which the
collector's summary answer gives (``JOBSIGHT_DASHBOARD_URL`` on the collector's side).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any, Final
from urllib.parse import quote

from jobsight.agent.settings import AgentSettings, load_agent_settings
from jobsight.agent.shipping.client import CollectorClient
from jobsight.commands.cli_error import CliError
from jobsight.protocol.terminal_text import terminal_safe
from jobsight.rules.report_text import format_report

TIMEOUT_S: Final = 10.0


class NotFound(CliError):
    """The collector answered 404: no such job in the cluster asked."""


def configure_parser(name: str, parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", metavar="JOBID", help="Slurm job id (or local-... run id)")
    parser.add_argument("--cluster", help="cluster name (default: JOBSIGHT_CLUSTER, else the collector's own)")
    parser.add_argument("--url", help="collector URL (default: JOBSIGHT_URL)")
    parser.add_argument("--json", action="store_true", help="print the job and its summary as JSON instead")


def _get(client: CollectorClient, path: str, query: dict[str, str]) -> Any:
    answer = client.request("GET", path, query=query)
    url = client.settings.url
    if answer.status == 0:
        raise CliError(f"cannot reach the collector at {url} ({terminal_safe(answer.error)})", code=1)
    if answer.status != 200:
        parsed = answer.json()
        detail = parsed.get("detail") if isinstance(parsed, dict) else None
        said = detail.get("error") if isinstance(detail, dict) else detail
        message = None if said is None else terminal_safe(said)
        if answer.status == 404:
            raise NotFound(f"{message or 'not found'}", code=1)
        if answer.status in (401, 403):
            raise CliError(f"the collector refused the token (HTTP {answer.status}: {message})", code=2)
        raise CliError(f"the collector answered HTTP {answer.status}: {message}", code=1)
    parsed = answer.json()
    if parsed is None:
        raise CliError(f"the collector at {url} did not answer JSON", code=1)
    return parsed


def clusters_holding(client: CollectorClient, job: str) -> list[str] | None:
    """The clusters whose jobs include ``job`` (``GET /v1/jobs?job_id=``, which spans every cluster);
    ``None`` when the collector would not say (a job token may list no jobs, an older collector has
    no ``job_id`` filter and answers every job: both are told apart from an answer about ``job``)."""
    answer = client.request("GET", "/v1/jobs", query={"job_id": job, "limit": "100"})
    parsed = answer.json() if answer.status == 200 else None
    rows = parsed.get("jobs") if isinstance(parsed, dict) else None
    if not isinstance(rows, list) or any(not isinstance(r, dict) or r.get("job_id") != job for r in rows):
        return None
    return sorted({str(r.get("cluster")) for r in rows})


def not_found_hint(job: str, asked: str | None, holding: list[str] | None) -> str:
    """What to try when ``job`` is not in the cluster asked (``None``: the collector's own), given the
    clusters that hold it (``None``: the collector would not say)."""
    others = None if holding is None else [c for c in holding if c != asked]
    if others is None:
        return f"if it ran on another cluster, name that cluster: jobsight report {job} --cluster NAME"
    if not others:
        return "no cluster of this collector has a job with this id"
    named = ", ".join(terminal_safe(c) for c in others)
    return f"it is in cluster {named}: jobsight report {job} --cluster {terminal_safe(others[0])}"


def fetch(settings: AgentSettings, job: str, cluster: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    query = {"cluster": cluster} if cluster else {}
    base = f"/v1/jobs/{quote(job, safe='')}"
    client = CollectorClient(settings, timeout_s=TIMEOUT_S)
    try:
        try:
            summary = _get(client, base + "/summary", query)
        except NotFound as exc:
            hint = not_found_hint(terminal_safe(job), cluster, clusters_holding(client, job))
            raise NotFound(f"{exc}; {hint}", code=1) from None
        # The same findings the job page's banner and GET …/findings show.
        summary["findings"] = _get(client, base + "/findings", query).get("findings", [])
        return _get(client, base, query), summary
    finally:
        client.close()


def run(name: str, args: argparse.Namespace) -> int:
    settings = load_agent_settings()
    if args.url:
        settings = dataclasses.replace(settings, url=args.url)
    cluster = args.cluster or (settings.cluster if settings.cluster != "default" else None)
    job, answer = fetch(settings, args.job, cluster)
    if args.json:
        # ensure_ascii: ESC, CSI, bidi overrides... are written as \u escapes, never as themselves.
        sys.stdout.write(json.dumps({"job": job, **answer}, indent=2, sort_keys=True, default=str,
                                    ensure_ascii=True) + "\n")
    else:
        sys.stdout.write(format_report(job, answer))
    return 0
