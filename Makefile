# Two commands: `make up` (run jobsight locally on the embedded PostgreSQL, with a demo
# job) and `make test` (the whole test suite). Both make .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: up test lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch is pinned (frameworks extra) so pip takes the CPU build, not a CUDA one.
	$(BIN)/python -m pip install --quiet -e '.[all]'
	touch $(STAMP)

up: $(STAMP)
	$(BIN)/jobsight up --demo

test: $(STAMP)
	$(BIN)/python tests/fake_nvml/build.py
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check jobsight/*.py jobsight/protocol jobsight/rules jobsight/commands agent collector dashboard tests bench
	$(BIN)/mypy --strict -p jobsight.protocol -p jobsight.rules -p jobsight.agent -p jobsight.collector -p jobsight.commands

bench: $(STAMP)
	$(BIN)/python bench/ingest.py

clean:
	rm -rf $(VENV) tests/fake_nvml/build test-output
