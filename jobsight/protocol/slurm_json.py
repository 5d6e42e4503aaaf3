"""Reading Slurm's structured answers (``squeue --json``), shared by the root hooks and the
collector's reconciliation. Their shape changed across Slurm versions; both are read here:

* 22.05 (data_parser v0.0.38): ``job_state`` a string, numbers plain (``time_limit`` minutes or
  ``null``), ``exit_code`` the raw wait status (``768`` is exit 3, ``15`` is signal 15);
* 23.02 and later: ``job_state`` a list of flags (the base state first), numbers
  ``{"set", "infinite", "number"}``, ``exit_code`` ``{"return_code", "signal": {"id"}}``.

Every value is Slurm's own field: a job's name is only ever a name (``docs/security.md``).
Standard library only.
"""

from __future__ import annotations

from typing import Any


def number(value: Any) -> int | None:
    """A count in either shape; ``None`` for unset, infinite or not a number."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def state(value: Any) -> str | None:
    """``"RUNNING"`` (22.05) or ``["COMPLETING", "..."]`` (later) → the base state."""
    if isinstance(value, list):
        value = value[0] if value else None
    return value if isinstance(value, str) and value else None


def exit_pair(value: Any) -> tuple[int, int] | None:
    """``(exit, signal)`` from the raw wait status (22.05) or the later object."""
    if isinstance(value, dict):
        code = number(value.get("return_code"))
        signal_field = value.get("signal")
        signal = number(signal_field.get("id")) if isinstance(signal_field, dict) else None
        if code is None and signal is None:
            return None
        return (code or 0, signal or 0)
    raw = number(value)
    if raw is None or raw < 0:
        return None
    return ((raw >> 8) & 0xFF, raw & 0x7F)
