"""The fork server the tests start their TensorFlow processes from (tests/harness/forkserver.py): a forked run
must see what a fresh interpreter sees, or the tests that go through it would test something else."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, clean_env, run_python, start_python

SEEN = """
import json, os, sys, tempfile
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "setting": os.environ.get("EPOCHS"), "path": sys.path[:2],
                  "tmp": tempfile.gettempdir()}))
sys.exit(3)
"""


def test_a_forked_run_sees_what_a_fresh_interpreter_sees(tmp_path):
    (tmp_path / "tmp").mkdir()
    env = clean_env(EPOCHS=7, TMPDIR=tmp_path / "tmp")
    env["PYTHONPATH"] += ":" + str(tmp_path)
    forked, fresh = (run_python(["-c", SEEN, "a", "b"], cwd=tmp_path, env=env, fresh=f) for f in (False, True))
    assert (forked.returncode, fresh.returncode) == (3, 3), forked.stderr[-2000:]
    seen = json.loads(forked.stdout)
    assert seen == json.loads(fresh.stdout)
    assert (seen["argv"], seen["setting"], seen["tmp"]) == (["-c", "a", "b"], "7", str(tmp_path / "tmp"))
    module = run_python(["-m", "json.tool", "--help"], cwd=tmp_path)
    assert module.returncode == 0 and "json.tool" in module.stdout


def test_a_forked_run_is_signalled_and_killed_as_a_process_is(tmp_path):
    waiting = "import sys, time\nprint('up', flush=True)\ntime.sleep(60)"
    process = start_python(["-c", waiting], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "up" and process.poll() is None
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=10) == -signal.SIGTERM
    process.stdout.close()


def test_no_test_process_starts_where_a_developers_env_would_be_read():
    """A .env is read from the working directory: no process a test starts runs in the repository (where a
    developer keeps theirs); one started without a folder of its own runs in an empty one."""
    with pytest.raises(ValueError, match=r"would read a developer's \.env there"):
        start_python(["-c", "pass"], cwd=REPO)
    with pytest.raises(ValueError, match=r"would read a developer's \.env there"):
        start_python(["-c", "pass"], cwd=REPO / "tests" / "..")
    where = run_python(["-c", "import os; print(os.getcwd(), os.path.exists('.env'))"])
    folder, has_dotenv = where.stdout.split()[-2:]
    assert Path(folder).resolve() != REPO and has_dotenv == "False"
