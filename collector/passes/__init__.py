"""What runs on timers, one leader at a time: health findings and their alerts, reconciliation with
Slurm, partition maintenance and compaction's trigger. Imports query and every room below."""
