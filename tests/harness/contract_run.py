"""Running the fork contract (tests/harness/contract.py) in a process of its own, as tests/test_project.py does,
and its failure as pytest shows it: the engine's one line first. No TensorFlow here."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.conftest import REPO, run_python
from train.settings import FIELDS


def run_contract(output_dir: Path, **settings: str) -> subprocess.CompletedProcess:
    """`python -m tests.harness.contract OUTPUT_DIR` with none of the user's settings, and these."""
    env = {name: value for name, value in os.environ.items() if name not in {f.env for f in FIELDS}}
    env["PYTHONPATH"] = str(REPO)
    env.update(settings)
    # in the repository, as a fork's `make test` runs it (project/defaults.env may name MODEL by a relative path);
    # the harness turns the .env layer off itself
    return run_python(["-m", "tests.harness.contract", str(output_dir)], cwd=REPO, env=env, without_dotenv=True)


def outcome(result: subprocess.CompletedProcess) -> dict:
    return json.loads(result.stdout.strip().splitlines()[-1])


def failure(result: subprocess.CompletedProcess) -> str:
    """What went wrong, the engine's one line ("error: ...") on top, then the end of stderr: not a TensorFlow log
    line, which its start-up prints first."""
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    return "\n".join([*errors[:1], result.stderr[-3000:]])
