"""The one way to the collector: the HTTP client, the shipper's bounded queue and its worker, the
spool (a log of what could not be sent yet), and the profiling directives' client.

It may import the agent's ``settings`` and ``atomic_files`` and :mod:`jobsight.protocol`; the standard
library only. Every room above it (node, slurm, training) sends through it.
"""
