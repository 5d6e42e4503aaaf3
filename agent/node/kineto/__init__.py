"""Profiling without code changes: the node daemon answers PyTorch's profiler (Kineto).

Three parts, and the service that runs them (:mod:`~jobsight.agent.node.kineto.service`):

* the endpoint: the datagrams (:mod:`~jobsight.agent.node.kineto.wire`), the socket that answers
  them (:mod:`~jobsight.agent.node.kineto.endpoint`) and one per user
  (:mod:`~jobsight.agent.node.kineto.sockets`);
* deciding: which job a process is in (:mod:`~jobsight.agent.node.kineto.process`), what it is
  given (:mod:`~jobsight.agent.node.kineto.deciding`), from the jobs' requests at the collector
  (:mod:`~jobsight.agent.node.kineto.directive_poll`);
* collecting: the trace files read without trusting them (:mod:`~jobsight.agent.node.kineto.traces`)
  and shipped as profiles (:mod:`~jobsight.agent.node.kineto.trace_collection`).

Beside them: the status file that says the service serves (:mod:`~jobsight.agent.node.kineto.heartbeat`),
and what the Slurm hooks need of it (:mod:`~jobsight.agent.node.kineto.hooks`).

It may import the node's ``registrations`` and ``slurm_cgroups``, the agent's ``settings``,
``atomic_files``, ``traces`` and ``shipping``, and :mod:`jobsight.protocol`: nothing of the node's
GPU or power rooms, nor of its core above them.
"""
