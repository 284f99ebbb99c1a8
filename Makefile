# bnlab: `make help` lists the targets.
SHELL := /bin/bash
UV ?= $(shell command -v uv 2>/dev/null || echo python3 -m uv)
PY := $(UV) run --frozen python
DATA ?=
# On a GPU machine with its own torch and no uv: make test-gpu PY=python3 INSTALL= (docs/training.md)
INSTALL ?= install
RUNS ?=
STAMP := $(shell date +%Y-%m-%d_%H-%M-%S)
DEMO_DIR := outputs/demo/$(STAMP)
export BNLAB_TEST_DATA ?= $(abspath ../shared/data/cifar10-mini)

.DEFAULT_GOAL := help
.PHONY: help install test test-gpu gpu-check test-slurm test-slow lint demo bench perf-doc clean table-jitter table-batch table-ranks \
	tables report table-pitfalls figure-losslog table-evalmode table-rankstats table-sync \
	table-precisebn layout table-lrpilot table-recoverpilot table-practicepilot table-practice table-recover table-converge table-plateau table-decompose table-pilot table-lr table-fixes table-values table-bf16ddp
JOBS ?= $(shell nproc 2>/dev/null || echo 1)
# make table-X runs bnlab/claims/X.py: its sweep (DATA, JOBS, RUNS), what it measures, experiments/X/
# LAUNCH: where the sweep's runs go (default this machine), e.g. LAUNCH="--launcher slurm
# --partition gpu --gpus-per-node 1 --time 240" (python -m bnlab.lab.sweep --help lists them)
LAUNCH ?=
CLAIMS = $(PY) -m bnlab.claims $(if $(DATA),--data $(DATA)) $(if $(RUNS),--runs $(RUNS)) --jobs $(JOBS) $(LAUNCH)

help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

# --compile-bytecode: each new Python process (a test's run, a rank, a sweep's job) reads the
# installed packages' bytecode instead of compiling their sources again where Python writes no
# bytecode of its own (PYTHONDONTWRITEBYTECODE): one process importing torch, torchvision,
# hydra and matplotlib took 20 s of CPU without it and 8 s with it (2-core AMD EPYC, both cores
# busy with a sweep)
install: ## install everything with uv from uv.lock (into .venv): the core and every extra (train, lab, slurm)
	@$(UV) --version >/dev/null 2>&1 || python3 -m pip install -q uv
	$(UV) sync --frozen --all-extras --compile-bytecode

test: install ## run the test suite on CPU, one worker per core (slow tests excluded; ~5 min on 2 cores)
	$(PY) -m pytest -q -n auto --dist worksteal --durations=20

test-gpu: $(INSTALL) ## on a CUDA machine: the cuda tests, then the GPU benchmark section (docs/performance.md)
	@$(PY) -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'make test-gpu: no CUDA device is visible; run it on a GPU machine.')"
	$(PY) -m pytest -q -m cuda -rs
	$(PY) benchmarks/bench.py --only gpu
	$(PY) benchmarks/perfdoc.py

# OUT: the check's folder (check.json, summary.txt, logs, bench.json, runs-cuda.tar.gz);
# MINUTES: its whole time, the values sweep taking what is left; BENCH: the bench's sections
# (default gpu,precision); K: the values sweep's runs per GPU (default: the bench's fastest)
OUT ?= outputs/gpu-check/$(STAMP)
MINUTES ?= 8
gpu-check: $(INSTALL) ## on a CUDA machine, one command: cuda tests, CPU = CUDA, SyncBN kernels, gpu bench, values runs (docs/training.md)
	$(PY) benchmarks/gpucheck.py --out $(OUT) --minutes $(MINUTES) $(if $(DATA),--data $(DATA)) $(if $(REHEARSE),--rehearse) \
		$(if $(BENCH),--bench $(BENCH)) $(if $(K),--runs-per-gpu $(K))

test-slurm: install ## on a SLURM cluster: sweeps submitted for real (tests/slurm/local-cluster.sh [--two-nodes] starts one; ~10 min)
	$(PY) -m pytest -q -m slurm -rs

test-slow: install ## run only the slow tests
	$(PY) -m pytest -q -m slow

lint: install ## ruff check
	$(UV) run --frozen ruff check .

demo: install ## bn, syncbn and gn at 4 ranks x 2, side by side, in one plot (~3 min; DATA=<dir> for CIFAR-10)
	$(PY) -m bnlab.lab.demo --out $(DEMO_DIR) $(if $(DATA),--data $(DATA))

bench: install ## benchmarks (quiet machine, ~15 min; ONLY=sim,syncbn,...) + docs/performance.md
	$(PY) benchmarks/bench.py $(if $(ONLY),--only $(ONLY))
	$(PY) benchmarks/perfdoc.py

perf-doc: install ## docs/performance.md from benchmarks/results/*.json (no measuring)
	$(PY) benchmarks/perfdoc.py

table-jitter: install ## the short protocol's jitter at 4x2 (history) + real-DDP check -> experiments/jitter/
	$(CLAIMS) jitter

table-batch: install ## C2 L1: val acc by images per rank -> experiments/batch/
	$(CLAIMS) batch

table-ranks: install ## C5: grad accumulation; 1 rank vs 4 (C3's history) -> experiments/ranks/
	$(CLAIMS) ranks

tables: install ## all three sweeps in one pool (shared cells run once), then every table
	$(CLAIMS) jitter ranks batch

table-lrpilot: install ## history: the first headline protocol's learning rate, by its stated rule -> experiments/lrpilot/
	$(CLAIMS) lrpilot

table-pilot: install ## the headline protocol's choices (lr, gn groups, freeze point) on 1,000 held-out images -> experiments/pilot/
	$(CLAIMS) pilot

table-lr: install ## C1 C3 C4 on the settled protocol: the learning-rate crossover, statistics vs weights (hours) -> experiments/lr/
	$(CLAIMS) lr

table-fixes: install ## C6 C8 C9 on the settled protocol: PreciseBN, gn, frozen BN at the rate C1 is ruled at (hours) -> experiments/fixes/
	$(CLAIMS) fixes

table-practicepilot: install ## table-practice's pilot: the reference's length and each fix's rate, on 1,000 held-out images (hours) -> experiments/practicepilot/
	$(CLAIMS) practicepilot

table-practice: install ## Wu and He's batch-size experiment at CIFAR scale: BN, GN and every fix at its best, 8 ranks x 16..2 (many hours) -> experiments/practice/
	$(CLAIMS) practice

table-recoverpilot: install ## table-recover's pilot: each fix's rate (and setting) on 1,000 held-out images (hours) -> experiments/recoverpilot/
	$(CLAIMS) recoverpilot

table-recover: install ## every fix at 4 x 2 at its pilot's rate against bn and 1 x 8 (hours; its spec: python -m bnlab.claims recover-spec) -> experiments/recover/
	$(CLAIMS) recover

table-converge: install ## does table-recover's ranking hold 4x longer? resnet20, 40 epochs, cosine (hours; its spec: python -m bnlab.claims converge-spec) -> experiments/converge/
	$(CLAIMS) converge

table-values: install ## where BN breaks: accuracy and jitter against values per channel (hours) -> experiments/values/
	$(CLAIMS) values

table-bf16ddp: install ## table-values' CUDA bf16 divergence re-run on this CPU: the simulation against real gloo DDP (about 1.5 h) -> experiments/bf16ddp/
	$(CLAIMS) bf16ddp

table-plateau: install ## history: the first headline protocol (lr 0.1): detrended jitter, floors, 5 seeds -> experiments/plateau/
	$(CLAIMS) plateau

table-decompose: install ## history: the first headline protocol's weights evaluated with EMA, PreciseBN and batch statistics -> experiments/decompose/
	$(CLAIMS) decompose

table-evalmode: install ## C10: eval vs train mode from checkpoints (DATA=<cifar dir>) -> experiments/evalmode/
	$(CLAIMS) evalmode

table-rankstats: install ## C7: ranks' running statistics, buffer sync on/off -> experiments/rankstats/
	$(CLAIMS) rankstats

table-sync: install ## C12: bn vs syncbn vs naive sync, skewed ranks, bias and cost -> experiments/sync/
	$(CLAIMS) sync

table-precisebn: install ## L2 (C8's gain on final checkpoints, shown): PreciseBN estimator, pooling, samples, batch -> experiments/precisebn/
	$(CLAIMS) precisebn

table-pitfalls: install ## C11: SyncBN conversion/launch pitfalls, measured -> experiments/pitfalls/
	$(CLAIMS) pitfalls

figure-losslog: install ## C13: one run's loss logged sparsely vs as a running mean -> experiments/losslog/
	$(CLAIMS) losslog

report: install ## regenerate every table, plot, verdict and the doctor outputs docs/library.md quotes, from existing runs (no training)
	$(PY) -m bnlab.claims all --report

layout: install ## the package's layers, circles and longest import chain, from its imports
	$(PY) tests/test_layout.py

clean: ## remove outputs/ (all run directories)
	rm -rf outputs
