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
from jobsight.rules import energy_text, job_states, links

WIDTH: Final = 72
BAR: Final = 40

ENERGY_SOURCES: Final = {"counter": "energy counter", "power": "from power samples"}
HINTS: Final = {
    "idle_gpu": "At least one allocated GPU was idle (mean utilisation under {idle:.0f} %). "
                "Request fewer GPUs (--gres=gpu:N) or make sure every rank uses its own GPU.",
    "low_utilization": "Mean GPU utilisation was under {low:.0f} %. Look for an input-bound loop "
                       "(data loading, CPU preprocessing) or too small a batch; a profile on the "
                       "dashboard shows where the time goes.",
    "memory_mostly_unused": "Peak GPU memory stayed under {mem:.0f} % of the total: a larger batch "
                            "may run faster, or a smaller GPU type would do.",
}


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(round(seconds))
    days, rest = divmod(seconds, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def _bytes(value: float | None) -> str:
    if value is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(value) < 1024 or unit == "TB":
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}TB"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _bar(percent: float | None) -> str:
    if percent is None:
        return f"[{'(no data)':^{BAR + 5}}]"
    filled = max(0, min(BAR, round(percent / 100 * BAR)))
    return f"[{'|' * filled}{' ' * (BAR - filled)} {percent:3.0f}%]"


def _time(value: Any) -> str:
    if not value:
        return "-"
    try:
        return dt.datetime.fromisoformat(str(value)).astimezone().strftime("%a %b %d, %Y at %H:%M:%S")
    except ValueError:
        return str(value)


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


def format_report(job: dict[str, Any], answer: dict[str, Any]) -> str:
    """The report text for a job row (``GET /v1/jobs/{job}``) and its summary answer, terminal-safe."""
    job, answer = terminal_safe_tree(job), terminal_safe_tree(answer)
    summary: dict[str, Any] = answer.get("summary") or {}
    gpus: list[dict[str, Any]] = summary.get("gpus") or []
    state = job_states.describe(job.get("state"), job.get("exit_code"))
    if not answer.get("final"):
        state += "  [running: figures so far]"
    user = job.get("user_name") or "-"
    if job.get("uid") is not None:
        user += f" (uid {job['uid']})"
    nodes = job.get("nodes") or []
    lines = ["=" * WIDTH, f"{'Job Statistics (jobsight)':^{WIDTH}}", "=" * WIDTH]
    for label, value in (
        ("Job ID", job.get("job_id")),
        ("Cluster", job.get("cluster")),
        ("User/Account", f"{user}/{job.get('account') or '-'}"),
        ("Job Name", job.get("name") or "-"),
        ("State", state),
        *([("Reason", job["end_reason"])] if job.get("end_reason") else []),
        ("Nodes", f"{len(nodes) or job.get('node_count') or '-'}" + (f" ({', '.join(nodes)})" if nodes else "")),
        ("GPUs", summary.get("gpu_count") if summary.get("gpu_count") is not None else "-"),
        ("Partition", job.get("partition") or "-"),
        ("Start Time", _time(job.get("start_time"))),
        ("End Time", _time(job.get("end_time")) if job.get("end_time") else "-"),
        ("Run Time", _duration(summary.get("elapsed_s"))),
        ("Time Limit", _duration(job.get("time_limit_s"))),
        ("GPU-hours", f"{summary['gpu_hours']:.3f}" if summary.get("gpu_hours") is not None else "-"),
    ):
        lines.append(f"{label:>15}: {value}")
    energy = answer.get("energy")
    if energy is None:  # an older collector's answer: the GPUs' energy alone
        lines.append(f"{'Energy':>15}: " + energy_text.kwh(summary.get("energy_kwh")))
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
            energy = gpu.get("energy_kwh")
            source = ENERGY_SOURCES.get(gpu.get("energy_source") or "", "")
            lines.append(f"      {_gpu_label(gpu)}: " + (f"{energy:.4f} kWh ({source})" if energy is not None else "-"))
    steps = summary.get("steps")
    if steps:
        rate = f"{steps['steps_per_s']:.2f} steps/s" if steps.get("steps_per_s") else "- steps/s"
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
    thresholds = summary.get("thresholds") or {}
    values = {"idle": thresholds.get("idle_util", 5), "low": thresholds.get("low_util", 30),
              "mem": thresholds.get("low_memory_share", 0.25) * 100}
    flags = summary.get("flags") or []
    for flag in flags:
        idle = [_gpu_label(g) for g in gpus if flag in (g.get("flags") or [])]
        hint = HINTS.get(flag, flag).format(**values)
        lines.append(f"  * {flag}: {hint}" + (f" ({', '.join(idle)})" if flag == "idle_gpu" and idle else ""))
    if not flags and gpus:
        lines.append("  * No efficiency problems found.")
    if answer.get("dashboard_url"):
        lines.append(f"  * Dashboard: {answer['dashboard_url']}")
    days = _audit_days(job)
    if base and days is not None:
        lines.append(f"  * Audit of the days it ran (admins): {links.audit_link(*days, base=base)}")
    return "\n".join(lines) + "\n"
