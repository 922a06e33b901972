"""The fuzz test's driver (tests/test_fuzz.py): every case's commands in this one process, as a user without root's
power over files (tests/harness/caps.py).

    python -m tests.harness.fuzz CASES.json RESULTS.json

A case is a folder holding a damaged run directory or model file, the settings to run with, and the newest
checkpoint the damage left intact (and, optionally, files to write just before it runs: "write"). Its commands
run through typer's CliRunner, in this process: what is refused before TensorFlow loads costs a millisecond, and
what gets further shares the TensorFlow the fork server imported.
After them, that checkpoint (or a newer one) must still load. Writes one JSON object: each case's runs (exit code,
streams, an exception that escaped, whether TensorFlow was reached, seconds) and the checkpoint that loaded.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from tests.harness.caps import drop_file_override


def restore_modes(folder: Path) -> None:
    """Read and write access back on everything under `folder`, so that what a case left can be looked at (root keeps
    CAP_FOWNER: it may chmod another user's file)."""
    with contextlib.suppress(OSError):
        os.chmod(folder, 0o755, follow_symlinks=False)
    if folder.is_symlink() or not folder.is_dir():
        return
    for entry in folder.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            restore_modes(entry)
        elif not entry.is_symlink():
            with contextlib.suppress(OSError):
                os.chmod(entry, 0o644)


def newest_loadable(checkpoints: Path, at_least: int) -> int | None:
    """The newest checkpoint numbered `at_least` or more whose every tensor reads back, or None."""
    import tensorflow as tf

    found = (re.fullmatch(r"ckpt-(\d+)\.index", path.name) for path in checkpoints.glob("ckpt-*.index"))
    for number in sorted((int(match.group(1)) for match in found if match), reverse=True):
        if number < at_least:
            break
        try:
            reader = tf.train.load_checkpoint(str(checkpoints / f"ckpt-{number}"))
            for name in reader.get_variable_to_shape_map():
                reader.get_tensor(name)
        except Exception:  # any failure to read it means: not this one
            continue
        return number
    return None


def import_datasets(path: str) -> None:
    """A case's own TFDS builders (its `datasets` file), registered as the engine registers a fork's
    project/datasets: by importing the module before any command opens DATASET."""
    spec = importlib.util.spec_from_file_location(f"fuzz_datasets_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def run_case(runner: CliRunner, app: Any, case: dict[str, Any], reached: list[bool]) -> dict[str, Any]:
    os.chdir(case["dir"])
    for path, text in case.get("write", {}).items():  # a file (re)written just before the case: the same path again
        Path(path).write_text(text)
    if case.get("datasets"):
        import_datasets(case["datasets"])
    runs = []
    for args in case["commands"]:
        reached.clear()
        started = time.monotonic()
        result = runner.invoke(app, args, env=case["env"])
        escaped = result.exception if not isinstance(result.exception, SystemExit) else None
        runs.append({
            "args": args, "exit": result.exit_code, "stdout": result.stdout, "stderr": result.stderr,
            "exception": None if escaped is None else f"{type(escaped).__name__}: {escaped}",
            "tensorflow": bool(reached), "seconds": round(time.monotonic() - started, 3),
        })  # fmt: skip
    started = time.monotonic()
    restore_modes(Path(case["dir"]))
    at_least = case["intact"]
    loaded = None if at_least is None else newest_loadable(Path(case["dir"]) / "run" / "checkpoints", at_least)
    return {"runs": runs, "loaded": loaded, "check_seconds": round(time.monotonic() - started, 3)}


def main(cases_path: str, results_path: str) -> None:
    drop_file_override()
    from train import cli

    reached: list[bool] = []
    load_tensorflow = cli._load_tensorflow

    def counted() -> None:
        reached.append(True)
        load_tensorflow()

    cli._load_tensorflow = counted
    runner = CliRunner()
    cases = json.loads(Path(cases_path).read_text())
    results = {case["name"]: run_case(runner, cli.app, case, reached) for case in cases}
    Path(results_path).write_text(json.dumps(results))


if __name__ == "__main__":
    main(*sys.argv[1:3])
