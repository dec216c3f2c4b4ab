# detpipe: the verbs people use. `make run` and `make test` set everything up themselves.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
IAC_VENV := .venv-iac
# The uv that installs the lock, here and in infra/Dockerfile (ARG UV_VERSION): keep them equal.
UV_VERSION := 0.13.9
DETPIPE := $(VENV)/bin/detpipe
DEMO := demo-data
DEMO_TRAIN ?= 2048
DEMO_VAL ?= 256
# How long the train step may take (tune's search shares it): auto is the trainer's choice for the
# machine it finds (components/train/time_budget.py), e.g. TIME_BUDGET=20m for a longer CPU run.
TIME_BUDGET ?= auto
# demo-data makes DEMO_TRAIN + DEMO_VAL images; the hash split takes about this share for val.
VAL_FRACTION ?= 0.1

.PHONY: help env run demo test test-fast compile docs clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

# Bytecode: Python writes each module's .pyc the first time a process imports it, so the
# recipes below clear PYTHONDONTWRITEBYTECODE (some machines set it; without .pyc files every
# process compiles all it imports on every start: TensorFlow's import 14.5 s, not 5.3 s).
# Compiling at install instead (uv's --compile-bytecode) compiles all 23,000 library files, of
# which `make run` imports about 7,200: the install took 32-69 s more on 2 cores, the first
# step (validate-and-convert) 10 s more without it; `make run` on a fresh clone 4:51-5:17 ->
# 3:56-4:26 (docs/measurements.md). The image still compiles at build (UV_COMPILE_BYTECODE in
# infra/Dockerfile): its files are read-only at run time.
unexport PYTHONDONTWRITEBYTECODE

$(VENV)/.synced: pyproject.toml uv.lock Makefile
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "detpipe needs Python 3.11 ($(PYTHON) not found on PATH): install it, or set PYTHON=/path/to/python3.11"; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || { echo "detpipe needs Python 3.11; $(PYTHON) is $$($(PYTHON) --version 2>&1)"; exit 1; }
	@[ "$$($(PYTHON) -m uv --version 2>/dev/null | cut -d' ' -f2)" = "$(UV_VERSION)" ] || $(PYTHON) -m pip install --quiet "uv==$(UV_VERSION)" || $(PYTHON) -m pip install --quiet --user "uv==$(UV_VERSION)"
	@$(PYTHON) -m uv --version >/dev/null 2>&1 || { echo "could not install uv $(UV_VERSION) with $(PYTHON) -m pip"; exit 1; }
	$(PYTHON) -m uv sync --frozen --python $(PYTHON)
	@touch $@

# The infrastructure scanners (checkov, hadolint) in their own locked environment:
# infra/scan/pyproject.toml says why they stay out of uv.lock.
$(IAC_VENV)/.synced: infra/scan/pyproject.toml infra/scan/uv.lock Makefile | $(VENV)/.synced
	UV_PROJECT_ENVIRONMENT=$(abspath $(IAC_VENV)) $(PYTHON) -m uv sync --frozen --project infra/scan --python $(PYTHON)
	@touch $@

env: $(VENV)/.synced  ## build .venv from uv.lock

$(DEMO)/.done: | $(VENV)/.synced
	$(DETPIPE) demo-data $(DEMO) --train $(DEMO_TRAIN) --val $(DEMO_VAL)
	@touch $@

demo: $(DEMO)/.done  ## write the synthetic demo dataset to demo-data/

run: $(DEMO)/.done  ## run the whole pipeline locally on the demo dataset
	$(DETPIPE) run --local --images $(DEMO)/images --annotations $(DEMO)/annotations --val-fraction $(VAL_FRACTION) --time-budget $(TIME_BUDGET)

# pytest-xdist workers: one per CPU this process may use. With one thread in each TensorFlow op
# pool (tests/conftest.py) the tests and the processes they start keep the cores busy without an
# extra worker, which then only adds contention. Measured on a 2-core machine, clean clones
# (2026-12-07): `make test` 12:40-13:41 with 3 workers (22.1-24.1 user CPU-min), 11:49 and 12:25
# with 2 (20.3, 20.7); before the thread limit, 11:22 and 11:46 with 3, 11:43 and 11:53 with 2 elsewhere.
TEST_WORKERS ?= $(shell nproc)
# Each worker takes whole modules (--dist loadfile) in the order tests/conftest.py sets, longest first
# (--no-loadscope-reorder: pytest-xdist would order them by their count of tests instead).

test: $(VENV)/.synced $(IAC_VENV)/.synced  ## run the tests (what CI runs: every test, end-to-end runs on real data included)
	$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

test-fast: $(VENV)/.synced $(IAC_VENV)/.synced  ## the tests without the slow end-to-end and long training ones, for iteration
	$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not slow"

compile: $(VENV)/.synced  ## compile the pipeline to detpipe.yaml and print its sha256
	$(DETPIPE) compile --output detpipe.yaml

docs: $(VENV)/.synced  ## build the documentation site (docs/, mkdocs.yml) into site/; `make test` builds it strictly
	$(VENV)/bin/mkdocs build --strict

clean:  ## remove outputs (keeps .venv)
	rm -rf $(DEMO) local_outputs detpipe.yaml site
