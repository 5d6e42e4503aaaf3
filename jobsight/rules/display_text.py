"""How a value reads wherever a person sees it: the dashboard's pages and tables, ``jobsight report``
and the e-mailed report. One function per kind of value, so a job's user, state, rank, energy, time
or GPU-hours is the same text on its page, in the jobs list, in the audit and in the report.

Absent values read :data:`MISSING` (never ``None``, ``nan`` or ``NaT``); a field that cannot apply
(a partition outside Slurm) reads :data:`NOT_APPLICABLE`; a fact nobody told us (a Slurm job's user
before its prolog is heard from) reads :data:`UNKNOWN`. Standard library only (a pandas ``NaN`` or
``NaT`` is recognised by being unequal to itself), so the CLI loads it without pandas.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from jobsight.rules import job_states

MISSING: Final = "-"
"""An absent figure or time: what Grafana prints for no value, and what the report always printed."""
UNKNOWN: Final = "unknown"
"""A fact that exists but nobody told us (a Slurm job whose prolog was never heard from)."""
NOT_APPLICABLE: Final = "n/a"
"""A field that does not exist for this job: a partition or an account outside Slurm."""
SINGLE_PROCESS: Final = "single process"
"""The rank of a process that is not one of several: sent as no rank, kept as -1 by the rollups."""
GROWING: Final = "≥ "
"""Before a running job's figure that will still grow (energy so far, GPU-hours so far)."""
ABOUT: Final = "≈ "
"""Before an energy integrated from power samples: less exact than a GPU's energy counter."""

POWER_METHODS: Final = frozenset({"power", "power integral", "power_integral"})
"""Energy methods that integrate power samples (the summary's ``power``, the epochs' ``power integral``)."""


def is_missing(value: Any) -> bool:
    """``None``, an empty string, a float NaN, pandas' ``NaN``/``NaT``/``NA`` (each unequal to itself)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return True
    try:
        return bool(value != value)  # NaN, NaT; pandas.NA raises TypeError on bool()
    except TypeError:
        return True
    except ValueError:  # an array: a value, even if some of it is missing
        return False


def text(value: Any) -> str:
    """Any cell's text: :data:`MISSING` when absent, else ``str(value)``."""
    return MISSING if is_missing(value) else str(value)


# -- who and where -----------------------------------------------------------------------------------


def _process(job: Mapping[str, Any]) -> Mapping[str, Any]:
    attrs = job.get("attrs")
    process = attrs.get("process") if isinstance(attrs, Mapping) else None
    return process if isinstance(process, Mapping) else {}


def outside_slurm(job: Mapping[str, Any]) -> bool:
    """True when the job is known to run outside Slurm: a local job id, or a training process that
    said Slurm did not start it, and no prolog registered it (which would name a user)."""
    if not is_missing(job.get("user_name")):
        return False
    return str(job.get("job_id") or "").startswith("local-") or _process(job).get("slurm") is False


def user(job: Mapping[str, Any]) -> str:
    """Slurm's user (the prolog's ``user_name``), else the training process's owner (``attrs.process.user``,
    which a run outside Slurm sends), else :data:`UNKNOWN`."""
    if not is_missing(job.get("user_name")):
        return str(job["user_name"])
    owner = _process(job).get("user")
    return owner if isinstance(owner, str) and owner else UNKNOWN


def partition(job: Mapping[str, Any]) -> str:
    """Slurm's partition; :data:`NOT_APPLICABLE` outside Slurm; else :data:`UNKNOWN`."""
    if not is_missing(job.get("partition")):
        return str(job["partition"])
    return NOT_APPLICABLE if outside_slurm(job) else UNKNOWN


def account(job: Mapping[str, Any]) -> str:
    """Slurm's account; :data:`NOT_APPLICABLE` outside Slurm; else :data:`UNKNOWN`."""
    if not is_missing(job.get("account")):
        return str(job["account"])
    return NOT_APPLICABLE if outside_slurm(job) else UNKNOWN


def group_name(value: Any) -> str:
    """A row of a table grouped by user, account or partition: the name, or :data:`UNKNOWN` for the
    jobs whose prolog never reported it."""
    return UNKNOWN if is_missing(value) else str(value)


def state(value: str | None, exit_code: Any = None) -> str:
    """As Slurm names it (``TIMEOUT``, ``OUT_OF_MEMORY``), with what a non-zero exit code says
    (``FAILED (exit code 3)``, ``CANCELLED (signal 15)``); an exit code 0 adds nothing to the state."""
    code = None if is_missing(exit_code) or int(exit_code) == 0 else int(exit_code)
    return job_states.describe(None if is_missing(value) else value, code).replace("UNKNOWN", UNKNOWN)


def rank(value: Any) -> str:
    """A rank's cell: ``3``; :data:`SINGLE_PROCESS` for none (``None``, or the rollups' -1)."""
    if is_missing(value) or (isinstance(value, int | float) and value < 0):
        return SINGLE_PROCESS
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def rank_label(value: Any) -> str:
    """``rank 3``, or :data:`SINGLE_PROCESS`."""
    shown = rank(value)
    return shown if shown == SINGLE_PROCESS else f"rank {shown}"


# -- figures -------------------------------------------------------------------------------------------


def figure(value: float, digits: int = 5) -> str:
    """``digits`` significant digits (a small job's 0.023156 kWh as exactly as a large one's 12345 kWh),
    never a power of ten."""
    if abs(value) >= 10 ** digits:
        return f"{value:.1f}"
    if value == 0:
        return "0"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"


def energy(kwh: Any, *, method: str | None = None, growing: bool = False, unit: bool = True) -> str:
    """An energy in kWh: five significant digits from counters; three, marked :data:`ABOUT`, when
    integrated from power samples (``method`` in :data:`POWER_METHODS`); :data:`GROWING` before a
    running job's. :data:`MISSING` when absent."""
    if is_missing(kwh):
        return MISSING
    rough = method in POWER_METHODS
    value = figure(float(kwh), 3 if rough else 5)
    return (GROWING if growing else "") + (ABOUT if rough else "") + value + (" kWh" if unit else "")


def figure_format(values: Iterable[Any], digits: int = 5) -> str:
    """A printf format (``%.4f``) for a column of numbers a table keeps sortable: as many decimals as
    :func:`figure` gives the column's largest value, so that its top figure (a period's only user, the
    biggest consumer) reads as the same figure does in a metric or the report, and every row of the
    column has the same decimals. ``%.0f`` when the column has no value (all missing or zero)."""
    present = [abs(float(v)) for v in values if not is_missing(v)]
    largest = max(present, default=0.0)
    if largest == 0 or largest >= 10 ** digits:
        return "%.1f" if largest else "%.0f"
    return f"%.{max(0, digits - 1 - math.floor(math.log10(largest)))}f"


def co2e(kg: Any, *, growing: bool = False, unit: bool = True) -> str:
    """Emissions in kg CO2e, as :func:`energy` writes a counter's figure."""
    if is_missing(kg):
        return MISSING
    return (GROWING if growing else "") + figure(float(kg)) + (" kg CO2e" if unit else "")


def gpu_hours(value: Any, *, growing: bool = False) -> str:
    """GPU-hours to two decimals (a minute of one GPU is 0.02); :data:`MISSING` when absent."""
    return MISSING if is_missing(value) else (GROWING if growing else "") + f"{float(value):.2f}"


def percent(value: Any) -> str:
    return MISSING if is_missing(value) else f"{float(value):.0f} %"


def memory(value: Any) -> str:
    """Bytes in binary units (``40.0 GB``). A profiler's negative self memory is what an op freed
    beyond what it allocated: ``frees 2.0 MB``, never a negative size."""
    if is_missing(value):
        return MISSING
    size = float(value)
    shown = abs(size)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if shown < 1024 or unit == "TB":
            number = f"{shown:.0f} {unit}" if unit == "B" else f"{shown:.1f} {unit}"
            break
        shown /= 1024
    return f"frees {number}" if size < 0 else number


# -- times ---------------------------------------------------------------------------------------------


def _moment(value: Any) -> dt.datetime | None:
    if is_missing(value):
        return None
    if isinstance(value, dt.datetime):
        moment = value
    else:
        try:
            moment = dt.datetime.fromisoformat(str(value))
        except ValueError:
            return None
    return moment.replace(tzinfo=dt.UTC) if moment.tzinfo is None else moment.astimezone(dt.UTC)


def moment(value: Any) -> str:
    """``2024-03-04 10:00:00 UTC`` (every page's clock is UTC); :data:`MISSING` when absent."""
    at = _moment(value)
    return MISSING if at is None else f"{at:%Y-%m-%d %H:%M:%S} UTC"


def iso_moment(value: Any) -> str:
    """ISO 8601 in UTC with ``Z`` (``2024-03-04T10:00:00Z``, microseconds only when there are any): a
    time as a file for machines says it (a CSV download). :data:`MISSING` when absent."""
    at = _moment(value)
    if at is None:
        return MISSING
    return at.replace(tzinfo=None).isoformat(timespec="microseconds" if at.microsecond else "seconds") + "Z"


def day(value: Any) -> str:
    """``2024-03-04``: a UTC day (the audit's trend), never ``2024-03-04 00:00:00+00:00``."""
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return value.isoformat()
    at = _moment(value)
    return MISSING if at is None else at.date().isoformat()


def duration(seconds: Any) -> str:
    """As Slurm's ``sacct`` prints an elapsed time: ``01:02:03``, ``2-01:02:03`` past a day."""
    if is_missing(seconds):
        return MISSING
    whole = max(0, int(round(float(seconds))))
    days, rest = divmod(whole, 86400)
    shown = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{shown}" if days else shown


# -- words for names -----------------------------------------------------------------------------------

FLAG_LABEL: Final = {"idle_gpu": "idle GPUs", "low_utilization": "low utilisation",
                     "memory_mostly_unused": "low memory use"}
FLAG_ADVICE: Final = {
    "idle_gpu": "At least one allocated GPU was idle (mean utilisation under {idle:.0f} %). "
                "Request fewer GPUs (--gres=gpu:N) or make sure every rank uses its own GPU.",
    "low_utilization": "Mean GPU utilisation was under {low:.0f} %. Look for an input-bound loop "
                       "(data loading, CPU preprocessing) or too small a batch; a profile on the "
                       "dashboard shows where the time goes.",
    "memory_mostly_unused": "Peak GPU memory stayed under {mem:.0f} % of the total: a larger batch "
                            "may run faster, or a smaller GPU type would do.",
}
"""A summary flag's advice, with the thresholds the summary was judged by (:func:`flag_advice`)."""


def flag_label(flag: str) -> str:
    return FLAG_LABEL.get(flag, words(flag))


def flag_advice(flag: str, thresholds: Mapping[str, Any] | None) -> str:
    """What to do about a summary flag, at the thresholds of the summary (``None``: the defaults)."""
    given = thresholds or {}
    values = {"idle": given.get("idle_util", 5), "low": given.get("low_util", 30),
              "mem": given.get("low_memory_share", 0.25) * 100}
    return FLAG_ADVICE[flag].format(**values) if flag in FLAG_ADVICE else flag_label(flag)


COLUMN_LABEL: Final = {
    "job_id": "job", "user_name": "user", "gpu_hours": "GPU-hours", "mean_util": "mean util %",
    "self_cpu_us": "self CPU (µs)", "cpu_total_us": "CPU total (µs)", "self_device_us": "self GPU (µs)",
    "cpu_memory_bytes": "CPU memory", "device_memory_bytes": "GPU memory", "calls_per_step": "calls per step",
    "input_shapes": "input shapes", "flops": "FLOPs", "energy_kwh": "GPU kWh", "end_reason": "ended by jobsight",
    "start_time": "started", "end_time": "ended", "gpu_count": "GPUs", "node_count": "nodes",
    "low_util_gpu_hours": "low-util GPU-hours", "profile_id": "profile", "requested_by": "requested by",
    "created_at": "requested (UTC)", "ts": "time (UTC)",
}
_UNITS: Final = (("_us", " (µs)"), ("_ms", " (ms)"), ("_kwh", " (kWh)"), ("_kg", " (kg)"), ("_s", " (s)"),
                 ("_pct", " %"), ("_bytes", ""), ("_mhz", " (MHz)"), ("_w", " (W)"), ("_c", " (°C)"))
_INNER_UNITS: Final = {"s": "(s)", "ms": "(ms)", "us": "(µs)"}
SNAKE_CASE: Final = re.compile(r"[a-z0-9]_[a-z0-9]")
"""A name as code writes it (``self_cpu_us``): never a column's header on a page."""


def words(name: str) -> str:
    """A code name in words: ``calls_per_step`` → ``calls per step``, ``wait_s`` → ``wait (s)``."""
    for suffix, unit in _UNITS:
        if name.endswith(suffix) and len(name) > len(suffix):
            return words(name[: -len(suffix)]) + unit
    # A unit inside a name: step_s_by_rank → step (s) by rank.
    return " ".join(_INNER_UNITS.get(part, part) for part in name.split("_")) if "_" in name else name


def key_path(keys: Iterable[str]) -> str:
    """A path of keys into nested data in words: ``("ranks", "1", "silent_s")`` → ``rank 1 › silent (s)``
    (an item of a plural, by its number, is named in the singular)."""
    parts: list[str] = []
    for key in keys:
        if key.isdigit() and parts and parts[-1].endswith("s") and not parts[-1].endswith(")"):
            parts[-1] = f"{parts[-1][:-1]} {key}"
        else:
            parts.append(words(key))
    return " › ".join(parts)


def column_label(name: str) -> str:
    """A column's header: its known label, else its name in :func:`words`."""
    return COLUMN_LABEL.get(name, words(name))
