# Prewarm: `make demo` runs the whole system locally, `make test` runs every test.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000
PRESET ?= burst
PG_URL ?= postgres://postgres@127.0.0.1:5432/prewarm
REDIS_TEST_URL ?= redis://127.0.0.1:6379/14
# Settings for the run against the real services (never used outside tests).
SERVICES_ENV := DATABASE_URL=$(PG_URL) REDIS_URL=$(REDIS_TEST_URL) PREWARM_TEST_REDIS_URL=$(REDIS_TEST_URL) \
	SECRET_KEY=test-only-secret-key-0123456789-abcdefghijklmnopqrstuvwxyz ALLOWED_HOSTS=127.0.0.1,localhost,testserver \
	PREWARM_SECURE=false PREWARM_DATA_DIR=$(CURDIR)/var/test-services

# What the tests need set up before any runs; a new prerequisite (an engine's virtualenv, a
# service) is one more target appended here: TEST_PREREQS += my-target. Each half takes all of
# them but the one it does without. (Append above the rules: make expands prerequisites as it
# reads each rule.)
TEST_PREREQS := install data services chromium
# Extra pytest arguments, e.g. `make test-services PYTEST_ARGS="tests/api -x"`.
PYTEST_ARGS ?=
# A skip fails the run (tests/conftest.py): what the suite needs is set up above, or left out on
# purpose with PREWARM_TEST_WITHOUT=browser (the summary says so; refused under CI=true).
PYTEST := PREWARM_TEST_STRICT=1 $(PY) -m pytest -p no:cacheprovider
EMBEDDED_RUN := PREWARM_DATA_DIR=$(CURDIR)/var/test $(PYTEST) -m "not services" $(PYTEST_ARGS)
SERVICES_RUN := $(SERVICES_ENV) $(PYTEST) -m "not browser" $(PYTEST_ARGS)

.PHONY: install demo test test-embedded test-services services chromium data bench lint clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,nccl]'
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(PY) -m controlplane.demo --host $(HOST) --port $(PORT) --preset $(PRESET)

# PostgreSQL and Redis answering (started when installed but stopped); one line if missing.
services: install
	@$(PY) -m tests.prereqs services $(PG_URL) $(REDIS_TEST_URL)

chromium: install
	@$(PY) -m tests.prereqs chromium

# The shared traces and vLLM event captures (../shared/data or PREWARM_SHARED_DATA).
data: install
	@$(PY) -m tests.prereqs data

# Everything: the embedded default (SQLite, in-process worker; browser tests included), then the
# same suite on the real PostgreSQL and Redis (live-process and e2e tests included).
test: $(TEST_PREREQS)
	$(EMBEDDED_RUN)
	$(SERVICES_RUN)

# Opt-outs: one half only, each says at the end what it left out.
test-embedded: $(filter-out services,$(TEST_PREREQS))
	$(EMBEDDED_RUN)
	@echo "make test-embedded: left out the PostgreSQL + Redis half (make test-services; make test runs both)"

test-services: $(filter-out chromium,$(TEST_PREREQS))
	$(SERVICES_RUN)
	@echo "make test-services: left out the embedded half and the browser tests (make test runs both)"

bench: install
	@for b in $$(ls bench/[a-z]*.py | grep -v gpu_check); do echo "== $$b"; $(PY) $$b --quick --json var/bench/$$(basename $$b .py).json || exit 1; done

lint: install
	$(PY) -m ruff check .
	$(PY) -m mypy

clean:
	rm -rf $(VENV) var
