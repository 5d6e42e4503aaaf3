"""The Slurm hooks (prolog, epilog, task prolog): a job's registration on its nodes, its start and
end sent to the collector, best effort and with the standard library alone (CONTRIBUTING rule 13).

It may import the node's registrations and Kineto hooks, the agent's ``settings``, ``shipping`` and
the rooms below them, and :mod:`jobsight.protocol`; nothing of ``training``.
"""
