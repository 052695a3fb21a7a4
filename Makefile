# The two commands: `make demo` (the one-machine demo) and `make test` (the whole suite).
# Both bootstrap .venv on a fresh machine; re-running is cheap.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PIP := $(BIN)/pip --disable-pip-version-check -q

.PHONY: demo test lint typecheck unit integration e2e bench proto fmt clean

$(STAMP): pyproject.toml scripts/install.sh
	PYTHON=$(PYTHON) VENV=$(VENV) bash scripts/install.sh
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/tba local

test: lint typecheck
	$(BIN)/pytest tests

lint: $(STAMP)
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/ruff format --check src tests bench scripts

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest tests/unit

integration: $(STAMP)
	$(BIN)/pytest tests/integration

e2e: $(STAMP)
	$(BIN)/pytest tests/e2e

bench: $(STAMP)
	$(BIN)/python -m bench

proto: $(STAMP)
	$(BIN)/python scripts/gen_proto.py

fmt: $(STAMP)
	$(BIN)/ruff format src tests bench scripts
	$(BIN)/ruff check --fix src tests bench scripts

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
