"""`python -m train tune`: Optuna trials that are ordinary run directories, resumed after a kill; its bad input."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import clean_env, engine_defaults, needs, read_summary, run_python, start_python
from train.cli import app
from train.settings import FIELDS

pytestmark = needs("tune")

# each trial a real `python -m train fit` (a new interpreter, TensorFlow imported in it): a few steps
TINY = {"EPOCHS": 1, "STEPS_PER_EPOCH": 5, "LOG_EVERY": 5, "CHECKPOINT_EVERY": 5, "PROGRESS": "lines"}
SPACE = ["--space", "LEARNING_RATE=1e-3..1e-1:log", "--space", "BATCH_SIZE=16|32"]
# the tune as a user types it, telling at its exit whether TensorFlow or Keras were imported in its process
TUNE = (
    "import atexit, sys\n"
    "atexit.register(lambda: print('imported:', sorted({m.split('.')[0] for m in sys.modules} & {'tensorflow', "
    "'keras'}), file=sys.stderr))\n"
    "from train.cli import app\n"
    "app(sys.argv[1:], prog_name='python -m train')\n"
)


def tune(tmp_path: Path, data_dir: Path, *args: str, timeout: float = 600, **settings: object
         ) -> subprocess.CompletedProcess:  # fmt: skip
    env = clean_env(TFDS_DATA_DIR=data_dir, STUDY_DIR=tmp_path / "study", **(TINY | settings))
    return run_python(["-c", TUNE, "tune", *args], cwd=tmp_path, env=env, timeout=timeout, fresh=True)


def study_trials(study_dir: Path) -> list:
    import optuna

    return optuna.load_study(study_name="study", storage=f"sqlite:///{study_dir / 'study.db'}").get_trials()


@pytest.mark.slow
def test_tune_runs_four_trials_two_at_a_time_each_a_run_directory(tmp_path, tfds_data_dir):
    result = tune(tmp_path, tfds_data_dir, "--trials", "4", "--jobs", "2", "--no-prune", "--json", *SPACE)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "imported: []" in result.stderr  # the tune itself: optuna, never TensorFlow; its trials train
    study_dir = tmp_path / "study"
    trials = study_trials(study_dir)
    assert [each.state.name for each in trials] == ["COMPLETE"] * 4
    assert sorted(p.name for p in study_dir.glob("trial-*")) == [f"trial-{n}" for n in range(4)]
    for each in trials:
        summary = read_summary(study_dir / f"trial-{each.number}")
        assert summary["steps"] == 5 and summary["trial"] == each.number and summary["pruned"] is False
        assert each.value == json.loads((study_dir / f"trial-{each.number}" / "epochs.json").read_text())[-1][
            "logs"]["val_loss"]  # fmt: skip
    assert len({each.params["LEARNING_RATE"] for each in trials}) == 4  # the two jobs' samplers differ
    best = json.loads((study_dir / "best.json").read_text())
    chosen = min(trials, key=lambda each: each.value)
    assert best == {"number": chosen.number, "value": chosen.value, "params": chosen.params,
                    "output_dir": str(study_dir / f"trial-{chosen.number}"),
                    "export": str(study_dir / f"trial-{chosen.number}" / "saved_model")}  # fmt: skip
    assert (Path(best["export"]) / "saved_model.pb").is_file()
    printed = json.loads(result.stdout)
    assert printed["best"] == best and [row["state"] for row in printed["trials"]] == ["complete"] * 4


@pytest.mark.slow
def test_a_killed_tune_run_again_resumes_its_interrupted_trial_under_its_number(tmp_path, tfds_data_dir):
    long = {"EPOCHS": 1, "STEPS_PER_EPOCH": 400, "CHECKPOINT_EVERY": 10, "LOG_EVERY": 50, "STEPS_PER_CALL": 10}
    env = clean_env(TFDS_DATA_DIR=tfds_data_dir, STUDY_DIR=tmp_path / "study", **(TINY | long))
    args = ["-m", "train", "tune", "--trials", "2", "--no-prune", *SPACE]
    process = start_python(args, cwd=tmp_path, env=env, fresh=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    trial = tmp_path / "study" / "trial-0"
    deadline = time.monotonic() + 180
    while not any(trial.glob("checkpoints/ckpt-[1-9]*.index")):
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no checkpoint of trial 0 within 180 s"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL
    assert [each.state.name for each in study_trials(tmp_path / "study")] == ["RUNNING"]

    again = run_python(args, cwd=tmp_path, env=env, fresh=True, timeout=600)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    assert "trial 0: resumed" in again.stderr
    trials = study_trials(tmp_path / "study")
    assert [each.state.name for each in trials] == ["COMPLETE", "COMPLETE"]
    summary = read_summary(trial)
    assert summary["resumed_from_step"] > 0 and summary["steps"] == 400
    assert sorted(p.name for p in (tmp_path / "study").glob("trial-*")) == ["trial-0", "trial-1"]


@pytest.mark.slow
@needs("track")  # its trials' MLflow runs
def test_a_trial_the_median_pruner_stops_says_pruned_in_its_summary(tmp_path, tfds_data_dir):
    import optuna

    study_dir = tmp_path / "study"
    study_dir.mkdir()
    study = optuna.create_study(study_name="study", storage=f"sqlite:///{study_dir / 'study.db'}")
    for rate in (0.05, 0.05, 1e-7):  # two that learn, then one that barely moves: above their median at epoch 1
        study.enqueue_trial({"LEARNING_RATE": rate})
    result = tune(tmp_path, tfds_data_dir, "--trials", "3", "--space", "LEARNING_RATE=1e-7..1e-1:log",
                  EPOCHS=2, STEPS_PER_EPOCH=20, CHECKPOINT_EVERY=20, LOG_EVERY=20, TRACKING="mlflow")  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert [each.state.name for each in study_trials(study_dir)] == ["COMPLETE", "COMPLETE", "PRUNED"]
    # TRACKING=mlflow: each trial an MLflow run (in the store beside the trials), under the study's one parent run
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{study_dir / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("study").experiment_id])
    parent = optuna.load_study(study_name="study", storage=f"sqlite:///{study_dir / 'study.db'}").user_attrs[
        "mlflow_parent_run_id"]  # fmt: skip
    trials = {run.info.run_id: run for run in runs if run.info.run_id != parent}
    assert len(runs) == 4 and len(trials) == 3
    assert all(run.data.tags["mlflow.parentRunId"] == parent for run in trials.values())
    assert sorted(run.data.tags["output_dir"] for run in trials.values()) == [
        str(study_dir / f"trial-{n}") for n in range(3)]  # fmt: skip
    summary = read_summary(study_dir / "trial-2")
    assert summary["pruned"] is True and summary["interrupted"] is False
    assert summary["steps"] == 20 and summary["epochs_completed"] == 1  # stopped after its first epoch, saved
    assert summary["checkpoint"] and (study_dir / "trial-2" / "saved_model").is_dir()
    assert json.loads((study_dir / "best.json").read_text())["number"] in (0, 1)


SEARCH_SPACE = """
def build_model(input_shape, num_classes, learning_rate):  # never built: these trials fail before
    raise NotImplementedError


def search_space(trial):
    return {"LEARNING_RATE": trial.suggest_float("lr", 1e-4, 1e-2, log=True), "BATCH_SIZE": 16}
"""


def test_three_failures_in_a_row_stop_the_tune_with_their_lines(tmp_path):
    study_dir = tmp_path / "study"
    study_dir.mkdir()
    for number in range(3):  # a file where each trial's run directory goes: its fit refuses it, exit 2
        (study_dir / f"trial-{number}").write_text("not a directory")
    model = tmp_path / "model.py"  # the space from MODEL's search_space(trial), not --space
    model.write_text(SEARCH_SPACE)
    env = clean_env(STUDY_DIR=study_dir, MODEL=model, **TINY)
    result = run_python(["-m", "train", "tune", "--trials", "5"], cwd=tmp_path, env=env, fresh=True)
    assert result.returncode == 1, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert lines[-4] == "the tune stopped: 3 trials failed in a row:"
    for number, line in enumerate(lines[-3:]):
        assert line.startswith(f"trial {number} failed (exit 2): ") and "OUTPUT_DIR" in line, line
    assert [each.state.name for each in study_trials(study_dir)] == ["FAIL"] * 3
    for each in study_trials(study_dir):
        assert each.user_attrs["error"] in lines[-3 + each.number]
        assert each.user_attrs["settings"] == {"LEARNING_RATE": str(each.params["lr"]), "BATCH_SIZE": "16"}


def test_a_search_space_returning_what_is_not_a_setting_is_one_line_and_exit_2(tmp_path):
    model = tmp_path / "model.py"
    model.write_text(SEARCH_SPACE.replace('"BATCH_SIZE"', '"BATCH"'))
    env = clean_env(STUDY_DIR=tmp_path / "study", MODEL=model, **TINY)
    result = run_python(["-m", "train", "tune", "--trials", "2"], cwd=tmp_path, env=env, fresh=True)
    assert result.returncode == 2, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: MODEL={str(model)!r}: search_space(trial) returned BATCH='16': BATCH is not a")
    assert [each.state.name for each in study_trials(tmp_path / "study")] == ["FAIL"]
    assert not list((tmp_path / "study").glob("trial-*"))


BAD = [
    (["--space", "LEARNING_RATE=0.1"], "--space 'LEARNING_RATE=0.1': '0.1' is not a SPEC"),
    (["--space", "LEARNING_RATE"], "is not NAME=SPEC"),
    (["--space", "LEARNING_RATE=0..1"], "LEARNING_RATE='0' is not allowed"),
    (["--space", "LEARNING_RATE=1e-2..1e-4:log"], "low must be below high"),
    (["--space", "BATCH_SIZE=int:8..16.5"], "int:low..high takes whole numbers"),
    (["--space", "BATCH_SIZE=16||32"], "a choice needs distinct, non-empty values"),
    (["--space", "BATCH_SIZE=16|x"], "BATCH_SIZE='x' is not allowed"),
    (["--space", "LERNING_RATE=1e-4..1e-2"], "LERNING_RATE is not a setting or a hyperparameter"),
    (["--space", "HP_WIDTH=int:8..64"], "HP_WIDTH is not a setting or a hyperparameter"),
    (["--space", "LEARNING_RATE=1e-4..1e-2", "--space", "LEARNING_RATE=1e-3..1e-2"], "is searched twice"),
    ([], "nothing to search"),
    (["--space", "LEARNING_RATE=1e-4..1e-2", "--jobs", "3", "--trials", "2"], "--jobs 3 is above --trials 2"),
    (["--space", "LEARNING_RATE=1e-4..1e-2", "--jobs", "2", "--gpus", "0,1,2"], "cannot share GPUS=0,1,2"),
    (["--space", "LEARNING_RATE=1e-4..1e-2", "--storage", "sqlite:////no/such/folder/study.db"], "cannot be opened"),
    (["--space", "LEARNING_RATE=1e-4..1e-2", "--storage", "journal:/no/such/folder/j.log"], "does not exist"),
    (["--space", "LEARNING_RATE=1e-4..1e-2", "--monitor", "val_thing"], "MONITOR='val_thing': whether it should"),
    (["--space", "LEARNING_RATE=1e-4..1e-2", "TF_CONFIG"], "TF_CONFIG is set and names 2 workers, but a tune runs"),
    (["--space", "LEARNING_RATE=1e-4..1e-2", "--study-wait", "0"], "STUDY_WAIT='0' is not allowed: use a whole number"),
    (["--space", "LEARNING_RATE=1e-4..1e-2", "--study-wait", "soon"], "STUDY_WAIT='soon' is not allowed: use a whole"),
]


@pytest.mark.parametrize(("args", "said"), BAD, ids=[" ".join(args) or "no space" for args, _ in BAD])
def test_bad_input_is_one_line_and_exit_2_before_any_trial(tmp_path, monkeypatch, args, said):
    monkeypatch.chdir(tmp_path)  # no stray .env
    for name in [field.env for field in FIELDS] + [n for n in os.environ if n.startswith("HP_")]:
        monkeypatch.delenv(name, raising=False)
    env = {"COLUMNS": "300", **engine_defaults()}
    if "TF_CONFIG" in args:  # not a flag: the environment TensorFlow reads, naming 2 workers
        args = [arg for arg in args if arg != "TF_CONFIG"]
        env["TF_CONFIG"] = json.dumps(
            {"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "worker", "index": 0}}
        )
    result = CliRunner().invoke(app, ["tune", "--study-dir", str(tmp_path / "study"), *args], env=env)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], result.output
    assert not (tmp_path / "study" / "study.db").exists()


@pytest.mark.parametrize("given", [False, True], ids=["STUDY_DIR's study.db", "--storage sqlite:///PATH"])
def test_a_study_storage_another_process_holds_locked_is_busy_exit_75_after_study_wait(tmp_path, given):
    """Busy is not bad input: a sqlite study another process holds locked is tried again for STUDY_WAIT seconds, not
    sqlite's 60 s wait of the trials' writes, then the tune exits 75 in one line, nothing written."""
    import optuna

    study_dir = tmp_path / "study"
    path = tmp_path / "held.db" if given else study_dir / "study.db"
    path.parent.mkdir(exist_ok=True)
    optuna.create_study(storage=f"sqlite:///{path}", study_name="study")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process's write in progress: reads and writes wait for it
    try:
        args = ["--trials", "2", *SPACE] + (["--storage", f"sqlite:///{path}"] if given else [])
        env = clean_env(STUDY_DIR=study_dir, STUDY_WAIT=1, **TINY)
        start = time.monotonic()
        result = run_python(["-m", "train", "tune", *args], cwd=tmp_path, env=env, timeout=300, fresh=True)
        took = time.monotonic() - start
    finally:
        holder.close()
    assert result.returncode == 75, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        "error: the study's storage is busy (database is locked): another tune holds it; run again when it is done"
    ]
    assert took < 30, took  # STUDY_WAIT's 1 s and the start, not SQLITE_TIMEOUT's 60 s
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no trial, no log; with --storage, no STUDY_DIR
    assert optuna.load_study(study_name="study", storage=f"sqlite:///{path}").get_trials() == []


def test_a_tune_without_the_tune_extra_is_one_line_and_exit_2(tmp_path, monkeypatch):
    """Without optuna (None in sys.modules: `import optuna` fails, and so does the look it is found through), the
    tune says which extra to install, before anything is written."""
    monkeypatch.chdir(tmp_path)  # no stray .env
    for name in [field.env for field in FIELDS] + [n for n in os.environ if n.startswith("HP_")]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setitem(sys.modules, "optuna", None)
    args = ["tune", "--study-dir", str(tmp_path / "study"), "--trials", "2", "--space", "LEARNING_RATE=1e-3..1e-1"]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "300", **engine_defaults()})
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1
    assert "python -m train tune needs optuna, which is not installed: make setup EXTRAS=dev,tune" in result.output
    assert not (tmp_path / "study").exists()


def test_bad_input_imports_neither_tensorflow_nor_keras(tmp_path):
    script = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from train.cli import app\n"
        "for args, said in ((['--space', 'X=1..2'], 'X is not a setting'),\n"
        "                   (['--space', 'LEARNING_RATE=1e-4..1e-2', '--storage', 'nope://x'], 'cannot be opened')):\n"
        "    result = CliRunner().invoke(app, ['tune', '--study-dir', 'study', *args])\n"
        "    assert result.exit_code == 2 and said in result.output, result.output\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=clean_env(), capture_output=True,
                            text=True)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def _tune_in_process(tmp_path: Path, monkeypatch, model: str, *args: str):
    """`tune` through typer's CliRunner with MODEL's text (no trial gets as far as a fit here)."""
    monkeypatch.chdir(tmp_path)  # no stray .env
    for name in [field.env for field in FIELDS] + [n for n in os.environ if n.startswith("HP_")]:
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "model.py").write_text(model)
    args = ["tune", "--study-dir", str(tmp_path / "study"), "--model", str(tmp_path / "model.py"), *args]
    return CliRunner().invoke(app, args, env={"COLUMNS": "300", **engine_defaults()})


def test_a_search_space_that_raises_is_one_line_naming_model_and_exit_2(tmp_path, monkeypatch):
    model = SEARCH_SPACE.replace('trial.suggest_float("lr", 1e-4, 1e-2, log=True)', 'trial.suggest_float("lr", 1, 0)')
    result = _tune_in_process(tmp_path, monkeypatch, model, "--trials", "2")
    assert result.exit_code == 2, result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith(f"error: MODEL={str(tmp_path / 'model.py')!r}: search_space(trial) raised ValueError: "), (
        last
    )
    assert "Traceback" not in result.output and "This is a bug" not in result.output
    [failed] = study_trials(tmp_path / "study")
    assert failed.state.name == "FAIL" and failed.user_attrs["error"] in last  # the trial asked for: failed, with it


# The storage lost in the middle of a tune: MODEL's search_space(trial), called between the study's writes, overwrites
# the study's sqlite file (what is faked is only when it breaks; the failure is sqlite's own).
LOSES_THE_STORAGE = SEARCH_SPACE.replace(
    "def search_space(trial):\n",
    "def search_space(trial):\n    open({path!r}, 'r+b').write(b'not a database' * 512)\n",
)


def test_a_storage_lost_in_the_middle_of_a_tune_is_one_line_and_exit_1(tmp_path, monkeypatch):
    model = LOSES_THE_STORAGE.replace("{path!r}", repr(str(tmp_path / "study" / "study.db")))
    result = _tune_in_process(tmp_path, monkeypatch, model, "--trials", "2")
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    storage = f"sqlite:///{tmp_path / 'study' / 'study.db'}"
    assert lines[-1].startswith(f"error: the study's storage {storage} failed ("), lines[-1]
    assert lines[-1].endswith("run the tune again once it is back: it goes on from what the storage holds"), lines[-1]
    assert "Traceback" not in result.output and "This is a bug" not in result.output
    assert not list((tmp_path / "study").glob("trial-*"))


def test_a_trial_on_several_workers_is_refused_before_tensorflow(tmp_path):
    """A fit that TUNE_TRIAL makes a tune's trial is one process: on workers, each would report to the trial and be
    pruned on its own. Refused in one line before TensorFlow loads, nothing written; so is a tune whose trials would
    get TF_CONFIG (test_bad_input_is_one_line_and_exit_2_before_any_trial)."""
    trial = {"storage": f"sqlite:///{tmp_path / 'study.db'}", "study": "study", "trial_id": 1, "number": 0,
             "objective": "val_loss", "direction": "minimize", "prune": True}  # fmt: skip
    config = {"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "worker", "index": 0}}
    env = clean_env(TUNE_TRIAL=json.dumps(trial), TF_CONFIG=json.dumps(config), OUTPUT_DIR=tmp_path / "run",
                    WORKER_START_TIMEOUT=5, **TINY)  # fmt: skip
    result = run_python(["-c", TUNE, "fit"], cwd=tmp_path, env=env, timeout=120, fresh=True)  # its imports its own
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert lines[-2].startswith("error: TUNE_TRIAL is set on a multi-worker run (TF_CONFIG, STRATEGY=multi_worker)")
    assert lines[-1] == "imported: []"
    assert not (tmp_path / "run").exists()


def test_a_tune_run_again_draws_new_values_not_its_first_trials_again(tmp_path, monkeypatch):
    """Each run's samplers are seeded apart from the runs before (the trials the study holds): a tune stopped and run
    again goes on searching. Its trials fail before TensorFlow here (a file where each run directory goes)."""
    (tmp_path / "study").mkdir()
    for number in range(6):
        (tmp_path / "study" / f"trial-{number}").write_text("not a directory")
    for _ in range(2):  # 3 failures in a row stop each run
        result = _tune_in_process(tmp_path, monkeypatch, SEARCH_SPACE, "--trials", "5")
        assert result.exit_code == 1, result.output
    rates = [each.params["lr"] for each in study_trials(tmp_path / "study")]
    assert len(rates) == 6 and len(set(rates)) == 6, rates
