"""The node's power beside its GPUs, and each job's share of it.

The sources (:mod:`~jobsight.agent.node.power.rapl`, :mod:`~jobsight.agent.node.power.ipmi`,
:mod:`~jobsight.agent.node.power.redfish`, read in the background by
:mod:`~jobsight.agent.node.power.reader`, with their credential files checked by
:mod:`~jobsight.agent.node.power.credential_files`), the one a site chose
(:mod:`~jobsight.agent.node.power.sources`), the node's energy tick by tick
(:mod:`~jobsight.agent.node.power.node_energy`) and its split between the jobs by CPU time
(:mod:`~jobsight.agent.node.power.energy_split`).

It may import the agent's settings, :mod:`jobsight.protocol` and itself: nothing of the node's core,
GPU or Kineto rooms.
"""
