#!/usr/bin/env bash
# make test-docker: build the CPU image and run it as a user would, with no image registry.
#
#   1. engine   use a Docker engine that answers; otherwise install docker.io (apt) and start
#               dockerd ourselves (private socket and data root, no bridge, no iptables
#               changes), remembering its PID. If no engine can run here at all, print a loud
#               SKIPPED banner and exit 0.
#   2. base     scripts/make-base-image.sh: debootstrap a small Debian + Python + the host's
#               CA certificates and `docker import` it (cached; skipped when BASE_IMAGE is given).
#   3. build    docker/Dockerfile, TF_VARIANT=cpu, on that base, for a non-root UID: the host
#               user's, or 1234 when the host user is root.
#   (1-3 are scripts/test-docker-common.sh, shared with scripts/test-docker-gpu.sh.)
#   4. devices  `make docker-devices` (docker/docker.mk) with GPUS=none, `devices --json`, and
#               `make docker-check` when the CLI has `check`.
#   5. fit      a short `make docker-train` with host directories on /data and /runs: exit 0,
#               checkpoints and summary.json on the host, every file owned by that UID.
#   6. stop     a longer fit, `docker stop` once it has checkpointed mid-run: exit 42, summary.json
#               says interrupted.
#   7. resume   `make docker-train` again on the same directories: exit 0, resumed_from_step > 0,
#               and the run ends at the step count of an uninterrupted run; `make docker-evaluate`.
# Containers run with --network none; only the build (pip, inside it) reaches a package
# registry, through the host network. On exit it removes its containers and temporary
# directories and stops, by PID, the dockerd it started. Each phase's time is printed.
#
# Env: BASE_IMAGE (skip debootstrap, use this base), TEST_IMAGE, KEEP_TMP=1,
#      LONG_STEPS / LONG_CHECKPOINT_EVERY (the stopped run), TEST_DOCKER_DATA_ROOT.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NAME=test-docker
LONG_STEPS="${LONG_STEPS:-3000}"
LONG_CHECKPOINT_EVERY="${LONG_CHECKPOINT_EVERY:-50}"
# shellcheck source=scripts/test-docker-common.sh
source "$REPO/scripts/test-docker-common.sh"

start_engine
local_base
build_image cpu "${TEST_IMAGE:-tf-train:test-cpu}"
host_dirs

# `make` as a user types it (no .env: the developer's own must not change the test).
mk() { make --no-print-directory -C "$TMP/cwd" -f "$REPO/docker/docker.mk" IMAGE="$TEST_IMAGE" TF_VARIANT=cpu \
          GPUS=none DATA_DIR="$TMP/data" RUNS_DIR="$TMP/runs" DOCKER_ENV_FILE= DOCKER_RUN_FLAGS="--network none" "$@"; }

# --- 4. devices -------------------------------------------------------------------------
phase devices
out="$(mk docker-devices 2>&1)" || { echo "$out"; die "make docker-devices failed"; }
echo "$out" | grep -vE '^[IWE][0-9]{4} |^WARNING: All log messages|^To enable the following|^docker run' | tail -n 20
echo "$out" | grep -q 'CPU' || die "docker-devices output names no CPU device"
ok "make docker-devices"
json="$(docker run --rm --network none -e GPUS=none "$TEST_IMAGE" devices --json 2>/dev/null)" \
    || die "devices --json failed"
python3 -c 'import json,sys; d=json.loads(sys.argv[1]); assert isinstance(d, dict) and d, d' "$json" \
    || die "devices --json did not print a JSON object: $json"
ok "devices --json prints JSON"
if docker run --rm --network none "$TEST_IMAGE" check --help >/dev/null 2>&1; then
    out="$(mk docker-check 2>&1)" || { echo "$out" | tail -n 30; die "make docker-check failed"; }
    echo "$out" | grep -vE '^[IWE][0-9]{4} |^WARNING: All log messages|^To enable the following|^docker run' | tail -n 8
    ok "make docker-check"
else
    say "the image's CLI has no 'check' command yet; docker-check not run"
fi

summary() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d.get(sys.argv[2]))' "$1" "$2"; }
owned_by_test_uid() {   # every file the container wrote on the host belongs to TEST_UID
    local bad
    bad="$(find "$@" \( ! -uid "$TEST_UID" -o ! -gid "$TEST_GID" \) -printf '%u:%g %p\n' | head -n 5)"
    [[ -z "$bad" ]] || die "files on the host not owned by $TEST_UID:$TEST_GID: $bad"
}

# --- 5. short fit -----------------------------------------------------------------------
phase fit
CONTAINERS+=("test-docker-short-$$" "test-docker-resume-$$")
out="$(mk docker-train RUN_NAME=short DOCKER_NAME="test-docker-short-$$" EPOCHS=1 STEPS_PER_EPOCH=20 CHECKPOINT_EVERY=5 LOG_EVERY=5 2>&1)" \
    || { echo "$out" | tail -n 30; die "the short fit failed"; }
echo "$out" | grep -vE '^[IWE][0-9]{4} |^WARNING: All log messages|^To enable the following' | tail -n 8
run="$TMP/runs/short"
[[ -f "$run/summary.json" ]] || die "no summary.json on the host in $run"
ls "$run"/checkpoints/*.index >/dev/null 2>&1 || die "no checkpoint on the host in $run/checkpoints"
[[ "$(summary "$run/summary.json" steps)" == 20 ]] || die "short fit: steps=$(summary "$run/summary.json" steps), expected 20"
owned_by_test_uid "$TMP/runs" "$TMP/data"
ok "short fit: checkpoints and summary.json on the host, owned by $TEST_UID:$TEST_GID ($(find "$TMP/runs" "$TMP/data" | wc -l) files)"

# --- 6. stop a longer fit ---------------------------------------------------------------
phase stop
run="$TMP/runs/long"
name="test-docker-long-$$"
CONTAINERS+=("$name")
long_env=(-e GPUS=none -e EPOCHS=1 -e STEPS_PER_EPOCH="$LONG_STEPS" -e CHECKPOINT_EVERY="$LONG_CHECKPOINT_EVERY"
          -e LOG_EVERY="$LONG_CHECKPOINT_EVERY" -e OUTPUT_DIR=/runs/long)
docker run --name "$name" --init --network none --stop-timeout 120 \
    -v "$TMP/data":/data -v "$TMP/runs":/runs "${long_env[@]}" "$TEST_IMAGE" fit > "$TMP/long.log" 2>&1 &
run_pid=$!
# Stop it once training is under way: two checkpoints on the host (the run may save one at
# step 0, before any training).
checkpoints() { find "$run/checkpoints" -name '*.index' 2>/dev/null | wc -l; }
for _ in $(seq 1 600); do
    (( $(checkpoints) >= 2 )) && break
    kill -0 "$run_pid" 2>/dev/null || break
    sleep 0.2
done
(( $(checkpoints) >= 2 )) || { tail -n 20 "$TMP/long.log"; die "no second checkpoint within 120s"; }
t0=$SECONDS
docker stop "$name" >/dev/null
rc=0; wait "$run_pid" || rc=$?
say "docker stop took $((SECONDS - t0))s; fit exited $rc"
grep -vE '^[IWE][0-9]{4} |^WARNING: All log messages|^To enable the following' "$TMP/long.log" | tail -n 6
[[ "$rc" == 42 ]] || die "a stopped fit should exit 42, got $rc (if 0, the run finished before the stop: raise LONG_STEPS)"
[[ "$(summary "$run/summary.json" interrupted)" == True ]] || die "summary.json does not say interrupted"
stopped_at="$(summary "$run/summary.json" steps)"
(( stopped_at > 0 && stopped_at < LONG_STEPS )) || die "stopped at step $stopped_at, expected between 0 and $LONG_STEPS"
docker rm "$name" >/dev/null
ok "docker stop: exit 42, summary.json interrupted at step $stopped_at of $LONG_STEPS"

# --- 7. resume --------------------------------------------------------------------------
phase resume
out="$(mk docker-train RUN_NAME=long DOCKER_NAME="test-docker-resume-$$" EPOCHS=1 STEPS_PER_EPOCH="$LONG_STEPS" CHECKPOINT_EVERY="$LONG_CHECKPOINT_EVERY" \
        LOG_EVERY="$LONG_CHECKPOINT_EVERY" 2>&1)" || { echo "$out" | tail -n 30; die "the resumed fit failed"; }
echo "$out" | grep -vE '^[IWE][0-9]{4} |^WARNING: All log messages|^To enable the following' | tail -n 5
resumed="$(summary "$run/summary.json" resumed_from_step)"
steps="$(summary "$run/summary.json" steps)"
if ! [[ "$resumed" =~ ^[0-9]+$ ]] || (( resumed == 0 )); then die "resumed_from_step=$resumed, expected > 0"; fi
(( resumed <= stopped_at )) || die "resumed from step $resumed, after the stop at $stopped_at"
[[ "$steps" == "$LONG_STEPS" ]] || die "resumed run ended at step $steps, an uninterrupted one ends at $LONG_STEPS"
[[ "$(summary "$run/summary.json" interrupted)" == False ]] || die "summary.json still says interrupted"
owned_by_test_uid "$TMP/runs" "$TMP/data"
ok "restart resumed from step $resumed and ended at step $steps"
out="$(mk -s docker-evaluate RUN_NAME=long 2>/dev/null)" || die "make docker-evaluate failed"
python3 -c 'import json,sys; t=sys.argv[1]; d=json.loads(t[t.index("{"):]); assert "loss" in str(d), d' "$out" \
    || die "docker-evaluate printed no loss: $out"
ok "make docker-evaluate scores the resumed run"

phase ""
say "timings:"
for p in "${PHASES[@]}"; do say "  $p"; done
say "image $TEST_IMAGE: $((size / 1000000)) MB on $BASE_IMAGE"
echo "test-docker: $checks_passed passed, 0 failed"
