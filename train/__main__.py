import os
import sys

# TensorFlow's C++ INFO lines (XLA service, "Compiled cluster using XLA!", ...) off unless asked for: warnings
# and errors still show. The few it prints before it reads this setting remain (absl logging, TF 2.21).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

from train.cli import app

try:
    app(prog_name="python -m train")
except SystemExit as done:
    if "tensorflow" not in sys.modules or not isinstance(done.code, int | None):
        raise
    if "TF_CONFIG" in os.environ and done.code != 1:
        raise
    # Every file is written and closed by now. TensorFlow's interpreter teardown takes a while (see
    # docs/performance.md, Start-up): end the process at once with the command's exit code. Not for multi-worker,
    # where the teardown also leaves the cluster in order, unless training could not go on (exit 1): a peer that
    # died is never there to leave with, and the teardown waited for it (over 40 s in CI) after the error was said.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(done.code or 0)
