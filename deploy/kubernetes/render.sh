#!/usr/bin/env bash
# Print a manifest of this directory for N workers, ready for `kubectl apply -f -`.
#
#   deploy/kubernetes/render.sh deploy/kubernetes/jobset.yaml 4 | kubectl apply -f -
#   GPUS_PER_WORKER=8 IMAGE=registry.example.com/tf-train:gpu deploy/kubernetes/render.sh deploy/kubernetes/multi-worker-job.yaml 4
#
# Sets the value on every line marked "# render: WORKERS" (completions, parallelism and the pods'
# WORKERS variable, which must agree), and, when given, "# render: GPUS_PER_WORKER" (nvidia.com/gpu)
# and "# render: IMAGE". Nothing else changes.
set -euo pipefail

die() { echo "error: $*" >&2; exit 2; }
[[ $# -eq 2 ]] || die "usage: deploy/kubernetes/render.sh MANIFEST WORKERS   e.g. deploy/kubernetes/render.sh deploy/kubernetes/jobset.yaml 4"
manifest="$1" workers="$2"
[[ -f "$manifest" ]] || die "MANIFEST=$manifest is not a file: use deploy/kubernetes/jobset.yaml or multi-worker-job.yaml"
grep -q '# render: WORKERS' "$manifest" || die "MANIFEST=$manifest has no line marked '# render: WORKERS'"
[[ "$workers" =~ ^[1-9][0-9]{0,3}$ ]] || die "WORKERS=$workers is not allowed: use a whole number from 1 to 9999"
gpus="${GPUS_PER_WORKER:-}"
[[ -z "$gpus" || "$gpus" =~ ^[0-9]{1,3}$ ]] || die "GPUS_PER_WORKER=$gpus is not allowed: use a whole number from 0"
image="${IMAGE:-}"
[[ -z "$image" || "$image" =~ ^[A-Za-z0-9][A-Za-z0-9._/:@-]*$ ]] || die "IMAGE=$image is not allowed: use an image reference like registry.example.com/tf-train:gpu"

# The value is what follows "key:" up to the marker comment: a number, "a quoted number", or an image.
edits=(-e "s/^( *[^ #][^:#]*: *\"?)[0-9]+(\"? *# render: WORKERS\b)/\1${workers}\2/")
[[ -z "$gpus" ]] || edits+=(-e "s/^( *[^ #][^:#]*: *)[0-9]+( *# render: GPUS_PER_WORKER\b)/\1${gpus}\2/")
[[ -z "$image" ]] || edits+=(-e "s|^( *image: *)[^ #]+( *# render: IMAGE\b)|\1${image}\2|")
sed -E "${edits[@]}" "$manifest"
