"""The node's GPUs: one door into NVML (:mod:`~jobsight.agent.node.gpu.nvml`, the only module that
imports pynvml), what is read through it (:mod:`~jobsight.agent.node.gpu.sampler` with its
:mod:`~jobsight.agent.node.gpu.devices`, :mod:`~jobsight.agent.node.gpu.faults`,
:mod:`~jobsight.agent.node.gpu.events` and :mod:`~jobsight.agent.node.gpu.field_values`), the
readings as plain data (:mod:`~jobsight.agent.node.gpu.reading`, at the precision of
:mod:`~jobsight.agent.node.gpu.precision`), and simulated GPUs read the same way
(:mod:`~jobsight.agent.node.gpu.simulated`).

It may import :mod:`jobsight.protocol` and itself only: nothing of the node's core, power or Kineto rooms.
"""
