"""jobsight: HPC job telemetry for GPU clusters.

The installed namespace. ``jobsight.protocol`` is what both sides share (wire format,
record shapes, tokens, diagnosis rules, data-dir paths) and imports nothing else of the
project; ``jobsight.agent``, ``jobsight.collector``, ``jobsight.dashboard`` and
``jobsight.migrations`` are the repository's top-level folders of the same names;
``jobsight.cli`` and ``jobsight.commands`` are the ``jobsight`` command.
"""

__version__ = "0.1.0"
