#!/usr/bin/env bash
# Run N workers of a multi-worker (MultiWorkerMirroredStrategy) job on this host, on loopback ports.
#
#   scripts/launch-workers.sh 2                    # python -m train fit on 2 workers
#   scripts/launch-workers.sh 2 fit --epochs 3     # any command and flags; settings as usual (.env, env)
#   EPOCHS=3 scripts/launch-workers.sh 4
#
# Each worker is `python -m train ...` with STRATEGY=multi_worker and its own TF_CONFIG naming
# free 127.0.0.1 ports; worker 0 is the chief, which writes OUTPUT_DIR. Output lines are prefixed
# with [worker I]. Ctrl-C or SIGTERM reaches every worker: all save a checkpoint and exit 42;
# running the same command again resumes. Exit code: the first worker error's, else 42 if the
# workers stopped to be restarted, else 0. For several hosts, see "Several machines" in README.md.
#
# PYTHON: the interpreter (default: .venv/bin/python if present, else python3).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$REPO/.venv/bin/python" ]]; then PYTHON="$REPO/.venv/bin/python"; else PYTHON=python3; fi
fi
if [[ $# -lt 1 ]]; then
    echo "usage: scripts/launch-workers.sh N [COMMAND [ARGS...]]   e.g. scripts/launch-workers.sh 2 fit --epochs 3" >&2
    exit 2
fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
exec "$PYTHON" -m train.cluster.launch "$@"
