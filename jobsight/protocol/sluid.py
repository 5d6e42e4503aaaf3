"""A job run's SLUID, Slurm's lexicographically sortable unique id (Slurm 26.05 and later).

slurmd gives the prolog and epilog ``SLURM_JOB_SLUID`` (``src/plugins/prep/script/prep_script_slurmd.c``)
and names the job's cgroup v2 folder by it (``src/plugins/cgroup/v2/cgroup_v2.c``: ``/<sluid>`` under
``slurmstepd.scope``), both written by ``print_sluid`` (``src/common/sluid.c``): ``s`` and 13 characters
of Crockford's base 32 (``0-9A-Z`` without ``I L O U``), the 64-bit id's top 4 bits first (so the first
of the 13 is ``0``-``F``), then 5 bits each. That one spelling is what Slurm writes, so it is the only
one taken here (``str2sluid`` reads lower case and ``O``/``I``/``L`` too, but Slurm never prints them):
a folder name and a registration match character for character. Standard library only.
"""

from __future__ import annotations

import re
from typing import Any, Final

SLUID: Final = re.compile(r"s[0-9A-F][0-9A-HJKMNP-TV-Z]{12}")
"""``print_sluid``'s output: ``s``, one character for the top 4 bits, twelve for 5 bits each."""


def is_sluid(value: Any) -> bool:
    """Whether ``value`` is a SLUID as Slurm prints it (``s8FXKTA79XAR00``)."""
    return isinstance(value, str) and SLUID.fullmatch(value) is not None


def sluid_problem(value: Any) -> str | None:
    """What is wrong with ``value`` as a SLUID, for the wire's error message; ``None`` when nothing."""
    if is_sluid(value):
        return None
    return "expected a Slurm SLUID: 's' and 13 characters of Crockford's base 32, as slurmd prints it"
