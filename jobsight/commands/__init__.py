"""The CLI's subcommands (``jobsight <command>``): the composition root, which may import any part of
the project, and the edge where errors become messages naming the flag or file (``cli_error.py``)."""
