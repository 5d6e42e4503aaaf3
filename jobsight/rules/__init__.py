"""The server's rules: what the collector, the dashboard and the CLI judge and say about a job.

Here: the health rules and their one registry of names (``rule_names``, ``health``), the hardware
causes a finding names (``hardware_cause``), the order of a job's end states (``job_states``), the
dashboard's addresses (``links``), the words of the end-of-job report (``report_text``,
``energy_text``), and how every value reads on a page and in the report (``display_text``). None of
it goes over the wire and the node agent needs none of it, which is why it is not in
:mod:`jobsight.protocol`.

Imports the standard library and :mod:`jobsight.protocol` only: never the collector, the dashboard,
the agent or the CLI. Imported by the collector, the dashboard and the CLI (``jobsight.commands``);
never by the agent, which the wire contract alone must be enough for.
"""
