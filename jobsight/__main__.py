"""``python -m jobsight``: the ``jobsight`` command, for places without the console script."""

import sys

from jobsight.cli import main

sys.exit(main())
