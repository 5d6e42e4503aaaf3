# Two commands: `make up` (run jobsight locally on the embedded PostgreSQL, with a demo
# job) and `make test` (the whole test suite). Both make .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two installs: what running needs (`make up`) and all of it, the test tooling too (`make test`).
RUN_STAMP := $(VENV)/.installed-run
STAMP := $(VENV)/.installed
# What `make up` runs: the agent, collector and dashboard, and torch (CPU) with Lightning for the demo's
# training job. pyproject.toml's `run` extra; the `dev` extra (pytest, selenium, ...) is `make test`'s.
RUN_EXTRA := run

.PHONY: up test lint bench clean

$(VENV)/bin/python:
	@echo "make: creating the virtualenv $(VENV) with $(PYTHON)"
	$(PYTHON) -m venv $(VENV)
	@echo "make: upgrading pip"
	$(BIN)/python -m pip install --quiet --upgrade pip

$(RUN_STAMP): pyproject.toml | $(VENV)/bin/python
	@echo "make: installing jobsight to run it: agent, collector, dashboard, torch (CPU) and Lightning for the demo"
	@echo "make: (minutes the first time, torch being the largest part; no test tooling: make test adds it)"
	# torch is pinned (frameworks extra) so pip takes the CPU build, not a CUDA one.
	$(BIN)/python -m pip install --quiet --progress-bar off -e '.[$(RUN_EXTRA)]'
	@echo "make: installed what jobsight runs with"
	touch $(RUN_STAMP)

$(STAMP): pyproject.toml | $(VENV)/bin/python
	@echo "make: installing jobsight with everything, the test tooling too (pytest, selenium, ruff, mypy, ...)"
	$(BIN)/python -m pip install --quiet --progress-bar off -e '.[all]'
	@echo "make: installed jobsight and its test tooling"
	touch $(STAMP) $(RUN_STAMP)

up: $(RUN_STAMP)
	@echo "make: starting jobsight with the demo (Ctrl-C stops it)"
	$(BIN)/jobsight up --demo

test: $(STAMP)
	$(BIN)/python tests/fake_nvml/build.py
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check jobsight/*.py jobsight/protocol jobsight/rules jobsight/commands agent collector dashboard tests bench
	$(BIN)/mypy --strict -p jobsight.protocol -p jobsight.rules -p jobsight.agent -p jobsight.collector -p jobsight.commands -p jobsight.dashboard

bench: $(STAMP)
	$(BIN)/python bench/ingest.py

clean:
	rm -rf $(VENV) tests/fake_nvml/build test-output
