"""One-line errors: what `first_line` keeps of TensorFlow's many-line messages (plain strings, no TensorFlow); the
error paths a fault probe found, each one line with the right exit code and nothing rewritten; a failure nobody
foresaw, which is exit 1, its first line and its traceback kept in crash.log; and what the exit codes are."""

from __future__ import annotations

import errno
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from tests.conftest import REPO, clean_env, engine_defaults, run_python, run_train, start_python, wait_for
from tests.harness.caps import UNPRIVILEGED_TRAIN, can_drop_file_override
from train import cli as cli_module
from train.cli import app
from train.devices.runtime import StartupDeadline
from train.errors import (
    EXIT_BAD_INPUT,
    EXIT_BUSY,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PREEMPTED,
    SettingsError,
    first_line,
    storage_fix,
)
from train.model_file import model_fingerprint
from train.rundir import RUN, RunLock, owner, write_json
from train.settings import ENVIRONMENT_TYPO_CUTOFF, FIELDS, RUN_SETTINGS, likely_typos
from train.settings.tf_config import Cluster

GOOD_MODEL = """import keras


def build_model(input_shape, num_classes, learning_rate):
    model = keras.Sequential([keras.Input(input_shape), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(num_classes, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model
"""

GRAPH_ERROR = """Graph execution error:

Detected at node IteratorGetNext defined at (most recent call last):
  File "train/training.py", line 233, in training_call

{{function_node __inference_training_call_512}} corrupted record at 12
\t [[{{node IteratorGetNext}}]] [Op:__inference_training_call_512]"""

STATUS_ERRORS = """2 root error(s) found.
  (0) INVALID_ARGUMENT: indices[3] = 70000 is not in [0, 60000)
\t [[{{node GatherV2}}]]
  (1) INVALID_ARGUMENT: indices[3] = 70000 is not in [0, 60000)
0 successful operations."""


def test_tensorflow_wrapping_is_dropped_to_the_line_that_says_what_went_wrong():
    assert first_line(RuntimeError(GRAPH_ERROR)) == "corrupted record at 12"
    assert first_line(RuntimeError(STATUS_ERRORS)) == "indices[3] = 70000 is not in [0, 60000)"


def test_a_plain_message_keeps_its_first_line_and_an_empty_one_names_the_type():
    assert first_line(OSError("No space left on device\n\nmore")) == "No space left on device"
    assert first_line(OSError("File exists: runs/default.\nmore")) == "File exists: runs/default."  # no stack frame
    assert first_line(KeyError()) == "KeyError"


def test_a_long_line_is_cut_after_its_last_whole_sentence_and_says_so():
    message = "The dataset is not prepared. Its folder holds 3 files; TFDS wants 4. Run again with network."
    assert first_line(OSError(message), 60) == "The dataset is not prepared. Its folder holds 3 files; ..."
    assert first_line(OSError(message), 35) == "The dataset is not prepared. ..."
    assert first_line(OSError(message), len(message)) == message


def test_a_line_is_never_cut_inside_a_sentence():
    url = "HTTPSConnectionPool(host='storage.googleapis.com', port=443): Max retries exceeded with url"
    assert first_line(ConnectionError(url), 60) == url  # one sentence, longer than the limit: kept whole
    path = "Failed to open gs://bucket/" + "a" * 200
    assert first_line(OSError(path), 60) == path


def test_a_sentence_wrapped_over_lines_is_one_line():
    """Keras wraps its messages at 72 columns (operation.py's get_config): the first line alone ends mid-sentence."""
    message = """
Object GAN was created by passing
non-serializable argument values in `__init__()`,
and therefore the object must override `get_config()` in
order to be serializable. Please implement `get_config()`.

Example:
"""
    assert first_line(NotImplementedError(message)) == (
        "Object GAN was created by passing non-serializable argument values in `__init__()`, and therefore the "
        "object must override `get_config()` in order to be serializable. Please implement `get_config()`."
    )
    assert first_line(NotImplementedError(message), 80) == first_line(NotImplementedError(message))


# --- the error paths a fault probe found (issue 27): each one line, the right code, nothing rewritten -----------

REACHED_TENSORFLOW = 99  # what the patched _load_tensorflow exits with: the command got past every pre-TF check
runner = CliRunner()


@pytest.fixture
def cli(tmp_path, monkeypatch):
    """`python -m train ARGS` in this process, in tmp_path, with only the settings given; TensorFlow never loads: a
    command that gets that far exits REACHED_TENSORFLOW."""

    def load_tensorflow():
        raise typer.Exit(REACHED_TENSORFLOW)

    monkeypatch.setattr(cli_module, "_load_tensorflow", load_tensorflow)
    monkeypatch.chdir(tmp_path)  # no stray .env
    for name in [field.env for field in FIELDS] + list(likely_typos(os.environ, ENVIRONMENT_TYPO_CUTOFF)):
        monkeypatch.delenv(name, raising=False)

    def invoke(*args: str, **settings: object):
        return runner.invoke(app, list(args), env={**engine_defaults(), **{k: str(v) for k, v in settings.items()}})

    return invoke


def last_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.output, result.output
    return lines[-1] if lines else ""


def fake_run(output_dir: Path, model: str = "examples.mlp") -> Path:
    """A run directory as fit leaves it, without TensorFlow: its settings, run.json and a checkpoint's files."""
    (output_dir / "checkpoints").mkdir(parents=True)
    for name in ("ckpt-3.index", "ckpt-3.data-00000-of-00001"):
        (output_dir / "checkpoints" / name).write_bytes(b"\0" * 16)
    write_json(output_dir / RUN_SETTINGS, {"MODEL": model})
    write_json(output_dir / RUN, {"model": model, "model_sha256": model_fingerprint(model), "jit_compile": False})
    return output_dir


NO_COLON = GOOD_MODEL.replace("learning_rate):", "learning_rate)", 1)


@pytest.mark.parametrize("command", ["fit", "resume", "evaluate"])
def test_a_model_file_that_does_not_parse_is_one_line_naming_the_file_and_line(cli, tmp_path, command):
    (tmp_path / "broken.py").write_text(GOOD_MODEL)
    output_dir = fake_run(tmp_path / "run", model="broken.py") if command == "resume" else tmp_path / "run"
    (tmp_path / "broken.py").write_text(NO_COLON)
    line = next(number for number, text in enumerate(NO_COLON.splitlines(), 1) if "def build_model" in text)
    result = cli("evaluate" if command == "evaluate" else "fit", MODEL="broken.py", OUTPUT_DIR=output_dir)
    assert result.exit_code == 2, result.output
    assert last_line(result) == f"error: MODEL='broken.py' does not parse: broken.py, line {line}: expected ':'"


def test_a_damaged_run_json_is_refused_naming_it_and_is_left_as_it_was(cli, tmp_path):
    output_dir = fake_run(tmp_path / "run")
    (output_dir / RUN).write_bytes(b"\x8f garbage")
    (tmp_path / "other.py").write_text(GOOD_MODEL.replace("Dense(16,", "Dense(32,"))
    result = cli("fit", MODEL="other.py", OUTPUT_DIR=output_dir)
    assert result.exit_code == 2, result.output
    assert last_line(result).startswith(f"error: {output_dir / RUN} is damaged (not JSON: ")
    assert "it records which MODEL this run's checkpoints are of" in last_line(result)
    assert (output_dir / RUN).read_bytes() == b"\x8f garbage"
    write_json(output_dir / RUN, ["valid JSON", "of the wrong type"])
    assert last_line(cli("evaluate", OUTPUT_DIR=output_dir)).startswith(
        f"error: {output_dir / RUN} is damaged (a JSON list, not an object)"
    )


@pytest.mark.parametrize(("key", "value"), [("initialized_from", "runs/a"), ("initialized_from", {"loaded": []}),
                                            ("phases", {"first_epoch": 1}), ("phases", ["phase 0"])])  # fmt: skip
def test_a_damaged_record_of_init_from_or_the_phases_is_named(tmp_path, key, value):
    """run.json's "initialized_from" and "phases" (issue 45) read back as the other records are: a value of
    another shape is the file's damage, named, not a crash where it is read."""
    from train.rundir import read_run

    write_json(tmp_path / RUN, {"model": "model.py", key: value})
    with pytest.raises(SettingsError, match=re.escape(f"{tmp_path / RUN} is damaged ({key}: {value!r})")):
        read_run(tmp_path)
    write_json(tmp_path / RUN, {"model": "model.py", "initialized_from": None, "phases": None})
    assert read_run(tmp_path)["phases"] is None  # a run without either records null


def test_a_damaged_settings_json_is_said_the_same_way_by_fit_and_evaluate(cli, tmp_path):
    output_dir = fake_run(tmp_path / "run")
    text = (output_dir / RUN_SETTINGS).read_text()
    (output_dir / RUN_SETTINGS).write_text(text[: len(text) // 2])  # truncated
    damaged = f"warning: {output_dir / RUN_SETTINGS} is damaged (not JSON: "
    fit = cli("fit", OUTPUT_DIR=output_dir)
    assert fit.exit_code == REACHED_TENSORFLOW, fit.output
    assert fit.stderr.startswith(damaged)
    assert "which settings changed since the run's last start cannot be said; this start writes it anew" in fit.stderr
    evaluate = cli("evaluate", OUTPUT_DIR=output_dir)
    assert evaluate.exit_code == REACHED_TENSORFLOW, evaluate.output
    assert evaluate.stderr.startswith(damaged)
    assert "evaluating with the flags, the environment, .env and the defaults alone" in evaluate.stderr


def test_an_output_dir_that_is_a_dangling_symlink_is_one_line_naming_the_link_and_its_target(cli, tmp_path):
    (tmp_path / "run").symlink_to(tmp_path / "gone")
    result = cli("fit", OUTPUT_DIR=tmp_path / "run")
    assert result.exit_code == 2, result.output
    assert last_line(result).startswith(
        f"error: OUTPUT_DIR={tmp_path / 'run'} is a symlink to {tmp_path / 'gone'}, which does not exist"
    )
    (tmp_path / "parent").symlink_to("nowhere")
    result = cli("fit", OUTPUT_DIR=tmp_path / "parent" / "run")
    assert last_line(result).startswith(f"error: OUTPUT_DIR={tmp_path / 'parent' / 'run'}: {tmp_path / 'parent'} is")


def test_what_a_killed_save_left_is_removed_when_the_run_next_opens_and_the_checkpoints_stay(cli, tmp_path):
    output_dir = fake_run(tmp_path / "run")
    checkpoints = output_dir / "checkpoints"
    (checkpoints / "ckpt-5_temp").mkdir()
    (checkpoints / "ckpt-5_temp" / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"\0" * 4096)
    (checkpoints / "ckpt-7.data-00000-of-00001").write_bytes(b"\0" * 4096)  # its index was never written
    (output_dir / "saved_model.tmp").mkdir()
    (output_dir / ".summary.json.4242.tmp").write_text("{")
    kept = sorted(path.name for path in checkpoints.iterdir() if path.name.startswith("ckpt-3"))
    result = cli("fit", OUTPUT_DIR=output_dir)
    assert result.exit_code == REACHED_TENSORFLOW, result.output
    assert sorted(path.name for path in checkpoints.iterdir()) == kept
    assert not (output_dir / "saved_model.tmp").exists() and not (output_dir / ".summary.json.4242.tmp").exists()
    assert "removed what a killed save or export left (or damaged) in" in result.stderr
    assert "checkpoints/ckpt-5_temp" in result.stderr


def test_a_live_run_keeps_its_save_in_progress(cli, tmp_path):
    output_dir = fake_run(tmp_path / "run")
    (output_dir / "checkpoints" / "ckpt-5_temp").mkdir()
    lock = RunLock(output_dir)
    lock.acquire()
    try:
        result = cli("fit", OUTPUT_DIR=output_dir)
    finally:
        lock.release()
    assert result.exit_code == 75, result.output
    assert (output_dir / "checkpoints" / "ckpt-5_temp").is_dir()


def test_a_failure_nobody_foresaw_is_one_line_and_its_traceback_goes_to_crash_log(cli, tmp_path, monkeypatch):
    def fit(settings, stop, **options):
        return {"steps": 1} / 0

    monkeypatch.setitem(sys.modules, "train.fit", types.SimpleNamespace(fit=fit))
    monkeypatch.setattr(cli_module, "_load_tensorflow", lambda: None)
    (tmp_path / "run").mkdir()
    result = cli("fit", OUTPUT_DIR=tmp_path / "run")
    assert result.exit_code == 1, result.output
    assert result.stderr.strip().splitlines() == [
        "error: TypeError: unsupported operand type(s) for /: 'dict' and 'int'. This is a bug: the full traceback is "
        f"in {tmp_path / 'run' / 'crash.log'}; please report it"
    ]
    assert "Traceback (most recent call last)" in (tmp_path / "run" / "crash.log").read_text()

    result = cli("fit", OUTPUT_DIR=tmp_path / "not-yet")  # no run directory: a file in the temporary folder
    crash_log = Path(re.search(r"the full traceback is in (\S+);", result.stderr).group(1))
    assert crash_log.parent == Path(tempfile.gettempdir())
    assert "ZeroDivisionError" not in result.stderr and "TypeError" in crash_log.read_text()
    crash_log.unlink()


@pytest.mark.parametrize(("units", "scores"), [("num_classes + 3", 13), ("1", 1)])
def test_an_output_that_does_not_fit_the_labels_is_exit_2_before_the_run_directory(tmp_path, tfds_data_dir, units,
                                                                                    scores):  # fmt: skip
    """Dense(num_classes + 3) trained a 13-way classifier for 10 classes without a word; Dense(1) trained to NaN."""
    (tmp_path / "wrong.py").write_text(GOOD_MODEL.replace("Dense(num_classes,", f"Dense({units},"))
    result = run_train("fit", cwd=tmp_path, MODEL="wrong.py", TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=tmp_path / "run")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: MODEL='wrong.py': its output (None, {scores}) scores {scores} class{'es' if scores > 1 else ''}, "
        "but each label of "
        "synthetic_clusters/1.0.0 (LABEL_KEY='label') is one of 10 (0-9) under sparse categorical cross-entropy: end "
        "the model with num_classes units, like Dense(num_classes, activation='softmax')"
    )
    assert not (tmp_path / "run").exists()


def test_a_start_that_cannot_open_the_run_rewrites_nothing_of_it(tmp_path, tfds_data_dir):
    """run.json gone and another MODEL: no checkpoint loads into it (exit 2, naming the changed MODEL), and no
    run.json naming it is written (which would lock the right model out); the right model then resumes."""
    (tmp_path / "mine.py").write_text(GOOD_MODEL)
    (tmp_path / "other.py").write_text(GOOD_MODEL.replace("Dense(16,", "Dense(32,"))
    settings = {"TFDS_DATA_DIR": tfds_data_dir, "OUTPUT_DIR": tmp_path / "run", "STEPS_PER_EPOCH": 10}
    assert run_train("fit", cwd=tmp_path, MODEL="mine.py", EPOCHS=1, **settings).returncode == 0
    (tmp_path / "run" / RUN).unlink()
    before = (tmp_path / "run" / RUN_SETTINGS).read_bytes()
    result = run_train("fit", cwd=tmp_path, MODEL="other.py", EPOCHS=2, **settings)
    assert result.returncode == 2, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: no checkpoint in "), last
    assert f"(MODEL {tmp_path / 'mine.py'} -> {tmp_path / 'other.py'})" in last, last  # paths recorded absolute
    assert not (tmp_path / "run" / RUN).exists()
    assert (tmp_path / "run" / RUN_SETTINGS).read_bytes() == before
    result = run_train("fit", cwd=tmp_path, MODEL="mine.py", EPOCHS=2, **settings)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Resuming from" in result.stdout and (tmp_path / "run" / RUN).is_file()


@pytest.mark.skipif(not can_drop_file_override(), reason="root here cannot drop CAP_DAC_OVERRIDE")
def test_checkpoints_that_become_unwritable_mid_run_are_told_as_permissions_not_space(tmp_path, tfds_data_dir):
    output_dir = tmp_path / "run"
    settings = {"TFDS_DATA_DIR": tfds_data_dir, "OUTPUT_DIR": output_dir, "BATCH_SIZE": 32, "EPOCHS": 2}
    settings |= {"STEPS_PER_EPOCH": 300, "STEPS_PER_CALL": 4, "CHECKPOINT_EVERY": 40, "LOG_EVERY": 1000}
    process = start_python(["-c", UNPRIVILEGED_TRAIN, "fit"], cwd=tmp_path, env=clean_env(**settings),
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    wait_for(lambda: any(output_dir.glob("checkpoints/ckpt-[1-9]*.index")), process, "a checkpoint past 0")
    (output_dir / "checkpoints").chmod(0o555)
    try:
        _, stderr = process.communicate(timeout=120)
    finally:
        (output_dir / "checkpoints").chmod(0o755)
    assert process.returncode == 1, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: could not write checkpoint ckpt-"), last
    assert f"is intact: fix the owner or permissions of {output_dir / 'checkpoints'} (UID {os.getuid()} " in last
    assert "free space" not in last


@pytest.mark.skipif(not can_drop_file_override(), reason="root here cannot drop CAP_DAC_OVERRIDE")
def test_a_lock_file_of_another_user_is_exit_2_naming_the_file_and_its_owner(tmp_path):
    output_dir = fake_run(tmp_path / "run")
    lock = output_dir / ".lock"
    lock.write_text("")
    if os.geteuid() == 0:
        os.chown(lock, 12345, 12345)  # a run directory from another user
    else:
        lock.chmod(0o444)
    result = run_python(["-c", UNPRIVILEGED_TRAIN, "fit"], cwd=tmp_path, env=clean_env(OUTPUT_DIR=output_dir))
    assert result.returncode == 2, result.stderr[-3000:]
    owned = "UID 12345" if os.geteuid() == 0 else owner(lock)  # a UID this machine has no name for
    assert result.stderr.strip().splitlines() == [
        f"error: OUTPUT_DIR={output_dir} cannot be locked: {lock} cannot be opened for writing by UID "
        f"{os.getuid()} (Permission denied, owned by {owned}): use another OUTPUT_DIR, or fix its owner or "
        "permissions"
    ]
    assert RunLock(output_dir).path.read_text() == ""


def test_the_readmes_exit_codes_are_every_code_a_run_ends_with():
    table = (REPO / "README.md").read_text().split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    codes = {int(code) for code in re.findall(r"^\| (\d+) \|", table, flags=re.MULTILINE)}
    assert codes == {EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_PREEMPTED, EXIT_BUSY, 128 + signal.SIGKILL}


def test_a_worker_waiting_for_the_others_says_who_is_up_and_who_is_awaited(capfd):
    with socket.socket() as listening, socket.socket() as closed:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        closed.bind(("127.0.0.1", 0))
        up, silent = (f"127.0.0.1:{each.getsockname()[1]}" for each in (listening, closed))
        cluster = Cluster(chief=(), worker=("127.0.0.1:1", up, silent), task_type="worker", task_index=0)
        with StartupDeadline(cluster, seconds=60, report_every=0.3):
            time.sleep(1)
    lines = capfd.readouterr().out.strip().splitlines()
    assert len(lines) >= 2
    assert lines[0].startswith("Waiting for the workers of TF_CONFIG (0 s of WORKER_START_TIMEOUT=60): ")
    assert lines[0].endswith(
        f"up: worker 0 (this one, 127.0.0.1:1), worker 1 ({up}); awaited: worker 2 at {silent} (nothing listens there)"
    )


@pytest.mark.parametrize(
    ("error", "fix"),
    [
        (PermissionError(errno.EACCES, "Permission denied"), "fix the owner or permissions of runs/x (UID "),
        (RuntimeError("runs/x/ckpt-5_temp; Permission denied [Op:SaveV2]"), "fix the owner or permissions of runs/x"),
        (OSError(errno.ENOSPC, "No space left on device"), "free space"),
        (RuntimeError("runs/x; No space left on device [Op:MergeV2Checkpoints]"), "free space"),
        (OSError(errno.EROFS, "Read-only file system"), "make runs/x writable (it is on a read-only filesystem)"),
        (OSError(errno.EIO, "Input/output error"), "fix what it names"),
    ],
)
def test_a_write_that_failed_is_told_what_to_do_from_its_cause(error, fix):
    assert storage_fix(error, "runs/x").startswith(fix)


FORK_MISTAKES = {
    "an Input of another shape": (
        "import keras\n"
        "def build_model(input_shape, num_classes, learning_rate):\n"
        "    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(num_classes, activation='softmax')])\n"
        "    model.compile('adam', 'sparse_categorical_crossentropy')\n"
        "    return model\n",
        2,
        "Sequential cannot be called on synthetic_clusters/1.0.0's features [32] float32 (Input 0 ",
    ),
    "a callback that raises": (
        "import keras\n"
        "from examples.mlp import build_model\n"
        "class Broken(keras.callbacks.Callback):\n"
        "    def on_epoch_end(self, epoch, logs=None):\n"
        "        raise RuntimeError('my callback broke')\n"
        "def build_callbacks(context):\n"
        "    return [Broken()]\n",
        1,
        "its callback Broken raised RuntimeError in on_epoch_end: my callback broke; the last checkpoint is intact",
    ),
    "a hook that raises": (
        "from examples.mlp import build_model\n"
        "from train.hooks import Hook\n"
        "class Broken(Hook):\n"
        "    def epoch_end(self, epoch, step, metrics):\n"
        "        raise RuntimeError('my hook broke')\n"
        "def build_hooks(context):\n"
        "    return [Broken()]\n",
        1,
        "its hook Broken raised RuntimeError in epoch_end: my hook broke; the last checkpoint is intact",
    ),
    "build_hooks returning what is not a hook": (
        "from examples.mlp import build_model\ndef build_hooks(context):\n    return [print]\n",
        2,
        "build_hooks returned a list holding builtin_function_or_method: return a list of train.hooks.Hook (see "
        "docs/fork.md, Hooks)",
    ),
}


@pytest.mark.parametrize("mistake", FORK_MISTAKES)
def test_a_forks_own_mistake_is_one_line_naming_model_not_a_bug(mistake, tmp_path, tfds_data_dir):
    """What a fork's code gets wrong is the fork's to fix: one line naming MODEL, never "This is a bug"."""
    text, code, said = FORK_MISTAKES[mistake]
    (tmp_path / "model.py").write_text(text)
    result = run_train("fit", cwd=tmp_path, MODEL="model.py", TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=tmp_path / "run",
                       EPOCHS=1, STEPS_PER_EPOCH=3, LOG_EVERY=1000)  # fmt: skip
    assert result.returncode == code, result.stderr[-3000:]
    [line] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith("error: MODEL='model.py': ") and said in line, line
    assert "This is a bug" not in result.stderr and "Traceback" not in result.stderr


def test_a_resume_whose_changed_settings_build_another_model_names_them_exit_2(tmp_path, tfds_data_dir):
    """HP_UNITS changes the shapes: no checkpoint loads, and the line names what changed (not "corrupt", exit 1)."""
    (tmp_path / "model.py").write_text(
        "import keras\n"
        "def build_model(input_shape, num_classes, learning_rate, *, units=16):\n"
        "    model = keras.Sequential([keras.Input(input_shape), keras.layers.Dense(units, activation='relu'),\n"
        "                              keras.layers.Dense(num_classes, activation='softmax')])\n"
        "    model.compile('adam', 'sparse_categorical_crossentropy')\n"
        "    return model\n"
    )
    settings = dict(MODEL="model.py", TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=tmp_path / "run", STEPS_PER_EPOCH=3,
                    LOG_EVERY=1000)  # fmt: skip
    assert run_train("fit", cwd=tmp_path, EPOCHS=1, **settings).returncode == 0
    checkpoints = sorted((tmp_path / "run" / "checkpoints").iterdir())
    result = run_train("fit", cwd=tmp_path, EPOCHS=2, HP_UNITS=12, **settings)
    assert result.returncode == 2, result.stderr[-3000:]
    [line] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "no checkpoint in " in line and "settings changed since the run's last start" in line, line
    assert "(HP_UNITS 16 -> 12)" in line, line  # EPOCHS, raised to go on, is not a change of the run
    assert sorted((tmp_path / "run" / "checkpoints").iterdir()) == checkpoints
