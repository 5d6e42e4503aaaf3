"""The agent: what runs on compute nodes and in training processes, and sends to the collector.

Its rooms, bottom first (tests/layout/import_rules.py, ``AGENT_ROOMS``): ``settings`` and
``atomic_files`` (shared by all), ``traces`` (what a profile says), ``shipping`` (the one way to
the collector), ``node`` (the node daemon), ``slurm`` (the Slurm hooks), ``training`` (the
in-process callbacks). A room imports only itself and the rooms below it; the agent imports
:mod:`jobsight.protocol` and itself, never the collector, the dashboard or the commands. All but
``training`` and ``traces`` run with the standard library alone (pynvml only through the NVML door,
:mod:`jobsight.agent.node.gpu.nvml`).
"""
