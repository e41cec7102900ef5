# k0s-fleet developer entry points. `make demo` and `make test` are the README's two commands.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_WORKERS ?= 2

.PHONY: all demo test test-unit test-integration testenv venv lint typecheck bench bench-scale bench-churn chaos chaos-real stress-restarts clean image dist

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
# (tests/image runs under `make image`.)
test: venv testenv lint
	$(BIN)/pytest tests --ignore=tests/image -q -n $(PYTEST_WORKERS) --dist loadfile --durations=15

# The container image, without a Docker engine or registry: installs the Debian tools if
# missing (as root), builds the Dockerfile with buildah into build/image/*.oci.tar, then
# runs it with podman as the charts do (tests/image). See docs/operations.md.
image: venv testenv
	bash hack/image/tools.sh
	bash hack/image/build.sh
	$(BIN)/pytest tests/image -q -n 0 -s

# The chaos suite (docs/reliability.md): >= 1000 seeded trials; failing seeds are printed.
CHAOS_TRIALS ?= 1000
chaos: venv
	$(BIN)/python -m tests.helpers.chaos --trials $(CHAOS_TRIALS)

# Seeded chaos on the real test world (docs/reliability.md): real kube-apiservers, etcd,
# controller and agent processes; SEEDS trials from FIRST_SEED, one after another (~1-3
# min each). A failing trial prints its seed and replay command and keeps its logs.
SEEDS ?= 20
FIRST_SEED ?= 0
# The controller cancelled and restarted at seeded random moments mid-rollout, over many
# seeds (the README's suite runs one): tests/integration/test_controller_rollout.py.
RESTART_SEEDS ?= 40
stress-restarts: venv testenv
	K0S_FLEET_RESTART_SEEDS=$$(seq -s, 0 $$(($(RESTART_SEEDS) - 1))) K0S_FLEET_RESTART_CYCLES=5 \
		$(BIN)/pytest tests/integration/test_controller_rollout.py -q -n $(PYTEST_WORKERS) \
		-k killed_and_restarted_mid_rollout

chaos-real: venv testenv
	$(BIN)/python -m tests.helpers.realchaos --seeds $(SEEDS) --first-seed $(FIRST_SEED) $(ARGS)

bench: venv testenv
	$(BIN)/python bench/rollout.py

# Scale benchmark (bench/README.md): one controller, CLUSTERS x (3 + 7) simulated nodes.
CLUSTERS ?= 100
bench-scale: venv testenv
	$(BIN)/python bench/scale.py --clusters $(CLUSTERS) $(ARGS)

# Node churn (bench/README.md "Issue 33"): CLUSTERS clusters whose workload clusters share
# 9 Nodes, annotation churn at 1 and 10 patches/s, a one-cluster rollout meanwhile.
bench-churn: venv testenv
	flock /tmp/k0s-fleet-bench.lock $(BIN)/python bench/churn.py --clusters $(CLUSTERS) $(ARGS)

# What users install (docs/operations.md "Install the CLI", "Install the controller"):
# the CLI's wheel and both charts' packages, into dist/ (tests/integration/test_dist.py
# installs each one).
DIST ?= dist
# the pinned helm `make testenv` builds (hack/testenv/build.sh)
HELM ?= $${K0S_FLEET_BIN:-$${K0S_FLEET_CACHE:-$$HOME/.cache/k0s-fleet}/bin}/helm
dist: venv testenv
	rm -rf $(DIST) && mkdir -p $(DIST)
	$(BIN)/pip wheel -q --no-deps -w $(DIST) .
	rm -rf build/lib build/bdist.* && rmdir build 2>/dev/null || true
	$(HELM) package charts/k0s-fleet charts/k0s-fleet-agent -d $(DIST)
	@ls -1 $(DIST)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache $(DIST)
