#!/usr/bin/env bash
# Make a minimal Debian + Python base image locally, without any image registry.
#
# What it does:
#   1. debootstrap --variant=minbase a Debian (bookworm by default) from the same
#      Debian mirror the host's apt uses (read from /etc/apt/sources.list*),
#      with python3, python3-venv (so `python3 -m venv` and pip work),
#      python-is-python3 (so `python` works) and ca-certificates.
#   2. Copies the host's CA certificates into it (/usr/local/share/ca-certificates
#      and /etc/ssl/certs/ca-certificates.crt), so pip works inside a build on a
#      machine behind a TLS-intercepting proxy, and writes /etc/pip.conf pointing
#      pip at that bundle (a pip upgraded from PyPI would otherwise use certifi's).
#   3. Strips apt lists, .deb caches, docs, man pages and locales.
#   4. `tar -C rootfs -c . | docker import - IMAGE`.
# The result is cached: if IMAGE already exists the script does nothing
# (FORCE=1 rebuilds). Needs root (debootstrap, chroot) and a running docker engine.
#
# Usage: scripts/make-base-image.sh [IMAGE]     (default: tf-train-base:bookworm)
# Env:   SUITE=bookworm  DEBIAN_MIRROR=<url>  FORCE=1
# Then:  docker build --build-arg BASE_IMAGE=IMAGE ... -f docker/Dockerfile .
set -euo pipefail

IMAGE="${1:-${BASE_IMAGE_NAME:-tf-train-base:bookworm}}"
SUITE="${SUITE:-bookworm}"
DOCKER="${DOCKER:-docker}"

log() { printf '[make-base-image] %s\n' "$*" >&2; }

if [[ "${FORCE:-0}" != 1 ]] && "$DOCKER" image inspect "$IMAGE" >/dev/null 2>&1; then
    log "image $IMAGE already exists, skipping (FORCE=1 to rebuild)"
    exit 0
fi

if [[ "$(id -u)" != 0 ]]; then
    log "needs root (debootstrap and chroot); run with sudo"
    exit 1
fi
command -v debootstrap >/dev/null || { log "debootstrap missing: apt-get install -y debootstrap"; exit 1; }

# The Debian mirror the host apt uses: first non-security URI from the
# one-line (.list) or deb822 (.sources) files.
find_mirror() {
    local f uri
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [[ -r "$f" ]] || continue
        while read -r uri; do
            case "$uri" in
                *security*) ;;
                http://*/debian|http://*/debian/|https://*/debian|https://*/debian/) echo "${uri%/}"; return 0 ;;
            esac
        done < <(sed -n -e 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]\+\).*/\2/p' \
                        -e 's/^URIs:[[:space:]]*//p' "$f" | tr ' ' '\n')
    done
    echo "http://deb.debian.org/debian"
}
MIRROR="${DEBIAN_MIRROR:-$(find_mirror)}"

work="$(mktemp -d /tmp/make-base-image.XXXXXX)"
cleanup() {
    # Unmount anything left mounted inside the rootfs before deleting it.
    for m in proc sys dev/pts dev; do
        mountpoint -q "$work/rootfs/$m" 2>/dev/null && umount -l "$work/rootfs/$m" || true
    done
    rm -rf --one-file-system "$work"
}
trap cleanup EXIT

start=$SECONDS
log "debootstrap $SUITE from $MIRROR into $work/rootfs"
debootstrap --variant=minbase --components=main \
    --include=python3,python3-venv,python-is-python3,ca-certificates \
    "$SUITE" "$work/rootfs" "$MIRROR" > "$work/debootstrap.log" 2>&1 || {
        tail -n 30 "$work/debootstrap.log" >&2; log "debootstrap failed"; exit 1; }
log "debootstrap done in $((SECONDS - start))s"

rootfs="$work/rootfs"

# Same apt sources as the host mirror, so `apt-get` inside derived images works.
cat > "$rootfs/etc/apt/sources.list" <<EOF
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
EOF

# Host CA certificates (TLS-intercepting proxies).
if compgen -G "/usr/local/share/ca-certificates/*" >/dev/null; then
    cp -a /usr/local/share/ca-certificates/. "$rootfs/usr/local/share/ca-certificates/"
    chroot "$rootfs" update-ca-certificates >/dev/null 2>&1 || log "warning: update-ca-certificates failed in chroot"
fi
if [[ -s /etc/ssl/certs/ca-certificates.crt ]]; then
    # The bundle the host's pip trusts; a superset of what update-ca-certificates made.
    cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
fi
cat > "$rootfs/etc/pip.conf" <<'EOF'
[global]
cert = /etc/ssl/certs/ca-certificates.crt
EOF

# Slim down.
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin \
       "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/cache/debconf/*-old \
       "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
       "$rootfs"/var/log/*.log "$rootfs"/var/log/apt/* "$rootfs"/tmp/*
find "$rootfs/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name 'locale.alias' -exec rm -rf {} + 2>/dev/null || true
find "$rootfs/usr/lib/python3" "$rootfs/usr/lib/python3.11" -name '__pycache__' -type d -prune -exec rm -rf {} + 2>/dev/null || true

log "importing as $IMAGE"
tar --numeric-owner -C "$rootfs" -c . | "$DOCKER" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    --message "debootstrap --variant=minbase $SUITE + python3 + host CA certificates" \
    - "$IMAGE" >/dev/null
log "done: $IMAGE ($("$DOCKER" image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}')) in $((SECONDS - start))s"
