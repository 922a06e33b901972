#!/usr/bin/env bash
# make test-docker-gpu: build the GPU image (tensorflow[and-cuda]) and start it on a host without a GPU.
#
#   1-3. engine, base, build   as make test-docker (scripts/test-docker-common.sh), with TF_VARIANT=gpu:
#               the dependency layer both variants share comes from the cache when the CPU image was
#               built first (make test-docker), so only the CUDA wheels' layer is new.
#   4. libraries the CUDA wheels' runtime and cuDNN load in the container (dlopen, no driver needed).
#   5. devices  `docker run IMAGE devices`, as a user who forgot --gpus: TensorFlow loads, the report
#               shows the pip CUDA and cuDNN, no GPU, and the doctor's error names the likely cause,
#               a container started without --gpus; exit 1 (the doctor's "requested devices not
#               usable": the image defaults to GPUS=all), no traceback. `devices --json` says the same.
#               The CUDA wheels installed are the ones requirements-gpu.lock pins (the doctor compares them).
#   6. fit      a short fit in the same container: GPUS=all without a GPU trains on the CPU, exit 0.
# Containers run with --network none. Env: as make test-docker (BASE_IMAGE, KEEP_TMP=1,
# TEST_DOCKER_DATA_ROOT), and TEST_IMAGE (default tf-train:test-gpu).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NAME=test-docker-gpu
# shellcheck source=scripts/test-docker-common.sh
source "$REPO/scripts/test-docker-common.sh"

start_engine
local_base
build_image gpu "${TEST_IMAGE:-tf-train:test-gpu}"
host_dirs
quiet() { grep -vE '^[IWE][0-9]{4} |^WARNING: All log messages|^To enable the following' || true; }   # TF's C++ lines

# --- 4. libraries -------------------------------------------------------------------------
phase libraries
load='import ctypes, glob, sys
for pattern in sys.argv[1:]:
    (path,) = glob.glob("/opt/venv/lib/python3*/site-packages/nvidia/" + pattern)
    ctypes.CDLL(path)
    print("loaded", path)'
docker run --rm --network none --entrypoint python "$TEST_IMAGE" -c "$load" \
    cuda_runtime/lib/libcudart.so.12 cudnn/lib/libcudnn.so.9 || die "the CUDA wheels' libraries do not load"
ok "libcudart and libcudnn from the CUDA wheels load without a driver"

# --- 5. devices ---------------------------------------------------------------------------
phase devices
rc=0
out="$(docker run --rm --network none "$TEST_IMAGE" devices 2>&1)" || rc=$?
echo "$out" | quiet
[[ "$out" != *Traceback* ]] || die "devices printed a traceback"
[[ "$rc" == 1 ]] || die "devices without a GPU should exit 1 (requested devices not usable), got $rc"
for expected in "built for CUDA" "(pip nvidia-cuda-runtime-cu12)" "(pip nvidia-cudnn-cu12)" "NVIDIA driver none" \
        "GPUs: none seen by TensorFlow" "a container started without --gpus" "docker run --gpus all"; do
    [[ "$out" == *"$expected"* ]] || die "devices does not say '$expected'"
done
ok "devices: CUDA wheels loaded, no GPU, 'a container started without --gpus' named, exit 1, no traceback"
rc=0
json="$(docker run --rm --network none "$TEST_IMAGE" devices --json 2>/dev/null)" || rc=$?
[[ "$rc" == 1 ]] || die "devices --json should exit 1 too, got $rc"
python3 - "$json" <<'EOF' || die "devices --json does not report the GPU image on a GPU-less host: $json"
import json, sys
report = json.loads(sys.argv[1])
assert report["build"]["cuda_build"] and report["gpus"] == [], report
assert all("pip" in v for v in report["cuda_libraries"]["cuda"] + report["cuda_libraries"]["cudnn"]), report
assert report["cuda_libraries"]["cudnn"] and report["cuda_libraries"]["driver"] == [], report
assert [(d["severity"], d["code"]) for d in report["diagnoses"]] == [("error", "no_gpu_driver")], report
versions = report["cuda_versions"]  # the image holds requirements-gpu.lock's CUDA wheels, and that lock
assert versions["lock"]["file"] == "/opt/venv/requirements-gpu.lock" and versions["installed_differ"] == [], versions
assert all(versions["installed"][name] == versions["lock"][name] for name in ("cudnn", "cuda", "nccl")), versions
EOF
ok "devices --json: cuda_build, pip CUDA and cuDNN, no driver, no GPU, diagnosis no_gpu_driver"
ok "devices --json: the CUDA wheels installed are the ones requirements-gpu.lock pins"

# --- 6. fit -------------------------------------------------------------------------------
phase fit
out="$(docker run --rm --init --network none -v "$TMP/data":/data -v "$TMP/runs":/runs -e EPOCHS=1 \
        -e STEPS_PER_EPOCH=20 -e LOG_EVERY=10 "$TEST_IMAGE" fit 2>&1)" || { echo "$out" | tail -n 30; die "fit failed"; }
echo "$out" | quiet | tail -n 3
steps="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["steps"])' "$TMP/runs/default/summary.json")"
[[ "$steps" == 20 ]] || die "fit ended at step $steps, expected 20"
[[ "$out" == *"training on CPU"* ]] || die "fit did not say it trains on the CPU"
ok "fit in the GPU image without a GPU: trains on the CPU, says so, 20 steps"

phase ""
say "timings:"
for p in "${PHASES[@]}"; do say "  $p"; done
say "image $TEST_IMAGE: $((size / 1000000)) MB on $BASE_IMAGE"
echo "$NAME: $checks_passed passed, 0 failed"
