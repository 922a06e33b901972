# Run `make help` for the targets. Settings pass through: `make train GPUS=0,1 EPOCHS=3`.
.DEFAULT_GOAL := help
SHELL := bash

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Every setting, read from its one table (train/settings/table.py, `    name: type = setting(...)` lines, upper-cased).
SETTINGS := $(shell sed -n '/^class Settings/,/^[^ ]/s/^    \([a-z][a-z0-9_]*\): [^=]* = setting.*/\1/p' train/settings/table.py | tr '[:lower:]' '[:upper:]')
# A setting given to make (or already in the environment) reaches python as an environment variable.
export $(foreach name,$(SETTINGS),$(if $(filter undefined,$(origin $(name))),,$(name)))
# build_model's hyperparameters pass through too: `make train HP_WIDTH=128` (MODEL's own settings, train/hparams.py).
export $(filter HP_%,$(.VARIABLES))

.PHONY: help setup train train-workers devices check formats bench bench-images bench-text bench-gpu bench-levers evaluate test test-all test-gpu lint format tensorboard mlflow-ui lock clean

help: ## Show this help
	@[ -t 1 ] && tty=1; grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk -v tty="$$tty" 'BEGIN {FS = ":.*?## "}; \
		{printf (tty ? "  \033[36m%-16s\033[0m %s\n" : "  %-16s %s\n"), $$1, $$2}'

# The environment comes from a lock, hash-checked (a wheel that changed since `make lock` fails the install):
# requirements-gpu.lock where the extras include gpu, else requirements.lock; both hold the dev, hub, track, tune and
# formats extras (LOCKED_EXTRAS, as scripts/lock.py makes them); the set-up installs the lock's entries that the
# dependencies and the extras need ($(VENV)/locked.txt, written by docker/requirements_from_pyproject.py as for the
# image). Then the project itself, without dependencies (pip installs no editable project in hash mode). An extra
# no lock holds (profile) comes last, under the lock's pins (LOCK_PINS: without hashes, which pip refuses beside an
# editable project).
# The extras: the venv's ($(BIN)/.extras, the last set-up's) and those EXTRAS names on the command line or in the
# environment (gpu on a GPU machine: make setup EXTRAS=dev,gpu; hub for KerasHub), dev first; dev where neither names
# one. EXTRAS adds, never drops: an extra the venv lacks runs the set-up again (to drop one: rm -rf $(VENV)).
comma := ,
empty :=
space := $(empty) $(empty)
uniq = $(if $1,$(firstword $1) $(call uniq,$(filter-out $(firstword $1),$1)))
VENV_EXTRAS := $(subst $(comma), ,$(shell cat $(BIN)/.extras 2>/dev/null))
GIVEN_EXTRAS := $(if $(filter undefined,$(origin EXTRAS)),,$(subst $(comma), ,$(EXTRAS)))
EXTRAS_LIST := $(or $(strip $(VENV_EXTRAS) $(GIVEN_EXTRAS)),dev)
EXTRAS_LIST := $(strip $(call uniq,$(filter dev,$(EXTRAS_LIST)) $(EXTRAS_LIST)))
ALL_EXTRAS := $(subst $(space),$(comma),$(EXTRAS_LIST))
LOCKED_EXTRAS := dev hub track tune formats gpu
LOCK = $(if $(filter gpu,$(EXTRAS_LIST)),requirements-gpu.lock,requirements.lock)
LOCK_PINS = <($(PYTHON) docker/requirements_from_pyproject.py --constraints $(LOCK) pyproject.toml)
$(BIN)/.installed: pyproject.toml requirements.lock requirements-gpu.lock $(BIN)/.extras
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(PYTHON) docker/requirements_from_pyproject.py --locked $(LOCK) pyproject.toml \
		$(filter $(LOCKED_EXTRAS),$(EXTRAS_LIST)) > $(VENV)/locked.txt
	$(BIN)/python -m pip install --quiet --require-hashes -r $(VENV)/locked.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	$(if $(filter-out $(LOCKED_EXTRAS),$(EXTRAS_LIST)),$(BIN)/python -m pip install --quiet -c $(LOCK_PINS) -e ".[$(ALL_EXTRAS)]")
	touch $@

# Rewritten (and the set-up run again) only when the extras add to the venv's.
$(BIN)/.extras: $(if $(filter-out $(VENV_EXTRAS),$(EXTRAS_LIST)),FORCE)
	@mkdir -p $(BIN) && echo "$(ALL_EXTRAS)" > $@
FORCE:

setup: $(BIN)/.installed ## Create .venv and install the pinned dependencies

train: setup ## Train (or resume) with the settings from flags, environment and .env
	$(BIN)/python -m train fit

train-workers: setup ## Train on WORKERS (default 2) local workers: MultiWorkerMirroredStrategy on loopback
	PYTHON=$(BIN)/python scripts/launch-workers.sh $(or $(WORKERS),2) fit

devices: setup ## Device doctor: what TensorFlow sees, what the settings resolve to, what is wrong
	$(BIN)/python -m train devices

check: setup ## Trial-run a small batch, then find the largest batch that fits
	$(BIN)/python -m train check

bench: setup ## Benchmark the training loop against its input ceiling, Keras fit and the tutorials' way (BENCH_ARGS: more flags)
	$(BIN)/python -m train bench $(BENCH_ARGS) --json "$(or $(BENCH_JSON),bench.json)"

bench-images: setup ## The benchmark on photos of any size: examples/resnet.py's preprocess on synthetic_photos (offline), streamed rows included
	MODEL=$(or $(MODEL),examples/resnet.py) DATASET=$(or $(DATASET),synthetic_photos) \
		$(BIN)/python -m train bench --json "$(or $(BENCH_JSON),bench-images.json)"

bench-text: setup ## The benchmark on texts: examples/text.py's adapted TextVectorization in preprocess on synthetic_reviews (offline)
	MODEL=$(or $(MODEL),examples/text.py) DATASET=$(or $(DATASET),synthetic_reviews) \
		$(BIN)/python -m train bench --json "$(or $(BENCH_JSON),bench-text.json)"

bench-gpu: setup ## GPU scaling: 1, 2, ... N GPUs at a fixed batch per GPU, and the levers that matter there
	$(BIN)/python -m train bench --compare-replicas --require-gpus --no-startup \
		--levers JIT_COMPILE,MIXED_PRECISION,DEVICE_PREFETCH --json "$(or $(BENCH_JSON),bench-gpu.json)"

bench-levers: setup ## The benchmark, then each value of every speed lever in its own process (minutes)
	$(BIN)/python -m train bench --levers all --json "$(or $(BENCH_JSON),bench-levers.json)"

# BENCH_RUN: the run whose exports are compared; trained (MODEL, DATASET, EPOCHS as given) when it has no model.keras.
BENCH_RUN ?= runs/bench-formats
.PHONY: bench-formats
bench-formats: setup ## BENCH_RUN's SavedModel, onnxruntime and LiteRT side by side: ms at batch 1, examples/s at 256
	[ -f "$(BENCH_RUN)/model.keras" ] || $(BIN)/python -m train fit --output-dir "$(BENCH_RUN)"
	$(BIN)/python -m train formats --output-dir "$(BENCH_RUN)" --format onnx,litert
	$(BIN)/python scripts/bench_formats.py --output-dir "$(BENCH_RUN)" --json "$(or $(BENCH_JSON),bench-formats.json)"

evaluate: setup ## Evaluate the latest checkpoint on EVAL_SPLIT
	$(BIN)/python -m train evaluate

formats: setup ## OUTPUT_DIR's model.keras as ONNX and LiteRT, checked against it (FORMATS=onnx,litert; QUANTIZE=int8)
	$(BIN)/python -m train formats --format "$(or $(FORMATS),onnx$(comma)litert)" $(if $(QUANTIZE),--quantize $(QUANTIZE))

.PHONY: predict
predict: setup ## Predict with OUTPUT_DIR's export: make predict INPUT="photos/ rows.csv" (or SPLIT=test), as JSON Lines
	$(BIN)/python -m train predict $(INPUT) $(if $(SPLIT),--split "$(SPLIT)")

# The tests run in pytest-xdist workers, whole files each (a file's shared runs stay in one worker). TEST_WORKERS=auto
# is one a physical core; each worker is a pytest process plus a TensorFlow fork server its runs start from, about
# 1.2 GiB at its peak (2.3 GiB in all for 2 workers here). TEST_WORKERS=N sets the count; 1 runs them in one process.
TEST_WORKERS ?= auto
PYTEST := $(BIN)/python -m pytest $(if $(filter 1,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

test: setup ## The fast tier: every test not marked slow, each command end to end (about 9 minutes on 2 cores)
	$(PYTEST) -m "not slow"

test-all: setup ## Every test, the slow end-to-end runs included: what CI runs (about 22 minutes on 2 cores)
	$(PYTEST)

test-gpu: setup ## Run the GPU tests (they skip where TensorFlow sees no GPU)
	$(BIN)/python -m pytest -m gpu -rP  # -rP: the figures the GPU tests print

lint: setup ## Check lint and formatting with ruff, and the engine's map with lint-imports (pyproject.toml)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

format: setup ## Fix lint and formatting with ruff
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

TENSORBOARD_HOST ?= 127.0.0.1# reachable from this machine only; 0.0.0.0 opens it to the network

tensorboard: setup ## Serve TensorBoard for OUTPUT_DIR's parent (on 127.0.0.1 unless TENSORBOARD_HOST); offers the Profile tab
	@$(BIN)/python -c "import tensorboard_plugin_profile" 2>/dev/null || { \
		echo "TensorBoard's Profile tab (PROFILE_STEPS traces) needs tensorboard-plugin-profile: make setup EXTRAS=dev,profile"; \
		if [ -t 0 ]; then read -r -p "Install it now? [y/N] " answer; \
			[ "$$answer" = y ] && $(BIN)/python -m pip install --quiet -c $(LOCK_PINS) -e ".[profile]"; fi; true; }
	$(BIN)/tensorboard --logdir "$(dir $(or $(OUTPUT_DIR),runs/default))" --host $(TENSORBOARD_HOST)

MLFLOW_UI_PORT ?= 5000
MLFLOW_STORE = sqlite:///$(abspath $(dir $(or $(OUTPUT_DIR),runs/default)))/mlflow.db

mlflow-ui: setup ## Serve the MLflow UI of OUTPUT_DIR's parent's store (TRACKING=mlflow's mlflow.db) on 127.0.0.1:MLFLOW_UI_PORT
	@$(BIN)/python -c "import mlflow" 2>/dev/null || { echo "make mlflow-ui needs mlflow: make setup EXTRAS=dev,track"; exit 2; }
	$(BIN)/mlflow ui --backend-store-uri "$(MLFLOW_STORE)" --host 127.0.0.1 --port $(MLFLOW_UI_PORT)

# uv resolves; the pinned TensorFlow (without dependencies) tells scripts/lock.py its CUDA ranges and build.
UV_VERSION := 0.13.9
lock: ## Re-resolve requirements.lock and requirements-gpu.lock, hashed, from pyproject.toml (UPGRADE=1: every pin afresh)
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/python -m pip install --quiet --no-deps uv==$(UV_VERSION) \
		"$$($(PYTHON) docker/requirements_from_pyproject.py pyproject.toml | grep '^tensorflow==')"
	.lock-venv/bin/python scripts/lock.py $(if $(UPGRADE),--upgrade) .lock-venv/bin/uv
	rm -rf .lock-venv

clean: ## Remove .venv, caches and runs/ (checkpoints included)
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info runs

include docker/docker.mk
