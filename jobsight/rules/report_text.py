"""The text of a job's efficiency report, jobstats' layout: ``jobsight report JOBID`` prints it and the
collector e-mails it to a job's owner when the job ends (collector/passes/reports.py). Pure formatting
of a job row (``GET /v1/jobs/{job}``) and its summary answer (``GET /v1/jobs/{job}/summary`` with the
job's findings); standard library, :mod:`jobsight.protocol` and the rules beside it only.

Every string of the job row and the answer (its name, user, partition, nodes, a finding's message) is
the job's or its user's, and goes through :func:`jobsight.protocol.terminal_text.terminal_safe` before
it is laid out: an escape sequence, a carriage return, a newline or a bidi override in a job's name is
printed as its escape (``\\x1b``), so it can neither drive the terminal nor forge a line of the report.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Final

from jobsight.protocol.terminal_text import terminal_safe_tree
from jobsight.rules import display_text, energy_text, links

WIDTH: Final = 72
BAR: Final = 40

ENERGY_SOURCES: Final = {"counter": "energy counter", "power": "from power samples"}
HINTS: Final = display_text.FLAG_ADVICE
"""Kept for callers of the old name: the advice lives in :mod:`jobsight.rules.display_text`."""


def _duration(seconds: float | None) -> str:
    return display_text.duration(seconds)


def _bytes(value: float | None) -> str:
    return display_text.memory(value).replace(" ", "")


def _pct(value: float | None) -> str:
    return display_text.MISSING if value is None else f"{value:.0f}%"


def _bar(percent: float | None) -> str:
    if percent is None:
        return f"[{'(no data)':^{BAR + 5}}]"
    filled = max(0, min(BAR, round(percent / 100 * BAR)))
    return f"[{'|' * filled}{' ' * (BAR - filled)} {percent:3.0f}%]"


def _time(value: Any) -> str:
    """The dashboard's clock (UTC), so a time in the report is the one a page shows."""
    return display_text.moment(value)


def _audit_days(job: dict[str, Any]) -> tuple[dt.date, dt.date] | None:
    """The UTC days the job ran on (to today for a running job); ``None`` when its start is unknown."""
    start = links.parse_moment(str(job["start_time"])) if job.get("start_time") else None
    if start is None:
        return None
    end = links.parse_moment(str(job["end_time"])) if job.get("end_time") else None
    return start.date(), (end or dt.datetime.now(dt.UTC)).date()


def _heading(title: str) -> list[str]:
    return ["", f"{title:^{WIDTH}}", "=" * WIDTH]


def _gpu_label(gpu: dict[str, Any]) -> str:
    mig = f" MIG {gpu['mig_uuid']}" if gpu.get("mig_uuid") else ""
    return f"{gpu.get('node') or '?'} (GPU {gpu.get('gpu_index')}{mig})"


def all_clear(findings: list[dict[str, Any]]) -> str:
    """The line for a job with no efficiency flag: "no problems" only when no finding is open, else
    what is still open, so the report never says all is well under an open finding."""
    still_open = [f for f in findings if not f.get("resolved_at")]
    if not still_open:
        return "No efficiency problems found."
    severities = ", ".join(dict.fromkeys(str(f.get("severity") or "open") for f in still_open))
    return f"No efficiency flags, but {len(still_open)} finding(s) still open ({severities}): see Health above."


def format_report(job: dict[str, Any], answer: dict[str, Any]) -> str:
    """The report text for a job row (``GET /v1/jobs/{job}``) and its summary answer, terminal-safe."""
    job, answer = terminal_safe_tree(job), terminal_safe_tree(answer)
    summary: dict[str, Any] = answer.get("summary") or {}
    gpus: list[dict[str, Any]] = summary.get("gpus") or []
    state = display_text.state(job.get("state"), job.get("exit_code"))
    final = bool(answer.get("final"))
    if not final:
        state += "  [running: figures so far]"
    user = display_text.user(job)
    if job.get("uid") is not None:
        user += f" (uid {job['uid']})"
    nodes = job.get("nodes") or []
    lines = ["=" * WIDTH, f"{'Job Statistics (jobsight)':^{WIDTH}}", "=" * WIDTH]
    for label, value in (
        ("Job ID", job.get("job_id")),
        ("Cluster", job.get("cluster")),
        ("User/Account", f"{user}/{display_text.account(job)}"),
        ("Job Name", display_text.text(job.get("name"))),
        ("State", state),
        *([("Reason", job["end_reason"])] if job.get("end_reason") else []),
        ("Nodes", display_text.text(len(nodes) or job.get("node_count")) + (f" ({', '.join(nodes)})" if nodes else "")),
        ("GPUs", display_text.text(summary.get("gpu_count"))),
        ("Partition", display_text.partition(job)),
        ("Start Time", _time(job.get("start_time"))),
        ("End Time", _time(job.get("end_time"))),
        ("Run Time", _duration(summary.get("elapsed_s"))),
        ("Time Limit", _duration(job.get("time_limit_s"))),
        ("GPU-hours", display_text.gpu_hours(summary.get("gpu_hours"), growing=not final)),
    ):
        lines.append(f"{label:>15}: {value}")
    energy = answer.get("energy")
    if energy is None:  # an older collector's answer: the GPUs' energy alone
        lines.append(f"{'Energy':>15}: " + display_text.energy(summary.get("energy_kwh"), growing=not final))
    for label, value in energy_text.energy_rows(energy) if energy is not None else ():
        lines.append(f"{label:>15}: {value}")

    shares = [g["peak_mem_share"] * 100 for g in gpus if g.get("peak_mem_share") is not None]
    lines += _heading("Overall Utilization")
    lines.append(f"  GPU utilization  {_bar(summary.get('mean_util'))}")
    lines.append(f"  GPU memory usage {_bar(sum(shares) / len(shares) if shares else None)}")

    lines += _heading("Detailed Utilization")
    if not gpus:
        lines.append("  No GPU samples were recorded for this job.")
    else:
        lines.append("  GPU utilization per node (mean, max, time idle under 5 %)")
        for gpu in gpus:
            idle = gpu.get("idle_fraction")
            lines.append(f"      {_gpu_label(gpu)}: {_pct(gpu.get('mean_util'))} (max {_pct(gpu.get('max_util'))}, "
                         f"idle {_pct(idle * 100 if idle is not None else None)})")
        lines.append("  GPU memory usage per node - maximum used/total")
        for gpu in gpus:
            share = gpu.get("peak_mem_share")
            used, total = _bytes(gpu.get("peak_mem_bytes")), _bytes(gpu.get("mem_total_bytes"))
            percent = _pct(share * 100 if share is not None else None)
            lines.append(f"      {_gpu_label(gpu)}: {used}/{total} ({percent})")
        lines.append("  GPU energy per node")
        for gpu in gpus:
            method = gpu.get("energy_source") or ""
            source = ENERGY_SOURCES.get(method, "")
            energy = display_text.energy(gpu.get("energy_kwh"), method=method, growing=not final)
            lines.append(f"      {_gpu_label(gpu)}: {energy}" + (f" ({source})" if source and energy != "-" else ""))
    steps = summary.get("steps")
    if steps:
        rate = f"{steps['steps_per_s']:.2f} steps/s" if steps.get("steps_per_s") else f"{display_text.MISSING} steps/s"
        first = steps.get("time_to_first_step_s")
        lines.append(f"  Training: {steps.get('count')} steps at {rate}"
                     + (f"; first step done {first:.1f} s after the job started" if first is not None else ""))

    base = answer.get("dashboard_base_url")  # absent from an older collector's answer: no links built here
    cluster, job_id = str(job.get("cluster") or answer.get("cluster") or ""), str(job.get("job_id") or "")
    findings = answer.get("findings") or []
    if findings:
        lines += _heading("Health")
        for finding in findings:
            when = (f"opened {_time(finding.get('opened_at'))}"
                    + (f", resolved {_time(finding.get('resolved_at'))}" if finding.get("resolved_at") else ", open"))
            lines.append(f"  * [{finding.get('severity')}] {finding.get('title')} ({finding.get('rule')}; {when})")
            lines.append(f"      {finding.get('message')}")
            moment = links.finding_moment(finding.get("at_ts"), finding.get("opened_at"))
            if base and moment is not None:
                lines.append(f"      {links.job_link(cluster, job_id, moment, base=base)}")

    lines += _heading("Notes")
    flags = summary.get("flags") or []
    for flag in flags:
        idle = [_gpu_label(g) for g in gpus if flag in (g.get("flags") or [])]
        hint = display_text.flag_advice(flag, summary.get("thresholds"))
        lines.append(f"  * {flag}: {hint}" + (f" ({', '.join(idle)})" if flag == "idle_gpu" and idle else ""))
    if not flags and gpus:
        lines.append("  * " + all_clear(findings))
    if answer.get("dashboard_url"):
        lines.append(f"  * Dashboard: {answer['dashboard_url']}")
    days = _audit_days(job)
    if base and days is not None:
        lines.append(f"  * Audit of the days it ran (admins): {links.audit_link(*days, base=base)}")
    return "\n".join(lines) + "\n"
