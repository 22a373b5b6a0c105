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

.PHONY: install demo test test-embedded test-services bench lint clean lmcache-env

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,nccl]'
	touch $(STAMP)

install: $(STAMP)

# LMCache 0.5.6 in its own environment, for the tests against the real controller, standalone
# engines and coordinator (tests/lmcache). Its wheel asks for CUDA packages, so it goes in with
# --no-deps beside CPU torch (the machine's local wheel) and the pure-Python modules it imports
# (requirements/lmcache-env.txt, pinned as found by importing its controller, standalone engine
# and coordinator); it never touches the project's own pins in $(VENV).
LMCACHE_VENV ?= .venv-lmcache
LMCACHE_STAMP := $(LMCACHE_VENV)/.installed
$(LMCACHE_STAMP): requirements/lmcache-env.txt
	test -x $(LMCACHE_VENV)/bin/python || $(PYTHON) -m venv $(LMCACHE_VENV)
	$(LMCACHE_VENV)/bin/python -m pip install -q torch==2.13.0
	$(LMCACHE_VENV)/bin/python -m pip install -q --no-deps lmcache==0.5.6
	$(LMCACHE_VENV)/bin/python -m pip install -q -r requirements/lmcache-env.txt
	$(LMCACHE_VENV)/bin/python -c "import lmcache.v1.api_server.__main__, lmcache.v1.standalone.__main__, lmcache.v1.mp_coordinator.__main__"
	touch $(LMCACHE_STAMP)

lmcache-env: $(LMCACHE_STAMP)

demo: install
	$(PY) -m controlplane.demo --host $(HOST) --port $(PORT) --preset $(PRESET)

test: install test-embedded test-services

test-embedded: install
	PREWARM_DATA_DIR=$(CURDIR)/var/test $(PY) -m pytest -m "not services" -p no:cacheprovider

test-services: install
	$(SERVICES_ENV) $(PY) -m pytest -m "not browser" -p no:cacheprovider

bench: install
	@for b in $$(ls bench/[a-z]*.py | grep -v gpu_check); do echo "== $$b"; $(PY) $$b --quick --json var/bench/$$(basename $$b .py).json || exit 1; done

lint: install
	$(PY) -m ruff check .
	$(PY) -m mypy

clean:
	rm -rf $(VENV) $(LMCACHE_VENV) var
