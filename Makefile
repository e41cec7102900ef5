# k0s-fleet developer entry points. `make demo` and `make test` are the README's two commands.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_WORKERS ?= 2

.PHONY: all demo test test-unit test-integration testenv venv lint typecheck bench chaos clean

all: test

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

# Builds (once, cached under ~/.cache/k0s-fleet) the pinned kube-apiserver, etcd and helm.
testenv:
	bash hack/testenv/build.sh

demo: venv testenv
	$(BIN)/k0s-fleet demo

lint: venv
	$(BIN)/ruff check fleet tests bench hack
	$(BIN)/mypy

test-unit: venv
	$(BIN)/pytest tests/unit -q

test-integration: venv testenv
	$(BIN)/pytest tests/integration -q -n $(PYTEST_WORKERS) --dist loadfile

# The README's test command: lint, unit and integration tests on real API servers.
test: venv testenv lint
	$(BIN)/pytest tests -q -n $(PYTEST_WORKERS) --dist loadfile --durations=15

bench: venv testenv
	$(BIN)/python bench/rollout.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
