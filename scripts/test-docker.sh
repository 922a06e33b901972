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
cd "$REPO"

TEST_IMAGE="${TEST_IMAGE:-tf-train:test-cpu}"
LOCAL_BASE="${LOCAL_BASE:-tf-train-base:bookworm}"
LONG_STEPS="${LONG_STEPS:-3000}"
LONG_CHECKPOINT_EVERY="${LONG_CHECKPOINT_EVERY:-50}"
export DOCKER_BUILDKIT=0   # the classic builder: local base images, --network host, no buildx needed

# The settings the container reads (train/settings.py's table) and docker.mk's variables:
# none of the caller's may leak into the test's runs.
for name in $(sed -n 's/^ *Field."\([A-Z0-9_]*\)".*/\1/p' train/settings.py) \
    IMAGE TF_VARIANT DATA_DIR RUNS_DIR RUN_NAME DOCKER_NAME DOCKER_RUN_FLAGS SETTINGS; do
    unset "$name"
done

say() { printf '[test-docker] %s\n' "$*"; }
die() { printf '[test-docker] FAILED: %s\n' "$*" >&2; exit 1; }

# --- phase timing ----------------------------------------------------------------------
declare -a PHASES=()
phase_name="" phase_start=0
phase() {   # phase NAME: end the current phase (if any), start NAME
    local now=$SECONDS
    if [[ -n "$phase_name" ]]; then
        PHASES+=("$(printf '%-9s %4ds' "$phase_name" $((now - phase_start)))")
        say "phase $phase_name done in $((now - phase_start))s"
    fi
    phase_name="$1" phase_start=$now
    [[ -n "$phase_name" ]] && say "=== phase $phase_name ==="
    return 0
}
checks_passed=0
ok() { checks_passed=$((checks_passed + 1)); say "ok: $*"; }

# --- cleanup: only what this script started ----------------------------------------------
DOCKERD_PID=""
state=/run/test-docker
CONTAINERS=()
TMP=""
cleanup() {
    local rc=$?
    set +e
    for c in "${CONTAINERS[@]}"; do
        docker rm -f "$c" >/dev/null 2>&1
    done
    if [[ -n "$TMP" && "${KEEP_TMP:-0}" != 1 ]]; then
        rm -rf --one-file-system "$TMP"
    fi
    if [[ -n "$DOCKERD_PID" ]]; then
        say "stopping the dockerd this script started (pid $DOCKERD_PID)"
        kill -TERM "$DOCKERD_PID" 2>/dev/null
        for _ in $(seq 1 30); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 1; done
        if kill -0 "$DOCKERD_PID" 2>/dev/null; then
            say "dockerd $DOCKERD_PID did not stop in 30s; killing it"
            kill -KILL "$DOCKERD_PID" 2>/dev/null
        fi
        # dockerd leaves its bind mount of the host network namespace behind.
        for m in "$state"/exec/netns/*; do
            mountpoint -q "$m" 2>/dev/null && umount "$m"
        done
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

skip() {
    cat <<EOF

######################################################################
###
###  SKIPPED: docker engine could not start: $1
###
###  make test-docker did NOT build or run the image on this machine.
###
######################################################################

EOF
    exit 0
}

engine_answers() { timeout 20 docker info >/dev/null 2>&1; }

# --- 1. engine --------------------------------------------------------------------------------
phase engine
if ! command -v docker >/dev/null || ! engine_answers; then
    if [[ "$(id -u)" != 0 ]]; then
        command -v docker >/dev/null || skip "no docker client, and not root to install docker.io"
        skip "no engine answers at ${DOCKER_HOST:-the default socket}, and not root to start dockerd"
    fi
    if ! command -v dockerd >/dev/null || ! command -v docker >/dev/null || ! command -v debootstrap >/dev/null; then
        say "installing docker.io and debootstrap (apt-get)"
        { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            docker.io debootstrap; } > /tmp/test-docker-apt.log 2>&1 \
            || { tail -n 20 /tmp/test-docker-apt.log; skip "apt-get install docker.io failed (log above)"; }
    fi
    mkdir -p "$state"
    data_root="${TEST_DOCKER_DATA_ROOT:-/var/lib/docker-test}"
    export DOCKER_HOST="unix://$state/docker.sock"
    say "starting dockerd (socket $state/docker.sock, data root $data_root, no bridge, no iptables)"
    # --bridge=none/--iptables=false: nothing changes on the host network; builds use the host
    # network, containers run with --network none.
    dockerd --host "$DOCKER_HOST" --data-root "$data_root" --exec-root "$state/exec" \
        --pidfile "$state/dockerd.pid" --bridge=none --iptables=false --ip6tables=false --ip-masq=false \
        > "$state/dockerd.log" 2>&1 &
    DOCKERD_PID=$!
    for _ in $(seq 1 60); do
        engine_answers && break
        kill -0 "$DOCKERD_PID" 2>/dev/null || break
        sleep 1
    done
    if ! engine_answers; then
        reason="$(grep -E 'level=(fatal|error)' "$state/dockerd.log" | tail -n 1 | sed 's/.*msg="\([^"]*\)".*/\1/')"
        tail -n 15 "$state/dockerd.log"
        skip "${reason:-dockerd did not answer within 60s} (log: $state/dockerd.log)"
    fi
    say "dockerd is up (pid $DOCKERD_PID)"
else
    say "using the engine that already answers (${DOCKER_HOST:-default socket})"
fi
docker version --format 'client {{.Client.Version}}, engine {{.Server.Version}}'

# --- 2. base image ----------------------------------------------------------------------
phase base
if [[ -n "${BASE_IMAGE:-}" ]]; then
    say "using BASE_IMAGE=$BASE_IMAGE"
    docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 || die "BASE_IMAGE $BASE_IMAGE is not in the engine (no registry here)"
else
    BASE_IMAGE="$LOCAL_BASE"
    if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1 && ! command -v debootstrap >/dev/null \
            && [[ "$(id -u)" == 0 ]]; then
        say "installing debootstrap (apt-get)"
        { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap; } \
            > /tmp/test-docker-apt.log 2>&1 || { tail -n 20 /tmp/test-docker-apt.log; die "apt-get install debootstrap failed"; }
    fi
    bash scripts/make-base-image.sh "$BASE_IMAGE" \
        || die "no base image: run as root (debootstrap), or give a local one: BASE_IMAGE=python:3.11-slim make test-docker"
fi
if ! out="$(docker run --rm --network none "$BASE_IMAGE" python3 -c 'print("hello")' 2>&1)"; then
    echo "$out"
    if [[ -n "$DOCKERD_PID" ]]; then skip "the engine started but cannot run a container: ${out##*$'\n'}"; fi
    die "cannot run a container from $BASE_IMAGE"
fi
ok "the engine runs containers ($BASE_IMAGE)"   # before minutes of build: cgroups, overlayfs, ... work

# --- 3. build ---------------------------------------------------------------------------
phase build
if [[ "$(id -u)" == 0 ]]; then TEST_UID=1234 TEST_GID=1234; else TEST_UID="$(id -u)" TEST_GID="$(id -g)"; fi
say "docker build TF_VARIANT=cpu UID=$TEST_UID GID=$TEST_GID on $BASE_IMAGE -> $TEST_IMAGE"
build_log="$(mktemp /tmp/test-docker-build.XXXXXX.log)"
if ! docker build --network host -f docker/Dockerfile -t "$TEST_IMAGE" \
        --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg TF_VARIANT=cpu \
        --build-arg UID="$TEST_UID" --build-arg GID="$TEST_GID" . > "$build_log" 2>&1; then
    tail -n 40 "$build_log"
    die "docker build failed (full log: $build_log)"
fi
grep -E '^(Step|Successfully)' "$build_log" | tail -n 4
rm -f "$build_log"
[[ -n "$DOCKERD_PID" ]] && docker image prune -f >/dev/null   # old builds' layers, in our own data root
size="$(docker image inspect -f '{{.Size}}' "$TEST_IMAGE")"
say "image $TEST_IMAGE: $((size / 1000000)) MB"
user="$(docker image inspect -f '{{.Config.User}}' "$TEST_IMAGE")"
[[ "$user" == "$TEST_UID:$TEST_GID" ]] || die "image USER is '$user', expected $TEST_UID:$TEST_GID"
in_id="$(docker run --rm --network none --entrypoint id "$TEST_IMAGE" -u)"
[[ "$in_id" == "$TEST_UID" ]] || die "container runs as uid $in_id, expected $TEST_UID"
ok "image built; the container runs as uid $TEST_UID, not root"

# Host directories, owned by the "host user" (TEST_UID) as theirs would be.
TMP="$(mktemp -d /tmp/test-docker.XXXXXX)"
chmod 755 "$TMP"
mkdir -p "$TMP/data" "$TMP/runs" "$TMP/cwd"
chown "$TEST_UID:$TEST_GID" "$TMP/data" "$TMP/runs"

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
