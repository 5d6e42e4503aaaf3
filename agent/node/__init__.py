"""The node daemon (``jobsight agent``): one snapshot of the node per tick, attributed to its jobs.

Its rooms, bottom first (tests/layout/import_rules.py, ``NODE_ROOMS``):

* ``registrations`` (which jobs run here) and ``slurm_cgroups`` (where Slurm put their processes);
* side by side, importing nothing of one another: ``gpu/`` (NVML: the door, the readings, faults,
  events, simulated GPUs), ``power/`` (the node's power beside its GPUs, and each job's share of
  it) and ``kineto/`` (answering PyTorch's profiler, deciding whom to profile, collecting traces);
* the daemon's core that puts them together: ``attribution`` (which job a GPU works for),
  ``host`` (each job's CPU and memory) and ``daemon`` (the tick).

It may import the agent's ``settings``, ``atomic_files``, ``traces`` and ``shipping`` rooms and
:mod:`jobsight.protocol`; the standard library only (pynvml through :mod:`jobsight.agent.node.gpu.nvml`).
"""
