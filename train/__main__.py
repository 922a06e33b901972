import os
import sys

from train.cli import app

try:
    app(prog_name="python -m train")
except SystemExit as done:
    if "tensorflow" not in sys.modules or "TF_CONFIG" in os.environ or not isinstance(done.code, int | None):
        raise
    # Every file is written and closed by now. TensorFlow's interpreter teardown takes ~0.7 s (measured by
    # `python -m train bench`): end the process at once with the command's exit code. (Not for multi-worker,
    # where the teardown also leaves the cluster in order.)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(done.code or 0)
