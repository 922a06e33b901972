#!/usr/bin/env bash
# Pre-fetch a TFDS dataset into a data directory, for machines that cannot download at run time.
#
# Run it where there is network, then copy (or mount) DATA_DIR on the offline machine and
# train with TFDS_DATA_DIR pointing at it (in the container: mount it on /data).
#
#   scripts/prepare-dataset.sh mnist ~/tensorflow_datasets          # with the project's venv
#   scripts/prepare-dataset.sh --docker mnist ./data                  # inside the image (IMAGE=...)
#   make docker-train DATASET=mnist DATA_DIR=./data                   # then, offline
#
# Both run TFDS's download-and-prepare for NAME (optionally NAME/config:version) into
# DATA_DIR: it downloads into DATA_DIR/downloads and writes the prepared records to
# DATA_DIR/NAME/config/version, which is what training reads. It calls the TFDS Python API
# rather than the `tfds build` command, because in tensorflow-datasets 4.9.10 that command
# cannot even start without apache-beam installed. Datasets that need apache-beam or manual
# downloads still need those (see the dataset's TFDS page).
#
#   --docker        run inside the training image ($IMAGE, default tf-train:gpu; build it with
#                   make docker-build) with DATA_DIR mounted on /data, as DATA_DIR's owner.
#   DATA_DIR        default: $TFDS_DATA_DIR, else ~/tensorflow_datasets.
#   PYTHON          the interpreter for the venv mode (default: .venv/bin/python, else python3).
#   DELETE_DOWNLOADS=1   remove DATA_DIR/downloads afterwards (the prepared data is enough to train).
#
# Not tested end to end where it was written (no network for TFDS downloads there); the
# same code path is exercised with the project's own generated dataset (synthetic_clusters).
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//'; exit 2; }

use_docker=0
if [[ "${1:-}" == "--docker" ]]; then use_docker=1; shift; fi
[[ $# -ge 1 && $# -le 2 && "$1" != -* ]] || usage
name="$1"
data_dir="${2:-${TFDS_DATA_DIR:-$HOME/tensorflow_datasets}}"
if ! [[ "$name" =~ ^[a-z][a-z0-9_]*(/[A-Za-z0-9_.-]+)?(:[0-9]+\.[0-9]+\.[0-9]+)?$ ]]; then
    echo "error: '$name' is not a TFDS dataset name (like mnist, or name/config:1.0.0)" >&2
    exit 2
fi

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$data_dir"
data_dir="$(cd "$data_dir" && pwd)"

# The same program for both modes: argv = NAME DATA_DIR.
read -r -d '' PREPARE <<'PY' || true
import sys

import tensorflow_datasets as tfds

try:
    import train.synthetic_clusters  # noqa: F401  (registers the project's own dataset)
except ImportError:
    pass

name, data_dir = sys.argv[1], sys.argv[2]
builder = tfds.builder(name, data_dir=data_dir)
builder.download_and_prepare()
splits = ", ".join(f"{split}: {info.num_examples}" for split, info in builder.info.splits.items())
print(f"prepared {builder.info.full_name} in {builder.data_dir} ({splits})")
PY

echo "preparing $name into $data_dir"
if [[ "$use_docker" == 1 ]]; then
    image="${IMAGE:-tf-train:gpu}"
    docker image inspect "$image" >/dev/null 2>&1 || {
        echo "error: image $image not found: make docker-build (or set IMAGE)" >&2; exit 1; }
    # As the owner of DATA_DIR, so the prepared files are theirs whatever UID the image has.
    docker run --rm -i --user "$(stat -c %u:%g "$data_dir")" --entrypoint python -v "$data_dir":/data \
        "$image" - "$name" /data <<<"$PREPARE"
else
    python="${PYTHON:-}"
    if [[ -z "$python" ]]; then
        if [[ -x "$REPO/.venv/bin/python" ]]; then python="$REPO/.venv/bin/python"; else python=python3; fi
    fi
    PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" "$python" - "$name" "$data_dir" <<<"$PREPARE"
fi

if [[ "${DELETE_DOWNLOADS:-0}" == 1 && -d "$data_dir/downloads" ]]; then
    rm -rf "$data_dir/downloads"
    echo "removed $data_dir/downloads"
fi
echo "done: train offline with TFDS_DATA_DIR=$data_dir DATASET=$name (or DATA_DIR=$data_dir for make docker-train)"
