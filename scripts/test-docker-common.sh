# shellcheck shell=bash disable=SC2153  # NAME and REPO are the caller's
# Sourced by scripts/test-docker.sh (CPU image) and scripts/test-docker-gpu.sh (GPU image): the parts
# both share. The caller sets REPO and NAME, sources this file, then calls:
#
#   start_engine            a Docker engine that answers; otherwise install docker.io (apt) and start
#                           dockerd ourselves (private socket and data root, no bridge, no iptables
#                           changes), remembering its PID; no engine possible here: a SKIPPED banner, exit 0
#   local_base              scripts/make-base-image.sh (debootstrap + `docker import`, cached), or BASE_IMAGE
#   build_image VARIANT IMAGE   docker/Dockerfile with TF_VARIANT=VARIANT on that base, for a non-root UID
#                           (the host user's, or 1234 when the host user is root), and check it runs as it
#   host_dirs               TMP with data/ and runs/ owned by that UID, as a user's would be
#
# On exit it removes the containers listed in CONTAINERS and TMP, and stops, by PID, the dockerd it started.
# The dockerd keeps its data root (TEST_DOCKER_DATA_ROOT, default /var/lib/docker-test) between runs: the
# base image and the dependency layers come from its cache the next time.
LOCAL_BASE="${LOCAL_BASE:-tf-train-base:bookworm}"   # scripts/make-base-image.sh makes it when BASE_IMAGE is not given
export DOCKER_BUILDKIT=0   # the classic builder: local base images, --network host, no buildx needed
cd "$REPO" || exit 1

# The settings the container reads (train/settings/table.py's table, upper-cased) and docker.mk's variables:
# none of the caller's may leak into the test's runs.
for name in $(sed -n '/^class Settings/,/^[^ ]/s/^    \([a-z][a-z0-9_]*\): [^=]* = setting.*/\1/p' train/settings/table.py | tr '[:lower:]' '[:upper:]') \
    IMAGE TF_VARIANT DATA_DIR RUNS_DIR RUN_NAME DOCKER_NAME DOCKER_RUN_FLAGS SETTINGS; do
    unset "$name"
done

say() { printf '[%s] %s\n' "$NAME" "$*"; }
die() { printf '[%s] FAILED: %s\n' "$NAME" "$*" >&2; exit 1; }

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
###  make $NAME did NOT build or run the image on this machine.
###
######################################################################

EOF
    exit 0
}

engine_answers() { timeout 20 docker info >/dev/null 2>&1; }

start_engine() {
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
}

local_base() {
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
}

build_image() {   # build_image VARIANT IMAGE: sets TEST_UID, TEST_GID and size
    local variant="$1" image="$2" build_log user in_id
    TEST_IMAGE="$image"
    phase build
    if [[ "$(id -u)" == 0 ]]; then TEST_UID=1234 TEST_GID=1234; else TEST_UID="$(id -u)" TEST_GID="$(id -g)"; fi
    say "docker build TF_VARIANT=$variant UID=$TEST_UID GID=$TEST_GID on $BASE_IMAGE -> $TEST_IMAGE"
    build_log="$(mktemp /tmp/test-docker-build.XXXXXX.log)"
    if ! docker build --network host -f docker/Dockerfile -t "$TEST_IMAGE" \
            --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg TF_VARIANT="$variant" \
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
}

host_dirs() {
    # Host directories, owned by the "host user" (TEST_UID) as theirs would be.
    TMP="$(mktemp -d /tmp/test-docker.XXXXXX)"
    chmod 755 "$TMP"
    mkdir -p "$TMP/data" "$TMP/runs" "$TMP/cwd"
    chown "$TEST_UID:$TEST_GID" "$TMP/data" "$TMP/runs"
}
