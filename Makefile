# bnlab: `make help` lists the targets.
SHELL := /bin/bash
UV ?= $(shell command -v uv 2>/dev/null || echo python3 -m uv)
PY := $(UV) run --frozen python
DATA ?=
RUNS ?=
STAMP := $(shell date +%Y-%m-%d_%H-%M-%S)
DEMO_DIR := outputs/demo/$(STAMP)
export BNLAB_TEST_DATA ?= $(abspath ../shared/data/cifar10-mini)

.DEFAULT_GOAL := help
.PHONY: help install test test-slow lint demo bench perf-doc clean table-jitter table-batch table-ranks \
	tables report table-pitfalls figure-losslog table-evalmode table-rankstats table-sync \
	table-precisebn
JOBS ?= $(shell nproc 2>/dev/null || echo 1)
SWEEP = $(PY) -m bnlab.sweep $(if $(DATA),--data $(DATA)) --jobs $(JOBS)

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

install: ## install everything with uv from uv.lock (into .venv)
	@$(UV) --version >/dev/null 2>&1 || python3 -m pip install -q uv
	$(UV) sync --frozen

test: install ## run the test suite on CPU (slow tests excluded)
	$(PY) -m pytest -q --durations=20

test-slow: install ## run only the slow tests
	$(PY) -m pytest -q -m slow

lint: install ## ruff check
	$(UV) run --frozen ruff check .

demo: install ## short training run + table + plot (synthetic data; DATA=<dir> for CIFAR-10)
	$(PY) train.py experiment=demo $(if $(DATA),data=cifar10 data.root=$(DATA) data.download=false) \
		hydra.run.dir=$(DEMO_DIR)
	$(PY) -m bnlab.report $(DEMO_DIR) --out $(DEMO_DIR)/report \
		--title "bnlab demo ($(if $(DATA),CIFAR-10 from $(DATA),synthetic data))"

bench: install ## benchmarks (quiet machine, ~15 min; ONLY=sim,syncbn,...) + docs/performance.md
	$(PY) benchmarks/bench.py $(if $(ONLY),--only $(ONLY))
	$(PY) benchmarks/perfdoc.py

perf-doc: install ## docs/performance.md from benchmarks/results/*.json (no measuring)
	$(PY) benchmarks/perfdoc.py

table-jitter: install ## C1 C4 C6 C8 C9: sweep (DATA=<cifar dir>, JOBS=N) + real-DDP check + experiments/jitter/table.md
	$(SWEEP) experiments/jitter/sweep.yaml
	$(PY) -m bnlab.ddpcheck $(if $(DATA),--data $(DATA))
	$(PY) -m bnlab.tables jitter

table-batch: install ## C2 L1: val acc by images per rank + experiments/batch/table.md
	$(SWEEP) experiments/batch/sweep.yaml
	$(PY) -m bnlab.tables batch

table-ranks: install ## C3 C5: 1 rank vs 4, grad accumulation + experiments/ranks/table.md
	$(SWEEP) experiments/ranks/sweep.yaml
	$(PY) -m bnlab.tables ranks

tables: install ## all three sweeps in one pool (shared cells run once), then every table
	$(SWEEP) experiments/jitter/sweep.yaml experiments/ranks/sweep.yaml experiments/batch/sweep.yaml
	$(PY) -m bnlab.ddpcheck $(if $(DATA),--data $(DATA))
	$(PY) -m bnlab.tables all

table-evalmode: install ## C10: eval vs train mode from checkpoints (DATA=<cifar dir>) -> experiments/evalmode/
	$(PY) -m bnlab.evalmode $(if $(DATA),--data $(DATA)) $(if $(RUNS),--runs $(RUNS)) --jobs $(JOBS)

table-rankstats: install ## C7: ranks' running statistics, buffer sync on/off -> experiments/rankstats/
	$(PY) -m bnlab.rankstats $(if $(DATA),--data $(DATA)) $(if $(RUNS),--runs $(RUNS)) --jobs $(JOBS)

table-sync: install ## C12: bn vs syncbn vs naive sync, skewed ranks, bias and cost -> experiments/sync/
	$(PY) -m bnlab.naivesync $(if $(DATA),--data $(DATA)) $(if $(RUNS),--runs $(RUNS)) --jobs $(JOBS)

table-precisebn: install ## L2 C8: PreciseBN estimator, pooling, samples, batch -> experiments/precisebn/
	$(PY) -m bnlab.recalib $(if $(DATA),--data $(DATA)) $(if $(RUNS),--runs $(RUNS)) --jobs $(JOBS)

table-pitfalls: install ## C11: SyncBN conversion/launch pitfalls, measured -> experiments/pitfalls/
	$(PY) -m bnlab.pitfalls

figure-losslog: install ## C13: one run's loss logged sparsely vs as a running mean -> experiments/losslog/
	$(PY) -m bnlab.losslog

report: install ## regenerate every table, plot and verdict from existing runs (no training)
	$(PY) -m bnlab.tables all
	$(PY) -m bnlab.pitfalls --report
	$(PY) -m bnlab.evalmode --report
	$(PY) -m bnlab.rankstats --report
	$(PY) -m bnlab.naivesync --report
	$(PY) -m bnlab.recalib --report
	$(PY) -m bnlab.losslog

clean: ## remove outputs/ (all run directories)
	rm -rf outputs
