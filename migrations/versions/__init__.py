"""One module per schema revision, in order; each has a real ``downgrade()``."""
