"""What a profile says, read from a trace: top ops, the time breakdown, source lines, and the trace
packed for the wire. Shared by the training hooks (a callback's window) and the node daemon (a
Kineto trace the job wrote); it may import only agent/settings below it, and :mod:`jobsight.protocol`."""
