# Docker targets, included by the root Makefile (`include docker/docker.mk`).
#
#   make docker-build                      # GPU image for this host user (UID/GID baked in)
#   make docker-build TF_VARIANT=cpu       # CPU image (laptops, CI)
#   make docker-devices GPUS=all           # what TensorFlow sees inside the container
#   make docker-train GPUS=0,1 EPOCHS=3    # settings pass through as environment variables
#   docker stop tf-train-default           # checkpoints, exits 42; run docker-train again to resume
#
# Volumes: DATA_DIR (host) -> /data (TFDS_DATA_DIR), RUNS_DIR (host) -> /runs, and the run
# writes to /runs/RUN_NAME (OUTPUT_DIR). The caches of pretrained weights, where the host has them:
# KERAS_DIR (KERAS_HOME, else ~/.keras) -> /cache/keras (KERAS_HOME: keras.applications' weights) and
# KAGGLEHUB_DIR (KAGGLEHUB_CACHE, else ~/.cache/kagglehub) -> /cache/kagglehub (KAGGLEHUB_CACHE: KerasHub presets).
# A DATASET that is a path (./photos, /data/table.csv: starts with /, ./, ../ or ~, or exists) is mounted
# read-only at /dataset/NAME and DATASET set to that; it is written once as TFDS records into TFDS_DATA_DIR
# (docs/data.md). OUTPUT_DIR=runs/exp1 on the make command line means
# RUNS_DIR=runs, RUN_NAME=exp1. The repository's `.env` (DOCKER_ENV_FILE) is mounted read-only where the
# container's `python -m train` reads it; what is given to make overrides it, and GPUS, TFDS_DATA_DIR,
# OUTPUT_DIR, KERAS_HOME and KAGGLEHUB_CACHE are always set to their in-container values.

# This file's directory and the repository root ("." when make runs in the root).
DOCKER_MK_DIR := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))
DOCKER_ROOT := $(patsubst %/,%,$(dir $(DOCKER_MK_DIR)))

DOCKER ?= docker
TF_VARIANT ?= gpu
IMAGE ?= tf-train:$(TF_VARIANT)
# pyproject.toml's extras the image adds (the Dockerfile's EXTRAS): hub for KerasHub (formats, the ONNX and LiteRT
# exports, is in every image). Not the root Makefile's EXTRAS, which names the venv's (dev).
IMAGE_EXTRAS ?=
BASE_IMAGE ?= python:3.11-slim
DOCKERFILE ?= $(DOCKER_ROOT)/docker/Dockerfile
DOCKER_BUILD_FLAGS ?=
DOCKER_RUN_FLAGS ?=
# Shared memory: NCCL (MirroredStrategy's all-reduce across GPUs) moves data through
# /dev/shm, and Docker's default of 64 MB makes multi-GPU runs fail or crawl.
DOCKER_SHM_SIZE ?= 1g
# The .env mounted where the container's `python -m train` reads it (if the file exists).
DOCKER_ENV_FILE ?= $(DOCKER_ROOT)/.env
# `docker stop` waits this long for the checkpoint save before it kills.
DOCKER_STOP_TIMEOUT ?= 120

# The image's user: the host user, so files on the volumes are theirs. Root on the
# host still gets a non-root container user (1000); the Dockerfile refuses UID 0.
HOST_UID := $(shell id -u)
HOST_GID := $(shell id -g)
DOCKER_UID ?= $(if $(filter 0,$(HOST_UID)),1000,$(HOST_UID))
DOCKER_GID ?= $(if $(filter 0,$(HOST_UID)),1000,$(HOST_GID))

# Host directories mounted as volumes.
DATA_DIR ?= $(or $(TFDS_DATA_DIR),$(wildcard $(HOME)/tensorflow_datasets),data)
_OUTPUT := $(patsubst %/,%,$(or $(OUTPUT_DIR),runs/default))
RUNS_DIR ?= $(or $(patsubst %/,%,$(dir $(_OUTPUT))),.)
RUN_NAME ?= $(notdir $(_OUTPUT))
DOCKER_NAME ?= tf-train-$(RUN_NAME)
# The caches of pretrained weights: the directory given (KERAS_HOME, KAGGLEHUB_CACHE), else the libraries' default
# if the host has it; read-write, because Keras looks for cached weights only in a KERAS_HOME it can write to.
KERAS_DIR ?= $(or $(KERAS_HOME),$(wildcard $(HOME)/.keras))
KAGGLEHUB_DIR ?= $(or $(KAGGLEHUB_CACHE),$(wildcard $(HOME)/.cache/kagglehub))
CACHE_MOUNTS = $(if $(KERAS_DIR),-v "$(abspath $(KERAS_DIR))":/cache/keras) \
	$(if $(KAGGLEHUB_DIR),-v "$(abspath $(KAGGLEHUB_DIR))":/cache/kagglehub) \
	-e KERAS_HOME=/cache/keras -e KAGGLEHUB_CACHE=/cache/kagglehub
# A path DATASET (train/dataset_path.py's rule): the host's file or folder, and where the container sees it.
DATASET_HOST := $(strip $(if $(DATASET),$(if $(or $(filter /% ./% ../% ~%,$(DATASET)),$(wildcard $(DATASET))),\
	$(abspath $(patsubst ~%,$(HOME)%,$(patsubst %/,%,$(DATASET)))))))
DATASET_MOUNT = $(if $(DATASET_HOST),-v "$(DATASET_HOST)":/dataset/$(notdir $(DATASET_HOST)):ro \
	-e DATASET=/dataset/$(notdir $(DATASET_HOST)))

# Settings passed to the container by name (`-e NAME`) when given to make or set in its
# environment: every `name: type = setting(...)` of train/settings/table.py (the one table of settings),
# plus the root Makefile's SETTINGS, plus build_model's hyperparameters (HP_WIDTH=64: MODEL's own).
# GPUS, TFDS_DATA_DIR, OUTPUT_DIR, KERAS_HOME and KAGGLEHUB_CACHE are mapped, not passed. MLflow's own variables
# (TRACKING=mlflow; the image needs IMAGE_EXTRAS=track) are passed the same way; unset, its store is the runs
# volume's mlflow.db, beside the run directories.
DOCKER_MLFLOW := MLFLOW_TRACKING_URI MLFLOW_EXPERIMENT_NAME MLFLOW_DISABLE_TELEMETRY MLFLOW_TRACKING_USERNAME \
	MLFLOW_TRACKING_PASSWORD MLFLOW_TRACKING_TOKEN MLFLOW_HTTP_REQUEST_MAX_RETRIES MLFLOW_HTTP_REQUEST_TIMEOUT
DOCKER_SETTINGS_ALL := $(sort $(SETTINGS) $(DOCKER_MLFLOW) $(shell sed -n '/^class Settings/,/^[^ ]/s/^    \([a-z][a-z0-9_]*\): [^=]* = setting.*/\1/p' $(DOCKER_ROOT)/train/settings/table.py 2>/dev/null | tr '[:lower:]' '[:upper:]') $(filter HP_%,$(.VARIABLES)))
DOCKER_PASSED = $(foreach name,$(filter-out GPUS TFDS_DATA_DIR OUTPUT_DIR KERAS_HOME KAGGLEHUB_CACHE $(if $(DATASET_HOST),DATASET),$(DOCKER_SETTINGS_ALL)),\
	$(if $(filter undefined default,$(origin $(name))),,$(name)))
export $(DOCKER_PASSED)

# GPUS -> docker's --gpus flag, in one place:
#   all -> --gpus all;  none -> (no flag);  0,1 -> --gpus '"device=0,1"'
# (`--gpus 0,1` would be read as count=0 plus device IDs: "cannot set both Count and DeviceIDs").
# Inside the container the chosen GPUs are renumbered from 0, so the container gets GPUS=all
# (or none). Default: all for the gpu variant, none for cpu.
DOCKER_GPUS = $(or $(GPUS),$(if $(filter cpu,$(TF_VARIANT)),none,all))
docker_gpus_flag = $(strip \
	$(if $(filter none,$(1)),,\
	$(if $(filter all,$(1)),--gpus all,\
	$(if $(shell printf '%s' '$(1)' | grep -Ex '[0-9]+(,[0-9]+)*'),--gpus '"device=$(1)"',\
	$(error GPUS='$(1)' is not allowed: use all, none, or GPU indices like 0 or 0,1)))))
docker_gpus_env = $(if $(filter none,$(1)),none,all)

DOCKER_RUN = $(DOCKER) run --rm --init \
	$(call docker_gpus_flag,$(DOCKER_GPUS)) \
	--shm-size=$(DOCKER_SHM_SIZE) --stop-timeout=$(DOCKER_STOP_TIMEOUT) \
	-v "$(abspath $(DATA_DIR))":/data -v "$(abspath $(RUNS_DIR))":/runs \
	$(if $(wildcard $(DOCKER_ENV_FILE)),-v "$(abspath $(DOCKER_ENV_FILE))":/workspace/.env:ro) \
	-e GPUS=$(call docker_gpus_env,$(DOCKER_GPUS)) -e TFDS_DATA_DIR=/data -e OUTPUT_DIR=/runs/$(RUN_NAME) \
	$(DATASET_MOUNT) $(CACHE_MOUNTS) \
	$(foreach name,$(DOCKER_PASSED),-e $(name)) \
	$(DOCKER_RUN_FLAGS)

# Create the volume directories before docker does (it would make them root-owned); when
# make runs as root, hand new ones to the container user.
define docker_dirs
	@for d in "$(DATA_DIR)" "$(RUNS_DIR)" $(if $(KERAS_DIR),"$(KERAS_DIR)") $(if $(KAGGLEHUB_DIR),"$(KAGGLEHUB_DIR)"); do \
		if [ ! -d "$$d" ]; then mkdir -p "$$d"; \
			if [ "$(HOST_UID)" = 0 ]; then chown $(DOCKER_UID):$(DOCKER_GID) "$$d"; fi; fi; \
	done
endef

.PHONY: docker-build docker-train docker-devices docker-check docker-evaluate docker-shell test-docker test-docker-gpu

docker-build: ## Build the image (TF_VARIANT=gpu|cpu, IMAGE, BASE_IMAGE, IMAGE_EXTRAS=hub; host UID/GID baked in)
	$(DOCKER) build -f $(DOCKERFILE) -t $(IMAGE) \
		--build-arg BASE_IMAGE=$(BASE_IMAGE) --build-arg TF_VARIANT=$(TF_VARIANT) \
		--build-arg UID=$(DOCKER_UID) --build-arg GID=$(DOCKER_GID) $(if $(IMAGE_EXTRAS),--build-arg EXTRAS=$(IMAGE_EXTRAS)) \
		$(DOCKER_BUILD_FLAGS) $(DOCKER_ROOT)

docker-train: ## Train in the container (GPUS=all|none|0,1; docker stop, then run again to resume)
	$(docker_dirs)
	$(DOCKER_RUN) --name $(DOCKER_NAME) $(IMAGE) fit

docker-devices: ## Show the devices TensorFlow sees inside the container
	$(docker_dirs)
	$(DOCKER_RUN) $(IMAGE) devices

docker-check: ## Run the container's self-check (python -m train check)
	$(docker_dirs)
	$(DOCKER_RUN) $(IMAGE) check

docker-evaluate: ## Evaluate the latest checkpoint of the run in the container
	$(docker_dirs)
	$(DOCKER_RUN) $(IMAGE) evaluate

docker-shell: ## Open a shell in the container, same volumes and settings
	$(docker_dirs)
	$(DOCKER_RUN) -it --entrypoint /bin/bash $(IMAGE)

test-docker: ## Build the CPU image on a locally made base and train, stop, resume in it
	bash scripts/test-docker.sh

test-docker-gpu: ## Build the GPU image on the same base and start it without a GPU: devices names the cause
	bash scripts/test-docker-gpu.sh
