"""The names of the health rules, spelled here once: every place that names a rule reads it from here.

A finding's ``rule`` column, the ``[health] rules`` and ``[actions.policies] rule`` settings, the alert
sinks' filters and the dashboard's labels all use these strings, so a rule renamed or added here is one
edit (``tests/rules/test_rule_names.py`` checks that every user covers exactly the rules it must).
"""

from __future__ import annotations

from typing import Final, Literal

HUNG_RANK: Final = "hung_rank"
STRAGGLER: Final = "straggler"
IDLE_ALLOCATION: Final = "idle_allocation"
LOW_UTILISATION: Final = "low_utilisation"
MEMORY_UNUSED: Final = "memory_unused"

RULES: Final = (HUNG_RANK, STRAGGLER, IDLE_ALLOCATION, LOW_UTILISATION, MEMORY_UNUSED)
"""Every rule, in the order :func:`jobsight.rules.health.evaluate` lists their findings."""
LIVE_RULES: Final = (HUNG_RANK, STRAGGLER, IDLE_ALLOCATION, LOW_UTILISATION)
"""Rules judged while a job runs; the rest (``memory_unused``) judge a whole run, once it has ended."""
EXPLAINED_RULES: Final = (HUNG_RANK, STRAGGLER)
"""Rules whose findings say their hardware cause (``evidence.cause``): a job where one fires has its
hardware read and is judged again with it, and the suspect-GPU list counts their findings."""

ActedOnRule = Literal["idle_allocation", "low_utilisation", "hung_rank"]
"""The type of a policy's ``rule`` setting: pydantic needs the names spelled in a ``Literal``, which
the test holds equal to :data:`ACTED_ON_RULES`."""
ACTED_ON_RULES: Final[tuple[ActedOnRule, ...]] = (IDLE_ALLOCATION, LOW_UTILISATION, HUNG_RANK)
"""The rules an action policy may act on: each says a job holds GPUs it does not use."""
