# Two commands that work on a fresh machine: `make run` and `make test`.
# Both create .venv (or refresh it when pyproject.toml / constraints.txt change).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

export DO_NOT_TRACK := 1
export DVC_NO_ANALYTICS := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export MLFLOW_DISABLE_TELEMETRY := true
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: run test setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@$(BIN)/python -c "" 2>/dev/null || (rm -rf $(VENV) && $(PYTHON) -m venv $(VENV))
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[dev]"
	@touch $(STAMP)

run: $(STAMP)
	dvc repro
	clusterfed models register
	clusterfed summary

test: $(STAMP)
	$(BIN)/python -m pytest

clean:
	rm -rf data/partitions data/coldstart metrics plots
