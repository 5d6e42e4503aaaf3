"""Tests of the repository's own documents: README.md, CONTRIBUTING.md and docs/, read as text."""
