# bnlab: `make help` lists the targets.
SHELL := /bin/bash
UV ?= $(shell command -v uv 2>/dev/null || echo python3 -m uv)
PY := $(UV) run --frozen python
DATA ?=
STAMP := $(shell date +%Y-%m-%d_%H-%M-%S)
DEMO_DIR := outputs/demo/$(STAMP)
export BNLAB_TEST_DATA ?= $(abspath ../shared/data/cifar10-mini)

.DEFAULT_GOAL := help
.PHONY: help install test test-slow lint demo bench-sim clean

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

install: ## install everything with uv from uv.lock (into .venv)
	@$(UV) --version >/dev/null 2>&1 || python3 -m pip install -q uv
	$(UV) sync --frozen

test: install ## run the test suite on CPU (slow tests excluded)
	$(PY) -m pytest -q

test-slow: install ## run only the slow tests
	$(PY) -m pytest -q -m slow

lint: install ## ruff check
	$(UV) run --frozen ruff check .

demo: install ## short training run + table + plot (synthetic data; DATA=<dir> for CIFAR-10)
	$(PY) train.py experiment=demo $(if $(DATA),data=cifar10 data.root=$(DATA) data.download=false) \
		hydra.run.dir=$(DEMO_DIR)
	$(PY) -m bnlab.report $(DEMO_DIR) --out $(DEMO_DIR)/report \
		--title "bnlab demo ($(if $(DATA),CIFAR-10 from $(DATA),synthetic data))"

bench-sim: install ## step time: simulated vs real gloo DDP, SyncBN vs BN (prints ratios)
	$(PY) benchmarks/sim_vs_ddp.py

clean: ## remove outputs/ (all run directories)
	rm -rf outputs
