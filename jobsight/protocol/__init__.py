"""The wire contract both sides share, shipped to every node: the records and their checks
(``records.py``, ``specs.py``, ``checks.py``), the batch encoding (``wire.py``), tokens
(``tokens.py``), job ids (``slurm_ids.py``, ``sluid.py``), and the vocabulary the agent needs too
(step phases, the post-run diagnosis, throttle reasons, terminal-safe text). Standard library only
(orjson optional in ``wire.py``); imports nothing else of the project. The server's rules and wording
live in ``jobsight.rules``."""
