"""What runs inside a training process: the framework callbacks (PyTorch, Lightning, Keras), the
step timer, the in-process GPU sampler, profiling windows on request, the run's records.

The top room of the agent: it may import every other (``node`` for the GPU sampler and the
registrations, ``shipping``, ``traces``, ``settings``) and :mod:`jobsight.protocol`; the frameworks
themselves are imported lazily, by the callback that needs them.
"""
